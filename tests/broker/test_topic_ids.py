"""raftmq/broker/topic_ids.py: the topic-id markers of a broker's replicas, read from disk
once and kept in memory after that (the broker compares them with every metadata version)."""

from __future__ import annotations

from raftmq.broker.topic_ids import TopicIdMarkers, marker_path
from raftmq.controller.model import MetadataState, Partition, Topic


def _state(version: int, **topic_ids: int) -> MetadataState:
    topics = {
        name: Topic(name, tid, 1, {}, (Partition((1,)), Partition((1,))))
        for name, tid in topic_ids.items()
    }
    return MetadataState("c", version=version, topics=topics)


def test_a_replica_is_gone_once_its_topic_id_is_not_in_a_new_enough_state(tmp_path):
    markers = TopicIdMarkers(tmp_path)
    markers.write(tmp_path / "a-0", 5)
    markers.write(tmp_path / "a-1", 5)
    markers.write(tmp_path / "b-0", 9)
    assert markers.gone(_state(10, a=5, b=9)) == []
    # a deleted; b created again under its name: both gone
    assert sorted(markers.gone(_state(12, b=11))) == [
        ("a", 0, tmp_path / "a-0"),
        ("a", 1, tmp_path / "a-1"),
        ("b", 0, tmp_path / "b-0"),
    ]
    # a lagging copy, older than b: b stays
    assert [name for name, _, _ in markers.gone(_state(8))] == ["a", "a"]


def test_markers_survive_a_restart_and_removals_are_forgotten(tmp_path):
    first = TopicIdMarkers(tmp_path)
    first.write(tmp_path / "my-topic-3", 7)
    first.write(tmp_path / "other-0", 8)
    first.remove(tmp_path / "other-0")
    assert not marker_path(tmp_path / "other-0").exists()
    again = TopicIdMarkers(tmp_path)  # a restarted broker reads the disk
    assert again.count_on_disk() == 1
    assert again.gone(_state(20)) == [("my-topic", 3, tmp_path / "my-topic-3")]
    marker_path(tmp_path / "my-topic-3").unlink()  # not through the object: not seen
    assert again.gone(_state(20)) == [("my-topic", 3, tmp_path / "my-topic-3")]


def test_a_missing_data_folder_holds_no_markers(tmp_path):
    markers = TopicIdMarkers(tmp_path / "not-yet")
    assert markers.count_on_disk() == 0
    assert markers.gone(_state(3)) == []
