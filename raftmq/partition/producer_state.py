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

Transactions (docs/transactions.md): a transactional batch (attribute bit 4) opens the
producer's transaction on this partition when none is open, and a TXN_MARKER closes it
(:meth:`ProducerStates.apply_marker`). The marker carries the epoch the coordinator moved
the producer to, so it also raises the producer's epoch here and forgets its sequences: a
late batch of the ended transaction is then fenced, and the next transaction starts at
sequence 0. The open transactions give the last stable offset (:meth:`first_open_offset`),
and ABORT markers feed the aborted-transaction list (raftmq.partition.aborted_transactions).

Pure and deterministic: the state changes only by :meth:`ProducerStates.apply` and
:meth:`ProducerStates.apply_marker` of committed entries, in log order, so every replica
builds the same state from the same log and a new leader needs nothing but its log. Writes
proposed but not yet committed are the leader's business (:meth:`check` and
:meth:`check_marker` take them into account through ``pending``, as if they were applied).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol

from raftmq.format.delay import is_mover
from raftmq.limits import KEPT_BATCHES
from raftmq.partition.aborted_transactions import AbortedTransactions

MAX_PRODUCERS = 10_000
"""Per partition; past it the producer idle longest is forgotten (bounded memory). A
forgotten producer's next batch is UNKNOWN_PRODUCER: it starts a new epoch at 0."""


@dataclass(frozen=True, slots=True)
class BatchRange:
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A producer's transaction on this partition that no marker has closed yet."""

    first_offset: int
    """The base offset of its first batch here: the last stable offset stays at or below it."""
    epoch: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: list[BatchRange] = field(default_factory=list)
    """The last KEPT_BATCHES batches, oldest first."""
    last_timestamp_ms: int = -1
    transaction: OpenTransaction | None = None

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"
    UNKNOWN_PRODUCER = "unknown_producer"
    INVALID_TXN_STATE = "invalid_txn_state"
    """An idempotent batch from a producer with a transaction open here."""
    CONCURRENT_TRANSACTIONS = "concurrent_transactions"
    """A transactional batch of a newer epoch while the older transaction's marker has
    not arrived yet (retriable)."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    message: str = ""
    duplicate_of: BatchRange | None = None


APPEND = Decision(Verdict.APPEND)


class MarkerVerdict(Enum):
    APPEND = "append"
    """The marker ends a transaction or raises the epoch here: append it."""
    HELD = "held"
    """This partition already holds it (a resend): answer at once, append nothing."""
    WAIT = "wait"
    """A marker of this epoch or a newer one is proposed and not committed yet: its
    outcome is this one's answer."""


class PendingWrite(Protocol):
    """A write of one producer that the leader proposed and has not applied yet, as the
    checks see it: a batch (its sequences, whether transactional) or a marker.
    raftmq.partition.producer_tracking's proposals have these fields, so a check reads
    them as they are (no copy per check on the produce path)."""

    @property
    def epoch(self) -> int: ...
    @property
    def first_sequence(self) -> int: ...
    @property
    def last_sequence(self) -> int: ...
    @property
    def transactional(self) -> bool: ...
    @property
    def is_marker(self) -> bool: ...


class Proposal(NamedTuple):
    """A :class:`PendingWrite` as plain values (tests, and markers: first_sequence -1)."""

    epoch: int
    first_sequence: int
    last_sequence: int
    transactional: bool = False

    @property
    def is_marker(self) -> bool:
        return self.first_sequence < 0


def marker_proposal(epoch: int) -> Proposal:
    return Proposal(epoch, -1, -1)


class _Projected(NamedTuple):
    """A producer's state here once every pending proposal is applied: what a check
    compares against (None epoch: unknown here)."""

    epoch: int | None
    next_sequence: int
    transaction_epoch: int | None


def _project(entry: ProducerEntry | None, pending: Sequence[PendingWrite]) -> _Projected:
    """The same steps as :meth:`ProducerStates.apply` and :meth:`ProducerStates.apply_marker`,
    on the three values the checks need."""
    if entry is None:
        epoch, expected, txn = None, 0, None
    else:
        epoch, expected = entry.epoch, entry.last_sequence + 1
        txn = entry.transaction.epoch if entry.transaction is not None else None
    for p in pending:
        if p.is_marker:
            if txn is not None and txn < p.epoch:
                txn = None
            if epoch is None or p.epoch > epoch:
                epoch, expected = p.epoch, 0
        elif epoch is None or p.epoch >= epoch:
            epoch, expected = p.epoch, p.last_sequence + 1
            if p.transactional and txn is None:
                txn = p.epoch
    return _Projected(epoch, expected, txn)


def _check_sparse(
    producer_id: int,
    entry: ProducerEntry | None,
    first_sequence: int,
    last_sequence: int,
    pending: Sequence[PendingWrite],
) -> Decision:
    """The rule for a delay mover's batches (docs/delayed-delivery.md): its sequences
    may skip (a record it dropped) and its epoch never changes, so a batch is new when it
    starts past everything held, a duplicate when it ends at or before what is committed
    (its mover sends each destination one batch at a time, in order, so everything up to
    the last committed sequence was stored), and anything else overlaps: refused, and the
    mover sends its records one by one (each then new or a duplicate). A batch covered
    only by a proposal not yet committed is refused too (retriable): answering it as
    stored before it commits could lose it."""
    committed = entry.last_sequence if entry is not None else -1
    held = max([committed, *(p.last_sequence for p in pending if not p.is_marker)])
    if first_sequence > held:
        return APPEND
    if last_sequence <= committed:
        assert entry is not None and entry.batches
        return Decision(Verdict.DUPLICATE, duplicate_of=entry.batches[-1])
    return Decision(
        Verdict.OUT_OF_ORDER,
        f"delay mover {producer_id} sent sequences {first_sequence}-{last_sequence}, which "
        f"overlap what this partition holds (up to {committed} committed, {held} proposed); "
        "send them one by one, or again once the proposal commits",
    )


class ProducerStates:
    def __init__(self) -> None:
        self._producers: OrderedDict[int, ProducerEntry] = OrderedDict()
        """Least recently written first (evicted first)."""
        self._open: OrderedDict[int, int] = OrderedDict()
        """Producer id -> first offset of its open transaction, in the order they opened
        (log order, so by first offset: the first one bounds the last stable offset)."""
        self.aborted = AbortedTransactions()

    def __len__(self) -> int:
        return len(self._producers)

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def first_open_offset(self) -> int | None:
        """The first offset of the oldest open transaction, None when none is open."""
        return next(iter(self._open.values()), None)

    def open_transactions(self) -> list[tuple[int, OpenTransaction]]:
        """(producer id, its open transaction), oldest first."""
        out = []
        for pid in self._open:
            txn = self._producers[pid].transaction
            assert txn is not None, pid
            out.append((pid, txn))
        return out

    def check(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        record_count: int,
        pending: Sequence[PendingWrite] = (),
        *,
        transactional: bool = False,
    ) -> Decision:
        """What to do with a batch. ``pending``: this producer's writes proposed but not
        committed yet, in proposal order; a duplicate of a batch among them is DUPLICATE
        with ``duplicate_of`` None (wait for it)."""
        assert record_count > 0, record_count
        last = first_sequence + record_count - 1
        entry = self._producers.get(producer_id)
        if is_mover(producer_id):
            return _check_sparse(producer_id, entry, first_sequence, last, pending)
        for p in pending:
            if not p.is_marker and (p.epoch, p.first_sequence, p.last_sequence) == (
                epoch,
                first_sequence,
                last,
            ):
                return Decision(Verdict.DUPLICATE)
        current_epoch, expected, txn_epoch = _project(entry, pending)
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
                "wrote here since (a newer session of this producer took over, or its "
                "transaction of that epoch ended)",
            )
        if txn_epoch is not None and not transactional:
            return Decision(
                Verdict.INVALID_TXN_STATE,
                f"producer {producer_id} has a transaction open on this partition (epoch "
                f"{txn_epoch}); a batch without the transactional bit (0x10) cannot join "
                "it: send it in the transaction, or end the transaction first",
            )
        if txn_epoch is not None and epoch > txn_epoch:
            return Decision(
                Verdict.CONCURRENT_TRANSACTIONS,
                f"producer {producer_id}'s transaction of epoch {txn_epoch} is still open "
                f"on this partition (its marker is on its way); epoch {epoch} may write "
                "here once it has ended: retry shortly",
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

    def check_marker(
        self, producer_id: int, epoch: int, pending: Sequence[PendingWrite] = ()
    ) -> MarkerVerdict:
        """What to do with a transaction marker of ``epoch`` (docs/transactions.md): append
        it when it ends a transaction of an older epoch open here, or raises the epoch
        this partition knows for the producer; else it is a resend, held already."""
        if any(p.is_marker and p.epoch >= epoch for p in pending):
            return MarkerVerdict.WAIT
        current_epoch, _, txn_epoch = _project(self._producers.get(producer_id), pending)
        if (txn_epoch is not None and txn_epoch < epoch) or (
            current_epoch is None or current_epoch < epoch
        ):
            return MarkerVerdict.APPEND
        return MarkerVerdict.HELD

    def apply(
        self,
        producer_id: int,
        epoch: int,
        first_sequence: int,
        record_count: int,
        base_offset: int,
        timestamp_ms: int,
        *,
        transactional: bool = False,
    ) -> None:
        """A committed batch of an idempotent or transactional producer, in log order.
        Deterministic: a replica applying the same log ends in the same state."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = ProducerEntry(epoch)
            self._producers[producer_id] = entry
        elif epoch > entry.epoch:
            # A new epoch: its sequences start over. An open transaction stays open (the
            # leader refuses such a batch; a marker alone closes a transaction).
            entry.epoch, entry.batches = epoch, []
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
        if transactional and entry.transaction is None:
            entry.transaction = OpenTransaction(base_offset, epoch)
            self._open[producer_id] = base_offset
        self._touched(producer_id)

    def apply_marker(
        self, producer_id: int, epoch: int, commit: bool, offset: int, timestamp_ms: int
    ) -> None:
        """A committed TXN_MARKER at ``offset`` (its base offset: the next record's). It
        closes the producer's open transaction when that one's epoch is older (an ABORT
        lists it as aborted), and raises the producer's epoch here to the marker's,
        forgetting its sequences."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = ProducerEntry(epoch)
            self._producers[producer_id] = entry
        txn = entry.transaction
        if txn is not None and txn.epoch < epoch:
            entry.transaction = None
            del self._open[producer_id]
            if not commit:
                self.aborted.add(producer_id, txn.first_offset, offset)
        if epoch > entry.epoch:
            entry.epoch, entry.batches = epoch, []
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        self._touched(producer_id)

    def _touched(self, producer_id: int) -> None:
        """Mark the producer most recently written; past MAX_PRODUCERS forget the least
        recent, except those with a transaction open (their first offset holds the last
        stable offset: forgetting it would show the transaction's records as committed)."""
        producers = self._producers
        producers.move_to_end(producer_id)
        spared = 0
        while len(producers) > MAX_PRODUCERS and spared < len(producers):
            pid, entry = producers.popitem(last=False)
            if entry.transaction is not None or is_mover(pid):
                producers[pid] = entry
                spared += 1

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

    def transactions_to_json(self) -> list[list[int]]:
        """The open transactions, oldest first: [producer id, first offset, epoch] each
        (a list of its own, so a checkpoint written before transactions still loads)."""
        return [[pid, t.first_offset, t.epoch] for pid, t in self.open_transactions()]

    @classmethod
    def from_json(
        cls, rows: list[list[int]], transactions: list[list[int]] | None = None
    ) -> ProducerStates:
        states = cls()
        for row in rows:
            if len(row) < 3 or (len(row) - 3) % 4 or not all(isinstance(x, int) for x in row):
                raise ValueError(f"a producer state row is malformed: {row[:8]}")
            pid, epoch, ts = row[:3]
            batches = [BatchRange(*row[i : i + 4]) for i in range(3, len(row), 4)]
            states._producers[pid] = ProducerEntry(epoch, batches[-KEPT_BATCHES:], ts)
        for txn in transactions or ():
            if len(txn) != 3 or not all(isinstance(x, int) for x in txn):
                raise ValueError(f"an open transaction row is malformed: {txn[:8]}")
            pid, first_offset, epoch = txn
            entry = states._producers.get(pid)
            if entry is None:
                raise ValueError(f"open transaction of producer {pid}, which has no row")
            entry.transaction = OpenTransaction(first_offset, epoch)
            states._open[pid] = first_offset
        return states
