"""Share-group operations on one partition replica (raftmq/partition/share_partition.py),
on a real one-node Raft group and its real log: acquisition committed before it is
answered, acknowledgement all-or-nothing, redelivery with its count, concurrent fetches
never taking one record twice, long polls woken by new records and by lock expiry,
aborted records never delivered, and the state rebuilt across a restart (checkpoint plus
replay, and replay alone when the checkpoint is gone) and carried by a snapshot."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.format.share_ops import AckType
from raftmq.log.config import LogConfig
from raftmq.log.inspect import verify_folder
from raftmq.partition import share_tracking
from raftmq.partition.producer_tracking import ProducerTracking
from raftmq.partition.replica import Acks, PartitionReplica
from raftmq.partition.share_partition import ShareGroupView
from raftmq.partition.share_tracking import ShareTracking
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.transport import MemoryNetwork
from raftmq.share_settings import ShareSettings
from tests.partition.test_producer_tracking import open_leader
from tests.partition.test_txn_replica import txn_batch

pytestmark = pytest.mark.timeout(60)
EARLIEST = ShareSettings(auto_offset_reset="earliest", record_lock_duration_ms=1000)
G = ShareGroupView("g", 5, EARLIEST)
LONG = ShareGroupView("g", 5, dataclasses.replace(EARLIEST, record_lock_duration_ms=3000))


def plain(*values: bytes) -> bytes:
    return build_batch([Record(None, v, 1_700_000_000_000) for v in values])


def run(tmp_path: Path, body: Callable[[PartitionReplica], Awaitable[None]]) -> None:
    async def main() -> None:
        host, replica = await open_leader(tmp_path)
        try:
            await body(replica)
        finally:
            await host.stop()

    asyncio.run(main())


def offsets(acquired: list[tuple[int, int, int]]) -> list[int]:
    return [o for first, last, _ in acquired for o in range(first, last + 1)]


def values_in(data: bytes) -> list[bytes | None]:
    return [
        r.value
        for h in entry.iter_headers(data)
        if h.type == entry.EntryType.DATA
        for r in decode_records(data, h)
    ]


def test_acquire_acknowledge_and_redeliver(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(plain(b"a", b"b", b"c"), Acks.ALL, 5)
        await replica.produce(plain(b"d"), Acks.ALL, 5)
        got = await replica.share.fetch(G, "m1", max_records=3)
        assert got.acquired == [(0, 2, 1)] and values_in(got.entries) == [b"a", b"b", b"c"]
        assert got.lock_deadline_ms > time.time() * 1000
        other = await replica.share.fetch(G, "m2")
        assert other.acquired == [(3, 3, 1)]
        # All-or-nothing: 2-3 holds m2's record, so neither changes.
        res = await replica.share.acknowledge(G, "m1", [(2, 3, 1), (0, 0, 1), (1, 1, 2), (9, 9, 7)])
        assert [r.error for r in res] == [
            "INVALID_RECORD_STATE",
            "",
            "",
            "INVALID_ACKNOWLEDGE_TYPE",
        ]
        again = await replica.share.fetch(G, "m2")
        assert again.acquired == [(1, 1, 2)]  # released: redelivered, its count grown
        d = replica.share.describe(G)
        assert (d.exists, d.start_offset, d.end_offset, d.in_flight, d.acquired) == (
            True,
            1,
            4,
            3,
            3,
        )
        # Consumers of the log skip the share-state entries it now holds.
        assert values_in(bytes(replica.read(0, 1 << 20).data)) == [b"a", b"b", b"c", b"d"]
        assert not replica.share.describe(ShareGroupView("g", 6)).exists

    run(tmp_path, body)


def test_log_verify_and_readers_take_share_state_entries(tmp_path: Path) -> None:
    """The log holds SHARE_STATE entries among the records: `raftmq log verify` finds
    nothing wrong with it, and consumers and the Spark reader read every record back once,
    in order, with no gap where the share entries are."""

    pytest.importorskip("pyarrow")
    from raftmq.spark.fetching import arrow_schema, decode_batch
    from raftmq.spark.planning import OffsetRange

    async def body(replica: PartitionReplica) -> None:
        await replica.produce(plain(b"a", b"b"), Acks.ALL, 5)
        await replica.share.fetch(G, "m")
        await replica.share.acknowledge(G, "m", [(0, 1, AckType.ACCEPT)])
        await replica.produce(plain(b"c"), Acks.ALL, 5)
        data = bytes(replica.read(0, 1 << 20).data)
        types = [h.type for h in entry.iter_headers(data)]
        assert types.count(entry.EntryType.SHARE_STATE) >= 3  # INIT, ACQUIRE, ACK
        assert values_in(data) == [b"a", b"b", b"c"]
        batch, nxt = decode_batch(data, OffsetRange("t", 0, 0, 3), 0, arrow_schema(False))
        assert batch is not None and batch.num_rows == 3 and nxt == 3

    run(tmp_path, body)
    report = verify_folder(tmp_path)
    assert report.ok, report
    assert sum(s.records for s in report.segments) == 3


def test_concurrent_fetches_never_take_the_same_record(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        for i in range(20):
            await replica.produce(plain(*(b"%d" % (i * 5 + j) for j in range(5))), Acks.ALL, 5)
        results = await asyncio.gather(
            *(replica.share.fetch(G, f"m{i}", max_records=7) for i in range(12))
        )
        taken = [o for r in results for o in offsets(r.acquired)]
        assert sorted(taken) == list(range(len(taken))) and len(taken) == 84

    run(tmp_path, body)


def test_long_polls_wake_on_records_and_on_lock_expiry(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.share.fetch(G, "m1")  # starts the group at the log start
        waiting = asyncio.create_task(replica.share.fetch(G, "m1", max_wait_s=10))
        await asyncio.sleep(0.1)
        await replica.produce(plain(b"x"), Acks.ALL, 5)
        got = await asyncio.wait_for(waiting, 5)
        assert got.acquired == [(0, 0, 1)]
        t0 = time.monotonic()
        late = await replica.share.fetch(G, "m2", max_wait_s=10)
        assert late.acquired == [(0, 0, 2)] and time.monotonic() - t0 < 3
        assert (await replica.share.acknowledge(G, "m1", [(0, 0, AckType.ACCEPT)]))[0].error

    run(tmp_path, body)


def test_a_member_removed_while_its_fetch_waits_acquires_nothing(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.share.fetch(G, "m1")  # starts the group at the log start
        member = {"m1": True}
        waiting = asyncio.create_task(
            replica.share.fetch(G, "m1", max_wait_s=10, still_member=lambda: member["m1"])
        )
        await asyncio.sleep(0.1)  # parked: nothing to acquire yet
        member["m1"] = False  # the metadata no longer has it
        await replica.produce(plain(b"x"), Acks.ALL, 5)
        got = await asyncio.wait_for(waiting, 5)
        assert got.acquired == [] and got.entries == b""
        assert (await replica.share.fetch(G, "m2")).acquired == [(0, 0, 1)]

    run(tmp_path, body)


def test_aborted_and_open_transactions_are_not_delivered(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(7, 0, 0, b"aborted"), Acks.ALL, 5)
        await replica.produce(plain(b"kept"), Acks.ALL, 5)
        await replica.produce(txn_batch(8, 0, 0, b"open"), Acks.ALL, 5)
        await replica.produce(plain(b"after"), Acks.ALL, 5)
        await replica.write_marker(7, 1, False, 5)
        got = await replica.share.fetch(G, "m")
        assert got.acquired == [(1, 1, 1)]
        await replica.write_marker(8, 1, True, 5)
        got = await replica.share.fetch(G, "m")
        assert got.acquired == [(2, 3, 1)] and values_in(got.entries) == [b"open", b"after"]

    run(tmp_path, body)


def test_reset_and_drop(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(plain(b"a", b"b", b"c"), Acks.ALL, 5)
        await replica.share.fetch(G, "m", max_records=2)
        assert await replica.share.reset(G, 1) == 1
        got = await replica.share.fetch(G, "m")
        assert got.acquired == [(1, 2, 1)]
        assert await replica.share.release_member(G, "m")
        assert replica.share.describe(G).available == 2
        assert await replica.share.drop_group("g", 9)
        assert not replica.share.describe(G).exists

    run(tmp_path, body)


def test_the_producer_pass_hands_over_share_entries_its_checkpoint_passed(
    tmp_path: Path,
) -> None:
    """A replica restarted with the producer checkpoint ahead of the share checkpoint (and
    of the commit hint): the pass that feeds both starts where the share state stops, so
    the acknowledgements between the two reach the share state (chaos seed 7511: they
    did not, and that replica, leading, delivered accepted records again)."""

    async def body(replica: PartitionReplica) -> None:
        await replica.produce(plain(b"a", b"b"), Acks.ALL, 5)
        await replica.share.fetch(G, "m1")
        await replica.share.acknowledge(G, "m1", [(0, 1, AckType.ACCEPT)])
        commit = replica.group.commit_index
        handed: list[int] = []
        behind = ProducerTracking(tmp_path / "other", "other")
        behind.applied_index = commit  # its checkpoint covers every entry
        behind.on_share = lambda index, _: handed.append(index)
        behind.share_applied = lambda: 0  # the share checkpoint covers none
        behind.catch_up(replica._log, commit)
        shares = [
            h.index
            for h in entry.iter_headers(replica._log.read_by_index(1, 1 << 20).data)
            if h.type == entry.EntryType.SHARE_STATE
        ]
        assert len(shares) >= 3 and handed == shares  # INIT, ACQUIRE, ACK
        assert behind.applied_index == commit

    (tmp_path / "other").mkdir()
    run(tmp_path, body)


@pytest.mark.parametrize("checkpoint", ["kept", "lost", "damaged"])
def test_a_restart_rebuilds_the_state(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    checkpoint: str,
) -> None:
    monkeypatch.setattr(share_tracking, "CHECKPOINT_EVERY_OPS", 3)
    saved: dict[str, object] = {}

    async def main() -> None:
        host, replica = await open_leader(tmp_path)
        try:
            await replica.produce(plain(*(b"%d" % i for i in range(10))), Acks.ALL, 5)
            await replica.share.fetch(G, "m1", max_records=4)
            await replica.share.acknowledge(G, "m1", [(0, 1, AckType.ACCEPT)])
            await replica.share.fetch(G, "m2", max_records=2)
            await replica.share.acknowledge(G, "m2", [(4, 4, AckType.RELEASE)])
            await asyncio.sleep(0.2)  # the checkpoint's write is off the loop
            await replica.share.fetch(G, "m3", max_records=1)  # after it: replayed
            saved.update(replica.shares.states.to_json())
        finally:
            await host.stop()
        path = tmp_path / share_tracking.CHECKPOINT_FILE
        if checkpoint == "lost":
            path.unlink()
        elif checkpoint == "damaged":
            path.write_bytes(b"rot" + path.read_bytes()[3:])
        with caplog.at_level(logging.WARNING):
            host, replica = await open_leader(tmp_path)
        warned = [r for r in caplog.records if "share-partition state checkpoint" in r.message]
        assert len(warned) == (checkpoint == "damaged")
        try:
            assert replica.shares.states.to_json() == saved
            got = await replica.share.fetch(G, "m1", max_records=1)
            assert got.acquired == [(6, 6, 1)]
            # The snapshot attachment carries both states; a fresh replica takes the share one.
            attached = json.loads(replica._snapshot_attachment())
            assert "producers" in attached and "share" in attached
            fresh = ShareTracking(tmp_path / "fresh", "t/0")
            (tmp_path / "fresh").mkdir()
            fresh.install(attached["share"]["index"], attached)
            assert fresh.states.to_json() == replica.shares.states.to_json()
            assert replica.retention_floor() <= replica.shares.replay_floor()
        finally:
            await host.stop()

    asyncio.run(main())


def test_a_leader_lost_while_records_are_acquired_keeps_accepts_and_counts(
    tmp_path: Path,
) -> None:
    """Three replicas; the leader stops dead (cut off, its host stopped, nothing handed
    over) while a member holds records: the new leader has every confirmed ACCEPT, the
    held records stay held until their lock ends, then go to another member with their
    delivery count carried on."""

    async def main() -> None:
        net = MemoryNetwork()
        hosts: dict[int, RaftHost] = {}
        replicas: dict[int, PartitionReplica] = {}
        for node in (1, 2, 3):
            hosts[node] = RaftHost(
                node, net.transport(node), seed=node, tick_s=0.01, election_tick=10
            )
            replicas[node] = PartitionReplica(
                hosts[node], "t", 0, tmp_path / f"n{node}", [1, 2, 3], LogConfig()
            )
            await hosts[node].start()
        try:
            old = await _ready_leader(replicas)
            await old.produce(plain(*(b"%d" % i for i in range(10))), Acks.ALL, 5)
            got = await old.share.fetch(LONG, "m1", max_records=6)
            assert got.acquired == [(0, 5, 1)]
            res = await old.share.acknowledge(LONG, "m1", [(0, 1, AckType.ACCEPT)])
            assert res[0].error == ""
            dead = next(n for n, r in replicas.items() if r is old)
            for n in hosts:
                if n != dead:
                    net.cut(dead, n)
            await hosts.pop(dead).stop()
            del replicas[dead]
            new = await _ready_leader(replicas)
            d = new.share.describe(LONG)
            assert (d.start_offset, d.end_offset, d.acquired) == (2, 6, 4)
            # Held until the lock ends, then another member's, counted twice.
            early = await new.share.fetch(LONG, "m2", max_records=4)
            assert early.acquired == [(6, 9, 1)]
            later = await new.share.fetch(LONG, "m2", max_records=10, max_wait_s=10)
            assert later.acquired == [(2, 5, 2)]
            assert time.time() * 1000 >= got.lock_deadline_ms
        finally:
            for host in hosts.values():
                await host.stop()

    asyncio.run(main())


async def _ready_leader(replicas: dict[int, PartitionReplica]) -> PartitionReplica:
    for _ in range(1000):
        for r in replicas.values():
            if r.is_leader and r.producers.ready(r.led_term):
                return r
        await asyncio.sleep(0.01)
    raise AssertionError("no leader")
