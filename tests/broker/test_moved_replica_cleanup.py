"""A broker deletes a replica the metadata moved away, but never on a copy of the metadata
older than the one that opened the replica there: after a restart the first copy a broker
gets may be a lagging voter's, from before the move that brought the replica here."""

from __future__ import annotations

from pathlib import Path

from raftmq.broker.reconciler import LISTED_SUFFIX
from raftmq.broker.server import Broker
from raftmq.broker.topic_ids import TOPIC_ID_SUFFIX
from raftmq.controller.model import MetadataState, Partition, Topic
from raftmq.devtools.local_cluster import local_spec
from raftmq.log.atomic_file import write_atomic

TOPIC_ID = 5


def state(version: int, replicas: tuple[int, ...]) -> MetadataState:
    topic = Topic("t", TOPIC_ID, 3, {}, (Partition(replicas),))
    return MetadataState("raftmq-test", version=version, topics={"t": topic})


async def test_only_a_copy_newer_than_the_listing_one_deletes_a_moved_replica(
    tmp_path: Path,
) -> None:
    broker = Broker(4, local_spec(4, {}, name="raftmq-test"), tmp_path)
    replica = broker.data_dir / "t-0"
    replica.mkdir(parents=True)
    write_atomic(broker.data_dir / f"t-0{LISTED_SUFFIX}", b"20")
    write_atomic(broker.data_dir / f"t-0{TOPIC_ID_SUFFIX}", str(TOPIC_ID).encode())
    # version 15: from before broker 4 was added (at 20); it must not delete the replica
    await broker.reconciler.delete_gone_replicas(state(15, (1, 2, 3)))
    assert replica.exists()
    # version 30: broker 4 was moved away since
    await broker.reconciler.delete_gone_replicas(state(30, (1, 2, 3)))
    assert not replica.exists()
    assert not (broker.data_dir / f"t-0{LISTED_SUFFIX}").exists()
