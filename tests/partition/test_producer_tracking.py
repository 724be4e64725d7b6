"""The partition leader's check of idempotent batches, on a real one-node Raft group and
its real log: a resend of a batch still in flight or already committed is answered with
the first offsets and not stored again; a gap, an older epoch and an unknown producer are
refused with a sentence; the state survives a restart (checkpoint plus replay)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.log.config import LogConfig
from raftmq.partition import producer_tracking
from raftmq.partition.errors import (
    InvalidBatchError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UnknownProducerIdError,
)
from raftmq.partition.producer_tracking import ProducerTracking
from raftmq.partition.replica import Acks, PartitionReplica
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.transport import MemoryNetwork

pytestmark = pytest.mark.timeout(60)


def batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    records = [Record(None, v, 1_700_000_000_000) for v in values]
    return build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


async def open_leader(
    directory: Path, config: LogConfig | None = None
) -> tuple[RaftHost, PartitionReplica]:
    host = RaftHost(1, MemoryNetwork().transport(1), tick_s=0.01, election_tick=3)
    replica = PartitionReplica(host, "t", 0, directory, [1], config or LogConfig())
    await host.start()
    for _ in range(500):
        if replica.is_leader and replica.producers.ready(replica.led_term):
            break
        await asyncio.sleep(0.01)
    assert replica.is_leader
    return host, replica


def values(replica: PartitionReplica) -> list[bytes | None]:
    data = replica.read(0, 1 << 20).data
    out: list[bytes | None] = []
    for h in entry.iter_headers(data):
        if h.type == entry.EntryType.DATA:
            out += [r.value for r in decode_records(data, h)]
    return out


def test_resends_in_flight_and_committed_get_the_first_offsets(tmp_path: Path) -> None:
    async def main() -> None:
        host, replica = await open_leader(tmp_path)
        try:
            first = batch(7, 0, 0, b"a", b"b")
            # The same batch twice at once: the second finds the first pending.
            one, two = await asyncio.gather(
                replica.produce(first, Acks.ALL, 5), replica.produce(first, Acks.ALL, 5)
            )
            assert one == two and (one.base_offset, one.last_offset) == (0, 1)
            again = await replica.produce(first, Acks.ALL, 5)  # committed by now
            assert again == one
            nxt = await replica.produce(batch(7, 0, 2, b"c"), Acks.ALL, 5)
            assert (nxt.base_offset, nxt.last_offset) == (2, 2)
            assert values(replica) == [b"a", b"b", b"c"]
            # Five batches in flight at once, in order, then all of them again.
            bodies = [batch(7, 0, 3 + i, f"x{i}".encode()) for i in range(5)]
            firsts = await asyncio.gather(*(replica.produce(b, Acks.ALL, 5) for b in bodies))
            seconds = await asyncio.gather(*(replica.produce(b, Acks.ALL, 5) for b in bodies))
            assert firsts == seconds
            assert [r.base_offset for r in firsts] == [3, 4, 5, 6, 7]
            assert len(values(replica)) == 8
        finally:
            await host.stop()

    asyncio.run(main())


def test_gaps_old_epochs_and_unknown_producers_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        host, replica = await open_leader(tmp_path)
        try:
            await replica.produce(batch(3, 1, 0, b"a"), Acks.ALL, 5)
            with pytest.raises(OutOfOrderSequenceError, match="next this partition expects is 1"):
                await replica.produce(batch(3, 1, 5, b"gap"), Acks.ALL, 5)
            with pytest.raises(ProducerFencedError, match="epoch 0 is fenced"):
                await replica.produce(batch(3, 0, 1, b"old"), Acks.ALL, 5)
            with pytest.raises(UnknownProducerIdError, match="start a new epoch"):
                await replica.produce(batch(99, 0, 4, b"who"), Acks.ALL, 5)
            with pytest.raises(InvalidBatchError, match="exactly one entry"):
                await replica.produce(batch(3, 1, 1, b"x") + batch(3, 1, 2, b"y"), Acks.ALL, 5)
            assert values(replica) == [b"a"]  # nothing refused was stored
        finally:
            await host.stop()

    asyncio.run(main())


def test_the_state_survives_a_restart_from_checkpoint_and_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_tracking, "CHECKPOINT_EVERY_ENTRIES", 4)

    async def main() -> None:
        host, replica = await open_leader(tmp_path)
        try:
            for i in range(10):  # checkpoints after some, replay of the rest
                await replica.produce(batch(5, 0, i, f"v{i}".encode()), Acks.ALL, 5)
            await asyncio.sleep(0.2)  # the checkpoint's write is off the loop
        finally:
            await host.stop()
        saved = ProducerTracking(tmp_path, "t/0")
        assert 0 < saved.applied_index < 12  # a checkpoint, not the end: replay has work
        host, replica = await open_leader(tmp_path)
        try:
            again = await replica.produce(batch(5, 0, 9, b"v9"), Acks.ALL, 5)
            assert again.base_offset == 9
            with pytest.raises(OutOfOrderSequenceError):
                await replica.produce(batch(5, 0, 11, b"gap"), Acks.ALL, 5)
            assert len(values(replica)) == 10
        finally:
            await host.stop()

    asyncio.run(main())


def test_a_new_leader_checks_nothing_before_it_applied_its_own_term(tmp_path: Path) -> None:
    tracking = ProducerTracking(tmp_path, "t/0")
    tracking.applied_term = 3
    assert not tracking.ready(4)  # elected in term 4, its NOOP not applied yet
    assert tracking.ready(3)
    assert not tracking.ready(0)  # not leading
