"""The transaction coordinator's state transitions (docs/transactions.md; the wire
contract is raftmq/api/v1/transactions.proto): a transactional id's producer id and
epoch, its transaction's partitions and consumer offsets, the commit or abort decision,
and the markers still to write. Pure, like every transition
(raftmq.controller.transitions); the running side is raftmq.controller.txn_coordinator.

The protocol is Kafka's with transaction protocol version 2 (KIP-890): the end of every
transaction moves the producer's epoch one up in the decision's own entry, and the
markers carry that new epoch, so a late batch or marker of an ended transaction can
never be taken for a later one's. An epoch would reach 32767: the producer gets a new
producer id at epoch 0 instead (from ``next_producer_id``, the counter idempotent
producers' blocks come from, so no id is used twice), and the markers carry the old id
at 32767.

A call carrying an older (producer id, epoch) than the id's is fenced, except the epoch
of the transaction just ended, whose calls get what fits who ended it
(:class:`~raftmq.controller.model.TxnEndedBy`): a retry of its EndTxn with the same
decision answers the same; a transaction the coordinator aborted (timeout, operator)
answers TRANSACTION_ABORTED, and its EndTxn(abort) succeeds.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from raftmq.controller import groups
from raftmq.controller.commands import (
    AbortTxn,
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    Done,
    EndTxn,
    InitTransactions,
    OffsetEntry,
    RecordTxnMarkers,
    Result,
    TransactionCalls,
    TxnOutcome,
    TxnOutcomes,
)
from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.model import (
    MetadataState,
    PartitionState,
    PendingOffset,
    TopicPartition,
    Transaction,
    TxnEndedBy,
    TxnState,
)
from raftmq.format.delay import MOVER_PRODUCER_ID_BASE

TRANSACTIONAL_ID = re.compile(r"\A[A-Za-z0-9._-]{1,200}\Z")
DEFAULT_TXN_TIMEOUT_MS = 60_000
MIN_TXN_TIMEOUT_MS = 1_000
MAX_TXN_TIMEOUT_MS = 900_000
MAX_TXN_PARTITIONS = 1_000
"""Partitions one transaction may write to, and partitions whose offsets it may carry:
each needs a marker, and the transaction's record sits in every metadata snapshot."""
MAX_TRANSACTIONAL_IDS = 10_000
"""Transactional ids the metadata keeps (each a small record in every snapshot)."""
MAX_PRODUCER_EPOCH = 32_767
"""The top of the entry header's 16-bit epoch: only markers carry it (the epoch a
producer is moved to at the end of its transaction at 32766); a producer never works
at it."""

Outcome = tuple[MetadataState, Result]


def apply_calls(state: MetadataState, index: int, c: TransactionCalls) -> Outcome:
    """Each call of the batch applied or refused alone, in order: the batch's calls were
    all in flight together, so this order is as valid as any."""
    outcomes = []
    for call in c.calls:
        request = call.request
        if request is None:  # only a bug of ours proposes one, but applying never raises
            outcomes.append(TxnOutcome(Code.MALFORMED_COMMAND.value, "not exactly one request"))
            continue
        try:
            state, outcome = _HANDLERS[type(request)](state, request, c.now_ms)
        except CommandRefused as refusal:
            outcome = TxnOutcome(refusal.code.value, refusal.message)
        outcomes.append(outcome)
    return state, TxnOutcomes(tuple(outcomes))


# -- a producer's calls ------------------------------------------------------------------


def _init(
    state: MetadataState, c: InitTransactions, now_ms: int
) -> tuple[MetadataState, TxnOutcome]:
    _check_id(c.transactional_id)
    if not MIN_TXN_TIMEOUT_MS <= c.timeout_ms <= MAX_TXN_TIMEOUT_MS:
        raise CommandRefused(
            Code.INVALID_TXN_TIMEOUT,
            f"transaction_timeout_ms {c.timeout_ms} is not between {MIN_TXN_TIMEOUT_MS} and "
            f"{MAX_TXN_TIMEOUT_MS} (0 for the default, {DEFAULT_TXN_TIMEOUT_MS})",
        )
    txn = state.transactions.get(c.transactional_id)
    if txn is None:
        if len(state.transactions) >= MAX_TRANSACTIONAL_IDS:
            raise CommandRefused(
                Code.INVALID_TRANSACTIONAL_ID,
                f"the cluster holds {MAX_TRANSACTIONAL_IDS} transactional ids, the most it "
                "keeps; reuse the ids of instances that are gone",
            )
        state, producer_id = _new_producer_id(state)
        txn = Transaction(c.transactional_id, producer_id, 0, TxnState.EMPTY, c.timeout_ms)
        return _with(state, txn), TxnOutcome("", "", producer_id, 0)
    _check_markers_written(txn)
    if txn.state == TxnState.ONGOING:
        # The transaction an older instance left open is aborted at a new epoch (which
        # fences that instance), and this call is answered once its markers are written.
        state, txn = _decide(state, txn, commit=False, ended_by=TxnEndedBy.INIT, now_ms=now_ms)
        if txn.state.ending:
            return _with(state, txn), TxnOutcome(
                Code.CONCURRENT_TRANSACTIONS.value,
                f"transactional id {txn.transactional_id} had a transaction open, which is "
                "being aborted now; retry shortly",
            )
    state, (producer_id, epoch) = _bumped(state, txn.producer_id, txn.producer_epoch)
    txn = Transaction(txn.transactional_id, producer_id, epoch, TxnState.EMPTY, c.timeout_ms)
    return _with(state, txn), TxnOutcome("", "", producer_id, epoch)


def _add_partitions(
    state: MetadataState, c: AddPartitionsToTxn, now_ms: int
) -> tuple[MetadataState, TxnOutcome]:
    txn = _open_for_more(state, c.transactional_id, c.producer_id, c.producer_epoch, now_ms)
    for tp in c.partitions:
        _check_partition(state, tp.topic, tp.partition)
    partitions = tuple(sorted({*txn.partitions, *c.partitions}))
    if len(partitions) > MAX_TXN_PARTITIONS:
        raise CommandRefused(
            Code.TOO_MANY_TXN_PARTITIONS,
            f"the transaction would write to {len(partitions)} partitions; at most "
            f"{MAX_TXN_PARTITIONS}: abort it and use smaller transactions",
        )
    return _with(state, dataclasses.replace(txn, partitions=partitions)), TxnOutcome("", "")


def _add_offsets(
    state: MetadataState, c: AddOffsetsToTxn, now_ms: int
) -> tuple[MetadataState, TxnOutcome]:
    txn = _open_for_more(state, c.transactional_id, c.producer_id, c.producer_epoch, now_ms)
    if txn.group_id not in ("", c.commit.group_id):
        raise CommandRefused(
            Code.INVALID_TXN_STATE,
            f"the transaction carries the offsets of group {txn.group_id} already; one "
            "transaction commits the offsets of one group",
        )
    groups.committed_group(state, c.commit, now_ms)  # as a member's commit is checked
    offsets = {t: dict(parts) for t, parts in txn.offsets.items()}
    for o in c.commit.offsets:
        offsets.setdefault(o.topic, {})[o.partition] = PendingOffset(o.offset, o.metadata)
    if sum(len(parts) for parts in offsets.values()) > MAX_TXN_PARTITIONS:
        raise CommandRefused(
            Code.TOO_MANY_TXN_PARTITIONS,
            f"the transaction would carry offsets of more than {MAX_TXN_PARTITIONS} "
            "partitions: abort it and use smaller transactions",
        )
    txn = dataclasses.replace(
        txn,
        group_id=c.commit.group_id,
        offsets={t: dict(sorted(p.items())) for t, p in sorted(offsets.items())},
    )
    return _with(state, txn), TxnOutcome("", "")


def _end(state: MetadataState, c: EndTxn, now_ms: int) -> tuple[MetadataState, TxnOutcome]:
    txn = _producers(state, c.transactional_id)
    decision = "commit" if c.commit else "abort"
    if _is_last(txn, c.producer_id, c.producer_epoch):
        done = "committed" if txn.state.commits else "aborted"
        if txn.state.commits == c.commit:  # a retry (or the abort the coordinator took)
            return state, TxnOutcome("", "", txn.producer_id, txn.producer_epoch)
        if txn.ended_by == TxnEndedBy.COORDINATOR:
            raise _aborted(txn)
        raise CommandRefused(
            Code.INVALID_TXN_STATE,
            f"the transaction of epoch {c.producer_epoch} was {done} already; it cannot {decision}",
        )
    _check_current(txn, c.producer_id, c.producer_epoch)
    if txn.state != TxnState.ONGOING and not c.commit:
        # Nothing open at the current epoch (the producer's AddPartitionsToTxn never
        # landed, say): nothing to abort, and the epoch stays what it is.
        return state, TxnOutcome("", "", txn.producer_id, txn.producer_epoch)
    if txn.state != TxnState.ONGOING:
        raise CommandRefused(
            Code.INVALID_TXN_STATE,
            f"transactional id {txn.transactional_id} has no transaction open at epoch "
            f"{c.producer_epoch} (it is {txn.state}): nothing to {decision}",
        )
    _check_markers_written(txn)
    state, txn = _decide(state, txn, commit=c.commit, ended_by=TxnEndedBy.PRODUCER, now_ms=now_ms)
    return _with(state, txn), TxnOutcome("", "", txn.producer_id, txn.producer_epoch)


# -- the coordinator's own ---------------------------------------------------------------


def _abort(state: MetadataState, c: AbortTxn, now_ms: int) -> tuple[MetadataState, TxnOutcome]:
    txn = state.transactions.get(c.transactional_id)
    if txn is None:
        raise CommandRefused(
            Code.UNKNOWN_TRANSACTIONAL_ID, f"there is no transactional id {c.transactional_id!r}"
        )
    guard = (c.producer_id, c.producer_epoch)
    if txn.state != TxnState.ONGOING or guard not in ((-1, -1), _current(txn)):
        raise CommandRefused(
            Code.INVALID_TXN_STATE,
            f"transactional id {txn.transactional_id} has no transaction open to abort "
            f"(it is {txn.state} at producer {txn.producer_id} epoch {txn.producer_epoch})",
        )
    _check_markers_written(txn)
    state, txn = _decide(state, txn, commit=False, ended_by=TxnEndedBy.COORDINATOR, now_ms=now_ms)
    return _with(state, txn), TxnOutcome("", "", txn.producer_id, txn.producer_epoch)


def record_markers(state: MetadataState, index: int, c: RecordTxnMarkers) -> Outcome:
    for written in c.written:
        txn = state.transactions.get(written.transactional_id)
        if (
            txn is None
            or not txn.pending_markers
            or (written.producer_id, written.producer_epoch) != marker_of(txn)
        ):
            continue  # ended (or moved on) meanwhile: a late record
        done = set(written.partitions)
        state = _with(
            state, _pending(txn, tuple(tp for tp in txn.pending_markers if tp not in done))
        )
    return state, Done()


def forget_topic(state: MetadataState, name: str) -> MetadataState:
    """A deleted topic's partitions need no marker (nothing reads them any more)."""
    for txn in sorted(state.transactions.values(), key=lambda t: t.transactional_id):
        if any(tp.topic == name for tp in txn.pending_markers):
            left = tuple(tp for tp in txn.pending_markers if tp.topic != name)
            state = _with(state, _pending(txn, left))
    return state


def marker_of(txn: Transaction) -> tuple[int, int]:
    """The (producer id, epoch) the markers of ``txn``'s ending transaction carry."""
    return txn.last_producer_id, txn.last_epoch + 1


def marker_commits(txn: Transaction) -> bool:
    """Whether the pending markers of ``txn``'s last transaction say commit."""
    return txn.state.commits if txn.state.ending else txn.last_committed


# -- helpers ---------------------------------------------------------------------------


def _decide(
    state: MetadataState, txn: Transaction, *, commit: bool, ended_by: TxnEndedBy, now_ms: int
) -> tuple[MetadataState, Transaction]:
    """``txn``'s open transaction decided: the epoch moved on, a commit's offsets applied
    to their group in this same entry (an abort drops them), and the markers pending for
    every partition that still exists (complete at once when there is none)."""
    assert not txn.pending_markers, "a decision while the last one's markers are pending"
    if commit and txn.offsets:
        entries = [
            OffsetEntry(t, p, o.offset, o.metadata)
            for t, parts in txn.offsets.items()
            for p, o in parts.items()
        ]
        state = groups.commit_checked(state, txn.group_id, entries, now_ms)
    state, (producer_id, epoch) = _bumped(state, txn.producer_id, txn.producer_epoch)
    pending = tuple(tp for tp in txn.partitions if _exists(state, tp))
    decided = dataclasses.replace(
        txn,
        producer_id=producer_id,
        producer_epoch=epoch,
        state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
        offsets={},
        last_producer_id=txn.producer_id,
        last_epoch=txn.producer_epoch,
        ended_by=ended_by,
    )
    return state, _pending(decided, pending)


def _pending(txn: Transaction, pending: tuple[TopicPartition, ...]) -> Transaction:
    if pending:
        return dataclasses.replace(txn, pending_markers=pending)
    if txn.state == TxnState.ONGOING:
        # The next transaction began while these markers were written: the last one is
        # done with, and nothing of it is kept.
        return _without_last(txn)
    done = TxnState.COMPLETE_COMMIT if txn.state.commits else TxnState.COMPLETE_ABORT
    return dataclasses.replace(txn, state=done, pending_markers=(), started_ms=0)


def _bumped(
    state: MetadataState, producer_id: int, epoch: int
) -> tuple[MetadataState, tuple[int, int]]:
    """The producer's next (id, epoch): one epoch up, or a new id at 0 rather than 32767."""
    if epoch + 1 < MAX_PRODUCER_EPOCH:
        return state, (producer_id, epoch + 1)
    state, new_id = _new_producer_id(state)
    return state, (new_id, 0)


def _new_producer_id(state: MetadataState) -> tuple[MetadataState, int]:
    first = state.next_producer_id
    if first + 1 > MOVER_PRODUCER_ID_BASE:  # the delay movers' range is reserved
        raise CommandRefused(Code.PRODUCER_IDS_EXHAUSTED, "no producer id is left")
    return dataclasses.replace(state, next_producer_id=first + 1), first


def _open_for_more(
    state: MetadataState, transactional_id: str, producer_id: int, epoch: int, now_ms: int
) -> Transaction:
    """The transaction to add to, begun now if none is open; refused when the caller is
    not the current producer or the last transaction is still ending."""
    txn = _producers(state, transactional_id)
    if _is_last(txn, producer_id, epoch):
        if txn.ended_by == TxnEndedBy.COORDINATOR:
            raise _aborted(txn)
        raise CommandRefused(
            Code.INVALID_TXN_STATE,
            f"the transaction of epoch {epoch} is ended; the next one uses epoch "
            f"{txn.producer_epoch} of producer {txn.producer_id} (what EndTxn answered)",
        )
    _check_current(txn, producer_id, epoch)
    if txn.state == TxnState.ONGOING:
        return txn
    begun = dataclasses.replace(
        txn, state=TxnState.ONGOING, started_ms=now_ms, partitions=(), group_id="", offsets={}
    )
    if txn.state.ending:
        # The last transaction's markers are still being written. The next one begins all
        # the same, so the markers are off the producer's path: each partition holds this
        # transaction's batches until its own marker of the last one is in (the marker's
        # epoch is the one this transaction writes at, so it cannot end this one), and
        # this transaction's EndTxn waits until every marker is recorded.
        return dataclasses.replace(begun, last_committed=txn.state.commits)
    return _without_last(begun)


def _without_last(txn: Transaction) -> Transaction:
    """``txn`` with nothing kept of the transaction before its current one."""
    return dataclasses.replace(
        txn,
        pending_markers=(),
        last_producer_id=-1,
        last_epoch=-1,
        ended_by=TxnEndedBy.NONE,
        last_committed=False,
    )


def _check_markers_written(txn: Transaction) -> None:
    """An open transaction is decided only once the last one's markers are all written:
    a partition must see the markers of one producer in the order of their epochs."""
    if txn.pending_markers:
        raise CommandRefused(
            Code.CONCURRENT_TRANSACTIONS,
            f"transactional id {txn.transactional_id}'s previous transaction still has "
            f"{len(txn.pending_markers)} markers to write; retry shortly",
        )


def _producers(state: MetadataState, transactional_id: str) -> Transaction:
    _check_id(transactional_id)
    txn = state.transactions.get(transactional_id)
    if txn is None:
        raise CommandRefused(
            Code.INVALID_TXN_STATE,
            f"transactional id {transactional_id} is not initialised: call InitTransactions first",
        )
    return txn


def _current(txn: Transaction) -> tuple[int, int]:
    return txn.producer_id, txn.producer_epoch


def _is_last(txn: Transaction, producer_id: int, epoch: int) -> bool:
    """Whether the call carries the epoch of the transaction just ended by its producer
    or by the coordinator (not by another instance's InitTransactions: that is fenced)."""
    return (
        txn.state.ended
        and txn.ended_by in (TxnEndedBy.PRODUCER, TxnEndedBy.COORDINATOR)
        and (producer_id, epoch) == (txn.last_producer_id, txn.last_epoch)
    )


def _check_current(txn: Transaction, producer_id: int, epoch: int) -> None:
    if (producer_id, epoch) == _current(txn):
        return
    raise CommandRefused(
        Code.PRODUCER_FENCED,
        f"transactional id {txn.transactional_id} is at producer {txn.producer_id} epoch "
        f"{txn.producer_epoch}, not producer {producer_id} epoch {epoch}: another instance "
        "called InitTransactions since (close this producer)",
    )


def _aborted(txn: Transaction) -> CommandRefused:
    return CommandRefused(
        Code.TRANSACTION_ABORTED,
        f"the coordinator aborted the transaction of epoch {txn.last_epoch} (its timeout "
        f"of {txn.timeout_ms} ms passed, or an operator aborted it): abort it, then begin "
        "a new one",
    )


def _check_id(transactional_id: str) -> None:
    if not TRANSACTIONAL_ID.fullmatch(transactional_id):
        raise CommandRefused(
            Code.INVALID_TRANSACTIONAL_ID,
            f"transactional id {transactional_id[:64]!r} is not 1-200 of A-Z a-z 0-9 . _ -",
        )


def _check_partition(state: MetadataState, topic: str, partition: int) -> None:
    if topic not in state.topics:
        raise CommandRefused(Code.UNKNOWN_TOPIC, f"there is no topic {topic[:64]!r}")
    parts = state.topics[topic].partitions
    if not 0 <= partition < len(parts):
        raise CommandRefused(
            Code.UNKNOWN_PARTITION,
            f"topic {topic} has partitions 0-{len(parts) - 1}, not {partition}",
        )
    if parts[partition].state != PartitionState.ACTIVE:
        raise CommandRefused(
            Code.PARTITION_DECOMMISSIONED,
            f"{topic}/{partition} is decommissioned: it takes no new writes",
        )


def _exists(state: MetadataState, tp: TopicPartition) -> bool:
    topic = state.topics.get(tp.topic)
    return topic is not None and tp.partition < len(topic.partitions)


def _with(state: MetadataState, txn: Transaction) -> MetadataState:
    txns = {**state.transactions, txn.transactional_id: txn}
    return dataclasses.replace(state, transactions=txns)


_HANDLERS: dict[type, Callable[[MetadataState, Any, int], tuple[MetadataState, TxnOutcome]]] = {
    InitTransactions: _init,
    AddPartitionsToTxn: _add_partitions,
    AddOffsetsToTxn: _add_offsets,
    EndTxn: _end,
    AbortTxn: _abort,
}
