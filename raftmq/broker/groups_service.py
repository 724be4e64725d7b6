"""raftmq.v1.Groups (groups.proto): the consumer group coordinator's gRPC face, on every
controller voter. A thin adapter over
:class:`~raftmq.controller.coordinator.GroupCoordinator`: what could make a command huge
(long lists, long metadata, a bad session timeout) is refused here, quoted short, before
anything is proposed; the state (members, epochs, assignments, topics) is the
transitions' to judge (raftmq.controller.groups), so one rule holds however a command
arrives. A voter that does not lead answers NOT_CONTROLLER with the leader's address
(:class:`ControllerFace`); a broker-only node answers through
:class:`~raftmq.broker.admin_redirect.AdminRedirect`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.broker.admin_redirect import AdminRedirect
from raftmq.broker.controller_service import ControllerFace
from raftmq.broker.refusals import Refusal, shorten
from raftmq.broker.rpc import add_service
from raftmq.controller import commands as c
from raftmq.controller.assignors import DEFAULT_ASSIGNOR
from raftmq.controller.coordinator import (
    DEFAULT_SESSION_TIMEOUT_MS,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    GroupCoordinator,
    commit_bytes,
    group_state,
    heartbeat_interval_ms,
    partitions_of,
)
from raftmq.controller.groups import (
    GROUP_ID,
    MAX_OFFSET_METADATA_CHARS,
    MAX_SUBSCRIPTIONS,
    MEMBER_ID,
)
from raftmq.controller.model import ConsumerGroup, MetadataState, TopicPartition
from raftmq.controller.quorum import ControllerQuorum

MAX_LISTED_PARTITIONS = 4096
"""What one heartbeat (owned) or one commit names at most: a metadata command is bounded
(1 MiB), and a member holding more partitions than this is not a layout we serve."""
MAX_REQUEST_COMMIT_BYTES = 512 * 1024
"""One commit's share of a batch, at most (coordinator.commit_bytes)."""


def check_group_id(group_id: str) -> str:
    if not GROUP_ID.fullmatch(group_id):
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"group id {shorten(group_id)} is not 1-255 of A-Z a-z 0-9 . _ -",
        )
    return group_id


def check_member_id(member_id: str) -> str:
    if member_id and not MEMBER_ID.fullmatch(member_id):
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"member id {shorten(member_id)} is not 1-255 of A-Z a-z 0-9 . _ : - (the id "
            "the coordinator's answer gave, or empty)",
        )
    return member_id


def _topic_partitions(listed: Iterable[gpb.GroupTopicPartitions]) -> tuple[TopicPartition, ...]:
    """Sorted and distinct, so that the same holdings always make the same member state
    (a beat that only reorders them changes nothing, and is not written)."""
    tps = {TopicPartition(tp.topic, p) for tp in listed for p in tp.partitions}
    if len(tps) > MAX_LISTED_PARTITIONS:
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"{len(tps)} partitions named; at most {MAX_LISTED_PARTITIONS} per request",
        )
    return tuple(sorted(tps))


class BeatRequest(Protocol):
    """What every group heartbeat carries (a consumer group's, a share group's)."""

    @property
    def group_id(self) -> str: ...
    @property
    def session_timeout_ms(self) -> int: ...
    @property
    def subscriptions(self) -> Sequence[str]: ...


def checked_beat(request: BeatRequest) -> int:
    """The session timeout a heartbeat asks for, once its group id, timeout and the
    number of its subscriptions pass."""
    check_group_id(request.group_id)
    timeout_ms = request.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS
    if not MIN_SESSION_TIMEOUT_MS <= timeout_ms <= MAX_SESSION_TIMEOUT_MS:
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"session_timeout_ms {timeout_ms} is not between {MIN_SESSION_TIMEOUT_MS} and "
            f"{MAX_SESSION_TIMEOUT_MS} (0 for the default, {DEFAULT_SESSION_TIMEOUT_MS})",
        )
    if len(request.subscriptions) > MAX_SUBSCRIPTIONS:
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"{len(request.subscriptions)} topics subscribed; a member subscribes to at "
            f"most {MAX_SUBSCRIPTIONS} (resolve a pattern to the topics it matches)",
        )
    return timeout_ms


def wire(tps: Iterable[TopicPartition]) -> list[gpb.GroupTopicPartitions]:
    return [gpb.GroupTopicPartitions(topic=t, partitions=p) for t, p in partitions_of(tps).items()]


def _offsets(listed: Iterable[gpb.OffsetToCommit]) -> tuple[c.OffsetEntry, ...]:
    offsets = tuple(c.OffsetEntry(o.topic, o.partition, o.offset, o.metadata) for o in listed)
    if not offsets:
        raise Refusal(pb.ERROR_CODE_INVALID_GROUP, "no offsets named; send at least one")
    if len(offsets) > MAX_LISTED_PARTITIONS:
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"{len(offsets)} offsets named; at most {MAX_LISTED_PARTITIONS} per request",
        )
    for o in offsets:
        if len(o.metadata) > MAX_OFFSET_METADATA_CHARS:
            raise Refusal(
                pb.ERROR_CODE_INVALID_GROUP,
                f"the metadata of {shorten(o.topic)}/{o.partition} is {len(o.metadata)} "
                f"characters; at most {MAX_OFFSET_METADATA_CHARS}",
            )
    if len({(o.topic, o.partition) for o in offsets}) != len(offsets):
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP, "a partition is named twice; name each partition once"
        )
    return offsets


def _check_size(commit: c.OffsetCommit) -> None:
    if commit_bytes(commit) > MAX_REQUEST_COMMIT_BYTES:
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"the offsets and their metadata are too large for one request (over "
            f"{MAX_REQUEST_COMMIT_BYTES // 1024} KiB); split them or shorten the metadata",
        )


class CommitRequest(Protocol):
    """What a commit's request carries (CommitOffsets, and a transaction's
    AddOffsetsToTxn, transactions.proto)."""

    @property
    def group_id(self) -> str: ...
    @property
    def member_id(self) -> str: ...
    @property
    def member_epoch(self) -> int: ...
    @property
    def offsets(self) -> Iterable[gpb.OffsetToCommit]: ...


def checked_commit(request: CommitRequest) -> c.OffsetCommit:
    """The commit a request asks for, once its fields pass the checks above."""
    commit = c.OffsetCommit(
        check_group_id(request.group_id),
        check_member_id(request.member_id),
        request.member_epoch,
        _offsets(request.offsets),
    )
    _check_size(commit)
    return commit


def _positions(
    group: ConsumerGroup | None, wanted: set[tuple[str, int]] | None
) -> list[gpb.CommittedPosition]:
    if group is None:
        return []
    return [
        gpb.CommittedPosition(
            topic=topic,
            partition=p,
            offset=o.offset,
            metadata=o.metadata,
            committed_ms=o.committed_ms,
        )
        for topic, parts in sorted(group.committed_offsets.items())
        for p, o in sorted(parts.items())
        if wanted is None or (topic, p) in wanted
    ]


def _group(state: MetadataState, group_id: str) -> ConsumerGroup:
    group = state.consumer_groups.get(check_group_id(group_id))
    if group is None:
        raise Refusal(
            pb.ERROR_CODE_UNKNOWN_GROUP, f"there is no consumer group {shorten(group_id)}"
        )
    return group


class GroupsService(ControllerFace):
    def __init__(self, quorum: ControllerQuorum, addresses: Mapping[int, str]) -> None:
        super().__init__(quorum, addresses)
        self.coordinator = GroupCoordinator(quorum)

    async def ConsumerGroupHeartbeat(
        self, request: gpb.ConsumerGroupHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> gpb.ConsumerGroupHeartbeatResponse:
        timeout_ms = checked_beat(request)
        beat = c.GroupHeartbeat(
            request.group_id,
            check_member_id(request.member_id),
            request.instance_id or None,
            request.member_epoch,
            tuple(request.subscriptions),
            _topic_partitions(request.owned),
            request.assignor or DEFAULT_ASSIGNOR,
            self.quorum.now_ms(),
        )
        answer = await self.call(self.coordinator.heartbeat(beat, timeout_ms))
        return gpb.ConsumerGroupHeartbeatResponse(
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            group_epoch=answer.group_epoch,
            assigned=wire(answer.assigned),
            revoke=wire(answer.revoke),
            heartbeat_interval_ms=heartbeat_interval_ms(timeout_ms),
        )

    async def CommitOffsets(
        self, request: gpb.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gpb.CommitOffsetsResponse:
        commit = checked_commit(request)
        version = await self.call(self.coordinator.commit(commit))
        return gpb.CommitOffsetsResponse(metadata_version=version)

    async def FetchOffsets(
        self, request: gpb.FetchOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gpb.FetchOffsetsResponse:
        check_group_id(request.group_id)
        wanted = {(tp.topic, p) for tp in request.partitions for p in tp.partitions} or None
        state = await self.call(self.coordinator.current())
        group = state.consumer_groups.get(request.group_id)
        return gpb.FetchOffsetsResponse(offsets=_positions(group, wanted))

    async def ListGroups(
        self, request: gpb.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gpb.ListGroupsResponse:
        state = await self.call(self.coordinator.current())
        return gpb.ListGroupsResponse(
            groups=[
                gpb.GroupSummary(
                    group_id=g.group_id,
                    state=group_state(g),
                    member_count=len(g.members),
                    group_epoch=g.epoch,
                )
                for _, g in sorted(state.consumer_groups.items())
            ]
        )

    async def DescribeGroup(
        self, request: gpb.DescribeGroupRequest, context: grpc.aio.ServicerContext
    ) -> gpb.GroupDescription:
        check_group_id(request.group_id)
        group = _group(await self.call(self.coordinator.current()), request.group_id)
        age_ms = self.coordinator.last_heartbeat_age_ms
        return gpb.GroupDescription(
            group_id=group.group_id,
            state=group_state(group),
            group_epoch=group.epoch,
            assignor=group.assignor,
            members=[
                gpb.GroupMemberDescription(
                    member_id=m.member_id,
                    instance_id=m.instance_id or "",
                    member_epoch=m.member_epoch,
                    subscriptions=m.subscriptions,
                    assigned=wire(m.assigned),
                    target=wire(group.target.get(m.member_id, ())),
                    joined_ms=m.joined_ms,
                    last_heartbeat_age_ms=age_ms(group.group_id, m.member_id),
                )
                for _, m in sorted(group.members.items())
            ],
            offsets=_positions(group, None),
        )

    async def ResetOffsets(
        self, request: gpb.ResetOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gpb.ChangeDoneResponse:
        offsets = _offsets(request.offsets)
        _check_size(c.OffsetCommit(check_group_id(request.group_id), "", 0, offsets))
        version = await self.call(
            self.coordinator.reset_offsets(request.group_id, offsets, request.force)
        )
        return gpb.ChangeDoneResponse(metadata_version=version)

    async def DeleteGroup(
        self, request: gpb.DeleteGroupRequest, context: grpc.aio.ServicerContext
    ) -> gpb.ChangeDoneResponse:
        version = await self.call(self.coordinator.delete_group(check_group_id(request.group_id)))
        return gpb.ChangeDoneResponse(metadata_version=version)


def add_groups_service(service: GroupsService, server: grpc.aio.Server) -> None:
    add_service(service, server, gpb, "Groups")


def add_groups_redirect(redirect: AdminRedirect, server: grpc.aio.Server) -> None:
    """Groups on a broker-only node: every call answered NOT_CONTROLLER, as Admin's."""
    add_service(redirect, server, gpb, "Groups")
