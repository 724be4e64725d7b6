"""Property-based tests of :class:`raftmq.log.log.Log` against an in-memory model.

The model knows every entry that should be physically present (including entries below the
log start that still sit in the first segment), where each segment starts, which entries were
durable, and the fake clock. After every step the log must agree with it exactly: contents
of reads, start/next index and offset, terms, segment layout, durable index.

Why a state machine: the log's bugs live in sequences (roll, then truncate, then crash, then
reopen), not in single calls, and hypothesis shrinks a failing sequence to a few steps.

Bugs this machine found are pinned as regressions in ``test_log.py``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from raftmq.format.entry import HEADER_SIZE, EntryType, encode
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import EntryTooLargeError, NotContiguousError, OutOfRangeError
from raftmq.log.log import Log, ReadResult
from raftmq.log.segment import LOG_SUFFIX, segment_name

MAX_MESSAGE_BYTES = 192 * 1024
BIG = 1 << 30


def _scratch_dir() -> str | None:
    """A tmpfs (``/dev/shm``) when there is one: the machine checks logic, crashes are
    simulated, and ~10 fsyncs per segment roll on a shared disk would dominate the run time.
    ``RAFTMQ_LOG_TEST_DIR`` overrides it (e.g. to run on the real disk)."""
    override = os.environ.get("RAFTMQ_LOG_TEST_DIR")
    if override:
        return override
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


_SCRATCH = _scratch_dir()


class FakeClock:
    """Injected as ``clock_ms`` so rolls and retention by time are driven by the test."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass(frozen=True, slots=True)
class Ent:
    """One entry as the model knows it: its bytes and the header fields the checks need."""

    raw: bytes
    index: int
    term: int
    base_offset: int
    record_count: int
    type: EntryType
    max_ts: int

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


def make_ent(
    *,
    index: int,
    term: int,
    base_offset: int,
    record_count: int,
    etype: EntryType,
    payload_size: int,
    ts: int,
) -> Ent:
    """A deterministic payload (derived from the index) keeps shrinking reproducible."""
    payload = (index.to_bytes(8, "big") * (payload_size // 8 + 1))[:payload_size]
    rc = record_count if etype == EntryType.DATA else 0
    raw = encode(
        payload,
        type=etype,
        index=index,
        term=term,
        base_offset=base_offset,
        record_count=rc,
        first_timestamp=ts,
        max_timestamp=ts,
    )
    return Ent(raw, index, term, base_offset, rc, etype, ts)


PAYLOAD_SIZE = st.one_of(
    st.integers(0, 300),
    st.integers(0, 300),
    st.integers(300, 3000),
    # Larger than READ_SLACK_BYTES (64 KiB): a read must fetch such an entry in a chunk of its own.
    st.integers(66_000, 140_000),
)
ENTRY_SPEC = st.tuples(
    st.sampled_from([EntryType.DATA] * 4 + [EntryType.NOOP, EntryType.CONFIG]),
    st.integers(1, 5),
    PAYLOAD_SIZE,
    st.sampled_from([0, 0, 0, 0, 1, 3]),  # term bump
    st.integers(0, 200),  # timestamp jitter
)
MAX_BYTES = st.one_of(
    st.integers(1, 400),
    st.integers(400, 20_000),
    st.integers(60_000, 300_000),
    st.just(BIG),
)


def _abandon(log: Log) -> None:
    """Simulate the process dying: drop the file handles without flush or checkpoints.

    Closing writes what write-behind kept back; a real death loses it instead, which is
    the "cut" damage below at the file's written end (pending bytes are never durable)."""
    for seg in log._segments:
        seg.close_fd()
    log._closed = True


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="raftmq-logprop-", dir=_SCRATCH))
        self.clock = FakeClock(1_000_000)
        self.log: Log | None = None

    def teardown(self) -> None:
        if self.log is not None:
            try:
                self.log.close()
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- set-up --------------------------------------------------------------------------

    @initialize(
        segment_bytes=st.sampled_from([1024, 2048, 4096, 8192]),
        segment_ms=st.sampled_from([100, 5_000, 10**12]),
        retention_ms=st.sampled_from([-1, 1_000, 60_000]),
        retention_bytes=st.sampled_from([-1, 0, 3_000, 30_000]),
        index_interval=st.sampled_from([1, 100, 4096]),
        max_open=st.sampled_from([2, 3, 256]),
        policy=st.sampled_from(
            [FlushPolicy.INTERVAL, FlushPolicy.INTERVAL, FlushPolicy.EVERY_BATCH]
        ),
        flush_interval=st.sampled_from([1, 500]),
        write_behind=st.sampled_from([0, 500, 64 * 1024]),
    )
    def setup(
        self,
        segment_bytes: int,
        segment_ms: int,
        retention_ms: int,
        retention_bytes: int,
        index_interval: int,
        max_open: int,
        policy: FlushPolicy,
        flush_interval: int,
        write_behind: int,
    ) -> None:
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            segment_ms=segment_ms,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            max_message_bytes=MAX_MESSAGE_BYTES,
            index_interval_bytes=index_interval,
            flush_policy=policy,
            flush_interval_ms=flush_interval,
            max_open_segments=max_open,
            write_behind_bytes=write_behind,
        )
        self.log = Log.open(self.dir, self.config, clock_ms=self.clock)
        assert self.log.recovery.clean
        self.phys: dict[int, Ent] = {}  # physically present entries, by Raft index
        self.segs: list[tuple[int, int]] = [(1, 0)]  # (first index, base offset) per segment
        self.start_index, self.start_offset, self.prev_term = 1, 0, 0
        self.next_index, self.next_offset = 1, 0
        self.durable = 0
        self.born = self.clock.now
        self.last_flush = self.clock.now
        self.ts_floor = 0

    # --- model helpers -----------------------------------------------------------------

    def _seg_end(self, k: int) -> int:
        return self.segs[k + 1][0] if k + 1 < len(self.segs) else self.next_index

    def _seg_entries(self, k: int) -> list[Ent]:
        return [self.phys[i] for i in range(self.segs[k][0], self._seg_end(k))]

    def _seg_size(self, k: int) -> int:
        return sum(e.size for e in self._seg_entries(k))

    def _logical(self) -> list[Ent]:
        return [self.phys[i] for i in range(self.start_index, self.next_index)]

    def _term_at(self, index: int) -> int:
        if index == self.start_index - 1:
            return self.prev_term
        return self.phys[index].term

    def _last_term(self) -> int:
        return self._term_at(self.next_index - 1)

    def _born_after_scan(self) -> int:
        """What the log's rescan of the active segment sets the segment's age from."""
        first = self.phys.get(self.segs[-1][0])
        if (
            first is not None
            and self.segs[-1][0] < self.next_index
            and 0 < first.max_ts <= self.clock.now
        ):
            return first.max_ts
        return self.clock.now

    def _drop_from(self, index: int) -> None:
        """Forget entries >= index (a suffix)."""
        if index < self.next_index:
            self.next_offset = self.phys[index].base_offset
        for i in range(index, self.next_index):
            del self.phys[i]
        self.next_index = index

    def _model_reopen(self) -> bool:
        """Mirror what Log.open does to a log already in the model; True if it removed files.

        Open deletes segments wholly below the log start (``truncate_prefix(next_index)``
        followed by a roll leaves one behind until then) and restarts an empty log at the
        start when every remaining entry is below it."""
        restarted = False
        while len(self.segs) > 1 and self.segs[1][0] <= self.start_index:
            for i in range(self.segs[0][0], self.segs[1][0]):
                del self.phys[i]
            self.segs.pop(0)
            restarted = True
            event("reopen: removed a segment wholly below the start")
        born = self._born_after_scan()
        if self.next_index <= self.start_index and self.segs[-1][0] < self.start_index:
            # Every entry is below the start: the log restarts empty at the start.
            self.phys.clear()
            self.segs = [(self.start_index, self.start_offset)]
            self.next_index, self.next_offset = self.start_index, self.start_offset
            restarted = True
        self.born = born
        self.durable = self.next_index - 1
        self.last_flush = self.clock.now
        return restarted

    def _expect_read_offset(
        self, offset: int, max_bytes: int, upper_offset: int | None
    ) -> list[Ent]:
        upper = self.next_offset if upper_offset is None else min(upper_offset, self.next_offset)
        out: list[Ent] = []
        if offset >= upper:
            return out
        total = 0
        for e in self._logical():
            if e.next_offset <= offset:
                continue
            if e.next_offset > upper or (e.record_count == 0 and e.base_offset >= upper):
                break
            if out and total + e.size > max_bytes:
                break
            out.append(e)
            total += e.size
            if total >= max_bytes:
                break
        return out

    def _expect_read_index(self, lo: int, max_bytes: int, hi: int | None) -> list[Ent]:
        upper = self.next_index if hi is None else min(hi, self.next_index)
        out: list[Ent] = []
        total = 0
        for i in range(lo, upper):
            e = self.phys[i]
            if out and total + e.size > max_bytes:
                break
            out.append(e)
            total += e.size
            if total >= max_bytes:
                break
        return out

    def _check_result(self, result: ReadResult, expected: list[Ent]) -> None:
        assert result.entries == len(expected)
        assert result.data == b"".join(e.raw for e in expected)
        if expected:
            assert result.first_index == expected[0].index
            assert result.next_index == expected[-1].index + 1
            assert result.next_offset == expected[-1].next_offset

    def _segment_path(self, k: int) -> Path:
        first, base = self.segs[k]
        return self.dir / (segment_name(base, first) + LOG_SUFFIX)

    # --- appends -----------------------------------------------------------------------

    @rule(data=st.data(), specs=st.lists(ENTRY_SPEC, min_size=1, max_size=4))
    def append(self, data: st.DataObject, specs: list[tuple]) -> None:
        assert self.log is not None
        index, offset, term = self.next_index, self.next_offset, self._last_term()
        ents: list[Ent] = []
        for etype, records, size, bump, jitter in specs:
            term = max(term, 1) + bump
            ts = max(self.ts_floor, self.clock.now - 100 + jitter)
            self.ts_floor = ts
            e = make_ent(
                index=index,
                term=term,
                base_offset=offset,
                record_count=records,
                etype=etype,
                payload_size=size,
                ts=ts,
            )
            ents.append(e)
            index, offset = e.index + 1, e.next_offset
        buf = b"".join(e.raw for e in ents)
        info = self.log.append(buf)
        assert (info.first_index, info.last_index, info.entries) == (
            ents[0].index,
            ents[-1].index,
            len(ents),
        )
        assert (info.base_offset, info.next_offset) == (ents[0].base_offset, offset)
        # model: roll first (validation precedes it), then write
        now = self.clock.now
        active_size = self._seg_size(len(self.segs) - 1)
        if active_size and (
            active_size + len(buf) > self.config.segment_bytes
            or now - self.born >= self.config.segment_ms
        ):
            # A roll does not fsync: the closed segment stays unsealed until the next flush.
            self.segs.append((self.next_index, self.next_offset))
            active_size = 0
            event("append: rolled a segment")
        if active_size == 0:
            self.born = now
        for e in ents:
            self.phys[e.index] = e
        self.next_index, self.next_offset = index, offset
        if self.config.flush_policy is FlushPolicy.EVERY_BATCH:
            self.durable = self.next_index - 1

    @rule(
        kind=st.sampled_from(
            [
                "crc",
                "too_large",
                "index_gap",
                "index_back",
                "offset_gap",
                "term_down",
                "empty",
                "torn",
            ]
        ),
        with_good_prefix=st.booleans(),
    )
    def bad_append(self, kind: str, with_good_prefix: bool) -> None:
        """Bad input raises the right error and writes nothing (not even a good prefix)."""
        assert self.log is not None
        before = self.log.segments()
        index, offset = self.next_index, self.next_offset
        term = max(self._last_term(), 1)
        ts = self.ts_floor
        prefix = b""
        if with_good_prefix and kind != "empty":
            good = make_ent(
                index=index,
                term=term,
                base_offset=offset,
                record_count=2,
                etype=EntryType.DATA,
                payload_size=50,
                ts=ts,
            )
            prefix, index, offset = good.raw, index + 1, offset + 2

        def ent(**kw: int) -> bytes:
            args = dict(
                index=index,
                term=term,
                base_offset=offset,
                record_count=1,
                etype=EntryType.DATA,
                payload_size=40,
                ts=ts,
            )
            args.update(kw)
            return make_ent(**args).raw

        expected: type[Exception] = InvalidEntryError
        if kind == "crc":
            bad = bytearray(ent())
            bad[-1] ^= 0x5A
            buf, expected = prefix + bytes(bad), CorruptEntryError
        elif kind == "too_large":
            buf = prefix + ent(payload_size=MAX_MESSAGE_BYTES - HEADER_SIZE + 1)
            expected = EntryTooLargeError
        elif kind == "index_gap":
            buf, expected = prefix + ent(index=index + 1), NotContiguousError
        elif kind == "index_back":
            if index < 2:
                return
            buf, expected = prefix + ent(index=index - 1), NotContiguousError
        elif kind == "offset_gap":
            buf, expected = prefix + ent(base_offset=offset + 1), NotContiguousError
        elif kind == "term_down":
            floor = term if prefix else self._last_term()
            if floor < 1:
                return
            buf = prefix + ent(term=floor - 1)
        elif kind == "empty":
            buf = b""
        else:  # torn: a whole entry cut short
            whole = ent()
            buf = prefix + whole[: len(whole) // 2]
        with pytest.raises(expected) as info:
            self.log.append(buf)
        if expected is InvalidEntryError:
            assert type(info.value) is InvalidEntryError, info.value
        assert self.log.segments() == before

    # --- time and durability -------------------------------------------------------------

    @rule(ms=st.sampled_from([0, 10, 100, 1_000, 10_000, 100_000]))
    def tick(self, ms: int) -> None:
        self.clock.now += ms

    @rule()
    def flush(self) -> None:
        assert self.log is not None
        self.log.flush()
        if self.durable < self.next_index - 1:
            self.last_flush = self.clock.now
        self.durable = self.next_index - 1

    @rule()
    def flush_if_due(self) -> None:
        assert self.log is not None
        due = (
            self.durable < self.next_index - 1
            and self.clock.now - self.last_flush >= self.config.flush_interval_ms
        )
        assert self.log.flush_if_due() == due
        if due:
            self.durable = self.next_index - 1
            self.last_flush = self.clock.now

    # --- reads -------------------------------------------------------------------------

    @rule(data=st.data(), max_bytes=MAX_BYTES)
    def read_by_offset(self, data: st.DataObject, max_bytes: int) -> None:
        assert self.log is not None
        offset = data.draw(st.integers(self.start_offset, self.next_offset), label="offset")
        upper = data.draw(
            st.one_of(st.none(), st.integers(self.start_offset - 1, self.next_offset + 2)),
            label="upper",
        )
        expected = self._expect_read_offset(offset, max_bytes, upper)
        result = self.log.read(offset, max_bytes, upper_offset=upper)
        self._check_result(result, expected)
        if not expected:
            assert result.data == b"" and result.entries == 0

    @rule(data=st.data(), max_bytes=MAX_BYTES)
    def read_by_index(self, data: st.DataObject, max_bytes: int) -> None:
        assert self.log is not None
        lo = data.draw(st.integers(self.start_index, self.next_index), label="lo")
        hi = data.draw(
            st.one_of(st.none(), st.integers(self.start_index - 1, self.next_index + 2)),
            label="hi",
        )
        expected = self._expect_read_index(lo, max_bytes, hi)
        result = self.log.read_by_index(lo, max_bytes, hi)
        self._check_result(result, expected)
        assert self.log.read_entries(lo, BIG, hi) == b"".join(
            e.raw for e in self._expect_read_index(lo, BIG, hi)
        )

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        assert self.log is not None
        delta = data.draw(st.integers(1, 5), label="delta")
        below = data.draw(st.booleans(), label="below")
        if below and self.start_offset >= delta:
            offset = self.start_offset - delta
        else:
            offset = self.next_offset + delta
        with pytest.raises(OutOfRangeError) as info:
            self.log.read(offset, 1000)
        assert (info.value.start, info.value.end) == (self.start_offset, self.next_offset)
        lo = (
            self.start_index - delta
            if below and self.start_index > delta
            else (self.next_index + delta)
        )
        with pytest.raises(OutOfRangeError) as info:
            self.log.read_by_index(lo, 1000)
        assert (info.value.start, info.value.end) == (self.start_index, self.next_index)
        bad = self.start_index - 1 - delta if below else self.next_index - 1 + delta
        with pytest.raises(OutOfRangeError) as info:
            self.log.term_at(bad)
        assert (info.value.start, info.value.end) == (self.start_index - 1, self.next_index - 1)

    @rule(data=st.data())
    def term_at(self, data: st.DataObject) -> None:
        assert self.log is not None
        i = data.draw(st.integers(self.start_index - 1, self.next_index - 1), label="index")
        assert self.log.term_at(i) == self._term_at(i)

    @rule(data=st.data())
    def offset_for_timestamp(self, data: st.DataObject) -> None:
        """Timestamps are non-decreasing in the model, so "first DATA entry at or after the
        start whose max timestamp reaches ts" has one answer; entries left below the start in
        the first segment must not count (``test_offset_for_timestamp_ignores_entries_below_
        the_start``)."""
        assert self.log is not None
        ts = data.draw(st.integers(0, self.ts_floor + 50), label="ts")
        expected: int | None = None
        for e in self._logical():
            if e.type == EntryType.DATA and e.max_ts >= ts:
                expected = e.base_offset
                break
        assert self.log.offset_for_timestamp(ts) == expected

    # --- truncation and retention ------------------------------------------------------

    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        assert self.log is not None
        index = data.draw(st.integers(self.start_index - 2, self.next_index + 1), label="index")
        if index < self.start_index:
            with pytest.raises(OutOfRangeError):
                self.log.truncate_suffix(index)
            return
        self.log.truncate_suffix(index)
        if index >= self.next_index:
            return
        while len(self.segs) > 1 and self.segs[-1][0] >= index:
            self.segs.pop()
        self._drop_from(index)
        self.durable = min(self.durable, self.next_index - 1)
        self.born = self._born_after_scan()

    @rule(data=st.data())
    def truncate_prefix_inside(self, data: st.DataObject) -> None:
        assert self.log is not None
        index = data.draw(st.integers(self.start_index - 1, self.next_index), label="index")
        self.log.truncate_prefix(index)
        if index <= self.start_index:
            return
        offset = self.next_offset if index == self.next_index else self.phys[index].base_offset
        self.prev_term = self._term_at(index - 1)
        self.start_index, self.start_offset = index, offset
        while len(self.segs) > 1 and self.segs[1][0] <= index:
            for i in range(self.segs[0][0], self.segs[1][0]):
                del self.phys[i]
            self.segs.pop(0)

    @rule(
        gap=st.integers(1, 20),
        offset_gap=st.integers(0, 50),
        term_bump=st.integers(0, 3),
        give_args=st.booleans(),
    )
    def truncate_prefix_past_end(
        self, gap: int, offset_gap: int, term_bump: int, give_args: bool
    ) -> None:
        """A snapshot install: the log restarts empty at ``index``/``offset``."""
        assert self.log is not None
        index = self.next_index + gap
        offset = self.next_offset + offset_gap
        prev_term = self._last_term() + term_bump
        if not give_args:
            with pytest.raises(ValueError):
                self.log.truncate_prefix(index)
            return
        self.log.truncate_prefix(index, offset=offset, prev_term=prev_term)
        self.start_index, self.start_offset, self.prev_term = index, offset, prev_term
        self.phys.clear()
        self.segs = [(index, offset)]
        self.next_index, self.next_offset = index, offset
        self.durable = index - 1
        self.born = self.clock.now

    @rule(data=st.data())
    def apply_retention(self, data: st.DataObject) -> None:
        assert self.log is not None
        max_index = data.draw(
            st.one_of(st.none(), st.integers(self.start_index, self.next_index + 1)),
            label="max_index",
        )
        deleted = self.log.apply_retention(max_index=max_index)
        expect = 0
        total = sum(self._seg_size(k) for k in range(len(self.segs)))
        cfg = self.config
        while len(self.segs) > 1:
            oldest_size = self._seg_size(0)
            nxt_first, nxt_base = self.segs[1]
            if max_index is not None and nxt_first - 1 >= max_index:
                break
            by_size = cfg.retention_bytes >= 0 and total - oldest_size >= cfg.retention_bytes
            max_ts = max(e.max_ts for e in self._seg_entries(0))
            by_time = cfg.retention_ms >= 0 and max_ts < self.clock.now - cfg.retention_ms
            if not (by_size or by_time):
                break
            self.prev_term = self._term_at(nxt_first - 1)
            self.start_index, self.start_offset = nxt_first, nxt_base
            for i in range(self.segs[0][0], nxt_first):
                del self.phys[i]
            self.segs.pop(0)
            total -= oldest_size
            expect += 1
        assert deleted == expect
        event(f"retention: deleted {min(expect, 2)}+ segments")

    # --- restarts and crashes ----------------------------------------------------------

    @rule()
    def close_reopen(self) -> None:
        assert self.log is not None
        self.log.close()
        self.log = Log.open(self.dir, self.config, clock_ms=self.clock)
        restarted = self._model_reopen()
        rec = self.log.recovery
        assert rec.truncated_bytes == 0 and rec.truncated_entries == 0
        assert rec.rebuilt_indexes == []
        assert bool(rec.removed_files) == restarted
        if restarted:
            event("reopen: restarted at the log start")

    @rule(
        data=st.data(),
        mode=st.sampled_from(["cut", "cut", "flip", "zeros", "none"]),
    )
    def crash(self, data: st.DataObject, mode: str) -> None:
        """Die without flushing, then damage the non-durable tail of one segment, the way a
        power cut may: the active one, or a closed one rolled since the last flush (unsealed,
        so recovery rescans it and drops every segment after a cut). Reopen and compare."""
        assert self.log is not None
        last = len(self.segs) - 1
        # Segments that may hold non-durable bytes: from the first holding a non-durable entry.
        k0 = next((k for k in range(last) if self._seg_end(k) - 1 > self.durable), last)
        # A segment wholly below the log start is deleted on open, whatever its bytes.
        live = next(
            k for k in range(last + 1) if k == last or self.segs[k + 1][0] > self.start_index
        )
        k = data.draw(st.integers(max(k0, live), last), label="segment")
        active = self._seg_entries(k)
        seg_size = sum(e.size for e in active)
        durable_pos = sum(e.size for e in active if e.index <= self.durable)
        path = self._segment_path(k)
        _abandon(self.log)
        assert path.stat().st_size == seg_size
        # boundaries[j] = byte where active[j] starts
        starts = []
        p = 0
        for e in active:
            starts.append(p)
            p += e.size
        survivors = len(active)  # how many entries of the damaged segment survive
        exp_bytes = exp_entries = 0
        exact_entries = True
        if mode == "cut":
            cut = data.draw(st.integers(durable_pos, seg_size), label="cut")
            os.truncate(path, cut)
            survivors = sum(1 for s, e in zip(starts, active, strict=True) if s + e.size <= cut)
            boundary = sum(e.size for e in active[:survivors])
            exp_bytes = cut - boundary
            exp_entries = 1 if exp_bytes else 0
        elif mode == "flip" and durable_pos < seg_size:
            at = data.draw(st.integers(durable_pos, seg_size - 1), label="at")
            xor = data.draw(st.integers(1, 255), label="xor")
            with open(path, "r+b") as f:
                f.seek(at)
                b = f.read(1)[0]
                f.seek(at)
                f.write(bytes([b ^ xor]))
            survivors = sum(1 for s in starts if s <= at) - 1
            exp_bytes = seg_size - starts[survivors]
            exp_entries = len(active) - survivors
            exact_entries = at - starts[survivors] >= 4  # a damaged length field miscounts
        elif mode == "zeros":
            extra = data.draw(st.integers(1, 300), label="zeros")
            with open(path, "ab") as f:
                f.write(bytes(extra))
            exp_bytes, exp_entries = extra, 1
        ends_early = bool(exp_bytes) or survivors < len(active)
        dropped = (
            [segment_name(base, first) + ".log" for first, base in self.segs[k + 1 :]]
            if ends_early
            else []
        )
        self.log = Log.open(self.dir, self.config, clock_ms=self.clock)
        rec = self.log.recovery
        assert rec.truncated_bytes == exp_bytes, (rec, exp_bytes)
        if exact_entries:
            assert rec.truncated_entries == exp_entries, (rec, exp_entries)
        else:
            assert rec.truncated_entries >= 1
        assert (rec.truncation_reason is not None) == bool(exp_bytes or dropped), rec
        assert rec.rebuilt_indexes == []
        assert set(dropped) <= set(rec.removed_files), (rec, dropped)
        if ends_early:
            lost = active[survivors].index if survivors < len(active) else self._seg_end(k)
            assert lost > self.durable, "a durable entry was lost"
            if lost < self.next_index:
                event(f"crash ({mode}): lost entries")
            if dropped:
                event("crash: dropped segments after an unsealed one")
            self._drop_from(lost)
            del self.segs[k + 1 :]
        if self._model_reopen():
            event("crash: restarted at the log start")

    # --- the model check after every step ----------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        log = self.log
        if log is None:
            return
        assert (log.start_index, log.start_offset) == (self.start_index, self.start_offset)
        assert (log.next_index, log.next_offset) == (self.next_index, self.next_offset)
        assert log.last_index == self.next_index - 1
        assert log.last_term == self._last_term()
        assert log.durable_index == self.durable
        expected_segs = [
            (segment_name(base, first), first, base, self._seg_size(k))
            for k, (first, base) in enumerate(self.segs)
        ]
        assert log.segments() == expected_segs
        logical = self._logical()
        whole = log.read_by_index(self.start_index, BIG)
        assert whole.data == b"".join(e.raw for e in logical)
        assert whole.entries == len(logical)
        by_offset = log.read(self.start_offset, BIG)
        self._check_result(by_offset, self._expect_read_offset(self.start_offset, BIG, None))
        if len(logical) <= 64:
            for e in logical:
                assert log.term_at(e.index) == e.term
        assert log.term_at(self.start_index - 1) == self.prev_term
        physical = [(name, h.index, h.term, h.size) for name, _, h in log.iter_headers()]
        expected_phys = [
            (segment_name(base, first), e.index, e.term, e.size)
            for k, (first, base) in enumerate(self.segs)
            for e in self._seg_entries(k)
        ]
        assert physical == expected_phys


_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def test_log_state_machine() -> None:
    """Fast default (~10 s): 100 random histories, each up to 50 steps."""
    run_state_machine_as_test(
        LogMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=_HEALTH,
        ),
    )


@pytest.mark.long
@pytest.mark.timeout(3600)
def test_log_state_machine_long() -> None:
    """Many more and longer histories; run with ``-m long``."""
    run_state_machine_as_test(
        LogMachine,
        settings=settings(
            max_examples=2_000,
            stateful_step_count=120,
            deadline=None,
            database=None,
            suppress_health_check=_HEALTH,
        ),
    )
