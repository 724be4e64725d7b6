"""A group's committed offsets as a consumer sees them, against real brokers: offsets
committed with metadata and read back (sync and asyncio, and in ``raftmq group
describe``), ``unsubscribe`` giving everything up and leaving the group (a static member
too) so the consumer can subscribe or assign again, and a committed offset that
retention deleted meeting each ``auto_offset_reset``.

The brokers run retention every 300 ms, so a topic with a tiny retention.ms and small
segments loses its old entries within a second or two."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.consumer import (
    AsyncConsumer,
    Consumer,
    ConsumerRecord,
    NoOffsetError,
    OffsetAndMetadata,
)
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import SHARED_BROKER_ARGS, cluster_spec, module_cluster
from tests.client.test_records_cli import raftmq

pytestmark = pytest.mark.timeout(180)

SESSION_MS = 2000
TOPICS = {"meta": 2, "ameta": 2, "unsub": 2, "aunsub": 1}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("group-commits"),
        cluster_spec(TOPICS),
        [*SHARED_BROKER_ARGS, "--retention-check-ms", "300"],
        request,
    ) as cluster:
        yield cluster


def produce(cluster: LocalCluster, topic: str, count: int, partitions: int) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(count):
            producer.send(topic, f"{topic}-{i}".encode(), partition=i % partitions)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.1)
    return found


def poll_until(c: Consumer, done: Callable[[list[ConsumerRecord]], bool]) -> list:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + 30
    while not done(got):
        assert time.monotonic() < deadline, f"polled {len(got)} records"
        got += c.poll(0.2)
    return got


async def apoll(c: AsyncConsumer, count: int) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + 30
    while len(got) < count:
        assert time.monotonic() < deadline, f"polled {len(got)} of {count}"
        got += await c.poll(0.3)
    return got


# --- offsets with metadata -------------------------------------------------------------


def test_offsets_are_committed_with_metadata_and_read_back(cluster: LocalCluster) -> None:
    produce(cluster, "meta", 10, 2)
    tps = [("meta", 0), ("meta", 1)]
    settings: dict[str, Any] = {
        "group_id": "g-meta",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": SESSION_MS,
    }
    with Consumer(cluster.addresses, **settings) as c:
        c.subscribe(["meta"])
        poll_until(c, lambda got: len(got) >= 10)
        note = "batch 7, checkpoint s3://bucket/ckpt-7 ✓"
        c.commit({("meta", 0): OffsetAndMetadata(3, note), ("meta", 1): 2})
        assert c.committed(with_metadata=True) == {
            ("meta", 0): OffsetAndMetadata(3, note),
            ("meta", 1): OffsetAndMetadata(2, ""),
        }
        assert c.committed() == {("meta", 0): 3, ("meta", 1): 2}  # ints, as before
        assert c.committed([("meta", 9)], with_metadata=True) == {("meta", 9): None}

        # the bound is checked here, with a sentence, before anything is sent
        with pytest.raises(ValueError, match="4097 characters; a group keeps at most 4096"):
            c.commit({("meta", 0): OffsetAndMetadata(4, "x" * 4097)})
        with pytest.raises(TypeError, match="OffsetAndMetadata"):
            c.commit({("meta", 0): "4"})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match="OffsetAndMetadata"):
            c.commit({("meta", 0): OffsetAndMetadata("4", "")})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="text"):
            c.commit({("meta", 0): OffsetAndMetadata(4, b"raw")})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="negative"):
            c.commit({("meta", 0): OffsetAndMetadata(-1, "")})
        assert c.committed(tps) == {("meta", 0): 3, ("meta", 1): 2}  # none of those landed
        c.commit({("meta", 1): OffsetAndMetadata(4, "x" * 4096)})  # the bound itself is fine

        described = json.loads(
            raftmq(cluster, "group", "describe", "g-meta", "--json").stdout.decode()
        )
        rows = {(p["topic"], p["partition"]): p for p in described["partitions"]}
        assert rows[("meta", 0)]["committed_offset"] == 3
        assert rows[("meta", 0)]["metadata"] == note
        assert rows[("meta", 1)]["metadata"] == "x" * 4096
        table = raftmq(cluster, "group", "describe", "g-meta")
        assert table.returncode == 0, table.stderr
        assert "metadata" in table.stdout.decode() and "batch 7" in table.stdout.decode()

        c.commit()  # the positions, without metadata: it replaces the text too
        assert c.committed(with_metadata=True) == {
            ("meta", 0): OffsetAndMetadata(5, ""),
            ("meta", 1): OffsetAndMetadata(5, ""),
        }
    # assign mode commits metadata for the (now empty) group as well
    with Consumer(cluster.addresses, **settings) as c:
        c.assign(tps)
        c.commit({("meta", 0): OffsetAndMetadata(1, "by hand")})
        assert c.committed([("meta", 0)], with_metadata=True) == {
            ("meta", 0): OffsetAndMetadata(1, "by hand")
        }


def test_the_async_consumer_commits_and_reads_metadata(cluster: LocalCluster) -> None:
    produce(cluster, "ameta", 4, 2)

    async def run() -> None:
        c = AsyncConsumer(
            cluster.addresses,
            group_id="g-ameta",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
        )
        async with c:
            c.subscribe(["ameta"])
            await apoll(c, 4)
            await c.commit({("ameta", 0): OffsetAndMetadata(2, "async note")})
            task = await c.commit({("ameta", 1): 1}, asynchronous=True)
            assert task is not None
            await task
            assert await c.committed(with_metadata=True) == {
                ("ameta", 0): OffsetAndMetadata(2, "async note"),
                ("ameta", 1): OffsetAndMetadata(1, ""),
            }
            assert await c.committed() == {("ameta", 0): 2, ("ameta", 1): 1}
            with pytest.raises(ValueError, match="at most 4096"):
                await c.commit({("ameta", 0): OffsetAndMetadata(2, "y" * 5000)})

    asyncio.run(run())


# --- unsubscribe ------------------------------------------------------------------------


def members_of(cluster: LocalCluster, group: str) -> list[str]:
    with AdminClient(cluster.addresses) as admin:
        return [m.member_id for m in admin.describe_group(group).members]


def test_unsubscribe_gives_up_everything_and_leaves_then_the_consumer_is_reusable(
    cluster: LocalCluster,
) -> None:
    produce(cluster, "unsub", 10, 2)
    tps = {("unsub", 0), ("unsub", 1)}
    revoked: list[set] = []
    misuse: list[Exception] = []
    settings: dict[str, Any] = {
        "group_id": "g-unsub",
        "auto_offset_reset": "earliest",
        # a static member with a long session: only leaving frees its partitions at once
        "group_instance_id": "worker-1",
        "session_timeout_ms": 30_000,
    }
    with Consumer(cluster.addresses, **settings) as c:

        def on_assign(_: set) -> None:
            try:
                c.unsubscribe()
            except RuntimeError as exc:
                misuse.append(exc)

        c.subscribe(["unsub"], on_assign=on_assign, on_revoke=revoked.append)
        got = poll_until(c, lambda got: len(got) >= 10)
        assert len(got) == 10 and c.assignment() == tps
        assert misuse and "after poll returns" in str(misuse[0])  # refused in a callback
        assert len(members_of(cluster, "g-unsub")) == 1

        c.unsubscribe()
        assert revoked == [tps]  # on_revoke, in this thread, before leaving
        assert c.assignment() == set()
        assert c.poll(0.3) == []
        assert c.committed(sorted(tps)) == {tp: 5 for tp in tps}  # auto-commit on the way out
        assert members_of(cluster, "g-unsub") == []  # left, though static
        c.unsubscribe()  # nothing held: nothing to do

        # another member takes both partitions at once, not after the 30 s session
        started = time.monotonic()
        with Consumer(cluster.addresses, **{**settings, "group_instance_id": None}) as b:
            b.subscribe(["unsub"])
            wait_until(lambda: b.poll(0.1) is not None and b.assignment() == tps, "takeover", 10)
            assert time.monotonic() - started < 10
        # after unsubscribe, assign is allowed, and unsubscribe drops it again
        c.assign([("unsub", 0)])
        c.seek(("unsub", 0), 0)
        assert poll_until(c, lambda got: len(got) >= 5)[0].offset == 0
        c.unsubscribe()
        assert c.assignment() == set()
        # ... and subscribing again rejoins, from the committed offsets
        c.subscribe(["unsub"], on_revoke=revoked.append)
        produce(cluster, "unsub", 2, 2)
        again = poll_until(c, lambda got: len(got) >= 2)
        assert sorted((r.partition, r.offset) for r in again) == [(0, 5), (1, 5)]
    c.close()  # closed twice: fine
    with pytest.raises(RuntimeError, match="closed"):
        c.unsubscribe()


def test_the_async_consumer_unsubscribes(cluster: LocalCluster) -> None:
    produce(cluster, "aunsub", 3, 1)

    async def run() -> None:
        revoked: list[set] = []

        async def on_revoke(tps: set) -> None:
            revoked.append(tps)

        c = AsyncConsumer(
            cluster.addresses,
            group_id="g-aunsub",
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
        )
        async with c:
            c.subscribe(["aunsub"], on_revoke=on_revoke)
            await apoll(c, 3)
            await c.unsubscribe()
            assert revoked == [{("aunsub", 0)}] and c.assignment() == set()
            assert await c.committed([("aunsub", 0)]) == {("aunsub", 0): 3}
            assert members_of(cluster, "g-aunsub") == []
            c.assign([("aunsub", 0)])
            assert c.assignment() == {("aunsub", 0)}

    asyncio.run(run())


# --- a committed offset below the log start ----------------------------------------------


def test_a_committed_offset_below_the_log_start_follows_auto_offset_reset(
    cluster: LocalCluster,
) -> None:
    """The group committed 2; retention then deleted offsets 0.. past it. A member taking
    the partition starts at the log start ('earliest'), at the end ('latest'), or poll
    raises NoOffsetError ('error') until it seeks."""
    topic, tp = "ret", ("ret", 0)
    with AdminClient(cluster.addresses) as admin:
        admin.create_topic(topic, 1, 3, {"segment.bytes": "4096", "retention.ms": "1000"})
    with Producer(cluster.addresses, linger_ms=0) as producer:
        for i in range(40):  # one entry each: about 10 segments
            producer.send(topic, f"r{i:02d}".encode() * 120, partition=0).result(timeout=30)
    policies = ("earliest", "latest", "error")
    for policy in policies:
        with Consumer(cluster.addresses, group_id=f"g-ret-{policy}", enable_auto_commit=False) as c:
            c.assign([tp])
            c.commit({tp: 2})

    with cluster.client() as client:

        def ends() -> pb.ListOffsetsResponse:
            return client.list_offsets(topic, 0, position=pb.LATEST)

        wait_until(lambda: ends().log_start_offset > 2, "retention deleting offset 2")
        time.sleep(1.5)  # every closed segment is past retention now; the active one stays
        start, end = ends().log_start_offset, ends().high_watermark
    assert 2 < start < end == 40

    def member(policy: str) -> Consumer:
        c = Consumer(
            cluster.addresses,
            group_id=f"g-ret-{policy}",
            auto_offset_reset=policy,  # type: ignore[arg-type]
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
        )
        c.subscribe([topic])
        assert c.committed([tp]) == {tp: 2}
        return c

    with member("earliest") as c:
        got = poll_until(c, lambda got: len(got) >= 1)
        assert got[0].offset == start

    with member("latest") as c:
        wait_until(lambda: c.poll(0.1) == [] and c.assignment() and c.position(tp) == end, "end")
        with Producer(cluster.addresses) as producer:
            producer.send(topic, b"after", partition=0).result(timeout=30)
        got = poll_until(c, lambda got: len(got) >= 1)
        assert [(r.offset, r.value) for r in got] == [(end, b"after")]

    with member("error") as c:
        deadline = time.monotonic() + 30
        with pytest.raises(NoOffsetError) as raised:
            while time.monotonic() < deadline:
                c.poll(0.2)
        message = str(raised.value)
        assert "ret/0" in message and "seek" in message, message
        c.seek_to_beginning(tp)
        got = poll_until(c, lambda got: len(got) >= 1)
        assert got[0].offset == start
