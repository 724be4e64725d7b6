"""Producer state with transactions (docs/transactions.md): a transactional batch opens
the producer's transaction, a marker closes it and moves the epoch (a late batch of the
ended transaction is fenced, the next starts at sequence 0), ABORT markers are listed, a
resent marker is held already, and the leader's pending proposals are checked as if they
were applied. The aborted list answers a fetch's range exactly as a scan would."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from raftmq.log.atomic_file import write_atomic
from raftmq.partition.aborted_transactions import AbortedTransaction, AbortedTransactions
from raftmq.partition.producer_state import (
    MAX_PRODUCERS,
    MarkerVerdict,
    ProducerStates,
    Proposal,
    Verdict,
    marker_proposal,
)

P = 7


def txn_batch(s: ProducerStates, epoch: int, seq: int, offset: int, count: int = 1) -> None:
    assert s.check(P, epoch, seq, count, transactional=True).verdict == Verdict.APPEND
    s.apply(P, epoch, seq, count, offset, 0, transactional=True)


def test_a_transactional_batch_opens_a_transaction_and_holds_the_stable_offset() -> None:
    s = ProducerStates()
    assert s.first_open_offset() is None
    txn_batch(s, 0, 0, offset=10, count=2)
    txn_batch(s, 0, 2, offset=15)
    assert s.first_open_offset() == 10  # the first batch's, not the last
    entry = s.get(P)
    assert entry is not None and entry.transaction is not None
    assert (entry.transaction.first_offset, entry.transaction.epoch) == (10, 0)


def test_an_idempotent_batch_inside_an_open_transaction_is_refused() -> None:
    s = ProducerStates()
    txn_batch(s, 0, 0, offset=0)
    d = s.check(P, 0, 1, 1)
    assert d.verdict == Verdict.INVALID_TXN_STATE and "transaction open" in d.message


def test_a_commit_marker_closes_moves_the_epoch_and_forgets_the_sequences() -> None:
    s = ProducerStates()
    txn_batch(s, 0, 0, offset=0, count=3)
    assert s.check_marker(P, 1) == MarkerVerdict.APPEND
    s.apply_marker(P, 1, True, 3, 0)
    assert s.first_open_offset() is None and len(s.aborted) == 0
    late = s.check(P, 0, 3, 1, transactional=True)
    assert late.verdict == Verdict.FENCED and "epoch 1 wrote here since" in late.message
    assert s.check(P, 1, 3, 1, transactional=True).verdict == Verdict.OUT_OF_ORDER
    assert s.check(P, 1, 0, 1, transactional=True).verdict == Verdict.APPEND
    assert s.check_marker(P, 1) == MarkerVerdict.HELD  # a resend


def test_an_abort_marker_lists_the_transaction() -> None:
    s = ProducerStates()
    s.apply(9, 0, 0, 1, 0, 0)  # another producer's record first
    txn_batch(s, 0, 0, offset=1, count=2)
    s.apply_marker(P, 1, False, 3, 0)
    assert s.aborted.overlapping(0, 10) == [AbortedTransaction(P, 1, 3)]
    assert s.first_open_offset() is None


def test_a_marker_fences_a_producer_that_never_wrote_here() -> None:
    s = ProducerStates()
    assert s.check_marker(P, 4) == MarkerVerdict.APPEND
    s.apply_marker(P, 4, False, 0, 0)
    assert len(s.aborted) == 0  # nothing was open: nothing to list
    assert s.check(P, 3, 0, 1, transactional=True).verdict == Verdict.FENCED
    assert s.check_marker(P, 4) == MarkerVerdict.HELD
    assert s.check_marker(P, 5) == MarkerVerdict.APPEND


def test_a_newer_epoch_waits_for_the_older_transactions_marker() -> None:
    s = ProducerStates()
    txn_batch(s, 2, 0, offset=0)
    d = s.check(P, 3, 0, 1, transactional=True)
    assert d.verdict == Verdict.CONCURRENT_TRANSACTIONS and "retry" in d.message


def test_pending_writes_are_checked_as_if_applied() -> None:
    s = ProducerStates()
    txn_batch(s, 0, 0, offset=0)
    marker = [marker_proposal(1)]
    # A marker on its way: a late batch of the ended epoch is fenced already, and a
    # second marker of the same epoch waits for the first.
    assert s.check(P, 0, 1, 1, marker, transactional=True).verdict == Verdict.FENCED
    assert s.check_marker(P, 1, marker) == MarkerVerdict.WAIT
    assert s.check_marker(P, 0, marker) == MarkerVerdict.WAIT
    # A transactional batch on its way opens the transaction for the checks.
    s2 = ProducerStates()
    pending = [Proposal(0, 0, 0, True)]
    assert s2.check(P, 0, 1, 1, pending).verdict == Verdict.INVALID_TXN_STATE
    assert s2.check_marker(P, 0, pending) == MarkerVerdict.HELD
    assert s2.check_marker(P, 1, pending) == MarkerVerdict.APPEND


def test_producers_with_an_open_transaction_are_never_forgotten() -> None:
    s = ProducerStates()
    s.apply(0, 0, 0, 1, 0, 0, transactional=True)
    for pid in range(1, MAX_PRODUCERS + 5):
        s.apply(pid, 0, 0, 1, pid, 0)
    assert len(s) == MAX_PRODUCERS
    assert s.get(0) is not None and s.first_open_offset() == 0


def test_a_checkpoint_round_trips_the_transactions_and_an_old_one_still_loads() -> None:
    s = ProducerStates()
    txn_batch(s, 0, 0, offset=5)
    s.apply(8, 0, 0, 1, 6, 0, transactional=True)
    s.apply_marker(8, 1, False, 7, 0)
    back = ProducerStates.from_json(s.to_json(), s.transactions_to_json())
    assert back.transactions_to_json() == [[P, 5, 0]]
    assert back.first_open_offset() == 5
    assert AbortedTransactions.from_json(s.aborted.to_json()).to_json() == [[8, 6, 7]]
    old = ProducerStates.from_json(s.to_json())  # written before transactions
    assert old.first_open_offset() is None and old.get(P) is not None


_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.integers(0, 2), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("marker"), st.integers(0, 2), st.just(0), st.booleans()),
    ),
    max_size=5,
)


@settings(max_examples=1000, deadline=None)
@given(committed=_EVENTS, pending=_EVENTS, probe=_EVENTS)
@example([("batch", 0, 0, False)], [("marker", 1, 0, True)], [("batch", 1, 0, False)])
def test_a_check_with_pending_writes_equals_a_check_after_they_apply(
    committed: list[tuple[str, int, int, bool]],
    pending: list[tuple[str, int, int, bool]],
    probe: list[tuple[str, int, int, bool]],
) -> None:
    """Whatever a leader has committed and proposed, its checks answer as they will once
    the proposals are applied (a duplicate of a proposal is answered "wait" instead)."""

    def apply(s: ProducerStates, events: list[tuple[str, int, int, bool]], at: int) -> int:
        for kind, epoch, seq, flag in events:
            if kind == "marker":
                s.apply_marker(P, epoch, flag, at, 0)
            else:
                s.apply(P, epoch, seq, 1, at, 0, transactional=flag)
                at += 1
        return at

    proposals = [
        marker_proposal(e) if kind == "marker" else Proposal(e, seq, seq, flag)
        for kind, e, seq, flag in pending
    ]
    before = ProducerStates()
    apply(before, committed, 0)
    after = ProducerStates()
    apply(after, [*committed, *pending], 0)
    for kind, epoch, seq, flag in probe:
        if kind == "marker":
            with_pending = before.check_marker(P, epoch, proposals)
            if with_pending is not MarkerVerdict.WAIT:
                assert with_pending == after.check_marker(P, epoch)
        else:
            got = before.check(P, epoch, seq, 1, proposals, transactional=flag)
            if got.verdict == Verdict.DUPLICATE and got.duplicate_of is None:
                continue  # a duplicate of a proposal: answered once it commits
            want = after.check(P, epoch, seq, 1, transactional=flag)
            if want.verdict == Verdict.DUPLICATE:
                # Applied, the proposal is a kept batch; pending, its retry waits (above)
                # or, past the kept window, is out of order either way.
                continue
            assert got.verdict == want.verdict, (got, want)


@settings(max_examples=200, deadline=None)
@given(
    spans=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 60)), max_size=30),
    lo=st.integers(0, 200),
    width=st.integers(1, 80),
    start=st.integers(0, 150),
    seal_every=st.integers(1, 40),
    write_files=st.booleans(),
)
@example(
    spans=[(0, 1), (0, 1), (0, 1), (1, 1)], lo=0, width=1, start=0, seal_every=2, write_files=False
)
def test_the_aborted_list_answers_a_range_as_a_scan_would(
    spans: list[tuple[int, int]],
    lo: int,
    width: int,
    start: int,
    seal_every: int,
    write_files: bool,
) -> None:
    """With the tail sealed into runs every ``seal_every`` transactions, read from their
    files (or, not yet written, from memory), across trims."""
    rows = []
    last = 0
    for pid, (gap, span) in enumerate(spans):
        last += gap
        rows.append(AbortedTransaction(pid, max(0, last - span), last))
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        aborted = AbortedTransactions(directory)
        sealed: list[range] = []  # the rows each run holds, in sealing order
        tail_from = 0
        for index, row in enumerate(rows):
            aborted.add(*row)
            if aborted.tail_size >= seal_every:
                aborted.seal(index)
                sealed.append(range(tail_from, index + 1))
                tail_from = index + 1
                if write_files:
                    for name, payload in aborted.unwritten():
                        write_atomic(directory / name, payload)
                        aborted.written(name)
        assert len(aborted) == len(rows)
        hi = lo + width
        want = sorted(
            (r for r in rows if r.last_offset > lo and r.first_offset < hi), key=lambda r: r[1]
        )
        assert aborted.overlapping(lo, hi) == want
        aborted.trim(start)
        # Runs passed wholly are dropped from the front; the rows of a run kept stay
        # whole (even those at or below the start); the tail is trimmed row by row. (Not
        # by offset ranges: two runs may share a last offset, and hypothesis found a case
        # where a dropped run's rows fell inside a kept run's range.)
        kept_runs = sealed[len(sealed) - len(aborted.runs) :] if aborted.runs else []
        in_kept_runs = {i for run_rows in kept_runs for i in run_rows}
        kept = [
            r
            for i, r in enumerate(rows)
            if i in in_kept_runs or (i >= tail_from and r.last_offset > start)
        ]
        assert aborted.all_to_json() == [list(r) for r in kept]
        # A run wholly passed is dropped (its file deleted later); one that straddles the
        # start is kept whole: a fetch never asks below the start.
        assert all(run.last_last > start for run in aborted.runs)
        want = sorted(
            (r for r in kept if r.last_offset > lo and r.first_offset < hi), key=lambda r: r[1]
        )
        assert [t for t in aborted.overlapping(lo, hi) if t.last_offset > start] == [
            t for t in want if t.last_offset > start
        ]
        if write_files:
            # The tail and the runs as a checkpoint lists them load back the same.
            again = AbortedTransactions.from_json(
                aborted.to_json(), aborted.runs_to_json(), directory
            )
            assert again.all_to_json() == aborted.all_to_json()
