"""Idempotent producer state: each batch stored once, in sequence order, whatever mix of
retries, duplicates and reorderings arrives; fenced epochs and unknown producers refused
with a sentence; the state survives a checkpoint round trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.partition.producer_state import (
    KEPT_BATCHES,
    MAX_PRODUCERS,
    BatchRange,
    ProducerStates,
    Proposal,
    Verdict,
)


def test_the_first_batch_starts_at_zero_and_the_next_follows() -> None:
    s = ProducerStates()
    assert s.check(7, 0, 0, 3).verdict == Verdict.APPEND
    s.apply(7, 0, 0, 3, base_offset=100, timestamp_ms=1)
    assert s.check(7, 0, 3, 2).verdict == Verdict.APPEND
    d = s.check(7, 0, 5, 1)
    assert d.verdict == Verdict.OUT_OF_ORDER and "expects is 3" in d.message


def test_a_retried_batch_is_answered_with_its_first_offsets() -> None:
    s = ProducerStates()
    s.apply(7, 0, 0, 3, base_offset=100, timestamp_ms=1)
    s.apply(7, 0, 3, 2, base_offset=200, timestamp_ms=2)
    d = s.check(7, 0, 0, 3)
    assert d.verdict == Verdict.DUPLICATE
    assert d.duplicate_of == BatchRange(0, 2, 100, 102)


def test_only_the_last_batches_are_kept() -> None:
    s = ProducerStates()
    for i in range(KEPT_BATCHES + 2):
        s.apply(7, 0, i, 1, base_offset=i, timestamp_ms=i)
    assert s.check(7, 0, 0, 1).verdict == Verdict.OUT_OF_ORDER  # too old to recognise
    assert s.check(7, 0, KEPT_BATCHES + 1, 1).verdict == Verdict.DUPLICATE


def test_an_older_epoch_is_fenced_and_a_new_one_starts_at_zero() -> None:
    s = ProducerStates()
    s.apply(7, 3, 0, 1, base_offset=0, timestamp_ms=1)
    d = s.check(7, 2, 1, 1)
    assert d.verdict == Verdict.FENCED and "epoch 3 wrote here since" in d.message
    assert s.check(7, 4, 5, 1).verdict == Verdict.OUT_OF_ORDER
    assert s.check(7, 4, 0, 1).verdict == Verdict.APPEND
    s.apply(7, 4, 0, 1, base_offset=1, timestamp_ms=2)
    s.apply(7, 3, 1, 1, base_offset=2, timestamp_ms=3)  # a fenced batch in the log: ignored
    assert s.get(7) is not None and s.get(7).epoch == 4  # type: ignore[union-attr]


def test_an_unknown_producer_must_start_at_zero() -> None:
    d = ProducerStates().check(9, 0, 4, 1)
    assert d.verdict == Verdict.UNKNOWN_PRODUCER and "start a new epoch" in d.message


def test_pending_batches_count_as_sent() -> None:
    s = ProducerStates()
    s.apply(7, 0, 0, 2, base_offset=0, timestamp_ms=1)
    pending = [Proposal(0, 2, 4)]
    assert s.check(7, 0, 2, 3, pending).verdict == Verdict.DUPLICATE  # wait for it
    assert s.check(7, 0, 5, 1, pending).verdict == Verdict.APPEND
    assert s.check(7, 0, 2, 1, pending).verdict == Verdict.OUT_OF_ORDER


def test_producers_past_the_cap_are_forgotten_least_recent_first() -> None:
    s = ProducerStates()
    for pid in range(MAX_PRODUCERS + 1):
        s.apply(pid, 0, 0, 1, base_offset=pid, timestamp_ms=pid)
    assert len(s) == MAX_PRODUCERS
    assert s.get(0) is None and s.get(1) is not None


def test_a_checkpoint_round_trips() -> None:
    s = ProducerStates()
    s.apply(7, 1, 0, 3, base_offset=10, timestamp_ms=5)
    s.apply(8, 0, 0, 1, base_offset=13, timestamp_ms=6)
    back = ProducerStates.from_json(s.to_json())
    assert back.to_json() == s.to_json()
    assert back.check(7, 1, 0, 3).duplicate_of == BatchRange(0, 2, 10, 12)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=30),
    script=st.lists(st.tuples(st.integers(0, 29), st.booleans()), max_size=120),
)
def test_any_mix_of_sends_and_retries_stores_each_batch_once_in_order(
    sizes: list[int], script: list[tuple[int, bool]]
) -> None:
    """A producer's batches arrive in any order, any number of times (the leader appends
    at once, no pending): the log holds exactly a prefix of them, in sequence order, and
    every retry of a stored batch gets the offsets it was stored at."""
    firsts = [sum(sizes[:i]) for i in range(len(sizes))]
    s = ProducerStates()
    log: list[int] = []  # batch numbers, as stored
    offsets: dict[int, int] = {}
    end = 0
    for pick, _ in [*script, *[(i, True) for i in range(len(sizes))]]:
        b = pick % len(sizes)
        d = s.check(1, 0, firsts[b], sizes[b])
        if d.verdict == Verdict.APPEND:
            s.apply(1, 0, firsts[b], sizes[b], base_offset=end, timestamp_ms=0)
            offsets[b] = end
            log.append(b)
            end += sizes[b]
        elif d.verdict == Verdict.DUPLICATE and d.duplicate_of is not None:
            assert d.duplicate_of.base_offset == offsets[b]
    assert log == list(range(len(log)))  # in order, each once
    assert log == list(range(len(sizes)))  # and the in-order pass stored them all
