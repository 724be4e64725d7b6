"""The group coordinator's transitions, driven through the metadata state machine: join,
incremental rebalance without two owners, fencing of zombies, static membership, commits
(single and batched), resets, deletes, and topics deleted or grown under a group."""

from __future__ import annotations

import pytest

from raftmq.controller.commands import (
    AddPartitions,
    CommitOffsets,
    CommitOutcome,
    CommitsApplied,
    CreateTopic,
    DeleteGroup,
    DeleteTopic,
    Done,
    GroupAssignment,
    GroupHeartbeat,
    OffsetCommit,
    OffsetEntry,
    Refused,
    RemoveGroupMembers,
    ResetOffsets,
)
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.model import TopicPartition as TP
from raftmq.controller.state_machine import decode_snapshot, encode_snapshot
from tests.controller.machine import Driver

G = "g"


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    for b in (1, 2, 3):
        driver.register(b)
    assert driver(CreateTopic("t", 4, 3)).ok
    return driver


def beat(
    d: Driver,
    member: str,
    epoch: int,
    owned: tuple[TP, ...] = (),
    *,
    instance: str | None = None,
    topics: tuple[str, ...] = ("t",),
) -> GroupAssignment:
    result = d(GroupHeartbeat(G, member, instance, epoch, topics, owned, "sticky", 1_000))
    assert isinstance(result, GroupAssignment), result
    return result


def refused(d: Driver, command: object, code: Code) -> str:
    result = d(command)  # type: ignore[arg-type]
    assert isinstance(result, Refused) and result.code == code, result
    return result.message


def test_a_joining_member_gets_everything_then_shares_without_two_owners(d: Driver) -> None:
    a = beat(d, "", 0)
    assert a.member_id == f"{G}-{d.index}" and len(a.assigned) == 4
    b = beat(d, "b", 0)
    assert b.assigned == ()  # every partition is still a's
    a2 = beat(d, a.member_id, a.member_epoch, a.assigned)
    assert len(a2.assigned) == 2 and len(a2.revoke) == 2  # keeps two, gives two up
    assert set(a2.assigned).isdisjoint(a2.revoke)
    # b still gets nothing while a holds them
    assert beat(d, "b", b.member_epoch).assigned == ()
    a3 = beat(d, a.member_id, a2.member_epoch, a2.assigned)  # a gave them up
    assert a3.assigned == a2.assigned and a3.revoke == ()
    b2 = beat(d, "b", b.member_epoch)
    assert set(b2.assigned) == set(a2.revoke)


def test_a_stale_epoch_or_unknown_member_is_fenced(d: Driver) -> None:
    a = beat(d, "a", 0)
    beat(d, "b", 0)
    a2 = beat(d, "a", a.member_epoch, a.assigned)
    assert a2.member_epoch > a.member_epoch  # its assignment changed
    msg = refused(
        d,
        GroupHeartbeat(G, "a", None, a.member_epoch, ("t",), (), "sticky", 2),
        Code.FENCED_MEMBER_EPOCH,
    )
    assert "join again" in msg
    refused(d, GroupHeartbeat(G, "zz", None, 3, ("t",), (), "sticky", 2), Code.UNKNOWN_MEMBER)


def test_commits_are_fenced_to_what_a_member_holds(d: Driver) -> None:
    a = beat(d, "a", 0)
    held = a.assigned[0]
    ok = OffsetCommit(G, "a", a.member_epoch, (OffsetEntry("t", held.partition, 42, "m"),))
    stale = OffsetCommit(G, "a", a.member_epoch - 1, (OffsetEntry("t", 0, 1, ""),))
    ghost = OffsetCommit(G, "nobody", 1, (OffsetEntry("t", 0, 1, ""),))
    outside = OffsetCommit(G, "", -1, (OffsetEntry("t", 0, 1, ""),))
    result = d(CommitOffsets((ok, stale, ghost, outside), 5_000))
    assert isinstance(result, CommitsApplied)
    codes = [o.code for o in result.outcomes]
    assert codes == ["", "FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER", "GROUP_NOT_EMPTY"]
    committed = d.machine.state.consumer_groups[G].committed_offsets["t"][held.partition]
    assert (committed.offset, committed.metadata, committed.committed_ms) == (42, "m", 5_000)
    beat(d, "b", 0)
    a2 = beat(d, "a", a.member_epoch, a.assigned)
    given_up = a2.revoke[0]
    # a may still commit what it gives up (it still holds it), at its new epoch
    last = OffsetCommit(G, "a", a2.member_epoch, (OffsetEntry("t", given_up.partition, 7, ""),))
    assert d(CommitOffsets((last,), 6_000)) == CommitsApplied((CommitOutcome("", ""),))
    a3 = beat(d, "a", a2.member_epoch, a2.assigned)
    late = OffsetCommit(G, "a", a3.member_epoch, (OffsetEntry("t", given_up.partition, 9, ""),))
    (outcome,) = d(CommitOffsets((late,), 7_000)).outcomes  # type: ignore[union-attr]
    assert outcome.code == "PARTITION_NOT_ASSIGNED"


def test_a_member_that_joins_again_never_gets_its_old_epoch_back(d: Driver) -> None:
    """A member whose session ran out on its side (no controller answered) joins again
    with the same id while the coordinator still knows it: it gets the same partitions,
    but at an epoch it never had, so a commit stamped before the loss (in flight, or
    retried) is refused instead of moving the group's offset back."""
    a = beat(d, "a", 0)
    held = a.assigned[0]
    before = OffsetCommit(G, "a", a.member_epoch, (OffsetEntry("t", held.partition, 50, ""),))
    assert d(CommitOffsets((before,), 1_000)) == CommitsApplied((CommitOutcome("", ""),))
    back = beat(d, "a", 0)  # lost everything, joined again
    assert set(back.assigned) == set(a.assigned)
    assert back.member_epoch > a.member_epoch
    stale = OffsetCommit(G, "a", a.member_epoch, (OffsetEntry("t", held.partition, 20, ""),))
    (outcome,) = d(CommitOffsets((stale,), 2_000)).outcomes  # type: ignore[union-attr]
    assert outcome.code == "FENCED_MEMBER_EPOCH"
    committed = d.machine.state.consumer_groups[G].committed_offsets["t"][held.partition]
    assert committed.offset == 50
    refused(
        d,
        GroupHeartbeat(G, "a", None, a.member_epoch, ("t",), a.assigned, "sticky", 3),
        Code.FENCED_MEMBER_EPOCH,
    )


def test_a_static_member_comes_back_to_its_partitions_without_a_rebalance(d: Driver) -> None:
    a = beat(d, "a1", 0, instance="host-a")
    b = beat(d, "b", 0, instance="host-b")
    a = beat(d, "a1", a.member_epoch, a.assigned)
    a = beat(d, "a1", a.member_epoch, a.assigned)
    epoch = d.machine.state.consumer_groups[G].epoch
    back = beat(d, "a2", 0, instance="host-a")  # restarted: new member id, same instance
    assert set(back.assigned) == set(a.assigned)
    assert d.machine.state.consumer_groups[G].epoch == epoch  # no rebalance
    assert set(d.machine.state.consumer_groups[G].members) == {"a2", "b"}
    del b


def test_leaving_and_removal_hand_partitions_on(d: Driver) -> None:
    a = beat(d, "a", 0)
    b = beat(d, "b", 0)
    a = beat(d, "a", a.member_epoch, a.assigned)
    left = beat(d, "a", -1)
    assert left.member_epoch == -1
    assert len(beat(d, "b", b.member_epoch).assigned) == 4
    assert d(RemoveGroupMembers(G, ("b",))) == Done()
    assert d.machine.state.consumer_groups[G].members == {}


def test_a_grown_topic_is_assigned_and_a_deleted_one_forgotten(d: Driver) -> None:
    a = beat(d, "a", 0)
    assert d(AddPartitions("t", 6)).ok
    grown = beat(d, "a", a.member_epoch, a.assigned)
    assert len(grown.assigned) == 6
    d(CommitOffsets((OffsetCommit(G, "a", grown.member_epoch, (OffsetEntry("t", 5, 3, ""),)),), 1))
    assert d(DeleteTopic("t")) == Done()
    assert "t" not in d.machine.state.consumer_groups[G].committed_offsets
    gone = beat(d, "a", grown.member_epoch, grown.assigned)
    assert gone.assigned == () and len(gone.revoke) == 6


def test_reset_and_delete_wait_for_an_empty_group(d: Driver) -> None:
    a = beat(d, "a", 0)
    reset = ResetOffsets(G, (OffsetEntry("t", 0, 0, ""),), False, 1)
    refused(d, reset, Code.GROUP_NOT_EMPTY)
    assert d(ResetOffsets(G, (OffsetEntry("t", 0, 0, ""),), True, 1)) == Done()
    refused(d, DeleteGroup(G), Code.GROUP_NOT_EMPTY)
    beat(d, "a", -1)
    assert d(reset) == Done()
    assert d(DeleteGroup(G)) == Done()
    refused(d, DeleteGroup(G), Code.UNKNOWN_GROUP)
    del a


def test_bad_heartbeats_are_refused_with_sentences(d: Driver) -> None:
    def hb(**kw: object) -> GroupHeartbeat:
        fields = dict(
            group_id=G, member_id="m", instance_id=None, member_epoch=0, subscriptions=("t",),
            owned=(), assignor="sticky", now_ms=0,
        )  # fmt: skip
        return GroupHeartbeat(**(fields | kw))  # type: ignore[arg-type]

    assert "group id" in refused(d, hb(group_id="a b"), Code.INVALID_GROUP)
    assert "assignor" in refused(d, hb(assignor="fancy"), Code.INVALID_GROUP)
    assert "sorted" in refused(d, hb(subscriptions=("t", "a")), Code.INVALID_GROUP)
    assert "1-100 topics" in refused(d, hb(subscriptions=()), Code.INVALID_GROUP)
    refused(d, hb(member_epoch=-2), Code.INVALID_GROUP)
    refused(d, hb(member_id="", member_epoch=3), Code.UNKNOWN_MEMBER)


def test_groups_survive_a_snapshot(d: Driver) -> None:
    a = beat(d, "a", 0)
    d(CommitOffsets((OffsetCommit(G, "a", a.member_epoch, (OffsetEntry("t", 1, 9, "x"),)),), 3))
    state = d.machine.state
    assert decode_snapshot(encode_snapshot(state)) == state
