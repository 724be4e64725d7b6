"""The aborted transactions of a partition: what a ``read_committed`` fetch lists so the
reader drops their batches (FetchResponse.aborted_transactions, docs/transactions.md).

Each ABORT marker that closes an open transaction adds (producer id, the transaction's
first offset, the marker's offset); they come in log order, so by marker offset. A fetch
asks for the ones overlapping its range with two bisections, never a log scan. The list
lives in memory (three 8-byte integers per aborted transaction, in ``array``s), is saved
with the producer-state checkpoint and rebuilt on open from it plus the log after it,
like the producer state (raftmq.partition.producer_tracking); entries wholly below the
log start are dropped as retention moves it. Known limit: a partition that holds millions
of aborted transactions keeps them all in memory (24 bytes each); a per-segment index file
is the later step.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import NamedTuple


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int
    """The offset of the transaction's first batch on this partition."""
    last_offset: int
    """The ABORT marker's offset (the next record's): the producer's batches from
    ``first_offset`` up to, not including, it are the transaction's."""


class AbortedTransactions:
    def __init__(self) -> None:
        self._producers = array("q")
        self._firsts = array("q")
        self._lasts = array("q")
        """Non-decreasing: markers are applied in log order."""
        self._max_span = 0
        """The largest ``last - first`` held: bounds how far past a range a marker of a
        transaction overlapping it can stand."""

    def __len__(self) -> int:
        return len(self._lasts)

    def add(self, producer_id: int, first_offset: int, last_offset: int) -> None:
        assert not self._lasts or last_offset >= self._lasts[-1], (last_offset, self._lasts[-1])
        self._producers.append(producer_id)
        self._firsts.append(first_offset)
        self._lasts.append(last_offset)
        self._max_span = max(self._max_span, last_offset - first_offset)

    def overlapping(self, lo: int, hi: int) -> list[AbortedTransaction]:
        """The aborted transactions with batches in offsets [lo, hi) (a fetch's range),
        by first offset."""
        # A candidate's marker is past ``lo``, and (its first offset being below ``hi``)
        # less than the largest span past ``hi``.
        lasts = self._lasts
        start = bisect_right(lasts, lo)
        end = bisect_left(lasts, hi + self._max_span, start)
        found = [
            AbortedTransaction(self._producers[i], self._firsts[i], lasts[i])
            for i in range(start, end)
            if self._firsts[i] < hi
        ]
        found.sort(key=lambda t: t.first_offset)
        return found

    def trim(self, start_offset: int) -> None:
        """Forget the transactions whose batches all lie below ``start_offset`` (the log
        start: retention deleted them)."""
        lasts = self._lasts
        if not lasts or lasts[0] > start_offset:
            return
        cut = bisect_right(lasts, start_offset)
        del self._producers[:cut], self._firsts[:cut], lasts[:cut]
        self._max_span = max((b - a for a, b in zip(self._firsts, lasts, strict=True)), default=0)

    def to_json(self) -> list[list[int]]:
        return [list(t) for t in zip(self._producers, self._firsts, self._lasts, strict=True)]

    @classmethod
    def from_json(cls, rows: list[list[int]]) -> AbortedTransactions:
        out = cls()
        for row in rows:
            if len(row) != 3 or not all(isinstance(x, int) for x in row):
                raise ValueError(f"an aborted transaction row is malformed: {row[:8]}")
            if out._lasts and row[2] < out._lasts[-1]:
                raise ValueError(f"aborted transactions out of order at {row}")
            out.add(*row)
        return out
