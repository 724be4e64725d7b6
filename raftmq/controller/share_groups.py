"""The share group coordinator's state transitions (docs/share-groups.md): members joining,
heartbeating and leaving, their assignment, the group's settings, and its deletion. Pure,
like every transition (raftmq.controller.transitions).

Smaller than a consumer group (raftmq.controller.groups): several members may fetch
from one partition (the partition leader's record locks keep each record with one member
at a time), so nothing has to be given up before it is given to another member and there
is no revocation handshake. A member's answer is simply its share of the assignment,
computed from the group's members, their subscriptions and the subscribed topics'
partition counts (:func:`target`): deterministic, so it is never stored apart from what
each member was last answered.

Epochs as in consumer groups: the group epoch grows when the membership, a subscription
or a subscribed topic's partition count changes; a member's epoch is the group epoch of
its last assignment, and a heartbeat stamped with another is FENCED_MEMBER_EPOCH.

Which records are acquired, by whom, is not here: that is each partition's own state
(model.ShareGroup says why).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from raftmq.controller.commands import (
    AlterShareGroupConfig,
    DeleteShareGroup,
    Done,
    RemoveShareMembers,
    Result,
    ShareAssignment,
    ShareGroupHeartbeat,
)
from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.groups import (
    MAX_GROUPS,
    MAX_MEMBERS,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    check_beat,
    check_group_id,
    check_group_type,
    check_member_epoch,
    member_of,
)
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import MetadataState, ShareGroup, ShareMember, TopicPartition
from raftmq.share_settings import ShareSettingError

Outcome = tuple[MetadataState, Result]


# -- heartbeats ------------------------------------------------------------------------------


def heartbeat(state: MetadataState, index: int, c: ShareGroupHeartbeat) -> Outcome:
    check_beat(c.group_id, c.member_id, c.member_epoch, c.subscriptions)
    check_group_type(state, c.group_id, share=True)
    group = state.share_groups.get(c.group_id)
    if group is None:
        if c.member_epoch != 0:
            member_of(c.group_id, {}, c.member_id)  # UNKNOWN_MEMBER
        group = _created(state, c.group_id, index)
    members = dict(group.members)
    if c.member_epoch == -1:
        member = member_of(group.group_id, group.members, c.member_id)
        del members[member.member_id]
        group = _next_epoch(dataclasses.replace(group, members=members))
        return _with_group(state, group), ShareAssignment(member.member_id, -1, group.epoch, ())
    if not MIN_SESSION_TIMEOUT_MS <= c.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        raise CommandRefused(
            Code.INVALID_GROUP,
            f"session timeout {c.session_timeout_ms} ms is not between "
            f"{MIN_SESSION_TIMEOUT_MS} and {MAX_SESSION_TIMEOUT_MS}",
        )
    if c.member_epoch == 0:
        # A member known here that joins again lost what it had (its session ran out on
        # its side, or it was fenced): it comes as a new member, with an epoch it never had.
        member_id = c.member_id or f"{c.group_id}-{index}"
        if member_id not in members and len(members) >= MAX_MEMBERS:
            raise CommandRefused(
                Code.INVALID_GROUP,
                f"share group {c.group_id} has {MAX_MEMBERS} members, the most a group may have",
            )
        member = ShareMember(member_id, 0, c.subscriptions, (), c.now_ms, c.session_timeout_ms)
        changed = True
    else:
        member = member_of(group.group_id, group.members, c.member_id)
        check_member_epoch(
            group.group_id,
            member.member_id,
            member.member_epoch,
            c.member_epoch,
            "stop fetching and join again (member epoch 0)",
        )
        changed = member.subscriptions != c.subscriptions
        member = dataclasses.replace(
            member, subscriptions=c.subscriptions, session_timeout_ms=c.session_timeout_ms
        )
    members[member.member_id] = member
    # Topics that exist only: the list stays bounded by the cluster's topics (a deleted
    # one leaves it, topic_changed), however many names members subscribe to over time.
    seen = (t for t in c.subscriptions if t in state.topics)
    topics = tuple(sorted({*group.topics, *seen}))
    group = dataclasses.replace(group, members=members, topics=topics)
    if changed:
        group = _next_epoch(group)
    assigned = target(state, group, member.member_id)
    if assigned != member.assigned or c.member_epoch == 0:
        member = dataclasses.replace(member, assigned=assigned, member_epoch=group.epoch)
        group = dataclasses.replace(group, members={**group.members, member.member_id: member})
    answer = ShareAssignment(member.member_id, member.member_epoch, group.epoch, member.assigned)
    return _with_group(state, group), answer


def target(state: MetadataState, group: ShareGroup, member_id: str) -> tuple[TopicPartition, ...]:
    """What ``member_id`` fetches from. The members of one subscription (all of them,
    usually), sorted by id, share the partitions of its topics, sorted: with M members
    and P partitions, member i gets partition i mod P when M >= P (every partition has a
    member, several share one), else partitions i, i + M, i + 2M, ... (dealt round robin).
    Members of other subscriptions take their own topics the same way, on their own."""
    subscriptions = group.members[member_id].subscriptions
    peers = sorted(m for m, v in group.members.items() if v.subscriptions == subscriptions)
    partitions = [
        TopicPartition(t, p)
        for t in subscriptions  # sorted, so the partitions are
        if t in state.topics
        for p in range(len(state.topics[t].partitions))
    ]
    if not partitions:
        return ()
    i = peers.index(member_id)
    if len(peers) >= len(partitions):
        return (partitions[i % len(partitions)],)
    return tuple(partitions[i :: len(peers)])


def remove_members(state: MetadataState, index: int, c: RemoveShareMembers) -> Outcome:
    group = _group(state, c.group_id)
    members = {m: v for m, v in group.members.items() if m not in c.member_ids}
    if len(members) == len(group.members):
        return state, Done()
    return _with_group(state, _next_epoch(dataclasses.replace(group, members=members))), Done()


def topic_changed(state: MetadataState, name: str) -> MetadataState:
    """After topic ``name`` was created, grew or was deleted: the groups subscribed to it
    have a new assignment (their epoch grows; each member gets its share at its next
    heartbeat), and a deleted topic leaves every group's topics (its share-partition
    state went with its partitions)."""
    if not state.share_groups:
        return state
    groups: dict[str, ShareGroup] = {}
    for gid, g in state.share_groups.items():
        if any(name in m.subscriptions for m in g.members.values()):
            g = _next_epoch(g)
        if name not in state.topics and name in g.topics:
            g = dataclasses.replace(g, topics=tuple(t for t in g.topics if t != name))
        groups[gid] = g
    return dataclasses.replace(state, share_groups=groups)


# -- settings and deletion ---------------------------------------------------------------------


def alter_config(state: MetadataState, index: int, c: AlterShareGroupConfig) -> Outcome:
    check_group_id(c.group_id)
    check_group_type(state, c.group_id, share=True)
    if not c.settings:
        raise CommandRefused(Code.INVALID_SHARE_SETTING, "name at least one setting to alter")
    group = state.share_groups.get(c.group_id) or _created(state, c.group_id, index)
    try:
        settings = group.settings.altered(c.settings)
    except ShareSettingError as exc:
        raise CommandRefused(Code.INVALID_SHARE_SETTING, str(exc)) from None
    topic = settings.dead_letter_topic
    if topic and not TOPIC_NAME.fullmatch(topic):
        raise CommandRefused(
            Code.INVALID_SHARE_SETTING,
            f"share.dead.letter.topic {topic[:64]!r} is not a topic name (1-200 characters "
            "of A-Z a-z 0-9 . _ -)",
        )
    return _with_group(state, dataclasses.replace(group, settings=settings)), Done()


def delete_group(state: MetadataState, index: int, c: DeleteShareGroup) -> Outcome:
    group = _group(state, c.group_id)
    if group.members:
        raise CommandRefused(
            Code.GROUP_NOT_EMPTY,
            f"share group {c.group_id} has {len(group.members)} active members; stop them first",
        )
    groups = {g: v for g, v in state.share_groups.items() if g != c.group_id}
    return dataclasses.replace(state, share_groups=groups), Done()


# -- helpers -----------------------------------------------------------------------------------


def _created(state: MetadataState, group_id: str, index: int) -> ShareGroup:
    if len(state.share_groups) >= MAX_GROUPS:
        raise CommandRefused(
            Code.INVALID_GROUP,
            f"the cluster holds {MAX_GROUPS} share groups, the most it keeps; delete unused "
            "ones ('raftmq share-group delete')",
        )
    return ShareGroup(group_id, created_version=index)


def _group(state: MetadataState, group_id: str) -> ShareGroup:
    check_group_id(group_id)
    group = state.share_groups.get(group_id)
    if group is None:
        also = (
            " (it is a consumer group: 'raftmq group')" if group_id in state.consumer_groups else ""
        )
        raise CommandRefused(Code.UNKNOWN_GROUP, f"there is no share group {group_id[:64]!r}{also}")
    return group


def _next_epoch(group: ShareGroup) -> ShareGroup:
    return dataclasses.replace(group, epoch=group.epoch + 1)


def _with_group(state: MetadataState, group: ShareGroup) -> MetadataState:
    groups: Mapping[str, ShareGroup] = {**state.share_groups, group.group_id: group}
    return dataclasses.replace(state, share_groups=groups)
