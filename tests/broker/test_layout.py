"""``same_layout``: a version that only moves leaderships is told apart from one that
changes what a broker's replicas are, so the reconciler can skip its pass over every
partition for the first kind (raftmq/broker/layout.py)."""

import dataclasses

from raftmq.broker.layout import same_layout, same_partition
from raftmq.controller.model import Broker, MetadataState, Partition, PartitionState, Topic


def _state(*partitions: Partition, config: dict[str, str] | None = None) -> MetadataState:
    brokers = {b: Broker(b, "h", 1000 + b, "h", 2000 + b, None, 1, 1, 0) for b in (1, 2, 3)}
    topic = Topic("t", 7, 3, config or {}, tuple(partitions))
    return MetadataState("c", version=5, brokers=brokers, topics={"t": topic})


BASE = (Partition((1, 2, 3), leader=1), Partition((2, 3, 1), leader=2))


def _with_partition(base: MetadataState, p: int, **changes: object) -> MetadataState:
    topic = base.topics["t"]
    parts = list(topic.partitions)
    parts[p] = dataclasses.replace(parts[p], **changes)  # type: ignore[arg-type]
    topics = {"t": dataclasses.replace(topic, partitions=tuple(parts))}
    return dataclasses.replace(base, version=base.version + 1, topics=topics)


def test_a_new_leader_or_term_keeps_the_layout() -> None:
    before = _state(*BASE)
    after = _with_partition(before, 0, leader=3, leader_term=4)
    assert same_layout(before, after)
    assert same_layout(before, before)


def test_heartbeats_and_fencing_keep_the_layout_but_a_new_raft_address_does_not() -> None:
    before = _state(*BASE)
    brokers = dict(before.brokers)
    brokers[2] = dataclasses.replace(brokers[2], last_heartbeat_ms=99, fenced=True)
    assert same_layout(before, dataclasses.replace(before, brokers=brokers))
    brokers[2] = dataclasses.replace(brokers[2], raft_port=1)
    assert not same_layout(before, dataclasses.replace(before, brokers=brokers))
    brokers = dict(before.brokers)
    brokers[4] = dataclasses.replace(brokers[3], id=4)
    assert not same_layout(before, dataclasses.replace(before, brokers=brokers))


def test_every_change_to_what_replicas_are_breaks_the_layout() -> None:
    before = _state(*BASE)
    for changes in (
        {"replicas": (1, 2, 4)},
        {"learners": (4,)},
        {"replacing": 3},
        {"state": PartitionState.DECOMMISSIONED},
        {"delete_after_ms": 10},
    ):
        assert not same_layout(before, _with_partition(before, 1, **changes)), changes
    assert not same_layout(before, _state(*BASE, config={"retention.ms": "1"}))
    assert not same_layout(before, _state(*BASE, BASE[0]))
    topic = before.topics["t"]
    recreated = {"t": dataclasses.replace(topic, topic_id=8)}
    assert not same_layout(before, dataclasses.replace(before, topics=recreated))
    assert not same_layout(before, dataclasses.replace(before, topics={}))


def test_a_partition_that_is_gone_or_new_is_not_the_same() -> None:
    assert same_partition(None, None)
    assert not same_partition(None, BASE[0])
    assert not same_partition(BASE[0], None)
    assert same_partition(BASE[0], dataclasses.replace(BASE[0], leader=2))
