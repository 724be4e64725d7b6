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

How the code is laid out: :class:`Log` is the one public face and owns all the state (the
segment list, the terms, the positions, the lock); the work is done by modules of plain
functions that take the log as their first argument, one module per concern:
recovery.py (opening a directory, cutting torn tails, rebuilding indexes), writes.py
(append, roll, group-committed flush and sealing), reads.py (reads by offset, by index and
by time), truncation.py (suffix, prefix, retention) and checkpoints.py (the two small files
beside the segments). Why functions over one state rather than classes: the invariants above
span all of the state at once under one lock (an append moves the positions, the terms and
the segment list together; a flush seals what a roll left), so dividing the state between
objects would spread each invariant over several of them; and mixins would hide where a
method comes from and make the type checker guess at the attributes each one expects. The
methods below keep the public signatures and docstrings; the segment-list and checkpoint
helpers every concern shares stay here with the state they change.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

from raftmq.format.entry import EntryHeader
from raftmq.format.tag_filter import TagFilter
from raftmq.log import checkpoints, filtered_reads, reads, recovery, truncation, writes
from raftmq.log.atomic_file import fsync_dir
from raftmq.log.checkpoints import START_CHECKPOINT, TERMS_CHECKPOINT
from raftmq.log.config import LogConfig
from raftmq.log.errors import LogClosedError, OutOfRangeError
from raftmq.log.filtered_reads import FilteredRead
from raftmq.log.index import SegmentIndex
from raftmq.log.preallocate import BUDGET, Pacer
from raftmq.log.reads import READ_SLACK_BYTES, ReadResult
from raftmq.log.recovery import RecoveryReport
from raftmq.log.segment import Segment
from raftmq.log.writes import AppendInfo


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Log:
    """A partition's log in a directory; see docs/format.md for the files it keeps."""

    def __init__(self, directory: Path, config: LogConfig, clock_ms: Callable[[], int]) -> None:
        # Use Log.open(); the constructor only sets fields.
        self.directory = directory
        self.config = config
        self._clock_ms = clock_ms
        # Disk reserved ahead of the active segment's end, paced by this log's recent
        # writes, never more than a segment holds (see preallocate.py).
        step_bytes = min(config.preallocate_bytes, config.segment_bytes)
        self._pacer = Pacer(step_bytes, clock_ms, BUDGET) if step_bytes > 0 else None
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
        self._terms_saved: list[tuple[int, int]] | None = None  # what the checkpoint holds
        self.start_index = 1
        self.start_offset = 0
        self._prev_term = 0
        self.next_index = 1
        self.next_offset = 0
        self.durable_index = 0
        self._last_flush_ms = clock_ms()
        self._validated_next = (1, 0)  # (next index, next offset) after the last validation
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
        recovery.recover(log)
        return log

    # --- the segment list (shared by every concern) --------------------------------------

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

    def _restart_empty(self, *, durable: bool = True) -> None:
        """Drop every segment, newest first, and start one empty segment at the log start
        (a new log, or a snapshot installed past the end); ``durable``: see Segment.create."""
        while self._segments:
            self._drop_segment(len(self._segments) - 1)
        self._open_cache.clear()
        self._terms.clear()
        self._push_segment(
            Segment.create(
                self.directory,
                self.start_offset,
                self.start_index,
                pacer=self._pacer,
                durable=durable,
            )
        )
        self.next_index, self.next_offset = self.start_index, self.start_offset
        self._active_born_ms = self._clock_ms()

    def _index_of(self, seg: Segment) -> SegmentIndex:
        """The segment's index, loaded (or rebuilt) for a closed one that dropped it."""
        if seg is not self._segments[-1]:
            self._cache_touch(seg)
            if seg.index is None:
                reason = seg.load_index()
                if reason is not None:
                    recovery.rebuild_index(self, seg, reason)
        assert seg.index is not None
        return seg.index

    def _rebuild_index(self, seg: Segment, reason: str) -> None:
        """Replace a closed segment's index that a lookup found wrong (reads.check_slot)."""
        assert seg is not self._segments[-1], "the active segment's index is never loaded"
        recovery.rebuild_index(self, seg, reason)

    def _cache_touch(self, seg: Segment) -> None:
        if seg in self._unsealed:
            return  # its fd and in-memory index stay until the flush that seals it
        self._open_cache[seg.first_index] = seg
        self._open_cache.move_to_end(seg.first_index)
        while len(self._open_cache) > self.config.max_open_segments:
            _, old = self._open_cache.popitem(last=False)
            if old is not self._segments[-1]:
                old.release()

    # --- start and terms ------------------------------------------------------------------

    def _set_start(self, index: int, offset: int, prev_term: int) -> None:
        self.start_index, self.start_offset, self._prev_term = index, offset, prev_term
        self._write_start()

    def _write_start(self) -> None:
        checkpoints.write_start(
            self.directory, self.start_index, self.start_offset, self._prev_term
        )

    def _write_terms(self) -> None:
        """Save the terms checkpoint, unless it already holds them: written at every
        open and close, it cost each of thousands of replicas two fsyncs for nothing."""
        if self._terms == self._terms_saved:
            return
        checkpoints.write_terms(self.directory, self._terms)
        self._terms_saved = list(self._terms)

    def _drop_terms_below_start(self) -> None:
        keep = checkpoints.boundary_at(self._terms, self.start_index)
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
            pos = checkpoints.boundary_at(self._terms, index)
            assert pos >= 0, f"no term boundary at or below index {index}"
            return self._terms[pos][1]

    @property
    def last_index(self) -> int:
        return self.next_index - 1

    @property
    def last_term(self) -> int:
        return self.term_at(self.next_index - 1)

    # --- writes (writes.py) ---------------------------------------------------------------

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
        return writes.append(self, buf if type(buf) is bytes else bytes(buf), crc_checked)

    def flush(self) -> None:
        """Make every entry appended before this call durable, sharing fsyncs between callers.

        A caller that finds a flush in progress waits for it and, if that flush did not
        cover its entries, joins the next one: N concurrent callers cost about 2 fsyncs.
        """
        writes.flush(self)

    def flush_if_due(self) -> bool:
        """For the INTERVAL policy: flush when ``flush_interval_ms`` passed since the last one."""
        return writes.flush_if_due(self)

    def reconfigure(self, config: LogConfig) -> None:
        """Take new settings while open (a topic's config was altered): each is read where
        it acts (the next append checks the new size limit and roll rule, the next
        retention pass the new retention), so nothing reopens and nothing written moves.
        Bytes kept back under the old write-behind go to the kernel now if the new one
        keeps less back."""
        with self._lock:
            old, self.config = self.config, config
            if config.preallocate_bytes != old.preallocate_bytes or (
                config.segment_bytes != old.segment_bytes
            ):
                step_bytes = min(config.preallocate_bytes, config.segment_bytes)
                self._pacer = Pacer(step_bytes, self._clock_ms, BUDGET) if step_bytes > 0 else None
                if self._segments and self._segments[-1].writable:
                    self._segments[-1].pacer = self._pacer
            if config.write_behind_bytes < old.write_behind_bytes and self._segments:
                active = self._segments[-1]
                if active.writable:
                    active.drain()

    # --- reads (reads.py) -----------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, upper_offset: int | None = None) -> ReadResult:
        """Whole entries from the one holding message ``offset``, up to ``max_bytes`` (always at
        least one entry), none holding offsets at or above ``upper_offset`` (the high watermark).

        The range starts at the DATA entry holding ``offset``; control entries between data
        entries are included as stored (clients skip them by type). Reading at the end
        returns no data; below the start or past the end raises OutOfRangeError.
        """
        with self._lock:
            self._check_open()
            return reads.read_from_offset(self, offset, max_bytes, upper_offset)

    def read_filtered(
        self, offset: int, max_bytes: int, flt: TagFilter, *, upper_offset: int | None = None
    ) -> FilteredRead:
        """:meth:`read` with a tag filter: only the entries that may hold a record matching
        ``flt``, and ``next_offset`` past everything looked at (filtered_reads.py)."""
        with self._lock:
            self._check_open()
            return filtered_reads.read_filtered(self, offset, max_bytes, upper_offset, flt)

    def read_entries(self, lo: int, max_bytes: int, hi: int | None = None) -> bytes:
        """Concatenated whole entries with Raft index in [lo, hi), at most ``max_bytes`` but
        always at least one; the Raft replication path."""
        return self.read_by_index(lo, max_bytes, hi).data

    def read_by_index(self, lo: int, max_bytes: int, hi: int | None = None) -> ReadResult:
        with self._lock:
            self._check_open()
            return reads.read_from_index(self, lo, max_bytes, hi)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Base offset of the first DATA entry whose max timestamp is >= ``timestamp_ms``, or
        None when no entry is that recent. Batch granularity: the entry may hold earlier
        records."""
        with self._lock:
            self._check_open()
            return reads.offset_for_timestamp(self, timestamp_ms)

    # --- truncation and retention (truncation.py) -----------------------------------------

    def truncate_suffix(self, index: int) -> None:
        """Remove every entry with Raft index >= ``index`` (Raft conflict resolution).

        Later segments go first, newest first, each unlink made durable before the next, so a
        crash leaves a contiguous prefix; the cut inside a segment is one ftruncate + fsync.
        """
        with self._lock:
            truncation.truncate_suffix(self, index)

    def truncate_prefix(
        self, index: int, *, offset: int | None = None, prev_term: int | None = None
    ) -> None:
        """Forget entries below ``index`` (retention, snapshots). Within the log the start
        moves and whole segments below it are deleted; past the end the log restarts empty at
        ``index``/``offset`` with ``prev_term`` as the term before it (snapshot install)."""
        with self._lock:
            truncation.truncate_prefix(self, index, offset, prev_term)

    def apply_retention(self, *, max_index: int | None = None) -> int:
        """Delete whole closed segments older than ``retention.ms`` or beyond
        ``retention.bytes``; never the active one, never one holding index >= ``max_index``
        (Raft passes what is committed and applied). Returns how many were deleted."""
        with self._lock:
            return truncation.apply_retention(self, max_index)

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
                raise reads.corrupt(seg, result.valid_end, result.error)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.flush()
            writes.wait_no_flush(self)
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


__all__ = [
    "READ_SLACK_BYTES",
    "START_CHECKPOINT",
    "TERMS_CHECKPOINT",
    "AppendInfo",
    "Log",
    "ReadResult",
    "RecoveryReport",
    "fsync_dir",
]
