"""The sparse sequence rule for the delay movers' reserved producer ids
(raftmq.partition.producer_state, docs/delayed-delivery.md): new past everything held,
duplicate up to what is committed, refused when it overlaps; whatever order two movers
(a zombie ex-leader and its successor) send the same numbered records in, each record is
stored once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.format.delay import MOVER_PRODUCER_ID_BASE
from raftmq.partition.producer_state import ProducerStates, Proposal, Verdict

MOVER = MOVER_PRODUCER_ID_BASE + 3


def _append(states: ProducerStates, first: int, count: int, offset: int) -> None:
    assert states.check(MOVER, 0, first, count).verdict is Verdict.APPEND
    states.apply(MOVER, 0, first, count, offset, 0)


def test_a_mover_may_start_anywhere_and_skip_sequences() -> None:
    states = ProducerStates()
    _append(states, 7, 3, 0)  # unknown producer, sequence above 0: fine for a mover
    _append(states, 20, 1, 3)  # a gap: records it dropped
    assert states.check(MOVER, 0, 21, 5).verdict is Verdict.APPEND


def test_a_batch_within_what_is_committed_is_a_duplicate() -> None:
    states = ProducerStates()
    _append(states, 0, 10, 0)
    _append(states, 10, 10, 10)
    for first, count in [(0, 10), (3, 4), (12, 8), (0, 20), (19, 1)]:
        decision = states.check(MOVER, 0, first, count)
        assert decision.verdict is Verdict.DUPLICATE, (first, count)
        assert decision.duplicate_of is not None


def test_an_overlapping_batch_is_refused_and_goes_one_by_one() -> None:
    states = ProducerStates()
    _append(states, 0, 10, 0)
    assert states.check(MOVER, 0, 5, 10).verdict is Verdict.OUT_OF_ORDER
    assert states.check(MOVER, 0, 9, 1).verdict is Verdict.DUPLICATE
    assert states.check(MOVER, 0, 10, 1).verdict is Verdict.APPEND


def test_a_batch_covered_only_by_a_pending_proposal_waits() -> None:
    states = ProducerStates()
    _append(states, 0, 5, 0)
    pending = [Proposal(0, 5, 9)]
    assert states.check(MOVER, 0, 5, 5, pending).verdict is Verdict.OUT_OF_ORDER
    assert states.check(MOVER, 0, 10, 1, pending).verdict is Verdict.APPEND


def test_movers_are_never_forgotten_for_newer_producers() -> None:
    states = ProducerStates()
    _append(states, 0, 1, 0)
    for pid in range(10_001):
        states.apply(pid, 0, 0, 1, pid + 1, 0)
    assert states.get(MOVER) is not None


@settings(max_examples=300, deadline=None)
@given(
    records=st.integers(1, 40),
    cut_a=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    cut_b=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    alone=st.integers(0, 20),
    behind=st.integers(0, 40),
    interleave=st.lists(st.booleans(), max_size=200),
)
def test_two_movers_sending_the_same_records_store_each_once(
    records: int,
    cut_a: list[int],
    cut_b: list[int],
    alone: int,
    behind: int,
    interleave: list[bool],
) -> None:
    """Mover A sends sequences 0..records-1 in batches cut one way, ``alone`` of them
    before mover B (the new leader) takes over at a cursor up to ``behind`` records short
    of what A had stored, and sends the rest cut another way while A goes on (a zombie);
    their sends interleave. Each waits for an answer before its next batch; an overlap is
    resent one record at a time. Every sequence ends up stored exactly once."""

    def batches(start: int, cuts: list[int]) -> list[tuple[int, int]]:
        out, at, i = [], start, 0
        while at < records:
            n = min(cuts[i % len(cuts)], records - at)
            out.append((at, n))
            at, i = at + n, i + 1
        return out

    states = ProducerStates()
    stored: list[int] = []

    def send(queue: list[tuple[int, int]]) -> None:
        first, count = queue.pop(0)
        decision = states.check(MOVER, 0, first, count)
        if decision.verdict is Verdict.APPEND:
            states.apply(MOVER, 0, first, count, len(stored), 0)
            stored.extend(range(first, first + count))
        elif decision.verdict is Verdict.OUT_OF_ORDER:
            queue[:0] = [(s, 1) for s in range(first, first + count)]
        else:
            assert decision.verdict is Verdict.DUPLICATE

    a = batches(0, cut_a)
    for _ in range(min(alone, len(a))):
        send(a)
    cursor = max(0, len(stored) - behind)  # everything below it was stored
    queues = [a, batches(cursor, cut_b)]
    picks = iter(interleave)
    while any(queues):
        who = 0 if not queues[1] else 1 if not queues[0] else int(next(picks, False))
        send(queues[who])
    assert sorted(stored) == list(range(records)), stored
