"""The consumer group coordinator's state transitions: members joining, heartbeating and
leaving, the target assignment, each member's incremental step toward it, and committed
offsets. Pure, like every transition (raftmq.controller.transitions): the same state and
command give the same next state on every controller replica.

The protocol is Kafka 4's (KIP-848) in outline. A member heartbeats what it subscribes
to and what it holds; the coordinator keeps a target assignment, computed by the group's
assignor whenever the group's epoch grows (a member came or went, subscriptions
changed, a subscribed topic grew or was deleted), and answers each member with what it
may consume now and what it must give up. A partition goes to its new member only once
its old one said it gave it up, so no partition ever has two consumers, and partitions
that do not move keep flowing (raftmq.controller.assignors.next_assignment).

Member epochs fence zombies: a member's epoch is the group epoch of its last assignment,
and a heartbeat or commit stamped with another is refused, as is a commit for a
partition the member does not hold.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

from raftmq.controller.assignors import ASSIGNORS, next_assignment
from raftmq.controller.commands import (
    CommitOffsets,
    CommitOutcome,
    CommitsApplied,
    DeleteGroup,
    Done,
    GroupAssignment,
    GroupHeartbeat,
    OffsetCommit,
    OffsetEntry,
    RemoveGroupMembers,
    ResetOffsets,
    Result,
)
from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import (
    CommittedOffset,
    ConsumerGroup,
    GroupMember,
    MetadataState,
    TopicPartition,
)
from raftmq.limits import MAX_OFFSET_METADATA_CHARS

GROUP_ID = re.compile(r"\A[A-Za-z0-9._-]{1,255}\Z")
MEMBER_ID = re.compile(r"\A[A-Za-z0-9._:-]{1,255}\Z")
MAX_GROUPS = 10_000
MAX_MEMBERS = 1_000
MAX_SUBSCRIPTIONS = 100
DEFAULT_SESSION_TIMEOUT_MS = 45_000
MIN_SESSION_TIMEOUT_MS = 1_000
MAX_SESSION_TIMEOUT_MS = 300_000

Outcome = tuple[MetadataState, Result]
M = TypeVar("M")


# -- heartbeats ------------------------------------------------------------------------------


def heartbeat(state: MetadataState, index: int, c: GroupHeartbeat) -> Outcome:
    _check_heartbeat(c)
    check_group_type(state, c.group_id, share=False)
    group = state.consumer_groups.get(c.group_id)
    if group is None:
        if len(state.consumer_groups) >= MAX_GROUPS:
            raise CommandRefused(
                Code.INVALID_GROUP,
                f"the cluster holds {MAX_GROUPS} consumer groups, the most it keeps; delete "
                "unused ones ('raftmq group delete')",
            )
        group = ConsumerGroup(c.group_id, assignor=c.assignor)
    members = dict(group.members)
    changed = False  # membership or subscriptions: the target must be computed again
    if c.member_epoch == -1:
        member = _member(group, c.member_id)
        del members[member.member_id]
        group = _retarget(state, dataclasses.replace(group, members=members), force=True)
        answer = GroupAssignment(member.member_id, -1, group.epoch, (), ())
        return _with_group(state, group), answer
    if c.member_epoch == 0:
        member, replaced = _joining(group, index, c)
        if replaced is not None:
            del members[replaced.member_id]
            changed = replaced.subscriptions != member.subscriptions
            target = {
                member.member_id if m == replaced.member_id else m: tps
                for m, tps in group.target.items()
            }
            group = dataclasses.replace(group, target=dict(sorted(target.items())))
        else:
            # A new member, or one still known here that joins again (epoch 0): that
            # one lost everything it held (its session ran out on its side first, or it
            # was fenced), so it counts as a member that came: the group's epoch grows and
            # its new member epoch is one it never had. Otherwise it could get its old
            # epoch back with the same partitions, and a commit stamped before the loss
            # (in flight, or retried) would pass the zombie check and move offsets back.
            changed = True
        if member.member_id not in members and len(members) >= MAX_MEMBERS:
            raise CommandRefused(
                Code.INVALID_GROUP,
                f"group {c.group_id} has {MAX_MEMBERS} members, the most a group may have",
            )
    else:
        member = _member_at(
            group, c.member_id, c.member_epoch, "stop consuming and join again (member epoch 0)"
        )
        changed = member.subscriptions != c.subscriptions
        member = dataclasses.replace(member, subscriptions=c.subscriptions, owned=c.owned)
    members[member.member_id] = member
    group = dataclasses.replace(group, members=members, assignor=c.assignor)
    group = _retarget(state, group, force=changed)
    others = _held_by_others(group, member.member_id)
    assigned, revoke = next_assignment(
        member.member_id,
        {(tp.topic, tp.partition) for tp in member.owned},
        {m: {(tp.topic, tp.partition) for tp in tps} for m, tps in group.target.items()},
        others,
    )
    now_assigned = _tps(assigned)
    if now_assigned != member.assigned or c.member_epoch == 0:
        member = dataclasses.replace(member, assigned=now_assigned, member_epoch=group.epoch)
        group = dataclasses.replace(group, members={**group.members, member.member_id: member})
    answer = GroupAssignment(
        member.member_id, member.member_epoch, group.epoch, member.assigned, _tps(revoke)
    )
    return _with_group(state, group), answer


def _check_heartbeat(c: GroupHeartbeat) -> None:
    check_beat(c.group_id, c.member_id, c.member_epoch, c.subscriptions)
    if c.instance_id is not None and not MEMBER_ID.fullmatch(c.instance_id):
        raise CommandRefused(Code.INVALID_GROUP, "an instance id is 1-255 of A-Z a-z 0-9 . _ : -")
    if c.assignor not in ASSIGNORS:
        raise CommandRefused(
            Code.INVALID_GROUP,
            f"assignor {c.assignor!r} is not one of {', '.join(sorted(ASSIGNORS))}",
        )


def check_beat(
    group_id: str, member_id: str, member_epoch: int, subscriptions: tuple[str, ...]
) -> None:
    """The fields every group heartbeat has (a consumer group's, a share group's)."""
    check_group_id(group_id)
    if member_id and not MEMBER_ID.fullmatch(member_id):
        raise CommandRefused(
            Code.INVALID_GROUP,
            "a member id is 1-255 of A-Z a-z 0-9 . _ : - (or empty to get one)",
        )
    if member_epoch < -1:
        raise CommandRefused(
            Code.INVALID_GROUP,
            f"member epoch {member_epoch}: send 0 to join, -1 to leave, else the epoch "
            "the last heartbeat answered",
        )
    if member_epoch != 0 and not member_id:
        raise CommandRefused(Code.UNKNOWN_MEMBER, "only a joining member (epoch 0) has no id")
    if member_epoch != -1:
        if not 1 <= len(subscriptions) <= MAX_SUBSCRIPTIONS:
            raise CommandRefused(
                Code.INVALID_GROUP,
                f"a member subscribes to 1-{MAX_SUBSCRIPTIONS} topics, not {len(subscriptions)}",
            )
        bad = [t for t in subscriptions if not TOPIC_NAME.fullmatch(t)]
        if bad or list(subscriptions) != sorted(set(subscriptions)):
            raise CommandRefused(
                Code.INVALID_GROUP,
                "subscriptions must be distinct, sorted, valid topic names"
                + (f" ({bad[0][:64]!r} is not one)" if bad else ""),
            )


def _joining(
    group: ConsumerGroup, index: int, c: GroupHeartbeat
) -> tuple[GroupMember, GroupMember | None]:
    """The member a join makes, and the static member it replaces (same instance id)."""
    member_id = c.member_id or f"{c.group_id}-{index}"
    if c.instance_id is not None:
        for old in group.members.values():
            if old.instance_id == c.instance_id:
                # A restarted static member takes its partitions back without a rebalance.
                member = dataclasses.replace(
                    old, member_id=member_id, subscriptions=c.subscriptions, owned=c.owned
                )
                return member, old
    fresh = GroupMember(member_id, c.instance_id, 0, c.subscriptions, (), c.owned, c.now_ms)
    return fresh, None


def _member(group: ConsumerGroup, member_id: str) -> GroupMember:
    return member_of(group.group_id, group.members, member_id)


def member_of(group_id: str, members: Mapping[str, M], member_id: str) -> M:
    """The member of a group (of either kind); UNKNOWN_MEMBER when it has none of that id."""
    member = members.get(member_id)
    if member is None:
        raise CommandRefused(
            Code.UNKNOWN_MEMBER,
            f"group {group_id} has no member {member_id!r} (it left, or missed its "
            "session timeout): stop consuming and join again (member epoch 0)",
        )
    return member


def check_member_epoch(
    group_id: str, member_id: str, have: int, sent: int, what_to_do: str
) -> None:
    """FENCED_MEMBER_EPOCH saying ``what_to_do`` unless ``sent`` is the member's epoch."""
    if sent != have:
        raise CommandRefused(
            Code.FENCED_MEMBER_EPOCH,
            f"member {member_id} of group {group_id} is at epoch {have}, not {sent}: {what_to_do}",
        )


def _member_at(group: ConsumerGroup, member_id: str, epoch: int, what_to_do: str) -> GroupMember:
    """The member, if it is at ``epoch``; else FENCED_MEMBER_EPOCH saying ``what_to_do``."""
    member = _member(group, member_id)
    check_member_epoch(group.group_id, member_id, member.member_epoch, epoch, what_to_do)
    return member


def _counts(state: MetadataState, group: ConsumerGroup) -> dict[str, int]:
    topics = {t for m in group.members.values() for t in m.subscriptions}
    return {t: len(state.topics[t].partitions) for t in sorted(topics) if t in state.topics}


def _retarget(state: MetadataState, group: ConsumerGroup, *, force: bool) -> ConsumerGroup:
    """The group with its target assignment computed again (and its epoch grown) when its
    membership or subscriptions changed (``force``) or its topics' partitions did."""
    counts = _counts(state, group)
    if not force and counts == dict(group.target_counts):
        return group
    subscriptions = {m.member_id: set(m.subscriptions) for m in group.members.values()}
    current = {
        m.member_id: {(tp.topic, tp.partition) for tp in m.assigned} for m in group.members.values()
    }
    target = ASSIGNORS[group.assignor](subscriptions, counts, current) if subscriptions else {}
    return dataclasses.replace(
        group,
        epoch=group.epoch + 1,
        target={m: _tps(parts) for m, parts in sorted(target.items())},
        target_counts=counts,
    )


def _held_by_others(group: ConsumerGroup, member_id: str) -> dict[tuple[str, int], str]:
    """Partitions another member may still be consuming: assigned to it, or reported
    held and not yet given up."""
    held: dict[tuple[str, int], str] = {}
    for m in sorted(group.members.values(), key=lambda x: x.member_id):
        if m.member_id == member_id:
            continue
        for tp in (*m.assigned, *m.owned):
            held.setdefault((tp.topic, tp.partition), m.member_id)
    return held


def _tps(parts: Iterable[tuple[str, int]]) -> tuple[TopicPartition, ...]:
    return tuple(sorted(TopicPartition(t, p) for t, p in parts))


def remove_members(state: MetadataState, index: int, c: RemoveGroupMembers) -> Outcome:
    group = _group(state, c.group_id)
    members = {m: v for m, v in group.members.items() if m not in c.member_ids}
    if len(members) == len(group.members):
        return state, Done()
    group = _retarget(state, dataclasses.replace(group, members=members), force=True)
    return _with_group(state, group), Done()


# -- offsets -----------------------------------------------------------------------------------


def commit_offsets(state: MetadataState, index: int, c: CommitOffsets) -> Outcome:
    """Each commit of the batch applied or refused alone, in order."""
    outcomes = []
    for commit in c.commits:
        try:
            state = _commit(state, commit, c.now_ms)
            outcomes.append(CommitOutcome("", ""))
        except CommandRefused as refusal:
            outcomes.append(CommitOutcome(refusal.code.value, refusal.message))
    return state, CommitsApplied(tuple(outcomes))


def _commit(state: MetadataState, c: OffsetCommit, now_ms: int) -> MetadataState:
    return _with_group(state, committed_group(state, c, now_ms))


def committed_group(state: MetadataState, c: OffsetCommit, now_ms: int) -> ConsumerGroup:
    """The group with ``c`` committed, once its membership (id, epoch, holdings) and its
    offsets pass; CommandRefused else. A transaction's offsets are checked with it when
    added (raftmq.controller.transactions)."""
    check_group_id(c.group_id)
    check_group_type(state, c.group_id, share=False)
    group = state.consumer_groups.get(c.group_id) or ConsumerGroup(c.group_id)
    if c.member_id:
        member = _member_at(
            group,
            c.member_id,
            c.member_epoch,
            "its assignment changed: heartbeat, then commit what it still holds",
        )
        held = set(member.assigned) | set(member.owned)
        for o in c.offsets:
            if TopicPartition(o.topic, o.partition) not in held:
                raise CommandRefused(
                    Code.PARTITION_NOT_ASSIGNED,
                    f"member {c.member_id} does not hold {o.topic}/{o.partition}, so it "
                    "cannot commit it (another member consumes it now)",
                )
    elif group.members:
        raise CommandRefused(
            Code.GROUP_NOT_EMPTY,
            f"group {c.group_id} has {len(group.members)} active members; only they commit "
            "for it (send a member id and epoch)",
        )
    if not c.offsets:
        raise CommandRefused(Code.INVALID_GROUP, "a commit needs at least one offset")
    return _with_offsets(state, group, c.offsets, now_ms)


def commit_checked(
    state: MetadataState, group_id: str, offsets: Iterable[OffsetEntry], now_ms: int
) -> MetadataState:
    """Offsets checked when they were added (a transaction's, applied with its commit
    decision): those of partitions that went since (a deleted topic) are dropped, as
    the topic's delete dropped its committed ones."""
    kept = [
        o
        for o in offsets
        if o.topic in state.topics and o.partition < len(state.topics[o.topic].partitions)
    ]
    if not kept:
        return state
    group = state.consumer_groups.get(group_id) or ConsumerGroup(group_id)
    return _with_group(state, _with_offsets(state, group, kept, now_ms))


def _with_offsets(
    state: MetadataState, group: ConsumerGroup, offsets: Iterable[OffsetEntry], now_ms: int
) -> ConsumerGroup:
    committed = {t: dict(parts) for t, parts in group.committed_offsets.items()}
    for o in offsets:
        topic = state.topics.get(o.topic)
        if topic is None:
            raise CommandRefused(Code.UNKNOWN_TOPIC, f"there is no topic {o.topic[:64]!r}")
        if not 0 <= o.partition < len(topic.partitions):
            raise CommandRefused(
                Code.UNKNOWN_PARTITION,
                f"topic {o.topic} has partitions 0-{len(topic.partitions) - 1}, not {o.partition}",
            )
        if o.offset < 0:
            raise CommandRefused(Code.INVALID_GROUP, f"offset {o.offset} is negative")
        if len(o.metadata) > MAX_OFFSET_METADATA_CHARS:
            raise CommandRefused(
                Code.INVALID_GROUP,
                f"commit metadata is {len(o.metadata)} characters; at most "
                f"{MAX_OFFSET_METADATA_CHARS}",
            )
        committed.setdefault(o.topic, {})[o.partition] = CommittedOffset(
            o.offset, o.metadata, now_ms
        )
    return dataclasses.replace(
        group,
        committed_offsets={t: dict(sorted(p.items())) for t, p in sorted(committed.items())},
    )


def reset_offsets(state: MetadataState, index: int, c: ResetOffsets) -> Outcome:
    check_group_id(c.group_id)
    check_group_type(state, c.group_id, share=False)
    group = state.consumer_groups.get(c.group_id) or ConsumerGroup(c.group_id)
    if group.members and not c.force:
        raise CommandRefused(
            Code.GROUP_NOT_EMPTY,
            f"group {c.group_id} has {len(group.members)} active members, which would "
            "overwrite the reset with their next commits; stop them first, or force it",
        )
    return _with_group(state, _with_offsets(state, group, c.offsets, c.now_ms)), Done()


def delete_group(state: MetadataState, index: int, c: DeleteGroup) -> Outcome:
    group = _group(state, c.group_id)
    if group.members:
        raise CommandRefused(
            Code.GROUP_NOT_EMPTY,
            f"group {c.group_id} has {len(group.members)} active members; stop them first",
        )
    groups = {g: v for g, v in state.consumer_groups.items() if g != c.group_id}
    return dataclasses.replace(state, consumer_groups=groups), Done()


def forget_topic(state: MetadataState, name: str) -> MetadataState:
    """A deleted topic's committed offsets go with it: a topic created again under the
    name starts with none (its offsets mean nothing for the new log)."""
    groups: dict[str, ConsumerGroup] = {}
    for gid, g in state.consumer_groups.items():
        if name in g.committed_offsets:
            offsets = {t: p for t, p in g.committed_offsets.items() if t != name}
            g = dataclasses.replace(g, committed_offsets=offsets)
        groups[gid] = g
    return dataclasses.replace(state, consumer_groups=groups)


# -- helpers -----------------------------------------------------------------------------------


def check_group_id(group_id: str) -> None:
    if not GROUP_ID.fullmatch(group_id):
        raise CommandRefused(
            Code.INVALID_GROUP,
            f"group id {group_id[:64]!r} is not 1-255 of A-Z a-z 0-9 . _ -",
        )


def check_group_type(state: MetadataState, group_id: str, *, share: bool) -> None:
    """A group id names a consumer group or a share group, never both: refused when it
    names a group of the other kind than ``share`` says."""
    kinds = ("consumer group", "share group", "group")
    if group_id in (state.consumer_groups if share else state.share_groups):
        other, this, cli = kinds if share else (kinds[1], kinds[0], "share-group")
        raise CommandRefused(
            Code.INCONSISTENT_GROUP_TYPE,
            f"{group_id[:64]!r} is a {other}, not a {this}: use another group id, or delete "
            f"the {other} first ('raftmq {cli} delete')",
        )


def _group(state: MetadataState, group_id: str) -> ConsumerGroup:
    group = state.consumer_groups.get(group_id)
    if group is None:
        raise CommandRefused(Code.UNKNOWN_GROUP, f"there is no consumer group {group_id[:64]!r}")
    return group


def _with_group(state: MetadataState, group: ConsumerGroup) -> MetadataState:
    groups: Mapping[str, ConsumerGroup] = {**state.consumer_groups, group.group_id: group}
    return dataclasses.replace(state, consumer_groups=groups)
