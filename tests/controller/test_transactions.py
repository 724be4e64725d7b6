"""The transaction coordinator's transitions (raftmq/controller/transactions.py), driven
through the metadata state machine: producer ids and epochs (a new id from the same
counter as idempotent producers' blocks, an epoch bump at Init and at every end, a new
id at the top of the epoch range), fencing, the coordinator's own aborts
(TRANSACTION_ABORTED, EndTxn(abort) then succeeds), retries of EndTxn, offsets applied
with a commit in its own entry and never with an abort, markers pending until
recorded, every refusal code, and the snapshot round trip."""

from __future__ import annotations

import dataclasses

import pytest

from raftmq.controller import commands as c
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.model import TopicPartition as TP
from raftmq.controller.model import TxnState
from raftmq.controller.state_machine import (
    MetadataStateMachine,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from raftmq.controller.transactions import MAX_PRODUCER_EPOCH, MAX_TXN_PARTITIONS
from tests.controller.machine import Driver

T = "tx"
A, B = TP("t", 0), TP("t", 1)


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    driver.register(1)
    assert driver(c.CreateTopic("t", 4, 1)).ok
    assert driver(c.CreateTopic("u", 1, 1)).ok
    return driver


def call(d: Driver, request: object, now_ms: int = 5_000) -> c.TxnOutcome:
    kind = {
        c.InitTransactions: "init",
        c.AddPartitionsToTxn: "add_partitions",
        c.AddOffsetsToTxn: "add_offsets",
        c.EndTxn: "end",
        c.AbortTxn: "abort",
    }[type(request)]
    result = d(c.TransactionCalls((c.TxnCall(**{kind: request}),), now_ms))
    assert isinstance(result, c.TxnOutcomes), result
    (outcome,) = result.outcomes
    return outcome


def ok(d: Driver, request: object, now_ms: int = 5_000) -> c.TxnOutcome:
    outcome = call(d, request, now_ms)
    assert outcome.code == "", outcome
    return outcome


def refused(d: Driver, request: object, code: Code) -> str:
    before = d.machine.state
    outcome = call(d, request)
    assert outcome.code == code.value, outcome
    assert dataclasses.replace(d.machine.state, version=before.version) == before
    return outcome.message


def init(d: Driver, tid: str = T, timeout_ms: int = 60_000) -> tuple[int, int]:
    outcome = ok(d, c.InitTransactions(tid, timeout_ms))
    return outcome.producer_id, outcome.producer_epoch


def add(d: Driver, pid: int, epoch: int, *tps: TP, tid: str = T) -> c.TxnOutcome:
    return call(d, c.AddPartitionsToTxn(tid, pid, epoch, tps))


def end(d: Driver, pid: int, epoch: int, commit: bool, tid: str = T) -> c.TxnOutcome:
    return call(d, c.EndTxn(tid, pid, epoch, commit))


def txn(d: Driver, tid: str = T):
    return d.machine.state.transactions[tid]


def written(d: Driver, tid: str = T, *tps: TP) -> None:
    t = txn(d, tid)
    marker = (t.last_producer_id, t.last_epoch + 1)
    assert d(c.RecordTxnMarkers((c.WrittenMarkers(tid, *marker, tps or t.pending_markers),))).ok


def join(d: Driver, group: str = "g") -> c.GroupAssignment:
    result = d(c.GroupHeartbeat(group, "", None, 0, ("t",), (), "sticky", 1_000))
    assert isinstance(result, c.GroupAssignment), result
    return result


def offsets(d: Driver, pid: int, epoch: int, member: c.GroupAssignment, **at: int) -> c.TxnOutcome:
    entries = tuple(c.OffsetEntry("t", int(p[1:]), o, "m") for p, o in sorted(at.items()))
    commit = c.OffsetCommit("g", member.member_id, member.member_epoch, entries)
    return call(d, c.AddOffsetsToTxn(T, pid, epoch, commit))


def committed(d: Driver, group: str = "g") -> dict[int, int]:
    g = d.machine.state.consumer_groups.get(group)
    return {p: o.offset for p, o in g.committed_offsets.get("t", {}).items()} if g else {}


def test_init_takes_ids_from_the_producer_id_counter_and_bumps_the_epoch(d: Driver) -> None:
    assert d(c.AllocateProducerIds(1, 10)).ok  # idempotent producers' block: ids 0-9
    assert init(d) == (10, 0)
    assert init(d, "other") == (11, 0)
    assert init(d) == (10, 1)  # the same id keeps its producer id; the epoch moves
    assert d.machine.state.next_producer_id == 12
    assert txn(d).state == TxnState.EMPTY


def test_a_commit_moves_the_epoch_and_applies_the_offsets_in_its_entry(d: Driver) -> None:
    member = join(d)
    pid, epoch = init(d)
    assert add(d, pid, epoch, A, B).code == ""
    assert add(d, pid, epoch, A).code == ""  # already in: nothing changes
    assert offsets(d, pid, epoch, member, p0=7, p1=8).code == ""
    assert offsets(d, pid, epoch, member, p0=9).code == ""  # a later position replaces
    assert txn(d).started_ms == 5_000 and txn(d).partitions == (A, B)
    assert committed(d) == {}
    answer = end(d, pid, epoch, commit=True)
    assert (answer.producer_id, answer.producer_epoch) == (pid, epoch + 1)
    assert committed(d) == {0: 9, 1: 8}  # in the decision's entry
    t = txn(d)
    assert t.state == TxnState.PREPARE_COMMIT and t.pending_markers == (A, B)
    assert (t.producer_epoch, t.last_epoch) == (epoch + 1, epoch) and not t.offsets
    written(d, T, A)
    assert txn(d).pending_markers == (B,)
    written(d, T, B)
    assert txn(d).state == TxnState.COMPLETE_COMMIT and txn(d).started_ms == 0
    assert add(d, pid, epoch + 1, B).code == ""
    assert txn(d).partitions == (B,) and txn(d).state == TxnState.ONGOING


def test_the_next_transaction_begins_while_the_last_ones_markers_are_written(
    d: Driver,
) -> None:
    """The markers are off the producer's path: AddPartitionsToTxn and AddOffsetsToTxn of
    the next epoch go on at once, and only the next decision (EndTxn, an abort, an Init)
    waits until every marker of the last one is written, so a partition sees one
    producer's markers in the order of their epochs."""
    member = join(d)
    pid, epoch = init(d)
    add(d, pid, epoch, A, B)
    end(d, pid, epoch, commit=True)
    assert add(d, pid, epoch + 1, B).code == ""
    assert offsets(d, pid, epoch + 1, member, p0=4).code == ""
    t = txn(d)
    assert t.state == TxnState.ONGOING and t.partitions == (B,) and t.started_ms == 5_000
    assert t.pending_markers == (A, B) and t.last_committed  # the last one's, still to write
    assert (t.last_producer_id, t.last_epoch) == (pid, epoch)
    # It survives a snapshot as it is (a new controller leader writes those markers).
    assert decode_snapshot(encode_snapshot(d.machine.state)) == d.machine.state
    for request in (
        c.EndTxn(T, pid, epoch + 1, True),
        c.EndTxn(T, pid, epoch + 1, False),
        c.AbortTxn(T, -1, -1),
        c.InitTransactions(T, 60_000),
    ):
        assert "retry" in refused(d, request, Code.CONCURRENT_TRANSACTIONS)
    # The last epoch's calls are fenced now: its producer went on to the next one.
    refused(d, c.EndTxn(T, pid, epoch, True), Code.PRODUCER_FENCED)
    written(d, T, A)
    assert txn(d).pending_markers == (B,) and txn(d).state == TxnState.ONGOING
    written(d, T, B)
    t = txn(d)
    assert t.state == TxnState.ONGOING and not t.pending_markers and not t.last_committed
    assert (t.last_producer_id, t.last_epoch) == (-1, -1)
    answer = end(d, pid, epoch + 1, commit=False)
    assert answer.producer_epoch == epoch + 2
    t = txn(d)
    assert t.state == TxnState.PREPARE_ABORT and t.pending_markers == (B,)
    assert committed(d) == {}  # the aborted one's offsets are dropped


def test_an_abort_ending_with_markers_pending_hands_its_decision_to_the_next_one(
    d: Driver,
) -> None:
    pid, epoch = init(d)
    add(d, pid, epoch, A)
    end(d, pid, epoch, commit=False)
    add(d, pid, epoch + 1, B)
    t = txn(d)
    assert t.pending_markers == (A,) and not t.last_committed
    assert (t.last_producer_id, t.last_epoch) == (pid, epoch)


def test_an_abort_drops_the_offsets(d: Driver) -> None:
    member = join(d)
    pid, epoch = init(d)
    assert offsets(d, pid, epoch, member, p0=5).code == ""
    answer = end(d, pid, epoch, commit=False)
    assert answer.producer_epoch == epoch + 1
    assert committed(d) == {}
    # Offsets only, no partition: no marker to write, complete at once.
    assert txn(d).state == TxnState.COMPLETE_ABORT


def test_retries_of_end_answer_the_same_and_the_other_decision_is_refused(d: Driver) -> None:
    pid, epoch = init(d)
    add(d, pid, epoch, A)
    first = end(d, pid, epoch, commit=True)
    again = end(d, pid, epoch, commit=True)
    assert again == first
    assert "committed already" in refused(d, c.EndTxn(T, pid, epoch, False), Code.INVALID_TXN_STATE)
    written(d)
    assert end(d, pid, epoch, commit=True) == first  # after completion too
    # The new epoch has no transaction open; the old one cannot add.
    refused(d, c.EndTxn(T, pid, epoch + 1, True), Code.INVALID_TXN_STATE)
    refused(d, c.AddPartitionsToTxn(T, pid, epoch, (A,)), Code.INVALID_TXN_STATE)
    # Once the next transaction begins, the old epoch is just old.
    add(d, pid, epoch + 1, A)
    refused(d, c.EndTxn(T, pid, epoch, True), Code.PRODUCER_FENCED)


def test_init_fences_the_older_instance_and_aborts_what_it_left_open(d: Driver) -> None:
    member = join(d)
    pid, old = init(d)
    add(d, pid, old, A)
    assert offsets(d, pid, old, member, p0=3).code == ""
    outcome = call(d, c.InitTransactions(T, 60_000))
    assert outcome.code == Code.CONCURRENT_TRANSACTIONS.value  # and the abort began
    t = txn(d)
    assert t.state == TxnState.PREPARE_ABORT and t.pending_markers == (A,)
    assert (t.last_producer_id, t.last_epoch + 1) == (pid, old + 1)  # the markers' epoch
    refused(d, c.InitTransactions(T, 60_000), Code.CONCURRENT_TRANSACTIONS)
    for request in (
        c.AddPartitionsToTxn(T, pid, old, (B,)),
        c.EndTxn(T, pid, old, True),
        c.EndTxn(T, pid, old, False),
    ):
        assert "another instance" in refused(d, request, Code.PRODUCER_FENCED)
    written(d)
    assert init(d) == (pid, old + 2)
    assert committed(d) == {}
    refused(d, c.AddPartitionsToTxn(T, pid, old + 1, (B,)), Code.PRODUCER_FENCED)


def test_the_coordinators_abort_answers_transaction_aborted(d: Driver) -> None:
    member = join(d)
    pid, epoch = init(d)
    add(d, pid, epoch, A)
    ok(d, c.AbortTxn(T, pid, epoch))  # the leader's timer saw it expire
    assert txn(d).state == TxnState.PREPARE_ABORT
    refused(d, c.AddPartitionsToTxn(T, pid, epoch, (B,)), Code.TRANSACTION_ABORTED)
    refused(d, c.EndTxn(T, pid, epoch, True), Code.TRANSACTION_ABORTED)
    commit = c.OffsetCommit(
        "g", member.member_id, member.member_epoch, (c.OffsetEntry("t", 0, 1, ""),)
    )
    refused(d, c.AddOffsetsToTxn(T, pid, epoch, commit), Code.TRANSACTION_ABORTED)
    answer = end(d, pid, epoch, commit=False)
    assert (answer.code, answer.producer_id, answer.producer_epoch) == ("", pid, epoch + 1)
    written(d)
    assert add(d, pid, epoch + 1, B).code == ""


def test_the_timers_abort_leaves_a_transaction_that_moved_on_alone(d: Driver) -> None:
    pid, epoch = init(d)
    add(d, pid, epoch, A)
    end(d, pid, epoch, commit=True)
    refused(d, c.AbortTxn(T, pid, epoch), Code.INVALID_TXN_STATE)
    written(d)
    add(d, pid, epoch + 1, A)
    refused(d, c.AbortTxn(T, pid, epoch), Code.INVALID_TXN_STATE)
    ok(d, c.AbortTxn(T, -1, -1))  # an operator's: whichever is open
    refused(d, c.AbortTxn(T, -1, -1), Code.INVALID_TXN_STATE)
    refused(d, c.AbortTxn("nobody", -1, -1), Code.UNKNOWN_TRANSACTIONAL_ID)


def test_the_epoch_overflows_into_a_new_producer_id(d: Driver) -> None:
    pid, _ = init(d)
    top = MAX_PRODUCER_EPOCH - 1
    state = d.machine.state
    t = dataclasses.replace(state.transactions[T], producer_epoch=top)
    d.machine.restore(encode_snapshot(dataclasses.replace(state, transactions={T: t})))
    add(d, pid, top, A)
    answer = end(d, pid, top, commit=True)
    assert (answer.producer_id, answer.producer_epoch) == (pid + 1, 0)
    t = txn(d)
    assert (t.last_producer_id, t.last_epoch + 1) == (pid, MAX_PRODUCER_EPOCH)  # markers
    assert end(d, pid, top, commit=True) == answer  # a retry still answers the same
    written(d)
    assert add(d, pid + 1, 0, A).code == ""
    refused(d, c.AddPartitionsToTxn(T, pid, top, (A,)), Code.PRODUCER_FENCED)


def test_refusals(d: Driver) -> None:
    empty = d(c.TransactionCalls((c.TxnCall(),), 0))
    assert isinstance(empty, c.TxnOutcomes)
    assert empty.outcomes[0].code == Code.MALFORMED_COMMAND.value
    refused(d, c.InitTransactions("bad id", 60_000), Code.INVALID_TRANSACTIONAL_ID)
    refused(d, c.InitTransactions("x" * 201, 60_000), Code.INVALID_TRANSACTIONAL_ID)
    refused(d, c.InitTransactions(T, 999), Code.INVALID_TXN_TIMEOUT)
    refused(d, c.InitTransactions(T, 900_001), Code.INVALID_TXN_TIMEOUT)
    refused(d, c.AddPartitionsToTxn(T, 0, 0, (A,)), Code.INVALID_TXN_STATE)  # no Init
    pid, epoch = init(d)
    refused(d, c.EndTxn(T, pid, epoch, True), Code.INVALID_TXN_STATE)  # none open
    # An abort with none open does nothing, and the epoch stays.
    assert ok(d, c.EndTxn(T, pid, epoch, False)).producer_epoch == epoch
    refused(d, c.AddPartitionsToTxn(T, pid, epoch + 1, (A,)), Code.PRODUCER_FENCED)
    refused(d, c.AddPartitionsToTxn(T, pid + 5, epoch, (A,)), Code.PRODUCER_FENCED)
    refused(d, c.AddPartitionsToTxn(T, pid, epoch, (TP("nope", 0),)), Code.UNKNOWN_TOPIC)
    refused(d, c.AddPartitionsToTxn(T, pid, epoch, (TP("t", 4),)), Code.UNKNOWN_PARTITION)
    assert d(c.DecommissionPartitions("u", (0,), 1_000)).ok is False  # the only one
    assert d(c.AddPartitions("u", 2)).ok and d(c.DecommissionPartitions("u", (0,), 1)).ok
    refused(d, c.AddPartitionsToTxn(T, pid, epoch, (TP("u", 0),)), Code.PARTITION_DECOMMISSIONED)
    many = tuple(TP("t", p % 4) for p in range(4))
    assert add(d, pid, epoch, *many).code == ""
    d(c.AddPartitions("t", MAX_TXN_PARTITIONS + 1))
    too_many = tuple(TP("t", p) for p in range(MAX_TXN_PARTITIONS + 1))
    assert "smaller transactions" in refused(
        d, c.AddPartitionsToTxn(T, pid, epoch, too_many), Code.TOO_MANY_TXN_PARTITIONS
    )
    member = join(d)
    refused_offsets = [
        ((member.member_id, member.member_epoch + 1), Code.FENCED_MEMBER_EPOCH),
        (("nobody", 1), Code.UNKNOWN_MEMBER),
        (("", 0), Code.GROUP_NOT_EMPTY),
    ]
    for (member_id, member_epoch), code in refused_offsets:
        commit = c.OffsetCommit("g", member_id, member_epoch, (c.OffsetEntry("t", 0, 1, ""),))
        refused(d, c.AddOffsetsToTxn(T, pid, epoch, commit), code)
    standalone = c.OffsetCommit("h", "", 0, (c.OffsetEntry("u", 0, 1, ""),))
    assert call(d, c.AddOffsetsToTxn(T, pid, epoch, standalone)).code == ""
    other = dataclasses.replace(standalone, group_id="i")
    assert "one group" in refused(
        d, c.AddOffsetsToTxn(T, pid, epoch, other), Code.INVALID_TXN_STATE
    )


def test_a_batch_applies_each_call_alone_and_a_deleted_topic_needs_no_marker(d: Driver) -> None:
    (p1, e1), (p2, e2) = init(d, "one"), init(d, "two")
    result = d(
        c.TransactionCalls(
            (
                c.TxnCall(add_partitions=c.AddPartitionsToTxn("one", p1, e1, (A,))),
                c.TxnCall(add_partitions=c.AddPartitionsToTxn("two", p2, e2 + 1, (A,))),
                c.TxnCall(add_partitions=c.AddPartitionsToTxn("two", p2, e2, (TP("u", 0),))),
                c.TxnCall(end=c.EndTxn("one", p1, e1, True)),
            ),
            7_000,
        )
    )
    assert isinstance(result, c.TxnOutcomes)
    codes = [o.code for o in result.outcomes]
    assert codes == ["", Code.PRODUCER_FENCED.value, "", ""]
    assert txn(d, "one").state == TxnState.PREPARE_COMMIT
    assert end(d, p2, e2, commit=True, tid="two").code == ""
    assert txn(d, "two").pending_markers == (TP("u", 0),)
    assert d(c.DeleteTopic("u")).ok
    assert txn(d, "two").state == TxnState.COMPLETE_COMMIT
    # A late record (another epoch's markers) is ignored.
    assert d(c.RecordTxnMarkers((c.WrittenMarkers("one", p1, e1, (A,)),))).ok
    assert txn(d, "one").pending_markers == (A,)


def test_the_snapshot_carries_transactions_and_refuses_a_broken_one(d: Driver) -> None:
    member = join(d)
    pid, epoch = init(d)
    add(d, pid, epoch, A, B)
    offsets(d, pid, epoch, member, p0=4)
    init(d, "two")
    ok(d, c.AbortTxn("two", -1, -1)) if txn(d, "two").state == TxnState.ONGOING else None
    data = encode_snapshot(d.machine.state)
    assert decode_snapshot(data) == d.machine.state
    restored = MetadataStateMachine("test")
    restored.restore(data)
    assert restored.snapshot() == data
    end(d, pid, epoch, commit=True)
    data = encode_snapshot(d.machine.state)
    assert decode_snapshot(data) == d.machine.state
    state = d.machine.state
    for broken in (
        dataclasses.replace(txn(d), pending_markers=()),
        dataclasses.replace(txn(d), producer_epoch=MAX_PRODUCER_EPOCH),
        dataclasses.replace(txn(d), transactional_id="other"),
        dataclasses.replace(txn(d), producer_id=state.next_producer_id),
    ):
        bad = dataclasses.replace(state, transactions={**state.transactions, T: broken})
        with pytest.raises(SnapshotError, match="transaction"):
            decode_snapshot(encode_snapshot(bad))
