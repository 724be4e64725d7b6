"""A broker deletes a replica the metadata moved away, but never on a copy of the metadata
older than the one that opened the replica there: after a restart the first copy a broker
gets may be a lagging voter's, from before the move that brought the replica here."""

from __future__ import annotations

from pathlib import Path

from raftmq.broker.listings import LEGACY_SUFFIX, LISTINGS_FILE
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
    # listed at version 20 by a broker of before raftmq.broker.listings (a file per replica)
    write_atomic(broker.data_dir / f"t-0{LEGACY_SUFFIX}", b"20")
    write_atomic(broker.data_dir / f"t-0{TOPIC_ID_SUFFIX}", str(TOPIC_ID).encode())
    # version 15: from before broker 4 was added (at 20); it must not delete the replica
    await broker.reconciler.delete_gone_replicas(state(15, (1, 2, 3)))
    assert replica.exists()
    # version 30: broker 4 was moved away since
    await broker.reconciler.delete_gone_replicas(state(30, (1, 2, 3)))
    assert not replica.exists()
    assert not (broker.data_dir / f"t-0{LEGACY_SUFFIX}").exists()


async def test_listings_are_kept_in_one_file_raised_never_lowered(tmp_path: Path) -> None:
    broker = Broker(4, local_spec(4, {}, name="raftmq-test"), tmp_path)
    listings = broker.reconciler.listings
    dirs = [broker.data_dir / f"t-{p}" for p in range(3)]
    broker.data_dir.mkdir(parents=True)
    write_atomic(broker.data_dir / f"t-2{LEGACY_SUFFIX}", b"40")
    listings.raise_to(dirs, 30)
    listings.raise_to(dirs[:1], 10)  # never lowered
    assert [listings.listed_at(d) for d in dirs] == [30, 30, 40]
    assert not (broker.data_dir / f"t-2{LEGACY_SUFFIX}").exists()
    # a restarted broker reads the one file
    again = Broker(4, local_spec(4, {}, name="raftmq-test"), tmp_path).reconciler.listings
    assert [again.listed_at(d) for d in dirs] == [30, 30, 40]
    assert (broker.data_dir / LISTINGS_FILE).exists()
    again.forget(dirs[0])
    again.raise_to(dirs[1:2], 50)
    third = Broker(4, local_spec(4, {}, name="raftmq-test"), tmp_path).reconciler.listings
    assert [third.listed_at(d) for d in dirs] == [None, 50, 40]
