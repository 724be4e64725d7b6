"""The segmented write-ahead log of one partition (or of the controller): Raft's log and the
partition's data in one place, so every entry is stored once.

Invariants (asserted where cheap):
- entries are contiguous in Raft index from ``start_index`` to ``last_index`` and their
  base offsets follow each other (a DATA entry takes ``record_count`` offsets, a control
  entry none); terms never decrease;
- segments are sorted by first index and partition the log; only the last one is written;
- ``durable_index`` never exceeds ``last_index`` and only grows by fsync;
- the log start (index, offset, and the term before it) is in a checkpoint written before
  any segment below it is deleted, so a crash between the two is finished on open.

Thread-safety: one lock guards all state; the fsync of a group commit runs outside it, so
appends continue while the disk works and one fsync serves every waiter that arrived meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple

from raftmq.format import entry
from raftmq.format.entry import EntryHeader, EntryType
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.log.atomic_file import fsync_dir, read_atomic, write_atomic
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import (
    EntryTooLargeError,
    LogClosedError,
    NotContiguousError,
    OutOfRangeError,
)
from raftmq.log.handles import HANDLES
from raftmq.log.index import SegmentIndex
from raftmq.log.preallocate import BUDGET, Pacer
from raftmq.log.segment import LOG_SUFFIX, Segment, first_unsealed, parse_segment_name

START_CHECKPOINT = "log-start.checkpoint"
TERMS_CHECKPOINT = "terms.checkpoint"
_START = struct.Struct(">qqq")  # start index, start offset, term of the entry before start
_TERM = struct.Struct(">qq")  # first index of a term, term
_FIRST_INDEX = attrgetter("first_index")  # bisect keys over the segment list
_BASE_OFFSET = attrgetter("base_offset")
READ_SLACK = 64 * 1024  # extra bytes read past max_bytes to find the next header cheaply


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class RecoveryReport:
    """What opening the log found and repaired; printed by ``raftmq log`` and logged by brokers."""

    segments: int = 0
    truncated_bytes: int = 0
    truncated_entries: int = 0
    truncation_reason: str | None = None
    rebuilt_indexes: list[str] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.truncated_bytes or self.rebuilt_indexes or self.removed_files)


class AppendInfo(NamedTuple):
    """What one append added. A named tuple: one is made per append on the write path."""

    first_index: int
    last_index: int
    base_offset: int
    next_offset: int
    entries: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole entries as stored. ``next_offset``/``next_index`` say where the next read starts."""

    data: bytes
    entries: int
    first_index: int
    next_index: int
    next_offset: int


_NO_BOUND = 1 << 62  # a stop bound no index or offset reaches
_U32_SPAN = 1 << 32  # index slots hold offsets and indexes relative to the segment as u32

_Validated = tuple[int, int, int, int, int, int]
"""One checked entry of an append: (position in the append, index, term, base offset, max
timestamp, next offset)."""


def _fitting(seg: Segment, headers: list[_Validated], start: int) -> int:
    """The end of the run of ``headers`` from ``start`` whose offsets and indexes fit
    ``seg``'s u32 relative slots (every offset an entry covers, not just its base)."""
    base_offset, first_index = seg.base_offset, seg.first_index

    def fits(h: _Validated) -> bool:
        return h[5] - base_offset <= _U32_SPAN and h[1] - first_index < _U32_SPAN

    if fits(headers[-1]):  # offsets and indexes only grow: the usual case in one test
        return len(headers)
    k = start
    while k < len(headers) and fits(headers[k]):
        k += 1
    return k


class Log:
    """A partition's log in a directory; see docs/format.md for the files it keeps."""

    def __init__(self, directory: Path, config: LogConfig, clock_ms: Callable[[], int]) -> None:
        # Use Log.open(); the constructor only sets fields.
        self.directory = directory
        self.config = config
        self._clock_ms = clock_ms
        # Disk reserved ahead of the active segment's end, paced by this log's recent
        # writes, never more than a segment holds (see preallocate.py).
        step = min(config.preallocate_bytes, config.segment_bytes)
        self._pacer = Pacer(step, clock_ms, BUDGET) if step > 0 else None
        self._lock = threading.RLock()
        self._flush_done = threading.Condition(self._lock)
        self._flushing = False
        self._closed = False
        self._segments: list[Segment] = []
        # Closed segments not yet fsynced and sealed (index files written): a roll leaves
        # the old active segment here and the next flush seals it. Never in _open_cache.
        self._unsealed: list[Segment] = []
        self._open_cache: OrderedDict[int, Segment] = OrderedDict()  # closed segments in memory
        self._terms: list[tuple[int, int]] = []  # (first index of term, term), ascending
        self.start_index = 1
        self.start_offset = 0
        self._prev_term = 0
        self.next_index = 1
        self.next_offset = 0
        self.durable_index = 0
        self._last_flush_ms = clock_ms()
        self._validated_next = (1, 0)  # (next index, next offset) after the last _validate
        self._active_born_ms = 0
        self.recovery = RecoveryReport()
        self.on_durable: Callable[[str, int], None] | None = None
        """Called as (segment file path, size) after an fsync made that many bytes of that
        segment durable, in the fsyncing thread, before ``flush()`` returns: a test-only
        observer (the chaos harness simulates losing whatever lies past it on power loss)."""

    # --- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> Log:
        """Open (creating if needed) the log in ``directory`` and recover its tail."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        log = cls(path, config or LogConfig(), clock_ms)
        log._recover()
        return log

    def _recover(self) -> None:
        report = self.recovery
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink()
            report.removed_files.append(tmp.name)
        found: list[tuple[int, int]] = []
        for path in self.directory.iterdir():
            if path.suffix != LOG_SUFFIX:
                continue
            parsed = parse_segment_name(path.stem)
            if parsed is None:
                report.notes.append(f"ignored unknown file {path.name}")
                continue
            found.append(parsed)
        found.sort(key=lambda pair: pair[1])

        start = read_atomic(self.directory / START_CHECKPOINT)
        if start is not None and len(start) == _START.size:
            self.start_index, self.start_offset, self._prev_term = _START.unpack(start)
        elif found:
            self.start_offset, self.start_index = found[0]
            report.notes.append("log-start checkpoint missing: starting at the first segment")
        else:
            self._write_start()

        # A crash during prefix truncation can leave segments wholly below the start.
        while len(found) > 1 and found[1][1] <= self.start_index:
            self._remove_orphan(found.pop(0))
        for base_offset, first_index in found:
            seg = Segment(self.directory, base_offset, first_index, 0)
            seg.size = seg.written = seg.path.stat().st_size
            self._push_segment(seg)
        report.segments = len(self._segments)

        self._load_terms()
        if not self._segments:
            self._restart_empty()
        else:
            first = first_unsealed(self._segments)  # recovery rescans from here, with CRCs
            self._check_closed_indexes(first)
            self._recover_tail(first)
        if (
            self.next_index <= self.start_index
            and self._segments[-1].first_index < self.start_index
        ):
            # Every entry is below the start (a snapshot was installed past the end): restart.
            report.removed_files += [seg.name + LOG_SUFFIX for seg in self._segments]
            self._restart_empty()
        # What a crashed process wrote may still be only in the page cache: make it durable
        # before calling it durable, or this node could vote or ack on data a power loss
        # would erase. One fsync of the active segment (closed ones are sealed: durable).
        # What a crashed process had reserved past its end is given back here.
        active = self._segments[-1]
        active.set_writable(True)
        active.fsync()
        active.release_reserved()
        self.durable_index = self.next_index - 1
        self._drop_terms_below_start()
        self._write_terms()

    def _remove_orphan(self, pair: tuple[int, int]) -> None:
        seg = Segment(self.directory, pair[0], pair[1], 0)
        seg.remove_files()
        self.recovery.removed_files.append(seg.name + LOG_SUFFIX)

    def _push_segment(self, seg: Segment) -> None:
        if self._segments:
            assert seg.first_index > self._segments[-1].first_index
            assert seg.base_offset >= self._segments[-1].base_offset
        self._segments.append(seg)

    def _segment_at(self, value: int, key: Callable[[Segment], int]) -> int:
        """Position of the last segment whose ``key`` is at or below ``value``."""
        return bisect_right(self._segments, value, key=key) - 1

    def _drop_segment(self, pos: int) -> None:
        """Forget the first or last segment and delete its files."""
        assert pos in (0, len(self._segments) - 1), "only an end of the log can go"
        seg = self._segments.pop(pos)
        self._open_cache.pop(seg.first_index, None)
        if seg in self._unsealed:
            self._unsealed.remove(seg)
        seg.remove_files()

    def _restart_empty(self) -> None:
        """Drop every segment, newest first, and start one empty segment at the log start
        (a new log, or a snapshot installed past the end)."""
        while self._segments:
            self._drop_segment(len(self._segments) - 1)
        self._open_cache.clear()
        self._terms.clear()
        self._push_segment(
            Segment.create(self.directory, self.start_offset, self.start_index, pacer=self._pacer)
        )
        self.next_index, self.next_offset = self.start_index, self.start_offset
        self._active_born_ms = self._clock_ms()

    def _check_closed_indexes(self, upto: int) -> None:
        for seg in self._segments[:upto]:
            if not seg.has_index_files():
                self._rebuild_index(seg)

    def _rebuild_index(self, seg: Segment) -> None:
        """Rebuild a closed segment's index from its entries (headers only; reads verify CRCs)."""
        idx = SegmentIndex(seg.base_offset, seg.first_index)
        interval = self.config.index_interval_bytes

        def observe(position: int, h: EntryHeader) -> str | None:
            idx.observe(position, h.index, h.base_offset, h.max_timestamp, interval)
            return None

        result = seg.scan(verify=False, on_entry=observe)
        if result.error is not None:
            seg.corrupt_at = result.valid_end
            self.recovery.notes.append(
                f"segment {seg.name}: {result.error}; reads past byte {result.valid_end} fail"
            )
        if result.last is not None:
            idx.seal(result.last.base_offset)
        idx.write(seg.index_path, seg.time_index_path)
        seg.index = idx
        self.recovery.rebuilt_indexes.append(seg.name)

    def _recover_active(self) -> None:
        """Rescan the last segment (it just became the active one again after a cut)."""
        self._recover_tail(len(self._segments) - 1)

    def _recover_tail(self, first: int) -> None:
        """Scan the segments from ``first`` on with CRCs and contiguity checks, rebuild their
        indexes, cut at the first torn or corrupt entry and delete every segment after the cut
        (or after a gap between segments: a power loss can keep a new segment's file and lose
        the end of an unsynced older one). Closed segments that pass are sealed."""
        self._terms = [t for t in self._terms if t[0] < self._segments[first].first_index]
        seg = self._segments[first]
        self.next_index, self.next_offset = seg.first_index, seg.base_offset
        pos = first
        born = 0
        while True:
            seg = self._segments[pos]
            clean, born = self._rescan(seg)
            last = pos == len(self._segments) - 1
            if last:
                break
            after = self._segments[pos + 1]
            if clean and (after.first_index, after.base_offset) == (
                self.next_index,
                self.next_offset,
            ):
                pos += 1
                continue
            if clean:
                self.recovery.truncation_reason = (
                    f"segment {after.name} does not follow segment {seg.name}, which ends "
                    f"before index {self.next_index}: its unsynced end was lost"
                )
            while len(self._segments) - 1 > pos:
                dropped = self._segments[-1]
                self.recovery.removed_files.append(dropped.name + LOG_SUFFIX)
                self._drop_segment(len(self._segments) - 1)
            break
        for seg in self._segments[first:-1]:
            if seg in self._unsealed:
                continue  # a suffix cut made the active segment again; the next flush seals it
            self._seal(seg)
            seg.set_writable(False)
        active = self._segments[-1]
        active.pacer = self._pacer
        # Age rolls count from the first entry's time when it is plausible; a producer's old
        # timestamps must not make every append after a restart roll a segment.
        now = self._clock_ms()
        self._active_born_ms = born if active.size and 0 < born <= now else now

    def _rescan(self, seg: Segment) -> tuple[bool, int]:
        """Scan one tail segment from ``next_index``/``next_offset``, rebuilding its index and
        the terms; cut a bad tail. (False when it was cut, the first entry's timestamp)."""
        seg.set_writable(True)
        idx = SegmentIndex(seg.base_offset, seg.first_index)
        interval = self.config.index_interval_bytes
        expect = [self.next_index, self.next_offset, self._terms[-1][1] if self._terms else 0]
        born = [0]

        def observe(position: int, h: EntryHeader) -> str | None:
            index, offset, term = expect
            if h.index != index or h.base_offset != offset:
                return (
                    f"entry at byte {position} has index {h.index} offset {h.base_offset}, "
                    f"expected index {index} offset {offset}"
                )
            if h.term < term:
                return f"entry at byte {position} has term {h.term} below {term}"
            if not self._terms or h.term != self._terms[-1][1]:
                self._terms.append((h.index, h.term))
            if position == 0:
                born[0] = h.max_timestamp
            idx.observe(position, h.index, h.base_offset, h.max_timestamp, interval)
            expect[:] = [h.index + 1, h.next_offset, h.term]
            return None

        result = seg.scan(verify=True, on_entry=observe)
        if result.error is not None:
            dropped = seg.size - result.valid_end
            self.recovery.truncated_bytes += dropped
            self.recovery.truncated_entries += self._count_frames(seg, result.valid_end)
            self.recovery.truncation_reason = f"segment {seg.name}: {result.error}"
            seg.truncate(result.valid_end)
        seg.verified_upto = seg.size
        seg.index = idx
        seg.remove_index_files()
        self.next_index, self.next_offset = expect[0], expect[1]
        return result.error is None, born[0]

    @staticmethod
    def _count_frames(seg: Segment, position: int) -> int:
        """How many entries a dropped tail held, counted by their length fields (at least 1)."""
        count = 0
        while position + 4 <= seg.size and count < 1_000_000:
            size = entry.entry_size_at(seg.pread(4, position), 0)
            count += 1
            if size < entry.HEADER_SIZE:
                break
            position += size
        return max(count, 1)

    # --- terms --------------------------------------------------------------------------

    def _load_terms(self) -> None:
        raw = read_atomic(self.directory / TERMS_CHECKPOINT)
        if raw is not None and len(raw) % _TERM.size == 0:
            self._terms = [(i, t) for i, t in _TERM.iter_unpack(raw)]
            return
        self._terms = []
        if len(self._segments) > 1:
            self.recovery.notes.append("terms checkpoint missing: rebuilt from closed segments")
            for seg in self._segments[:-1]:

                def observe(_: int, h: EntryHeader) -> str | None:
                    if not self._terms or h.term != self._terms[-1][1]:
                        self._terms.append((h.index, h.term))
                    return None

                seg.scan(verify=False, on_entry=observe)
                seg.close_fd()

    def _write_terms(self) -> None:
        write_atomic(
            self.directory / TERMS_CHECKPOINT, b"".join(_TERM.pack(i, t) for i, t in self._terms)
        )

    def _drop_terms_below_start(self) -> None:
        keep = bisect_right(self._terms, (self.start_index, 1 << 62)) - 1
        if keep > 0:
            del self._terms[:keep]

    def term_at(self, index: int) -> int:
        """Term of the entry at ``index``; ``start_index - 1`` answers the term before the start."""
        with self._lock:
            if index == self.start_index - 1:
                return self._prev_term
            if not self.start_index <= index < self.next_index:
                raise OutOfRangeError(
                    f"no term for index {index}: the log holds indexes "
                    f"{self.start_index - 1} to {self.next_index - 1}",
                    start=self.start_index - 1,
                    end=self.next_index - 1,
                )
            pos = bisect_right(self._terms, (index, 1 << 62)) - 1
            assert pos >= 0, f"no term boundary at or below index {index}"
            return self._terms[pos][1]

    @property
    def last_index(self) -> int:
        return self.next_index - 1

    @property
    def last_term(self) -> int:
        return self.term_at(self.next_index - 1)

    # --- append -------------------------------------------------------------------------

    def append(
        self, buf: bytes | bytearray | memoryview, *, crc_checked: bool = False
    ) -> AppendInfo:
        """Validate and append one or more whole entries with one write.

        Everything is checked before a byte is written: framing, size, CRC, contiguity of
        Raft index and offsets, and that terms do not decrease. Under the EVERY_BATCH policy
        the call returns once the entries are durable.

        ``crc_checked``: the caller already checked every CRC at its trust boundary (the
        Raft host's appends: a producer's batch at the client edge, then stamped by the
        leader; a leader's append at the follower's peer edge), so it is not recomputed
        here; everything else still is.
        """
        data = buf if type(buf) is bytes else bytes(buf)
        config = self.config
        with self._lock:
            if self._closed:
                self._check_open()
            headers = self._validate(data, crc_checked=crc_checked)
            final_next = self._validated_next
            first_index = self.next_index
            first_offset = self.next_offset
            seg = self._segments[-1]
            now = self._clock_ms()
            if seg.size and (
                seg.size + len(data) > config.segment_bytes
                or now - self._active_born_ms >= config.segment_ms
            ):
                seg = self._roll()
            start = 0
            while start < len(headers):
                stop = _fitting(seg, headers, start)
                if stop == start:
                    # Its offsets or indexes would not fit the segment's u32 relative slots:
                    # roll instead of overflowing (a fresh segment always fits one entry).
                    assert seg.size, "an entry does not fit even an empty segment"
                    seg = self._roll()
                    continue
                if seg.size == 0:
                    self._active_born_ms = now
                if start == 0 and stop == len(headers):
                    chunk = data  # the usual case: the whole append goes to one segment
                else:
                    end = headers[stop][0] if stop < len(headers) else len(data)
                    chunk = data[headers[start][0] : end]
                self._write_entries(seg, chunk, headers, start, stop)
                start = stop
            assert (self.next_index, self.next_offset) == final_next
            info = AppendInfo(
                first_index, self.next_index - 1, first_offset, self.next_offset, len(headers)
            )
        if config.flush_policy is FlushPolicy.EVERY_BATCH:
            self.flush()
        return info

    def _write_entries(
        self, seg: Segment, chunk: bytes, headers: list[_Validated], start: int, stop: int
    ) -> None:
        """Write ``chunk``, the entries ``headers[start:stop]``, to the active segment and
        index them."""
        base = seg.size
        size = len(chunk)
        assert base + size < (1 << 32), "segment would overflow u32 positions"
        seg.write(chunk, self.config.write_behind_bytes)
        index = seg.index
        assert index is not None
        interval = self.config.index_interval_bytes
        terms = self._terms
        shift = base - headers[start][0]  # chunk positions are relative to the append
        for k in range(start, stop):
            position, e_index, e_term, e_offset, max_ts, _ = headers[k]
            index.observe(shift + position, e_index, e_offset, max_ts, interval)
            if not terms or e_term != terms[-1][1]:
                terms.append((e_index, e_term))
        seg.verified_upto = base + size
        last = headers[stop - 1]
        # The invariant append keeps by rolling: relative offsets and indexes fit u32.
        assert last[5] - seg.base_offset <= _U32_SPAN and last[1] - seg.first_index < _U32_SPAN
        self.next_index, self.next_offset = last[1] + 1, last[5]

    def _validate(self, data: bytes, *, crc_checked: bool = False) -> list[_Validated]:
        """Check every entry of an append; (position, index, term, base offset, max
        timestamp, next offset) of each. Plain tuples: this runs once per entry on the
        write path.

        Framing, size and contiguity always; the CRC unless the caller checked it at its
        trust boundary (``crc_checked``): the Raft host's appends were checked once, at the
        client edge (raftmq/partition/batch_check.py) or at the peer edge (the Raft core's
        check of a leader's append). The disk-read boundary is the log's own CRC check of
        what it reads back."""
        if not data:
            raise InvalidEntryError("nothing to append: the buffer holds no entry")
        index, offset = self.next_index, self.next_offset
        term = self._terms[-1][1] if self._terms else self._prev_term
        limit = self.config.max_message_bytes
        out = []
        position = 0
        end = len(data)
        view = memoryview(data)
        decode = entry.decode_header
        while position < end:
            length, crc, _, _, _, e_index, e_term, e_offset, count, _, max_ts, _, _, _, _ = decode(
                view, position
            )
            size = length + 4
            if size > limit:
                raise EntryTooLargeError(
                    f"entry at byte {position} is {size} bytes; max.message.bytes is {limit}"
                )
            if position + size > end:
                raise InvalidEntryError(
                    f"entry at byte {position} needs {size} bytes, {end - position} given"
                )
            if not crc_checked and not entry.crc_matches(view, position, size, crc):
                raise CorruptEntryError(
                    f"CRC mismatch in entry at byte {position} of the append (index {e_index})",
                    position=position,
                )
            if e_index != index:
                raise NotContiguousError(
                    f"entry at byte {position} has index {e_index}; the log expects {index}"
                )
            if e_offset != offset:
                raise NotContiguousError(
                    f"entry at byte {position} has base offset {e_offset}; the log expects {offset}"
                )
            if e_term < term:
                raise InvalidEntryError(
                    f"entry at byte {position} has term {e_term}, below the log's term {term}"
                )
            index, offset, term = e_index + 1, e_offset + count, e_term
            out.append((position, e_index, e_term, e_offset, max_ts, offset))
            position += size
        self._validated_next = (index, offset)
        return out

    def _roll(self) -> Segment:
        """Start a new active segment; the old one waits in ``_unsealed`` for the next flush.

        Why not fsync here: under the INTERVAL policy the old segment can hold 128 MiB of
        dirty pages, and the appender (a Raft round) would stall for the whole fsync. A
        segment becomes closed-and-sealed only once it is durable (fsync, then index files),
        so recovery can trust index files and rescans whatever has none.
        """
        old = self._segments[-1]
        assert old.index is not None
        old.drain()  # _seal fsyncs it outside the lock: its bytes must be in the file
        self._unsealed.append(old)
        seg = Segment.create(self.directory, self.next_offset, self.next_index, pacer=self._pacer)
        self._push_segment(seg)
        return seg

    def _seal(self, seg: Segment) -> None:
        """Make a closed segment durable, then write its index files: their presence is what
        tells recovery the segment needs no rescan. Runs outside the lock, under _flushing."""
        assert seg.index is not None, f"unsealed segment {seg.name} lost its index"
        seg.fsync()
        if self.on_durable is not None:
            self.on_durable(str(seg.path), seg.size)  # a sealed segment is wholly durable
        seg.index.seal(self._last_header(seg).base_offset)
        seg.index.write(seg.index_path, seg.time_index_path)
        seg.release_reserved()

    def _last_header(self, seg: Segment) -> EntryHeader:
        assert seg.index is not None and seg.size > 0
        found: list[EntryHeader] = []
        start = seg.index.positions[-1] if seg.index.positions else 0

        def keep(_: int, h: EntryHeader) -> str | None:
            found[:] = [h]
            return None

        seg.scan(verify=False, on_entry=keep, start=start)
        return found[0]

    # --- durability ---------------------------------------------------------------------

    def flush(self) -> None:
        """Make every entry appended before this call durable, sharing fsyncs between callers.

        A caller that finds a flush in progress waits for it and, if that flush did not
        cover its entries, joins the next one: N concurrent callers cost about 2 fsyncs.
        """
        with self._lock:
            target = self.next_index - 1
            while self.durable_index < target or self._unsealed:
                if self._flushing:
                    self._flush_done.wait()
                    continue
                self._check_open()
                active = self._segments[-1]
                active.drain()  # may raise (EIO, ENOSPC): the bytes stay pending for a retry
                # Pinned: no other log's open may close it while the fdatasync runs.
                fd = HANDLES.pin(active)
                self._flushing = True
                pending = list(self._unsealed)
                covered = self.next_index - 1
                # What this fdatasync covers, captured with ``covered``: appends made while
                # the disk works may or may not be on it.
                durable_size = active.size
                self._lock.release()
                try:
                    for seg in pending:  # older segments first: the log stays a prefix
                        self._seal(seg)
                    os.fdatasync(fd)
                    if self.on_durable is not None:
                        self.on_durable(str(active.path), durable_size)
                finally:
                    HANDLES.unpin(active)
                    self._lock.acquire()
                    self._flushing = False
                    self._flush_done.notify_all()
                if pending:
                    # Every change that drops segments waits for the flush to finish, so
                    # all of them are still here; only now may the cache close their fds.
                    for seg in pending:
                        self._unsealed.remove(seg)
                        seg.set_writable(False)
                        self._cache_touch(seg)
                    self._write_terms()
                self.durable_index = max(self.durable_index, min(covered, self.next_index - 1))
                self._last_flush_ms = self._clock_ms()

    def flush_if_due(self) -> bool:
        """For the INTERVAL policy: flush when ``flush_interval_ms`` passed since the last one."""
        with self._lock:
            due = (
                self.durable_index < self.next_index - 1
                and self._clock_ms() - self._last_flush_ms >= self.config.flush_interval_ms
            )
        if due:
            self.flush()
        return due

    def _wait_no_flush(self) -> None:
        while self._flushing:
            self._flush_done.wait()

    # --- reads --------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, upper_offset: int | None = None) -> ReadResult:
        """Whole entries from the one holding message ``offset``, up to ``max_bytes`` (always at
        least one entry), none holding offsets at or above ``upper_offset`` (the high watermark).

        The range starts at the DATA entry holding ``offset``; control entries between data
        entries are included as stored (clients skip them by type). Reading at the end
        returns no data; below the start or past the end raises OutOfRangeError.
        """
        with self._lock:
            self._check_open()
            self._check_max_bytes(max_bytes)
            if not self.start_offset <= offset <= self.next_offset:
                raise OutOfRangeError(
                    f"offset {offset} is out of range: the log holds offsets "
                    f"{self.start_offset} to {self.next_offset - 1} (next is {self.next_offset})",
                    start=self.start_offset,
                    end=self.next_offset,
                )
            upper = (
                self.next_offset if upper_offset is None else min(upper_offset, self.next_offset)
            )
            if offset >= upper:
                return ReadResult(b"", 0, self.next_index, self.next_index, offset)
            pos = self._segment_at(offset, _BASE_OFFSET)
            return self._collect(
                pos,
                lambda seg: self._index_of(seg).position_for_offset(offset),
                lambda i, base, n: base + n <= offset or i < self.start_index,
                max_bytes,
                stop_index=_NO_BOUND,
                stop_offset=upper,
            )

    def read_entries(self, lo: int, max_bytes: int, hi: int | None = None) -> bytes:
        """Concatenated whole entries with Raft index in [lo, hi), at most ``max_bytes`` but
        always at least one; the Raft replication path."""
        return self.read_by_index(lo, max_bytes, hi).data

    def read_by_index(self, lo: int, max_bytes: int, hi: int | None = None) -> ReadResult:
        with self._lock:
            self._check_open()
            self._check_max_bytes(max_bytes)
            if not self.start_index <= lo <= self.next_index:
                raise OutOfRangeError(
                    f"index {lo} is out of range: the log holds indexes "
                    f"{self.start_index} to {self.next_index - 1}",
                    start=self.start_index,
                    end=self.next_index,
                )
            upper = self.next_index if hi is None else min(hi, self.next_index)
            if lo >= upper:
                return ReadResult(b"", 0, lo, lo, self.next_offset)
            pos = self._segment_at(lo, _FIRST_INDEX)
            return self._collect(
                pos,
                lambda seg: self._index_of(seg).position_for_index(lo),
                lambda i, base, n: i < lo,
                max_bytes,
                stop_index=upper,
                stop_offset=_NO_BOUND,
            )

    def _collect(
        self,
        pos: int,
        start_position: Callable[[Segment], int],
        skip: Callable[[int, int, int], bool],
        max_bytes: int,
        *,
        stop_index: int,
        stop_offset: int,
    ) -> ReadResult:
        """Whole entries from segment ``pos`` on. ``skip`` sees each entry's (index, base
        offset, record count) until the first one wanted (``_seek`` places the reads there,
        and what follows it is wanted too); the read stops before an entry with index
        ``stop_index`` or holding offsets at or past ``stop_offset``. Only framing is
        decoded, and CRCs are checked only past what this process already verified. The
        bounds are numbers, not callables, because the inner loop runs once per entry."""
        pieces: list[bytes] = []
        total = entries = 0
        first_index = next_index = next_offset = -1
        frame_at = entry.frame_at
        done = False
        first_segment = True
        while pos < len(self._segments) and not done:
            seg = self._segments[pos]
            if seg is not self._segments[-1]:
                self._cache_touch(seg)  # bound open descriptors on reads across segments
            position = start_position(seg) if first_segment else 0
            if not entries:
                # The index knows the entry at its slot: when that one is wanted (as for a
                # consumer reading on from the last read's end), no seek read is needed.
                # Counting it as a data entry is a guess; if it is a control entry to
                # skip, the walk below skips it.
                at = self._entry_after(pos, seg, position) if position < seg.size else None
                if at is None or skip(at[0], at[1], 1):
                    position = self._seek(seg, position, skip)
            first_segment = False
            while position < seg.size and not done:
                if seg.corrupt_at is not None and position >= seg.corrupt_at:
                    raise self._corrupt(seg, seg.corrupt_at, "found when its index was rebuilt")
                want = self._read_size(seg, position, max_bytes - total, have=entries)
                if not want:
                    done = True  # what is left of max_bytes cannot hold another entry
                    break
                chunk = seg.pread(want, position)
                size, _, index, base, count = self._frame(seg, chunk, 0, position)
                after = self._entry_after(pos, seg, position + want)
                if (
                    after is not None
                    and want <= max_bytes - total  # not the slack read for a first entry
                    and after[0] <= stop_index
                    and after[1] < stop_offset
                    and (entries or not skip(index, base, count))
                ):
                    # Whole entries, none near a bound: the index says where they end, so
                    # the bytes go out without the bounded walk below; those this process
                    # has not checked yet get a lean CRC walk first.
                    verified = seg.verified_upto
                    if verified < position + want:
                        bad = entry.first_bad_entry(chunk, max(0, verified - position))
                        if bad is not None:
                            raise self._corrupt(seg, position + bad[0], bad[1])
                        if verified >= position:
                            seg.verified_upto = position + want
                    if first_index < 0:
                        first_index = index
                    entries += after[0] - index
                    total += want
                    next_index, next_offset = after
                    pieces.append(chunk)
                    position += want
                    if total >= max_bytes:
                        done = True
                    continue
                if size > len(chunk):
                    # The first entry is larger than the read: decide on it from its header,
                    # then read it whole if it is wanted.
                    if position + size > seg.size:
                        raise self._corrupt(seg, position, "entry runs past the segment end")
                    if skip(index, base, count):
                        position += size
                        continue
                    if (
                        index >= stop_index
                        or base + count > stop_offset
                        or (count == 0 and base >= stop_offset)
                        or (entries and total + size > max_bytes)
                    ):
                        done = True
                        break
                    chunk = seg.pread(size, position)
                p = 0
                begin = None
                end = len(chunk)
                verified = seg.verified_upto - position
                header_size = entry.HEADER_SIZE
                try:
                    while end - p >= header_size:
                        size, crc, index, base, count = frame_at(chunk, p)
                        if p + size > end:
                            break  # continues past this read: the next read starts here
                        if begin is None and not entries and skip(index, base, count):
                            p += size
                            continue
                        if (
                            index >= stop_index
                            or base + count > stop_offset
                            or (count == 0 and base >= stop_offset)
                            or (entries and total + size > max_bytes)
                        ):
                            done = True
                            break
                        # Trust boundary: the disk read. Bytes not yet checked by this
                        # process are CRC-checked before they are served.
                        if p >= verified and not entry.crc_matches(chunk, p, size, crc):
                            raise self._corrupt(seg, position + p, "CRC mismatch")
                        if begin is None:
                            begin = p
                            if first_index < 0:
                                first_index = index
                        entries += 1
                        total += size
                        next_index, next_offset = index + 1, base + count
                        p += size
                except InvalidEntryError as exc:
                    raise self._corrupt(seg, position + p, str(exc)) from None
                if begin is not None:
                    pieces.append(chunk if (begin, p) == (0, end) else chunk[begin:p])
                if position <= seg.verified_upto < position + p:
                    seg.verified_upto = position + p  # checked now: later reads skip it
                assert p > 0 or done, "a read must advance or finish"
                position += p
                if total >= max_bytes:
                    done = True
            pos += 1
        if not entries:
            return ReadResult(b"", 0, self.next_index, self.next_index, self.next_offset)
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return ReadResult(data, entries, first_index, next_index, next_offset)

    def _seek(self, seg: Segment, position: int, skip: Callable[[int, int, int], bool]) -> int:
        """From an index slot, the position of the first entry ``skip`` does not refuse (at
        most about one index interval further), found with small reads so the bulk read
        that follows can start exactly there and be returned without a copy."""
        window = self.config.index_interval_bytes + entry.HEADER_SIZE
        while position < seg.size:
            if seg.corrupt_at is not None and position >= seg.corrupt_at:
                raise self._corrupt(seg, seg.corrupt_at, "found when its index was rebuilt")
            chunk = seg.pread(min(window, seg.size - position), position)
            p = 0
            while len(chunk) - p >= entry.HEADER_SIZE:
                size, _, index, base, count = self._frame(seg, chunk, p, position)
                if not skip(index, base, count):
                    return position + p
                p += size
            if p == 0:
                raise self._corrupt(seg, position, "no whole entry where one must start")
            position += p
        return position

    def _entry_after(self, pos: int, seg: Segment, end: int) -> tuple[int, int] | None:
        """(Raft index, base offset) of the entry that starts at byte ``end`` of segment
        ``pos``, when the index or the segment's end says so without reading; else None."""
        if end == seg.size:
            if pos + 1 < len(self._segments):
                following = self._segments[pos + 1]
                return following.first_index, following.base_offset
            return self.next_index, self.next_offset
        return None if seg.index is None else seg.index.entry_at(end)

    def _read_size(self, seg: Segment, position: int, budget: int, *, have: int) -> int:
        """Bytes to read from ``position``: up to the last index slot (an entry boundary)
        within ``budget`` when there is one, so the read holds only whole entries. When
        none fits, a read that already has entries reads exactly the rest of its budget
        (less than one index interval: whatever whole entries fit are taken, as max_bytes
        promises), or stops (0) when not even a header fits. A read with nothing yet reads
        ``budget`` plus slack: it must return at least one entry."""
        rest = seg.size - position
        if budget >= rest:
            return rest
        positions = self._index_of(seg).positions
        boundary = positions[bisect_right(positions, position + budget) - 1] if positions else 0
        if boundary > position:
            return boundary - position
        if have:
            return min(rest, budget) if budget >= entry.HEADER_SIZE else 0
        return min(rest, max(budget, 0) + READ_SLACK)

    def _frame(self, seg: Segment, buf: bytes, p: int, base: int) -> tuple[int, int, int, int, int]:
        try:
            return entry.frame_at(buf, p)
        except InvalidEntryError as exc:
            raise self._corrupt(seg, base + p, str(exc)) from None

    def _corrupt(self, seg: Segment, position: int, why: str) -> CorruptEntryError:
        return CorruptEntryError(
            f"corrupt entry in segment {seg.name} at byte {position}: {why}; "
            "it is not served. Run 'raftmq log verify' on this folder",
            position=position,
            segment=seg.name,
        )

    def _check_max_bytes(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")

    def _index_of(self, seg: Segment) -> SegmentIndex:
        if seg is not self._segments[-1]:
            self._cache_touch(seg)
            if seg.index is None and not seg.load_index():
                self._rebuild_index(seg)
        assert seg.index is not None
        return seg.index

    def _cache_touch(self, seg: Segment) -> None:
        if seg in self._unsealed:
            return  # its fd and in-memory index stay until the flush that seals it
        self._open_cache[seg.first_index] = seg
        self._open_cache.move_to_end(seg.first_index)
        while len(self._open_cache) > self.config.max_open_segments:
            _, old = self._open_cache.popitem(last=False)
            if old is not self._segments[-1]:
                old.release()

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Base offset of the first DATA entry whose max timestamp is >= ``timestamp``, or None
        when no entry is that recent. Batch granularity: the entry may hold earlier records."""
        with self._lock:
            self._check_open()
            found: list[int] = []

            def match(_: int, h: EntryHeader) -> str | None:
                if h.index < self.start_index:
                    return None  # below the start: deleted as far as readers know
                if h.type == EntryType.DATA and h.max_timestamp >= timestamp:
                    found.append(h.base_offset)
                    return "found"
                return None

            for seg in self._segments:
                if seg.size == 0:
                    continue
                position = self._index_of(seg).position_for_timestamp(timestamp)
                if position is None:
                    continue
                seg.scan(verify=False, on_entry=match, start=position)
                if found:
                    return found[0]
            return None

    # --- truncation and retention -------------------------------------------------------

    def truncate_suffix(self, index: int) -> None:
        """Remove every entry with Raft index >= ``index`` (Raft conflict resolution).

        Later segments go first, newest first, each unlink made durable before the next, so a
        crash leaves a contiguous prefix; the cut inside a segment is one ftruncate + fsync.
        """
        with self._lock:
            self._check_open()
            self._wait_no_flush()
            if index >= self.next_index:
                return
            if index < self.start_index:
                raise OutOfRangeError(
                    f"cannot truncate to index {index}: below the log start {self.start_index}",
                    start=self.start_index,
                    end=self.next_index,
                )
            # Find the cut first, while the target segment is still a closed one whose index
            # can be loaded: nothing is deleted before every position is known.
            k = self._segment_at(index, _FIRST_INDEX)
            if k > 0 and self._segments[k].first_index == index:
                target = self._segments[k - 1]  # the cut is a segment boundary: keep it whole
                cut = target.size
            else:
                target = self._segments[k]
                cut = self._position_of_index(target, index)
            while len(self._segments) > 1 and self._segments[-1].first_index >= index:
                self._drop_segment(len(self._segments) - 1)
            seg = self._segments[-1]
            assert seg is target, "the cut lies in the last remaining segment"
            self._open_cache.pop(seg.first_index, None)
            if seg in self._unsealed:
                self._unsealed.remove(seg)  # it is the active segment again
            seg.truncate(cut)
            seg.remove_index_files()
            del self._terms[bisect_right(self._terms, (index - 1, 1 << 62)) :]
            self._recover_active()
            assert self.next_index == max(index, self.start_index), (self.next_index, index)
            self.durable_index = min(self.durable_index, self.next_index - 1)
            self._write_terms()

    def _position_of_index(self, seg: Segment, index: int) -> int:
        if index <= seg.first_index:
            return 0
        start = self._index_of(seg).position_for_index(index)
        found: list[int] = []

        def at(position: int, h: EntryHeader) -> str | None:
            if h.index >= index:
                found.append(position)
                return "found"
            return None

        result = seg.scan(verify=False, on_entry=at, start=start)
        return found[0] if found else result.valid_end

    def truncate_prefix(
        self, index: int, *, offset: int | None = None, prev_term: int | None = None
    ) -> None:
        """Forget entries below ``index`` (retention, snapshots). Within the log the start
        moves and whole segments below it are deleted; past the end the log restarts empty at
        ``index``/``offset`` with ``prev_term`` as the term before it (snapshot install)."""
        with self._lock:
            self._check_open()
            self._wait_no_flush()
            if index <= self.start_index:
                return
            if index <= self.next_index:
                start_offset = self._offset_at_index(index)
                term_before = self.term_at(index - 1)
                self._set_start(index, start_offset, term_before)
                while len(self._segments) > 1 and self._segments[1].first_index <= index:
                    self._drop_segment(0)
                self._drop_terms_below_start()
                self._write_terms()
                return
            if offset is None or prev_term is None:
                raise ValueError(
                    f"truncating past the end (index {index} > {self.next_index}) needs the "
                    "offset and term of the snapshot"
                )
            # No offset check against the old log: a follower whose tail diverged from the
            # leader's history may hold more records than the snapshot, and all of it goes.
            self._set_start(index, offset, prev_term)
            self._restart_empty()
            self.durable_index = index - 1
            self._write_terms()

    def _offset_at_index(self, index: int) -> int:
        if index == self.next_index:
            return self.next_offset
        result = self.read_by_index(index, 1)
        return entry.parse_header(result.data).base_offset

    def _set_start(self, index: int, offset: int, prev_term: int) -> None:
        self.start_index, self.start_offset, self._prev_term = index, offset, prev_term
        self._write_start()

    def _write_start(self) -> None:
        write_atomic(
            self.directory / START_CHECKPOINT,
            _START.pack(self.start_index, self.start_offset, self._prev_term),
        )

    def apply_retention(self, *, max_index: int | None = None) -> int:
        """Delete whole closed segments older than ``retention.ms`` or beyond
        ``retention.bytes``; never the active one, never one holding index >= ``max_index``
        (Raft passes what is committed and applied). Returns how many were deleted."""
        with self._lock:
            self._check_open()
            self._wait_no_flush()  # a flush may be sealing the segments we would delete
            now = self._clock_ms()
            deleted = 0
            total = sum(s.size for s in self._segments)
            while len(self._segments) > 1:
                oldest, nxt = self._segments[0], self._segments[1]
                if max_index is not None and nxt.first_index - 1 >= max_index:
                    break
                by_size = (
                    self.config.retention_bytes >= 0
                    and total - oldest.size >= self.config.retention_bytes
                )
                by_time = (
                    self.config.retention_ms >= 0
                    and self._index_of(oldest).max_timestamp < now - self.config.retention_ms
                )
                if not (by_size or by_time):
                    break
                self._set_start(nxt.first_index, nxt.base_offset, self.term_at(nxt.first_index - 1))
                total -= oldest.size
                self._drop_segment(0)
                deleted += 1
            if deleted:
                self._drop_terms_below_start()
                self._write_terms()
            return deleted

    # --- introspection and closing ------------------------------------------------------

    def segments(self) -> list[tuple[str, int, int, int]]:
        """(name, first index, base offset, size) of each segment, oldest first."""
        with self._lock:
            return [(s.name, s.first_index, s.base_offset, s.size) for s in self._segments]

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    def iter_headers(self, *, verify: bool = True) -> Iterator[tuple[str, int, EntryHeader]]:
        """Every entry's header, segment by segment; raises on the first bad one."""
        with self._lock:
            segs = list(self._segments)
        for seg in segs:
            found: list[tuple[int, EntryHeader]] = []

            def keep(
                position: int, h: EntryHeader, acc: list[tuple[int, EntryHeader]] = found
            ) -> str | None:
                acc.append((position, h))
                return None

            with self._lock:
                result = seg.scan(verify=verify, on_entry=keep)
                if seg is not self._segments[-1] and seg not in self._unsealed:
                    seg.close_fd()  # an unsealed one keeps its fd: a flush may be using it
            for position, h in found:
                yield seg.name, position, h
            if result.error is not None:
                raise self._corrupt(seg, result.valid_end, result.error)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.flush()
            self._wait_no_flush()
            self._write_terms()
            self._segments[-1].release_reserved()
            for seg in self._segments:
                seg.close_fd()
            self._closed = True

    def abandon(self) -> None:
        """Close every descriptor without flushing or writing anything: for a log whose
        write or fsync failed, which its owner reopens from disk.

        Why not :meth:`close`: it fsyncs, and a second fsync on a descriptor whose fsync
        failed can report success for pages the kernel already dropped (PostgreSQL's
        "fsyncgate"); the next :meth:`open` re-reads and re-checks what is really there."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for seg in self._segments:
                seg.pending.clear()  # kept-back writes: never acknowledged, never written
                with contextlib.suppress(OSError):
                    seg.close_fd()

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log in {self.directory} is closed")

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort for leaked handles
        if not getattr(self, "_closed", True):
            for seg in getattr(self, "_segments", []):
                seg.close_fd()


__all__ = ["AppendInfo", "Log", "ReadResult", "RecoveryReport", "fsync_dir"]
