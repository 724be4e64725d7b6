"""Transactions on one partition replica, on a real one-node Raft group and its real log
(docs/transactions.md): transactional batches hold the last stable offset, markers end
them (a resend appends nothing, a late batch is fenced), read_committed reads stop at the
LSO and list the aborted transactions, a long poll wakes when a marker moves the LSO, and
a restart rebuilds the same open transactions and aborted list."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.records import Record, build_batch
from raftmq.log.config import LogConfig
from raftmq.partition import producer_tracking
from raftmq.partition import replica as replica_module
from raftmq.partition.aborted_transactions import AbortedTransaction
from raftmq.partition.errors import (
    ConcurrentTransactionsError,
    InvalidBatchError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from raftmq.partition.replica import Acks, PartitionReplica
from tests.partition.test_producer_tracking import open_leader

pytestmark = pytest.mark.timeout(60)
P = 42


def reencoded(batch: bytes, **fields: int) -> bytes:
    """``batch`` (one entry) with some header fields changed, its CRC recomputed."""
    h = entry.parse_header(batch)
    header = {
        "record_count": h.record_count,
        "first_timestamp": h.first_timestamp,
        "max_timestamp": h.max_timestamp,
        "attributes": h.attributes,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
    }
    return entry.encode(bytes(entry.payload_of(batch, h)), **{**header, **fields})  # type: ignore[arg-type]


def txn_batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    """A transactional producer's batch: build_batch's entry with attribute bit 4 set."""
    records = [Record(None, v, 1_700_000_000_000) for v in values]
    batch = build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    return reencoded(batch, attributes=entry.TRANSACTIONAL)


def unowned_txn_batch() -> bytes:
    """A batch with the transactional bit and no producer: refused."""
    return reencoded(plain(b"x"), attributes=entry.TRANSACTIONAL)


def plain(*values: bytes) -> bytes:
    return build_batch([Record(None, v, 1_700_000_000_000) for v in values])


def data_offsets(replica: PartitionReplica, *, read_committed: bool) -> list[int]:
    data = replica.read(0, 1 << 20, read_committed=read_committed).data
    return [h.base_offset for h in entry.iter_headers(data) if h.type == entry.EntryType.DATA]


SMALL_SEGMENTS = LogConfig(segment_bytes=1024, retention_bytes=0)
"""Segments of about one 600-byte batch, and retention that would delete every one."""


def run(
    tmp_path: Path,
    body: Callable[[PartitionReplica], Awaitable[None]],
    config: LogConfig | None = None,
) -> None:
    async def main() -> None:
        host, replica = await open_leader(tmp_path, config)
        try:
            await body(replica)
        finally:
            await host.stop()

    asyncio.run(main())


def test_a_commit_makes_the_transaction_readable_committed(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(plain(b"before"), Acks.ALL, 5)
        await replica.produce(txn_batch(P, 0, 0, b"a", b"b"), Acks.ALL, 5)
        await replica.produce(plain(b"other"), Acks.ALL, 5)
        assert replica.high_watermark == 4 and replica.last_stable_offset == 1
        assert data_offsets(replica, read_committed=True) == [0]
        assert data_offsets(replica, read_committed=False) == [0, 1, 3]
        await replica.write_marker(P, 1, True, 5)
        assert replica.last_stable_offset == replica.high_watermark == 4
        assert data_offsets(replica, read_committed=True) == [0, 1, 3]
        assert replica.aborted_transactions(0, 4) == []

    run(tmp_path, body)


def test_an_abort_is_listed_and_a_resend_appends_nothing(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(P, 0, 0, b"a"), Acks.ALL, 5)
        await replica.produce(txn_batch(P, 0, 1, b"b"), Acks.ALL, 5)
        await replica.write_marker(P, 1, False, 5)
        assert replica.aborted_transactions(0, 2) == [AbortedTransaction(P, 0, 2)]
        assert replica.aborted_transactions(2, 3) == []
        last_index = replica.group.last_index
        await replica.write_marker(P, 1, False, 5)  # the coordinator's resend
        assert replica.group.last_index == last_index
        with pytest.raises(ProducerFencedError, match="epoch 0 is fenced"):
            await replica.produce(txn_batch(P, 0, 2, b"late"), Acks.ALL, 5)
        with pytest.raises(OutOfOrderSequenceError, match="expects is 0"):
            await replica.produce(txn_batch(P, 1, 2, b"x"), Acks.ALL, 5)
        await replica.produce(txn_batch(P, 1, 0, b"next"), Acks.ALL, 5)
        assert replica.last_stable_offset == 2  # the next transaction is open

    run(tmp_path, body)


def test_idempotent_inside_a_transaction_and_unowned_bits_are_refused(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(P, 0, 0, b"a"), Acks.ALL, 5)
        idempotent = build_batch(
            [Record(None, b"i", 1_700_000_000_000)],
            producer_id=P,
            producer_epoch=0,
            base_sequence=1,
        )
        with pytest.raises(InvalidTxnStateError, match="transaction open"):
            await replica.produce(idempotent, Acks.ALL, 5)
        with pytest.raises(InvalidBatchError, match="names no producer"):
            await replica.produce(unowned_txn_batch(), Acks.ALL, 5)
        with pytest.raises(InvalidBatchError, match="holds exactly one entry"):
            await replica.produce(plain(b"p") + txn_batch(P, 0, 1, b"x"), Acks.ALL, 5)
        # Nor an idempotent batch behind a plain entry, which would go unchecked.
        with pytest.raises(InvalidBatchError, match="holds exactly one entry"):
            await replica.produce(plain(b"p") + idempotent, Acks.ALL, 5)
        assert data_offsets(replica, read_committed=False) == [0]

    run(tmp_path, body)


def test_markers_and_batches_in_flight_together_never_decide_on_stale_state(
    tmp_path: Path,
) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(P, 0, 0, b"a"), Acks.ALL, 5)
        last_index = replica.group.last_index
        # The marker and its resend are proposed in the same loop turn as a late batch
        # of the ended epoch: one marker entry, and the batch fenced.
        results = await asyncio.gather(
            replica.write_marker(P, 1, False, 5),
            replica.write_marker(P, 1, False, 5),
            replica.produce(txn_batch(P, 0, 1, b"late"), Acks.ALL, 5),
            return_exceptions=True,
        )
        assert results[:2] == [None, None]
        assert isinstance(results[2], ProducerFencedError)
        assert replica.group.last_index == last_index + 1
        assert replica.aborted_transactions(0, 1) == [AbortedTransaction(P, 0, 1)]

    run(tmp_path, body)


def test_the_next_transactions_batch_waits_for_the_last_ones_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The coordinator lets the next transaction begin while the last one's markers are
    written, so its first batch may come first: the leader holds it until the marker is
    proposed, then appends it behind the marker (which therefore cannot end it); with no
    marker within MARKER_HOLD_S it is refused CONCURRENT_TRANSACTIONS (retriable)."""
    monkeypatch.setattr(replica_module, "MARKER_HOLD_S", 0.3)

    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(P, 0, 0, b"a"), Acks.ALL, 5)
        early = asyncio.create_task(replica.produce(txn_batch(P, 1, 0, b"next"), Acks.ALL, 5))
        await asyncio.sleep(0.1)
        assert not early.done()  # held, not refused
        await replica.write_marker(P, 1, True, 5)
        result = await asyncio.wait_for(early, 2.0)
        assert result.base_offset == 1
        # The marker ended epoch 0's transaction only: epoch 1's is open behind it.
        assert replica.producers.states.transactions_to_json() == [[P, 1, 1]]
        assert replica.last_stable_offset == 1
        with pytest.raises(ConcurrentTransactionsError, match="retry"):
            await replica.produce(txn_batch(P, 2, 0, b"too early"), Acks.ALL, 5)
        assert data_offsets(replica, read_committed=False) == [0, 1]

    run(tmp_path, body)


def test_a_read_committed_long_poll_wakes_when_a_marker_moves_the_lso(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(P, 0, 0, b"a"), Acks.ALL, 5)
        poll = asyncio.create_task(replica.fetch(0, 1 << 20, 1, 10.0, read_committed=True))
        await asyncio.sleep(0.1)
        assert not poll.done()  # the record is committed but not stable
        await replica.write_marker(P, 1, True, 5)
        result = await asyncio.wait_for(poll, 2.0)
        assert result.entries == 1

    run(tmp_path, body)


def test_a_restart_rebuilds_the_open_and_aborted_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_tracking, "CHECKPOINT_EVERY_ENTRIES", 3)

    async def before(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(7, 0, 0, b"a"), Acks.ALL, 5)
        await replica.write_marker(7, 1, False, 5)
        await replica.produce(txn_batch(8, 0, 0, b"b"), Acks.ALL, 5)
        await replica.produce(txn_batch(9, 0, 0, b"c"), Acks.ALL, 5)
        await replica.write_marker(9, 1, False, 5)  # after the last checkpoint: replayed
        await asyncio.sleep(0.2)  # the checkpoint's write is off the loop

    async def after(replica: PartitionReplica) -> None:
        assert replica.last_stable_offset == 1
        assert replica.producers.states.transactions_to_json() == [[8, 1, 0]]
        assert replica.aborted_transactions(0, 3) == [
            AbortedTransaction(7, 0, 1),
            AbortedTransaction(9, 2, 3),
        ]
        with pytest.raises(ProducerFencedError):
            await replica.produce(txn_batch(9, 0, 1, b"late"), Acks.ALL, 5)

    run(tmp_path, before)
    run(tmp_path, after)


def test_retention_trims_the_aborted_transactions_it_deleted(tmp_path: Path) -> None:
    async def body(replica: PartitionReplica) -> None:
        await replica.produce(txn_batch(7, 0, 0, b"a"), Acks.ALL, 5)
        await replica.write_marker(7, 1, False, 5)
        await replica.produce(txn_batch(8, 0, 0, b"b"), Acks.ALL, 5)
        await replica.write_marker(8, 1, False, 5)
        cut = replica.group.last_index
        await replica.produce(plain(b"kept"), Acks.ALL, 5)
        # Cut the log after the first marker: producer 8's batch is still held.
        replica._host.compact(replica.group.name, through=cut - 2)
        await replica.produce(plain(b"next"), Acks.ALL, 5)  # the next apply trims
        assert replica.log_start_offset == 1
        assert replica.producers.states.aborted.to_json() == [[8, 1, 2]]
        replica._host.compact(replica.group.name, through=cut)
        await replica.produce(plain(b"last"), Acks.ALL, 5)
        assert replica.producers.states.aborted.to_json() == []

    run(tmp_path, body)


async def checkpointed(replica: PartitionReplica) -> None:
    """Write the producer state checkpoint and wait until it is durable."""
    tracking = replica.producers
    tracking.checkpoint()
    for _ in range(500):
        if tracking.durable_index >= tracking.applied_index:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"checkpoint stuck at {tracking.durable_index}")


def test_retention_keeps_an_open_transactions_first_batch(tmp_path: Path) -> None:
    """Retention would delete every sealed segment; it stops at the one holding the open
    transaction's first batch, and goes on once a marker ends the transaction."""

    async def body(replica: PartitionReplica) -> None:
        host = replica._host
        for _ in range(5):
            await replica.produce(plain(b"x" * 600), Acks.ALL, 5)
        opened = await replica.produce(txn_batch(P, 0, 0, b"t" * 600), Acks.ALL, 5)
        for _ in range(5):
            await replica.produce(plain(b"y" * 600), Acks.ALL, 5)
        await checkpointed(replica)
        host.compact(replica.group.name, keep_from=replica.retention_floor())
        assert 0 < replica.log_start_offset <= opened.base_offset
        await replica.write_marker(P, 1, True, 5)
        await checkpointed(replica)
        assert replica.retention_floor() == replica.producers.durable_index + 1
        host.compact(replica.group.name, keep_from=replica.retention_floor())
        assert replica.log_start_offset > opened.base_offset

    run(tmp_path, body, SMALL_SEGMENTS)


def test_retention_keeps_what_rebuilds_the_producer_state_after_a_restart(
    tmp_path: Path,
) -> None:
    """Retention deleted segments past the producer state's checkpoint; a broker that
    restarted then loaded a state with a transaction whose marker was deleted: open for
    good, its partition's last stable offset stuck at the log start (chaos seed 7451).
    Retention now keeps the entries after the durable checkpoint, and asks for a newer one
    so it can go on."""

    async def body(replica: PartitionReplica) -> None:
        host = replica._host
        await replica.produce(txn_batch(P, 0, 0, b"t" * 600), Acks.ALL, 5)
        await checkpointed(replica)  # the transaction is open in the file
        marker_index = replica.group.last_index + 1
        await replica.write_marker(P, 1, True, 5)
        for _ in range(10):
            await replica.produce(plain(b"y" * 600), Acks.ALL, 5)
        floor = replica.retention_floor()
        assert floor <= marker_index, "the marker is needed to rebuild the state"
        host.compact(replica.group.name, keep_from=floor)
        assert replica._log.start_index <= marker_index
        for _ in range(500):  # retention asked for a newer checkpoint
            if replica.producers.durable_index >= marker_index:
                break
            await asyncio.sleep(0.01)
        host.compact(replica.group.name, keep_from=replica.retention_floor())
        assert replica._log.start_index > marker_index

    run(tmp_path, body, SMALL_SEGMENTS)


def test_an_open_transaction_past_the_log_s_end_sets_no_retention_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose producer state is ahead of its log (a snapshot just installed, or a
    log cut back under a newer checkpoint) names an open transaction the log does not hold
    yet: retention has nothing of it to keep, and must neither fail nor stop (it failed on
    every pass in chaos seed 7422). The state is set ahead here: producing it takes a
    snapshot race no test can time."""

    async def body(replica: PartitionReplica) -> None:
        for _ in range(5):
            await replica.produce(plain(b"x" * 600), Acks.ALL, 5)
        await checkpointed(replica)
        ahead = replica._log.next_offset + 100
        monkeypatch.setattr(replica.producers.states, "first_open_offset", lambda: ahead)
        assert replica.retention_floor() == replica.producers.durable_index + 1
        replica._host.compact(replica.group.name, keep_from=replica.retention_floor())
        assert replica.log_start_offset > 0  # retention went on

    run(tmp_path, body, SMALL_SEGMENTS)


def test_aborted_transactions_past_the_tail_go_to_run_files_and_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Memory keeps at most SEAL_ENTRIES aborted transactions: the rest are sealed into
    index files beside the log, listed by the checkpoint, read back by fetches and at a
    restart; a damaged run file sets the checkpoint aside (the state is rebuilt from the
    log, with one WARNING), and files retention passed are deleted."""
    monkeypatch.setattr(producer_tracking, "SEAL_ENTRIES", 3)
    expected = [AbortedTransaction(pid, 2 * (pid - 1), 2 * (pid - 1) + 1) for pid in range(1, 9)]

    async def before(replica: PartitionReplica) -> None:
        for pid in range(1, 9):
            await replica.produce(txn_batch(pid, 0, 0, b"a"), Acks.ALL, 5)
            await replica.write_marker(pid, 1, False, 5)
            await replica.produce(plain(b"between"), Acks.ALL, 5)
        aborted = replica.producers.states.aborted
        assert aborted.tail_size < 3 and len(aborted.runs) >= 2
        assert replica.aborted_transactions(0, 100) == expected
        for _ in range(100):  # the checkpoints' writes are off the loop
            if all((tmp_path / run.name).exists() for run in aborted.runs):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)

    async def after(replica: PartitionReplica) -> None:
        assert replica.producers.states.aborted.runs
        assert replica.aborted_transactions(0, 100) == expected
        assert replica.aborted_transactions(5, 7) == [expected[3]]

    run(tmp_path, before)
    files = sorted(tmp_path.glob("*.txnindex"))
    assert len(files) >= 2
    run(tmp_path, after)
    files[0].write_bytes(b"rot" + files[0].read_bytes()[3:])
    with caplog.at_level(logging.WARNING):
        run(tmp_path, after)
    assert any("producer state checkpoint" in r.getMessage() for r in caplog.records)


def test_run_files_retention_passed_are_deleted_after_the_next_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_tracking, "SEAL_ENTRIES", 2)
    tracking = producer_tracking.ProducerTracking(tmp_path, "t/0")
    aborted = tracking.states.aborted
    for pid in range(6):
        aborted.add(pid, 10 * pid, 10 * pid + 5)
        if aborted.tail_size >= 2:
            tracking.applied_index = pid
            tracking.checkpoint()  # no loop here: written at once
    names = [run.name for run in aborted.runs]
    assert len(names) == 3 and all((tmp_path / n).exists() for n in names)
    aborted.trim(30)  # the first two runs end at 15 and 35: only the first is passed
    assert [run.name for run in aborted.runs] == names[1:]
    assert (tmp_path / names[0]).exists()  # the last checkpoint still lists it
    tracking.checkpoint()
    assert not (tmp_path / names[0]).exists()
    reloaded = producer_tracking.ProducerTracking(tmp_path, "t/0")
    assert reloaded.states.aborted.all_to_json() == aborted.all_to_json()
