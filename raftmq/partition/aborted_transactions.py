"""The aborted transactions of a partition: what a ``read_committed`` fetch lists so the
reader drops their batches (FetchResponse.aborted_transactions, docs/transactions.md).

Each ABORT marker that closes an open transaction adds (producer id, the transaction's
first offset, the marker's offset); they come in log order, so by marker offset. A fetch
asks for the ones overlapping its range with bisections, never a log scan.

Two tiers, so memory stays bounded however many aborted transactions retention keeps:

- the **tail**: the latest ones, in memory (three 8-byte integers each, in ``array``s),
  saved with the producer-state checkpoint;
- **runs**: once the tail holds :data:`SEAL_ENTRIES`, the producer-state tracking
  (raftmq.partition.producer_tracking) seals it into an index file of its own in the
  partition's directory (``<Raft index it was sealed at>.txnindex``, CRC-framed,
  written atomically, never changed). Memory keeps only each run's bounds; a fetch whose range a
  run may overlap reads that file (the last :data:`RUNS_CACHED` read stay decoded).

Runs are deleted as retention moves the log start past their last marker. This object
itself does no I/O but reading a run (``directory`` set by the tracking): sealing and
deleting are the tracking's, which orders them around its checkpoints.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from raftmq.log.atomic_file import read_atomic

SEAL_ENTRIES = 1024
"""Aborted transactions the tail holds before it is sealed into a run file (24 KiB)."""
RUNS_CACHED = 2
"""Decoded runs kept per partition after a fetch read them."""
RUN_SUFFIX = ".txnindex"


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int
    """The offset of the transaction's first batch on this partition."""
    last_offset: int
    """The ABORT marker's offset (the next record's): the producer's batches from
    ``first_offset`` up to, not including, it are the transaction's."""


class AbortedIndexError(Exception):
    """A run file the index relies on is missing or damaged."""


@dataclass(frozen=True, slots=True)
class Run:
    """A sealed run's bounds, all that memory keeps of it."""

    name: str
    """Its file's name in the partition's directory."""
    first_last: int
    last_last: int
    """The marker offsets of its first and last transaction."""
    max_span: int
    count: int

    def to_json(self) -> list[object]:
        return [self.name, self.first_last, self.last_last, self.max_span, self.count]

    @classmethod
    def from_json(cls, row: list[object]) -> Run:
        match row:
            case [str(name), int(first_last), int(last_last), int(max_span), int(count)] if (
                name.endswith(RUN_SUFFIX)
                and 0 <= first_last <= last_last
                and max_span >= 0
                and count >= 1
            ):
                return cls(name, first_last, last_last, max_span, count)
        raise ValueError(f"an aborted-transaction run row is malformed: {row[:6]}")


class _Columns:
    """Aborted transactions as three parallel arrays, by marker offset."""

    __slots__ = ("firsts", "lasts", "max_span", "producers")

    def __init__(self) -> None:
        self.producers = array("q")
        self.firsts = array("q")
        self.lasts = array("q")
        """Non-decreasing: markers are applied in log order."""
        self.max_span = 0
        """The largest ``last - first`` held: bounds how far past a range a marker of a
        transaction overlapping it can stand."""

    def __len__(self) -> int:
        return len(self.lasts)

    def add(self, producer_id: int, first_offset: int, last_offset: int) -> None:
        self.producers.append(producer_id)
        self.firsts.append(first_offset)
        self.lasts.append(last_offset)
        self.max_span = max(self.max_span, last_offset - first_offset)

    def overlapping(self, lo: int, hi: int) -> list[AbortedTransaction]:
        # A candidate's marker is past ``lo``, and (its first offset being below ``hi``)
        # less than the largest span past ``hi``.
        lasts = self.lasts
        start = bisect_right(lasts, lo)
        end = bisect_left(lasts, hi + self.max_span, start)
        return [
            AbortedTransaction(self.producers[i], self.firsts[i], lasts[i])
            for i in range(start, end)
            if self.firsts[i] < hi
        ]

    def trim(self, start_offset: int) -> None:
        lasts = self.lasts
        if not lasts or lasts[0] > start_offset:
            return
        cut = bisect_right(lasts, start_offset)
        del self.producers[:cut], self.firsts[:cut], lasts[:cut]
        self.max_span = max((b - a for a, b in zip(self.firsts, lasts, strict=True)), default=0)

    def rows(self) -> list[list[int]]:
        return [list(t) for t in zip(self.producers, self.firsts, self.lasts, strict=True)]

    def encode(self) -> bytes:
        out = bytearray()
        for column in (self.producers, self.firsts, self.lasts):
            data = array("q", column)
            if sys.byteorder != "little":
                data.byteswap()
            out += data.tobytes()
        return bytes(out)

    @classmethod
    def decode(cls, payload: bytes, count: int) -> _Columns:
        if len(payload) != 24 * count:
            raise ValueError(f"{len(payload)} bytes for {count} aborted transactions")
        out = cls()
        for i, column in enumerate((out.producers, out.firsts, out.lasts)):
            column.frombytes(payload[i * 8 * count : (i + 1) * 8 * count])
            if sys.byteorder != "little":
                column.byteswap()
        if any(b < a for a, b in zip(out.lasts, out.lasts[1:], strict=False)):
            raise ValueError("marker offsets out of order")
        out.max_span = max((b - a for a, b in zip(out.firsts, out.lasts, strict=True)), default=0)
        return out


class AbortedTransactions:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        """Where run files are (None: a state with no runs, as in the pure tests)."""
        self._tail = _Columns()
        self.runs: list[Run] = []
        """Sealed, by marker offset (each run's markers after the previous run's)."""
        self._run_lasts: list[int] = []
        self._runs_max_span = 0
        self._held: dict[str, _Columns] = {}
        """Runs sealed and not yet written: read from memory until their file is in."""
        self._cache: OrderedDict[str, _Columns] = OrderedDict()
        self.dropped: list[str] = []
        """Run files retention passed: the tracking deletes them once a checkpoint that no
        longer lists them is written."""

    def __len__(self) -> int:
        return len(self._tail) + sum(run.count for run in self.runs)

    @property
    def tail_size(self) -> int:
        return len(self._tail)

    def add(self, producer_id: int, first_offset: int, last_offset: int) -> None:
        newest = self._newest_last()
        assert newest is None or last_offset >= newest, (last_offset, newest)
        self._tail.add(producer_id, first_offset, last_offset)

    def _newest_last(self) -> int | None:
        """The marker offset of the newest aborted transaction held, tail or runs."""
        if self._tail.lasts:
            return self._tail.lasts[-1]
        return self.runs[-1].last_last if self.runs else None

    def overlapping(self, lo: int, hi: int) -> list[AbortedTransaction]:
        """The aborted transactions with batches in offsets [lo, hi) (a fetch's range),
        by first offset. Raises AbortedIndexError when a run it needs cannot be read."""
        found: list[AbortedTransaction] = []
        runs = self.runs
        for run in runs[bisect_right(self._run_lasts, lo) :]:
            if run.first_last >= hi + self._runs_max_span:
                break
            if run.first_last < hi + run.max_span:
                found += self._columns(run).overlapping(lo, hi)
        found += self._tail.overlapping(lo, hi)
        found.sort(key=lambda t: t.first_offset)
        return found

    def trim(self, start_offset: int) -> None:
        """Forget the transactions whose batches all lie below ``start_offset`` (the log
        start: retention deleted them); a run wholly below it is dropped."""
        self._tail.trim(start_offset)
        cut = 0
        while cut < len(self.runs) and self.runs[cut].last_last <= start_offset:
            cut += 1
        if cut:
            for run in self.runs[:cut]:
                self.dropped.append(run.name)
                self._held.pop(run.name, None)
                self._cache.pop(run.name, None)
            del self.runs[:cut], self._run_lasts[:cut]
            self._runs_max_span = max((run.max_span for run in self.runs), default=0)

    # --- runs (driven by the tracking) ----------------------------------------------------

    def seal(self, applied_index: int) -> Run:
        """Turn the tail into a run, read from memory until :meth:`written` says its file
        (:meth:`unwritten`) is in. Its name is the Raft index the state was at: applied
        entries are never taken back, so no two runs of a replica share one."""
        tail = self._tail
        assert len(tail) > 0, "nothing to seal"
        run = Run(
            f"{applied_index:020d}{RUN_SUFFIX}",
            tail.lasts[0],
            tail.lasts[-1],
            tail.max_span,
            len(tail),
        )
        assert not self.runs or run.first_last >= self.runs[-1].last_last
        self._append_run(run)
        self._held[run.name] = tail
        self._tail = _Columns()
        return run

    def unwritten(self) -> list[tuple[str, bytes]]:
        """The runs sealed whose files are not known to be in: (name, payload) each."""
        return [(name, columns.encode()) for name, columns in self._held.items()]

    def _append_run(self, run: Run) -> None:
        self.runs.append(run)
        self._run_lasts.append(run.last_last)
        self._runs_max_span = max(self._runs_max_span, run.max_span)

    def written(self, name: str) -> None:
        """The run's file is durable: its columns leave memory."""
        self._held.pop(name, None)

    def _columns(self, run: Run) -> _Columns:
        held = self._held.get(run.name)
        if held is not None:
            return held
        cached = self._cache.get(run.name)
        if cached is not None:
            self._cache.move_to_end(run.name)
            return cached
        columns = read_run(self.directory, run)
        self._cache[run.name] = columns
        while len(self._cache) > RUNS_CACHED:
            self._cache.popitem(last=False)
        return columns

    # --- encoding -------------------------------------------------------------------------

    def to_json(self) -> list[list[int]]:
        """The tail (runs are listed by :meth:`runs_to_json`)."""
        return self._tail.rows()

    def runs_to_json(self) -> list[list[object]]:
        return [run.to_json() for run in self.runs]

    def all_to_json(self) -> list[list[int]]:
        """Every aborted transaction, runs read back (for a peer, which has no run files)."""
        rows: list[list[int]] = []
        for run in self.runs:
            rows += self._columns(run).rows()
        return rows + self._tail.rows()

    @classmethod
    def from_json(
        cls,
        rows: list[list[int]],
        runs: list[list[object]] | None = None,
        directory: Path | None = None,
    ) -> AbortedTransactions:
        """A tail and the runs it follows; each run's file is read and checked now (a
        missing or damaged one raises ValueError: the state cannot be trusted)."""
        out = cls(directory)
        for listed in runs or ():
            run = Run.from_json(listed)
            if out.runs and run.first_last < out.runs[-1].last_last:
                raise ValueError(f"aborted-transaction runs out of order at {run.name}")
            try:
                read_run(directory, run)
            except AbortedIndexError as exc:
                raise ValueError(str(exc)) from None
            out._append_run(run)
        for row in rows:
            if len(row) != 3 or not all(isinstance(x, int) for x in row):
                raise ValueError(f"an aborted transaction row is malformed: {row[:8]}")
            newest = out._newest_last()
            if newest is not None and row[2] < newest:
                raise ValueError(f"aborted transactions out of order at {row}")
            out._tail.add(*row)
        return out


def read_run(directory: Path | None, run: Run) -> _Columns:
    """A run file's columns, checked against its bounds."""
    if directory is None:
        raise AbortedIndexError(f"run {run.name} has no directory to be read from")
    path = directory / run.name
    try:
        payload = read_atomic(path)
    except OSError as exc:
        raise AbortedIndexError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if payload is None:
        raise AbortedIndexError(f"{path} is missing or fails its CRC")
    try:
        columns = _Columns.decode(payload, run.count)
    except ValueError as exc:
        raise AbortedIndexError(f"{path} does not decode ({exc})") from None
    if (columns.lasts[0], columns.lasts[-1]) != (run.first_last, run.last_last):
        raise AbortedIndexError(f"{path} does not hold the run its checkpoint lists")
    return columns
