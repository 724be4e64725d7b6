"""What a partition's Raft leader does next to make its group's configuration the replica
set the controller's metadata names: pure decisions, no I/O (the broker's
:mod:`raftmq.broker.membership_driver` runs them and carries them out).

The metadata is the plan, the Raft configuration the execution. A move under way lists the
new replica as a learner (``partition.learners``); once its leader reports it caught up,
the metadata lists it as a voter in the replaced one's place. The group follows with
single-step changes, each committed before the next:

1. drop Raft learners the metadata no longer names (a move given up);
2. add every replica the metadata names but the group lacks, as a learner (it copies the
   log without counting for quorums, so a slow copy never stalls commits);
3. promote, once caught up, each learner the metadata now lists as a voter;
4. only then remove the voters the metadata no longer lists, the leader itself last and
   only after handing leadership to a caught-up voter that stays.

Why this order: a voter leaves only once every voter the metadata names votes, so the
group never has fewer voters holding the log than the replication factor, even when the
replaced voter is dead (then the group runs, for a moment, one voter more with one
missing, which a majority still covers).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from raftmq.raft.host.host import PeerProgress
from raftmq.raft.membership import Membership
from raftmq.raft.progress import ProgressState


@dataclass(frozen=True, slots=True)
class Propose:
    """Propose this configuration (one voter changed at most)."""

    membership: Membership
    why: str


@dataclass(frozen=True, slots=True)
class Transfer:
    """Hand leadership to ``to`` first: this leader is a voter that must leave."""

    to: int
    why: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing can be done yet (the reason says what it waits for)."""

    why: str


Step = Propose | Transfer | Wait


def caught_up(progress: PeerProgress | None, commit: int) -> bool:
    """A follower holds everything committed and the leader streams to it."""
    return (
        progress is not None
        and progress.match >= commit
        and progress.state == ProgressState.REPLICATE
    )


def in_sync(raft: Membership, voters: Collection[int], learners: Collection[int]) -> bool:
    """The group's configuration is the metadata's."""
    return raft.voters == frozenset(voters) and raft.learners == frozenset(learners) - set(voters)


def next_step(
    me: int,
    raft: Membership,
    *,
    pending: bool,
    commit: int,
    followers: Mapping[int, PeerProgress],
    voters: Sequence[int],
    learners: Collection[int],
    alive: Collection[int],
) -> Step | None:
    """The next step of leader ``me`` toward the metadata's ``voters`` (preferred leader
    first) and ``learners``, given the group's configuration ``raft`` (the latest in the
    log), whether a change of it is still uncommitted (``pending``), the commit index, each
    follower's progress and which peers are reachable; None when there is nothing to do."""
    mv, ml = frozenset(voters), frozenset(learners) - frozenset(voters)
    assert mv, "a partition has at least one voting replica"
    rv, rl = raft.voters, raft.learners
    if in_sync(raft, mv, ml):
        return None
    if pending:
        return Wait("the previous configuration change is not committed yet")
    dropped = rl - mv - ml
    if dropped:
        x = min(dropped)
        return Propose(
            Membership(rv, rl - {x}), f"broker {x} is no replica in the metadata: drop the learner"
        )
    missing = (mv | ml) - rv - rl
    if missing:
        x = min(missing)
        return Propose(Membership(rv, rl | {x}), f"broker {x} joins as a learner")
    promote = mv & rl
    if promote:
        ready = [x for x in sorted(promote) if caught_up(followers.get(x), commit)]
        if not ready:
            return Wait(
                f"learners {sorted(promote)} are voters in the metadata; they vote once they "
                f"hold the log up to the commit at {commit}"
            )
        x = ready[0]
        return Propose(Membership(rv | {x}, rl - {x}), f"learner {x} caught up: it votes now")
    extra = rv - mv
    assert extra, (raft, voters, learners)  # else in sync: every member is where it belongs
    others = extra - {me}
    x = min(others) if others else me
    if x in ml:
        # The contract never turns a voter into a learner: this copy of the metadata is
        # older than the group's configuration. Newer metadata will say what to do.
        return Wait(f"voter {x} is a learner in the metadata (an older version, it seems)")
    if x == me:
        stays = [
            v
            for v in voters
            if v != me and v in rv and v in alive and caught_up(followers.get(v), commit)
        ]
        if not stays:
            return Wait(
                f"broker {me} leads and must leave, but no voter that stays is caught up and "
                "reachable to take over"
            )
        return Transfer(stays[0], f"broker {me} leaves the replicas: broker {stays[0]} leads")
    return Propose(
        Membership(rv - {x}, rl), f"broker {x} is no voter in the metadata: it leaves the group"
    )


def learners_to_report(
    raft: Membership,
    *,
    commit: int,
    followers: Mapping[int, PeerProgress],
    learners: Collection[int],
) -> list[int]:
    """The metadata's learners that are Raft learners holding the whole committed log: the
    leader tells the controller, which then lists them as voters (PromoteReplica)."""
    return [
        x for x in sorted(learners) if x in raft.learners and caught_up(followers.get(x), commit)
    ]
