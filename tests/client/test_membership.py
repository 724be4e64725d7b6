"""The member's state machine (raftmq.client.membership) alone, then several members
against the real coordinator transitions (raftmq.controller.groups through the metadata
state machine, as the controller runs them): in any interleaving of heartbeats, give-ups,
joins, leaves and session expiries, no partition is held by two members, and once
everyone heartbeats every partition is held by exactly one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.membership import Membership, Step
from raftmq.controller.commands import (
    CreateTopic,
    GroupAssignment,
    GroupHeartbeat,
    Refused,
    RemoveGroupMembers,
)
from raftmq.controller.errors import RefusalCode
from raftmq.controller.model import TopicPartition as TP
from tests.controller.machine import Driver

A, B, C, D = ("t", 0), ("t", 1), ("t", 2), ("u", 0)


def joined(assigned: set[tuple[str, int]], epoch: int = 3) -> Membership:
    m = Membership()
    m.subscribe(["t"])
    assert m.answered(m.member_id, epoch, assigned, 500) == Step(assign=frozenset(assigned))
    return m


def test_a_join_is_sent_at_epoch_0_with_its_own_id_and_starts_what_is_assigned() -> None:
    m = Membership()
    assert m.beat() is None  # nothing subscribed, not in the group: nothing to say
    m.subscribe(["u", "t", "t"])
    beat = m.beat()
    assert beat is not None and beat.member_epoch == 0 and beat.owned == ()
    assert beat.subscriptions == ("t", "u") and beat.member_id.startswith("m-")
    step = m.answered(beat.member_id, 7, {A, B}, 500)
    assert step == Step(assign=frozenset({A, B})) and m.epoch == 7 and m.interval_ms == 500
    assert not m.due_now
    again = m.beat()
    assert again is not None and again.member_epoch == 7 and again.owned == (A, B)


def test_what_is_not_assigned_any_more_is_revoked_once_and_held_until_given_up() -> None:
    m = joined({A, B, C})
    step = m.answered(m.member_id, 4, {A}, 500)
    assert step == Step(revoke=frozenset({B, C}))
    beat = m.beat()
    assert beat is not None and beat.owned == (A, B, C)  # not given up yet: still held
    assert m.answered(m.member_id, 4, {A}, 500) == Step()  # not revoked twice
    m.given_up({B})
    assert m.due_now and m.held == {A, C} and m.revoking == {C}
    m.given_up({C})
    beat = m.beat()
    assert beat is not None and beat.owned == (A,)


def test_fenced_loses_everything_and_rejoins_at_epoch_0_holding_nothing() -> None:
    m = joined({A, B})
    m.answered(m.member_id, 5, {A}, 500)  # B being revoked
    step = m.fenced()
    assert step == Step(lost=frozenset({A, B}))
    beat = m.beat()
    assert beat is not None and beat.member_epoch == 0 and beat.owned == ()
    assert m.due_now and m.revoking == set()
    # the answer to the rejoin starts the partitions again
    assert m.answered(m.member_id, 9, {B}, 500) == Step(assign=frozenset({B}))


def test_an_empty_subscription_leaves_and_a_leave_answer_ends_the_membership() -> None:
    m = joined({A})
    m.given_up({A})
    m.subscribe([])
    beat = m.beat()
    assert beat is not None and beat.member_epoch == -1
    assert m.answered(m.member_id, -1, set(), 0) == Step()
    assert m.left and m.beat() is None


def test_a_partition_given_back_while_being_revoked_is_started_again_after_give_up() -> None:
    m = joined({A, B})
    assert m.answered(m.member_id, 4, {A}, 500) == Step(revoke=frozenset({B}))
    assert m.answered(m.member_id, 5, {A, B}, 500) == Step()  # B is still held
    m.given_up({B})
    assert m.answered(m.member_id, 5, {A, B}, 500) == Step(assign=frozenset({B}))


# --- several members against the real coordinator ---------------------------------------

G = "g"
MEMBERS = 3
PARTITIONS = {(t, p) for t in ("t",) for p in range(5)}

actions = st.lists(
    st.tuples(
        st.sampled_from(["beat", "beat", "beat", "give_up", "join", "join", "leave", "expire"]),
        st.integers(0, MEMBERS - 1),
    ),
    max_size=40,
)


class Sim:
    def __init__(self) -> None:
        self.d = Driver()
        for b in (1, 2, 3):
            self.d.register(b)
        assert self.d(CreateTopic("t", len(PARTITIONS), 3)).ok
        self.members: list[Membership | None] = [None] * MEMBERS

    def beat(self, i: int) -> None:
        m = self.members[i]
        if m is None:
            return
        beat = m.beat()
        if beat is None:
            return
        owned = tuple(TP(t, p) for t, p in beat.owned)
        result = self.d(
            GroupHeartbeat(
                G,
                beat.member_id,
                None,
                beat.member_epoch,
                beat.subscriptions,
                owned,
                "sticky",
                3_000,
            )
        )
        if isinstance(result, Refused):
            assert result.code in (RefusalCode.UNKNOWN_MEMBER, RefusalCode.FENCED_MEMBER_EPOCH)
            m.fenced()
            return
        assert isinstance(result, GroupAssignment), result
        assigned = {(tp.topic, tp.partition) for tp in result.assigned}
        m.answered(result.member_id, result.member_epoch, assigned, 500)
        if result.member_epoch == -1:
            self.members[i] = None

    def act(self, action: str, i: int) -> None:
        m = self.members[i]
        if action == "join" and m is None:
            m = self.members[i] = Membership()
            m.subscribe(["t"])
            self.beat(i)
        elif action == "beat":
            self.beat(i)
        elif action == "give_up" and m is not None:
            m.given_up(set(m.revoking))
        elif action == "leave" and m is not None and m.joined:
            m.given_up(set(m.held))  # close: on_revoke, commit, then leave
            m.subscribe([])
            self.beat(i)
        elif action == "expire" and m is not None and m.joined:
            # Its session ran out: it stopped itself (a session's silence) before the
            # coordinator removed it and handed its partitions on.
            m.fenced()
            self.d(RemoveGroupMembers(G, (m.member_id,)))

    def check_no_two_holders(self) -> None:
        seen: dict[tuple[str, int], int] = {}
        for i, m in enumerate(self.members):
            for tp in m.held if m is not None else ():
                assert tp not in seen, f"{tp} held by members {seen[tp]} and {i}"
                seen[tp] = i


@settings(max_examples=60, deadline=None)
@given(actions)
def test_no_partition_is_ever_held_by_two_members_and_all_settle(
    steps: list[tuple[str, int]],
) -> None:
    sim = Sim()
    for action, i in steps:
        sim.act(action, i)
        sim.check_no_two_holders()
    # Then everyone cooperates, heartbeats first (a member that is slow to give up must
    # not lose its partitions to another), until nothing moves.
    for _ in range(6):
        for i in range(MEMBERS):
            sim.beat(i)
            sim.check_no_two_holders()
        for i in range(MEMBERS):
            sim.act("give_up", i)
    live = [m for m in sim.members if m is not None and m.joined]
    if live:
        held = [tp for m in live for tp in m.held]
        assert sorted(held) == sorted(PARTITIONS)
        assert all(not m.revoking for m in live)
