"""The leader's next configuration step toward the metadata's replica set: one voter at a
time, learners first, the replaced voter only after its replacement votes, the leader
itself last and only after handing leadership over. The last test walks whole moves
step by step and checks the group never has fewer voters holding the log than the factor."""

from __future__ import annotations

from raftmq.partition.membership_steps import (
    Propose,
    Transfer,
    Wait,
    learners_to_report,
    next_step,
)
from raftmq.raft.host.host import PeerProgress
from raftmq.raft.membership import Membership
from raftmq.raft.progress import ProgressState

COMMIT = 100


def m(voters: set[int], learners: set[int] = frozenset()) -> Membership:  # type: ignore[assignment]
    return Membership(frozenset(voters), frozenset(learners))


def progress(caught: set[int], behind: set[int] = frozenset()) -> dict[int, PeerProgress]:  # type: ignore[assignment]
    out = {n: PeerProgress(COMMIT, ProgressState.REPLICATE) for n in caught}
    out |= {n: PeerProgress(COMMIT - 50, ProgressState.PROBE) for n in behind}
    return out


def step(
    raft: Membership,
    voters: tuple[int, ...],
    learners: tuple[int, ...] = (),
    *,
    me: int = 1,
    caught: set[int] | None = None,
    behind: set[int] = frozenset(),  # type: ignore[assignment]
    pending: bool = False,
    alive: set[int] | None = None,
):
    members = raft.members - {me}
    caught = members - behind if caught is None else caught
    return next_step(
        me,
        raft,
        pending=pending,
        commit=COMMIT,
        followers=progress(caught, behind),
        voters=voters,
        learners=learners,
        alive=members if alive is None else alive,
    )


def test_in_sync_means_nothing_to_do() -> None:
    assert step(m({1, 2, 3}), (1, 2, 3)) is None
    assert step(m({1, 2, 3}, {4}), (1, 2, 3), (4,)) is None


def test_a_pending_change_waits() -> None:
    got = step(m({1, 2, 3}), (1, 2, 3), (4,), pending=True)
    assert isinstance(got, Wait)


def test_a_new_learner_joins_as_a_learner() -> None:
    got = step(m({1, 2, 3}), (1, 2, 3), (4,))
    assert got == Propose(m({1, 2, 3}, {4}), got.why)


def test_a_voter_named_by_the_metadata_but_unknown_to_the_group_joins_as_a_learner() -> None:
    got = step(m({1, 2, 3}), (1, 2, 4))
    assert isinstance(got, Propose) and got.membership == m({1, 2, 3}, {4})


def test_a_promoted_learner_votes_only_once_caught_up() -> None:
    raft = m({1, 2, 3}, {4})
    waiting = step(raft, (1, 2, 4), behind={4})
    assert isinstance(waiting, Wait) and "4" in waiting.why
    got = step(raft, (1, 2, 4))
    assert isinstance(got, Propose) and got.membership == m({1, 2, 3, 4})


def test_the_replaced_voter_leaves_only_after_its_replacement_votes() -> None:
    # 3 is dead (never caught up) and replaced: 4 is promoted first, then 3 removed
    raft = m({1, 2, 3}, {4})
    first = step(raft, (1, 2, 4), behind={3})
    assert isinstance(first, Propose) and first.membership == m({1, 2, 3, 4})
    second = step(first.membership, (1, 2, 4), behind={3})
    assert isinstance(second, Propose) and second.membership == m({1, 2, 4})
    assert step(second.membership, (1, 2, 4)) is None


def test_a_leader_that_must_leave_hands_over_to_a_caught_up_voter_that_stays() -> None:
    raft = m({1, 2, 3, 4})
    got = step(raft, (4, 2, 3), me=1)
    assert got == Transfer(4, got.why)  # the preferred (first) voter when caught up
    got = step(raft, (4, 2, 3), me=1, behind={4})
    assert isinstance(got, Transfer) and got.to == 2
    got = step(raft, (4, 2, 3), me=1, alive={3, 4}, behind={4})
    assert isinstance(got, Transfer) and got.to == 3
    got = step(raft, (4, 2, 3), me=1, alive=set())
    assert isinstance(got, Wait)


def test_other_leaving_voters_go_before_the_leader() -> None:
    got = step(m({1, 2, 3, 4, 5}), (2, 3, 4), me=1)
    assert isinstance(got, Propose) and got.membership == m({1, 2, 3, 4})


def test_a_learner_the_metadata_dropped_is_removed() -> None:
    got = step(m({1, 2, 3}, {4}), (1, 2, 3))
    assert isinstance(got, Propose) and got.membership == m({1, 2, 3})


def test_an_older_metadata_never_demotes_a_voter() -> None:
    # The group already promoted 4 (newer metadata); a lagging copy lists 4 as a learner.
    got = step(m({1, 2, 3, 4}), (1, 2, 3), (4,))
    assert isinstance(got, Wait)


def test_caught_up_learners_are_reported() -> None:
    raft = m({1, 2, 3}, {4, 5})
    followers = progress({2, 3, 4}, behind={5})
    assert learners_to_report(raft, commit=COMMIT, followers=followers, learners=(4, 5)) == [4]
    # not yet a learner of the group, or no longer one in the metadata: nothing to report
    assert learners_to_report(m({1, 2, 3}), commit=COMMIT, followers=followers, learners=(4,)) == []
    assert learners_to_report(raft, commit=COMMIT, followers=followers, learners=()) == []


def _run_move(
    raft: Membership,
    voters: tuple[int, ...],
    learners: tuple[int, ...],
    *,
    me: int,
    dead: set[int],
    factor: int,
) -> Membership:
    """Apply steps until in sync (each proposal committing at once), checking after each
    that at least ``factor`` live voters remain; the leader changes on a transfer."""
    for _ in range(20):
        got = step(
            raft,
            voters,
            learners,
            me=me,
            behind=dead & (raft.members - {me}),
            alive=raft.members - dead - {me},
        )
        if got is None:
            return raft
        if isinstance(got, Transfer):
            me = got.to
            continue
        assert isinstance(got, Propose), got
        assert got.membership.is_single_step_from(raft)
        raft = got.membership
        assert len(raft.voters - dead) >= factor, raft
    raise AssertionError("no end to the steps")


def test_whole_moves_keep_the_factor_of_live_voters() -> None:
    # the usual move, 3 -> 4, led by 1; the metadata first names 4 a learner, then a voter
    raft = _run_move(m({1, 2, 3}), (1, 2, 3), (4,), me=1, dead=set(), factor=3)
    assert raft == m({1, 2, 3}, {4})
    raft = _run_move(raft, (1, 2, 4), (), me=1, dead=set(), factor=3)
    assert raft == m({1, 2, 4})
    # the leader moves away: 1 -> 4, the leadership goes to 4 first
    raft = _run_move(m({1, 2, 3}, {4}), (4, 2, 3), (), me=1, dead=set(), factor=3)
    assert raft == m({2, 3, 4})
    # the replaced voter is dead: 2 of 3 alive, the move still ends
    raft = _run_move(m({1, 2, 3}, {4}), (1, 2, 4), (), me=1, dead={3}, factor=3)
    assert raft == m({1, 2, 4})
