"""Consumer group assignors: every subscribed partition to exactly one subscriber, balance
where the assignor promises it, few moves for sticky, and the incremental step never
gives a partition two owners."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.controller.assignors import (
    ASSIGNORS,
    next_assignment,
    range_assign,
    round_robin_assign,
    sticky_assign,
)

TOPICS = ["a", "b", "c"]
members_st = st.dictionaries(
    st.sampled_from([f"m{i}" for i in range(8)]),
    st.sets(st.sampled_from(TOPICS), min_size=1),
    min_size=1,
)
counts_st = st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS})


def check_exact_cover(members, counts, out) -> None:  # type: ignore[no-untyped-def]
    seen = [tp for parts in out.values() for tp in parts]
    assert len(seen) == len(set(seen)), "a partition has two owners"
    wanted = {(t, p) for ts in members.values() for t in ts for p in range(counts[t])}
    assert set(seen) == wanted
    for m, parts in out.items():
        assert all(t in members[m] for t, _ in parts), f"{m} got a topic it does not want"


@settings(max_examples=150, deadline=None)
@given(members=members_st, counts=counts_st, name=st.sampled_from(sorted(ASSIGNORS)))
def test_every_assignor_covers_each_partition_once(members, counts, name) -> None:  # type: ignore[no-untyped-def]
    out = ASSIGNORS[name](members, counts, {})
    check_exact_cover(members, counts, out)
    assert out == ASSIGNORS[name](dict(reversed(list(members.items()))), counts, {})  # order-free


@settings(max_examples=150, deadline=None)
@given(
    ids=st.sets(st.sampled_from([f"m{i}" for i in range(8)]), min_size=1),
    counts=counts_st,
    name=st.sampled_from(["round_robin", "sticky"]),
)
def test_same_subscriptions_stay_within_one(ids, counts, name) -> None:  # type: ignore[no-untyped-def]
    members = {m: set(TOPICS) for m in ids}
    sizes = [len(p) for p in ASSIGNORS[name](members, counts, {}).values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=150, deadline=None)
@given(
    ids=st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=2, unique=True),
    counts=counts_st,
)
def test_sticky_moves_only_what_balance_needs(ids, counts) -> None:  # type: ignore[no-untyped-def]
    """A member joins: each old member keeps at least its new fair share of what it had,
    so only the partitions the newcomer needs move."""
    old = {m: set(TOPICS) for m in ids[:-1]}
    before = sticky_assign(old, counts, {})
    after = sticky_assign({**old, ids[-1]: set(TOPICS)}, counts, before)
    check_exact_cover({**old, ids[-1]: set(TOPICS)}, counts, after)
    total = sum(counts.values())
    floor = total // len(ids)
    for m in old:
        assert len(after[m] & before[m]) >= min(len(before[m]), floor)
    moved = sum(len(before[m] - after[m]) for m in old)
    assert moved <= -(-total // len(ids))  # at most the newcomer's share


def test_range_keeps_co_partitioned_topics_together() -> None:
    out = range_assign({"x": {"a", "b"}, "y": {"a", "b"}}, {"a": 4, "b": 4}, {})
    assert out["x"] == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}


def test_round_robin_deals_in_turn() -> None:
    out = round_robin_assign({"x": {"a"}, "y": {"a"}}, {"a": 4}, {})
    assert out == {"x": {("a", 0), ("a", 2)}, "y": {("a", 1), ("a", 3)}}


def test_a_member_gets_a_moved_partition_only_once_its_owner_gave_it_up() -> None:
    target = {"x": {("a", 0)}, "y": {("a", 1)}}
    # y owns a/0 still, so x may not consume it yet; y must give it up
    assert next_assignment("x", set(), target, {("a", 0): "y"}) == (set(), set())
    assert next_assignment("y", {("a", 0), ("a", 1)}, target, {}) == ({("a", 1)}, {("a", 0)})
    assert next_assignment("x", set(), target, {}) == ({("a", 0)}, set())
