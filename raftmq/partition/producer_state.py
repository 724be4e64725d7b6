"""What a partition remembers of each idempotent producer, to store each of its batches
once and in order (docs/format.md, "Producers"; the producer side: raftmq.client.producer).

A producer id comes with an epoch and numbers its records per partition from 0 (the
entry header's ``base_sequence`` is its first record's). For each producer the partition
keeps the epoch and its last :data:`~raftmq.limits.KEPT_BATCHES` batches (a bound the
producer keeps too, so it is defined at the api floor): a batch sent again (its answer
was lost) is recognised by its sequence range and answered with the offsets it got the
first time; a batch that does not follow the last one is refused as out of
order; a batch of an older epoch is refused as fenced (a newer session of the same
producer took over). Kafka keeps five batches because its producer keeps at most five in
flight per partition; so do we.

Pure and deterministic: the state changes only by :meth:`ProducerStates.apply` of
committed entries, in log order, so every replica builds the same state from the same
log and a new leader needs nothing but its log. Batches proposed but not yet committed
are the leader's business (:meth:`check` takes them into account through ``pending``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from raftmq.limits import KEPT_BATCHES

MAX_PRODUCERS = 10_000
"""Per partition; past it the producer idle longest is forgotten (bounded memory). A
forgotten producer's next batch is UNKNOWN_PRODUCER: it starts a new epoch at 0."""


@dataclass(frozen=True, slots=True)
class BatchRange:
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: list[BatchRange] = field(default_factory=list)
    """The last KEPT_BATCHES batches, oldest first."""
    last_timestamp_ms: int = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"
    UNKNOWN_PRODUCER = "unknown_producer"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    message: str = ""
    duplicate_of: BatchRange | None = None


APPEND = Decision(Verdict.APPEND)


class ProducerStates:
    def __init__(self) -> None:
        self._producers: OrderedDict[int, ProducerEntry] = OrderedDict()
        """Least recently written first (evicted first)."""

    def __len__(self) -> int:
        return len(self._producers)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def check(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        record_count: int,
        pending: Iterable[tuple[int, int, int]] = (),
    ) -> Decision:
        """What to do with a batch. ``pending``: the (epoch, first, last) sequences of
        this producer's batches proposed but not committed yet, in proposal order; a
        duplicate of one of them is DUPLICATE with ``duplicate_of`` None (wait for it)."""
        assert record_count > 0, record_count
        last = first_sequence + record_count - 1
        entry = self._producers.get(producer_id)
        pending = list(pending)
        for p_epoch, p_first, p_last in pending:
            if (p_epoch, p_first, p_last) == (epoch, first_sequence, last):
                return Decision(Verdict.DUPLICATE)
        current_epoch = pending[-1][0] if pending else (entry.epoch if entry else None)
        expected = pending[-1][2] + 1 if pending else (entry.last_sequence + 1 if entry else 0)
        if current_epoch is None:
            if first_sequence == 0:
                return APPEND
            return Decision(
                Verdict.UNKNOWN_PRODUCER,
                f"this partition holds no batch of producer {producer_id} (it never wrote "
                f"here, or retention deleted its batches), so sequence {first_sequence} "
                "cannot be checked; start a new epoch from sequence 0",
            )
        if epoch < current_epoch:
            return Decision(
                Verdict.FENCED,
                f"producer {producer_id} epoch {epoch} is fenced: epoch {current_epoch} "
                "wrote here since (a newer session of this producer took over)",
            )
        if epoch > current_epoch:
            if first_sequence == 0:
                return APPEND
            return Decision(
                Verdict.OUT_OF_ORDER,
                f"producer {producer_id} starts epoch {epoch} at sequence {first_sequence}; "
                "a new epoch starts at sequence 0",
            )
        if entry is not None and entry.epoch == epoch:
            for batch in entry.batches:
                if (batch.first_sequence, batch.last_sequence) == (first_sequence, last):
                    return Decision(Verdict.DUPLICATE, duplicate_of=batch)
        if first_sequence != expected:
            return Decision(
                Verdict.OUT_OF_ORDER,
                f"producer {producer_id} epoch {epoch} sent sequence {first_sequence}, but "
                f"the next this partition expects is {expected}"
                + (
                    " (a batch before it was lost or is still on its way)"
                    if first_sequence > expected
                    else " (an older batch, no longer kept)"
                ),
            )
        return APPEND

    def apply(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        record_count: int,
        base_offset: int,
        timestamp_ms: int,
    ) -> None:
        """A committed batch of an idempotent producer, in log order. Deterministic: a
        replica applying the same log ends in the same state."""
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = ProducerEntry(epoch)
            self._producers[producer_id] = entry
        elif epoch < entry.epoch:
            return  # a fenced epoch's batch that made it into the log before the fence
        batch = BatchRange(
            first_sequence,
            first_sequence + record_count - 1,
            base_offset,
            base_offset + record_count - 1,
        )
        entry.batches.append(batch)
        del entry.batches[:-KEPT_BATCHES]
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        self._producers.move_to_end(producer_id)
        while len(self._producers) > MAX_PRODUCERS:
            self._producers.popitem(last=False)

    # --- checkpoints ------------------------------------------------------------------------

    def to_json(self) -> list[list[int]]:
        """Plain JSON (one list per producer, least recently written first), so a replica
        opening need not read its whole log back to rebuild the state."""
        out = []
        for pid, e in self._producers.items():
            row = [pid, e.epoch, e.last_timestamp_ms]
            for b in e.batches:
                row += [b.first_sequence, b.last_sequence, b.base_offset, b.last_offset]
            out.append(row)
        return out

    @classmethod
    def from_json(cls, rows: list[list[int]]) -> ProducerStates:
        states = cls()
        for row in rows:
            if len(row) < 3 or (len(row) - 3) % 4 or not all(isinstance(x, int) for x in row):
                raise ValueError(f"a producer state row is malformed: {row[:8]}")
            pid, epoch, ts = row[:3]
            batches = [BatchRange(*row[i : i + 4]) for i in range(3, len(row), 4)]
            states._producers[pid] = ProducerEntry(epoch, batches[-KEPT_BATCHES:], ts)
        return states
