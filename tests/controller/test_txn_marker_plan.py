"""The marker driver's pure planning (raftmq/controller/txn_coordinator.py): which markers
a round sends where (the reported leader's address, or the one a NOT_LEADER answer
pointed to), which wait (no known leader, not due yet), its bound, and how written
markers are recorded in bounded commands."""

from __future__ import annotations

from raftmq.controller import commands as c
from raftmq.controller import txn_coordinator as tc
from raftmq.controller.model import TopicPartition as TP
from raftmq.controller.txn_coordinator import MarkerTarget, plan_markers, written_commands
from tests.controller.machine import Driver


def ended(d: Driver, tid: str, commit: bool, *tps: TP) -> tuple[int, int]:
    def one(**kind: object) -> c.TxnOutcome:
        result = d(c.TransactionCalls((c.TxnCall(**kind),), 1_000))  # type: ignore[arg-type]
        assert isinstance(result, c.TxnOutcomes) and not result.outcomes[0].code, result
        return result.outcomes[0]

    init = one(init=c.InitTransactions(tid, 60_000))
    pid, epoch = init.producer_id, init.producer_epoch
    one(add_partitions=c.AddPartitionsToTxn(tid, pid, epoch, tps))
    one(end=c.EndTxn(tid, pid, epoch, commit))
    return pid, epoch + 1


def test_a_round_goes_to_the_reported_leaders_or_where_it_was_pointed() -> None:
    d = Driver()
    for b in (1, 2):
        d.register(b)
    assert d(c.CreateTopic("t", 3, 1, replica_assignment=((1,), (2,), (1,)))).ok
    assert d(c.ReportLeader("t", 0, 1, 1)).ok and d(c.ReportLeader("t", 1, 2, 1)).ok
    pid, epoch = ended(d, "a", True, TP("t", 0), TP("t", 1), TP("t", 2))
    ended(d, "b", False)  # nothing to write: complete at once, nothing planned
    state = d.machine.state
    plan = plan_markers(state, {}, lambda t: True)
    one, two = "127.0.0.1:9001", "127.0.0.1:9002"
    assert plan == {
        one: [MarkerTarget("a", TP("t", 0), pid, epoch, True)],
        two: [MarkerTarget("a", TP("t", 1), pid, epoch, True)],
    }  # t/2 has no reported leader: it waits
    hinted = plan_markers(state, {TP("t", 0): "elsewhere:1"}, lambda t: True)
    assert set(hinted) == {"elsewhere:1", two}
    assert plan_markers(state, {}, lambda t: t.partition != TP("t", 1)) == {one: plan[one]}
    assert sum(map(len, plan_markers(state, {}, lambda t: True, limit=1).values())) == 1


def test_written_markers_are_recorded_in_bounded_commands(monkeypatch) -> None:
    monkeypatch.setattr(tc, "RECORDS_PER_ENTRY", 2)
    targets = [MarkerTarget("a", TP("t", p), 7, 3, True) for p in range(3)]
    targets.append(MarkerTarget("b", TP("t", 0), 8, 1, False))
    commands = written_commands(reversed(targets))
    assert commands == [
        c.RecordTxnMarkers((c.WrittenMarkers("a", 7, 3, (TP("t", 0), TP("t", 1))),)),
        c.RecordTxnMarkers(
            (
                c.WrittenMarkers("a", 7, 3, (TP("t", 2),)),
                c.WrittenMarkers("b", 8, 1, (TP("t", 0),)),
            )
        ),
    ]
