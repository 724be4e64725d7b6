"""The share group coordinator's transitions, driven through the metadata state machine:
join, heartbeat and leave, the assignment (every partition has a member, members share),
fencing of stale epochs, recomputation when a topic grows or goes, settings, deletion,
group-type exclusivity both ways, and share groups through a snapshot (and a snapshot
written before share groups existed)."""

from __future__ import annotations

import json

import pytest

from raftmq.controller import codec
from raftmq.controller.commands import (
    AddPartitions,
    AlterShareGroupConfig,
    CommitOffsets,
    CommitsApplied,
    CreateTopic,
    DeleteGroup,
    DeleteShareGroup,
    DeleteTopic,
    Done,
    GroupHeartbeat,
    OffsetCommit,
    OffsetEntry,
    Refused,
    RemoveShareMembers,
    ResetOffsets,
    ShareAssignment,
    ShareGroupHeartbeat,
)
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.model import TopicPartition as TP
from raftmq.controller.state_machine import (
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from raftmq.share_settings import ShareSettings
from tests.controller.machine import Driver

G = "sg"


@pytest.fixture
def d() -> Driver:
    driver = Driver()
    for b in (1, 2, 3):
        driver.register(b)
    assert driver(CreateTopic("t", 3, 3)).ok
    return driver


def beat(
    d: Driver,
    member: str,
    epoch: int,
    topics: tuple[str, ...] = ("t",),
    *,
    group: str = G,
    timeout_ms: int = 45_000,
) -> ShareAssignment:
    result = d(ShareGroupHeartbeat(group, member, epoch, topics, timeout_ms, 1_000))
    assert isinstance(result, ShareAssignment), result
    return result


def refused(d: Driver, command: object, code: Code) -> str:
    result = d(command)  # type: ignore[arg-type]
    assert isinstance(result, Refused) and result.code == code, result
    return result.message


def test_a_joining_member_gets_an_id_an_epoch_and_every_partition(d: Driver) -> None:
    a = beat(d, "", 0)
    assert a.member_id == f"{G}-{d.index}" and a.member_epoch == a.group_epoch == 1
    assert a.assigned == (TP("t", 0), TP("t", 1), TP("t", 2))
    group = d.machine.state.share_groups[G]
    assert group.created_version == d.index and group.topics == ("t",)
    assert group.members[a.member_id].joined_ms == 1_000
    version = d.machine.version
    again = beat(d, a.member_id, a.member_epoch)
    assert again == a and d.machine.state.share_groups[G] == group  # changes nothing
    assert d.machine.version == version + 1  # (the driver still applies an entry)


def test_members_share_partitions_and_every_partition_has_one(d: Driver) -> None:
    ids = [f"m{i:02}" for i in range(50)]
    for m in ids:
        beat(d, m, 0)
    answers = {m: beat(d, m, d.machine.state.share_groups[G].members[m].member_epoch) for m in ids}
    assert all(len(a.assigned) == 1 for a in answers.values())
    assert answers["m00"].assigned == (TP("t", 0),) and answers["m04"].assigned == (TP("t", 1),)
    covered = {tp for a in answers.values() for tp in a.assigned}
    assert covered == {TP("t", p) for p in range(3)}
    # Fewer members than partitions: dealt round robin.
    assert d(CreateTopic("wide", 5, 1)).ok
    x = beat(d, "x", 0, ("wide",), group="w")
    y = beat(d, "y", 0, ("wide",), group="w")
    x = beat(d, "x", x.member_epoch, ("wide",), group="w")
    assert [tp.partition for tp in x.assigned] == [0, 2, 4]
    assert [tp.partition for tp in y.assigned] == [1, 3]


def test_the_assignment_is_the_same_whatever_the_order_of_joins(d: Driver) -> None:
    other = Driver()
    for b in (1, 2, 3):
        other.register(b)
    assert other(CreateTopic("t", 3, 3)).ok
    for m in ("c", "a", "b", "d"):
        beat(d, m, 0)
    for m in ("d", "b", "c", "a"):
        beat(other, m, 0)
    for driver in (d, other):
        group = driver.machine.state.share_groups[G]
        for m in group.members:
            beat(driver, m, group.members[m].member_epoch)
    assigned = [
        {m: v.assigned for m, v in x.machine.state.share_groups[G].members.items()}
        for x in (d, other)
    ]
    assert assigned[0] == assigned[1]
    assert assigned[0]["a"] == assigned[0]["d"] == (TP("t", 0),)


def test_a_stale_epoch_is_fenced_and_an_unknown_member_refused(d: Driver) -> None:
    a = beat(d, "a", 0)
    b = beat(d, "b", 0)
    a2 = beat(d, "a", a.member_epoch)
    assert a2.member_epoch == b.group_epoch > a.member_epoch  # its share changed
    msg = refused(
        d, ShareGroupHeartbeat(G, "a", a.member_epoch, ("t",), 45_000, 2), Code.FENCED_MEMBER_EPOCH
    )
    assert "join again" in msg
    refused(d, ShareGroupHeartbeat(G, "zz", 3, ("t",), 45_000, 2), Code.UNKNOWN_MEMBER)
    refused(d, ShareGroupHeartbeat("none", "zz", 3, ("t",), 45_000, 2), Code.UNKNOWN_MEMBER)
    assert "none" not in d.machine.state.share_groups
    # joining again with a known id: a new member, with an epoch it never had
    a3 = beat(d, "a", 0)
    assert a3.member_epoch > a2.member_epoch


def test_leave_and_removal_hand_partitions_on(d: Driver) -> None:
    a = beat(d, "a", 0)
    beat(d, "b", 0)
    c = beat(d, "c", 0)
    left = d(ShareGroupHeartbeat(G, "b", -1, (), 0, 3))
    assert isinstance(left, ShareAssignment) and left.member_epoch == -1 and not left.assigned
    assert d(RemoveShareMembers(G, ("c", "gone"))) == Done()
    group = d.machine.state.share_groups[G]
    assert set(group.members) == {"a"} and group.epoch == c.group_epoch + 2
    a2 = beat(d, "a", a.member_epoch)
    assert len(a2.assigned) == 3
    assert d(RemoveShareMembers(G, ("gone",))) == Done()
    assert d.machine.state.share_groups[G].epoch == group.epoch  # nothing removed: unchanged


def test_subscription_changes_and_topics_that_grow_or_go(d: Driver) -> None:
    assert d(CreateTopic("u", 2, 3)).ok
    a = beat(d, "a", 0, ("t",))
    a = beat(d, "a", a.member_epoch, ("t", "u"))
    assert len(a.assigned) == 5 and a.group_epoch == 2
    assert d.machine.state.share_groups[G].topics == ("t", "u")
    assert d(AddPartitions("u", 4)).ok
    assert d.machine.state.share_groups[G].epoch == 3
    a = beat(d, "a", a.member_epoch, ("t", "u"))
    assert a.member_epoch == 3 and len(a.assigned) == 7
    assert d(DeleteTopic("u")).ok
    group = d.machine.state.share_groups[G]
    assert group.epoch == 4 and group.topics == ("t",)
    a = beat(d, "a", a.member_epoch, ("t", "u"))
    assert len(a.assigned) == 3
    # a subscription to a topic that does not exist yet assigns nothing, until it does
    b = beat(d, "b", 0, ("later",))
    assert b.assigned == () and d.machine.state.share_groups[G].topics == ("t",)
    assert d(CreateTopic("later", 1, 3)).ok
    b = beat(d, "b", b.member_epoch, ("later",))
    assert b.assigned == (TP("later", 0),)
    assert d.machine.state.share_groups[G].topics == ("later", "t")
    # an unrelated topic changes no group
    epoch = d.machine.state.share_groups[G].epoch
    assert d(CreateTopic("other", 1, 3)).ok
    assert d.machine.state.share_groups[G].epoch == epoch


def test_settings_are_checked_and_altering_creates_the_group(d: Driver) -> None:
    changed = {"share.record.lock.duration.ms": "5000", "share.dead.letter.topic": "dlq"}
    assert d(AlterShareGroupConfig("fresh", changed)) == Done()
    group = d.machine.state.share_groups["fresh"]
    assert group.created_version == d.index and not group.members
    assert group.settings == ShareSettings(record_lock_duration_ms=5_000, dead_letter_topic="dlq")
    assert d(AlterShareGroupConfig("fresh", {"share.record.lock.duration.ms": ""})) == Done()
    assert d.machine.state.share_groups["fresh"].settings.record_lock_duration_ms == 30_000
    for bad, words in (
        ({"share.delivery.count.limit": "0"}, "between 1 and 10"),
        ({"share.auto.offset.reset": "middle"}, "latest or earliest"),
        ({"share.record.lock.duration.ms": "soon"}, "not a whole number"),
        ({"no.such.setting": "1"}, "unknown share group setting"),
        ({"share.dead.letter.topic": "bad name!"}, "not a topic name"),
        ({}, "at least one"),
    ):
        assert words in refused(d, AlterShareGroupConfig("fresh", bad), Code.INVALID_SHARE_SETTING)
    assert d.machine.state.share_groups["fresh"].settings.dead_letter_topic == "dlq"
    refused(
        d, AlterShareGroupConfig("bad id!", {"share.delivery.count.limit": "2"}), Code.INVALID_GROUP
    )


def test_delete_waits_for_an_empty_group(d: Driver) -> None:
    a = beat(d, "a", 0)
    assert "active members" in refused(d, DeleteShareGroup(G), Code.GROUP_NOT_EMPTY)
    d(ShareGroupHeartbeat(G, "a", -1, (), 0, 2))
    assert G in d.machine.state.share_groups  # an empty group stays until deleted
    assert d(DeleteShareGroup(G)) == Done()
    assert G not in d.machine.state.share_groups
    refused(d, DeleteShareGroup(G), Code.UNKNOWN_GROUP)
    # created again under the same id: a new created_version
    again = beat(d, "a", 0)
    assert d.machine.state.share_groups[G].created_version > a.member_epoch
    assert again.member_epoch == 1


def test_a_group_id_is_a_consumer_group_or_a_share_group_never_both(d: Driver) -> None:
    beat(d, "a", 0, group="shared")
    consumer = GroupHeartbeat("shared", "", None, 0, ("t",), (), "sticky", 1)
    assert "is a share group" in refused(d, consumer, Code.INCONSISTENT_GROUP_TYPE)
    commit = OffsetCommit("shared", "", -1, (OffsetEntry("t", 0, 1, ""),))
    result = d(CommitOffsets((commit,), 1))
    assert isinstance(result, CommitsApplied)
    assert result.outcomes[0].code == Code.INCONSISTENT_GROUP_TYPE.value
    reset = ResetOffsets("shared", (OffsetEntry("t", 0, 1, ""),), True, 1)
    refused(d, reset, Code.INCONSISTENT_GROUP_TYPE)
    refused(d, DeleteGroup("shared"), Code.UNKNOWN_GROUP)

    assert d(GroupHeartbeat("cg", "", None, 0, ("t",), (), "sticky", 1)).ok
    share = ShareGroupHeartbeat("cg", "", 0, ("t",), 45_000, 1)
    assert "is a consumer group" in refused(d, share, Code.INCONSISTENT_GROUP_TYPE)
    alter = AlterShareGroupConfig("cg", {"share.delivery.count.limit": "2"})
    refused(d, alter, Code.INCONSISTENT_GROUP_TYPE)
    assert "consumer group" in refused(d, DeleteShareGroup("cg"), Code.UNKNOWN_GROUP)
    assert "cg" not in d.machine.state.share_groups


def test_bad_heartbeats_are_refused_with_sentences(d: Driver) -> None:
    for command, code in (
        (ShareGroupHeartbeat("bad id", "", 0, ("t",), 45_000, 1), Code.INVALID_GROUP),
        (ShareGroupHeartbeat(G, "", 0, (), 45_000, 1), Code.INVALID_GROUP),
        (ShareGroupHeartbeat(G, "", 0, ("u", "t"), 45_000, 1), Code.INVALID_GROUP),
        (ShareGroupHeartbeat(G, "", -2, ("t",), 45_000, 1), Code.INVALID_GROUP),
        (ShareGroupHeartbeat(G, "", 3, ("t",), 45_000, 1), Code.UNKNOWN_MEMBER),
        (ShareGroupHeartbeat(G, "", 0, ("t",), 999, 1), Code.INVALID_GROUP),
        (ShareGroupHeartbeat(G, "a b", 0, ("t",), 45_000, 1), Code.INVALID_GROUP),
    ):
        assert refused(d, command, code)
    assert not d.machine.state.share_groups


def test_share_groups_survive_a_snapshot_and_old_snapshots_read(d: Driver) -> None:
    beat(d, "a", 0)
    beat(d, "b", 0, ("t", "u"))
    assert d(AlterShareGroupConfig(G, {"share.delivery.count.limit": "3"})) == Done()
    state = d.machine.state
    assert decode_snapshot(encode_snapshot(state)) == state
    # A snapshot written before share groups existed has no share_groups: it reads as none.
    raw = json.loads(encode_snapshot(state))
    del raw["state"]["share_groups"]
    old = decode_snapshot(codec.dumps(raw))
    assert old.share_groups == {} and old.topics == state.topics
    # ...and one whose share group has settings from before a setting existed reads its
    # default.
    raw = json.loads(encode_snapshot(state))
    del raw["state"]["share_groups"][G]["settings"]["record_lock_partition_limit"]
    assert decode_snapshot(codec.dumps(raw)).share_groups[G].settings.delivery_count_limit == 3
    # A damaged one is refused.
    raw = json.loads(encode_snapshot(state))
    raw["state"]["share_groups"]["other"] = raw["state"]["share_groups"][G]
    with pytest.raises(SnapshotError, match="share group key 'other'"):
        decode_snapshot(codec.dumps(raw))
