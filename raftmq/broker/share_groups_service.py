"""raftmq.v1.ShareGroups (share.proto): the share group coordinator's gRPC face, on every
controller voter, as Groups is (raftmq.broker.groups_service). A thin adapter over
:class:`~raftmq.controller.share_coordinator.ShareCoordinator`: what could make a command
huge (long lists, long setting values, a bad session timeout) is refused here, quoted
short, before anything is proposed; the group's state is the transitions' to judge
(raftmq.controller.share_groups). A voter that does not lead answers NOT_CONTROLLER with
the leader's address (:class:`ControllerFace`); a broker-only node answers through
:class:`~raftmq.broker.admin_redirect.AdminRedirect`.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import share_pb2 as spb
from raftmq.broker.admin_redirect import AdminRedirect
from raftmq.broker.controller_service import ControllerFace
from raftmq.broker.groups_service import check_group_id, check_member_id, checked_beat, wire
from raftmq.broker.refusals import Refusal, shorten
from raftmq.broker.rpc import add_service
from raftmq.controller import commands as c
from raftmq.controller.coordinator import heartbeat_interval_ms
from raftmq.controller.model import MetadataState, ShareGroup
from raftmq.controller.quorum import ControllerQuorum
from raftmq.controller.share_coordinator import ShareCoordinator

MAX_SETTINGS = 32
MAX_SETTING_CHARS = 255
"""A setting's name or value at most (a topic name, the longest value, is 200)."""


def _settings(listed: list[spb.ShareGroupSetting]) -> dict[str, str]:
    if not listed:
        raise Refusal(pb.ERROR_CODE_INVALID_SHARE_SETTING, "name at least one setting to alter")
    if len(listed) > MAX_SETTINGS:
        raise Refusal(
            pb.ERROR_CODE_INVALID_SHARE_SETTING,
            f"{len(listed)} settings named; at most {MAX_SETTINGS} per request",
        )
    out: dict[str, str] = {}
    for s in listed:
        for what, text in (("name", s.name), ("value", s.value)):
            if len(text) > MAX_SETTING_CHARS:
                raise Refusal(
                    pb.ERROR_CODE_INVALID_SHARE_SETTING,
                    f"setting {what} {shorten(text)} is over {MAX_SETTING_CHARS} characters",
                )
        if s.name in out:
            raise Refusal(
                pb.ERROR_CODE_INVALID_SHARE_SETTING,
                f"setting {shorten(s.name)} is named twice; name each setting once",
            )
        out[s.name] = s.value
    return out


def _group(state: MetadataState, group_id: str) -> ShareGroup:
    group = state.share_groups.get(check_group_id(group_id))
    if group is None:
        also = (
            " (it is a consumer group: 'raftmq group')" if group_id in state.consumer_groups else ""
        )
        raise Refusal(
            pb.ERROR_CODE_UNKNOWN_GROUP, f"there is no share group {shorten(group_id)}{also}"
        )
    return group


class ShareGroupsService(ControllerFace):
    def __init__(self, quorum: ControllerQuorum, addresses: Mapping[int, str]) -> None:
        super().__init__(quorum, addresses)
        self.coordinator = ShareCoordinator(quorum)

    async def ShareGroupHeartbeat(
        self, request: spb.ShareGroupHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> spb.ShareGroupHeartbeatResponse:
        timeout_ms = checked_beat(request)
        beat = c.ShareGroupHeartbeat(
            request.group_id,
            check_member_id(request.member_id),
            request.member_epoch,
            tuple(request.subscriptions),
            timeout_ms,
            self.quorum.now_ms(),
        )
        answer, version = await self.call(self.coordinator.heartbeat(beat))
        return spb.ShareGroupHeartbeatResponse(
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            group_epoch=answer.group_epoch,
            assigned=wire(answer.assigned),
            heartbeat_interval_ms=heartbeat_interval_ms(timeout_ms),
            metadata_version=version,
        )

    async def ListShareGroups(
        self, request: spb.ListShareGroupsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListShareGroupsResponse:
        state = await self.call(self.coordinator.current())
        return spb.ListShareGroupsResponse(
            groups=[
                spb.ShareGroupSummary(
                    group_id=g.group_id, member_count=len(g.members), group_epoch=g.epoch
                )
                for _, g in sorted(state.share_groups.items())
            ]
        )

    async def DescribeShareGroup(
        self, request: spb.DescribeShareGroupRequest, context: grpc.aio.ServicerContext
    ) -> spb.ShareGroupDescription:
        check_group_id(request.group_id)
        group = _group(await self.call(self.coordinator.current()), request.group_id)
        age_ms = self.coordinator.last_heartbeat_age_ms
        return spb.ShareGroupDescription(
            group_id=group.group_id,
            group_epoch=group.epoch,
            members=[
                spb.ShareMemberDescription(
                    member_id=m.member_id,
                    member_epoch=m.member_epoch,
                    subscriptions=m.subscriptions,
                    assigned=wire(m.assigned),
                    joined_ms=m.joined_ms,
                    last_heartbeat_age_ms=age_ms(group.group_id, m.member_id),
                )
                for _, m in sorted(group.members.items())
            ],
            settings=[
                spb.ShareGroupSetting(name=k, value=v) for k, v in group.settings.as_dict().items()
            ],
            topics=group.topics,
            created_version=group.created_version,
        )

    async def AlterShareGroupConfig(
        self, request: spb.AlterShareGroupConfigRequest, context: grpc.aio.ServicerContext
    ) -> gpb.ChangeDoneResponse:
        check_group_id(request.group_id)
        settings = _settings(list(request.settings))
        version = await self.call(self.coordinator.alter_config(request.group_id, settings))
        return gpb.ChangeDoneResponse(metadata_version=version)

    async def DeleteShareGroup(
        self, request: gpb.DeleteGroupRequest, context: grpc.aio.ServicerContext
    ) -> gpb.ChangeDoneResponse:
        version = await self.call(self.coordinator.delete_group(check_group_id(request.group_id)))
        return gpb.ChangeDoneResponse(metadata_version=version)


def add_share_groups_service(service: ShareGroupsService, server: grpc.aio.Server) -> None:
    add_service(service, server, spb, "ShareGroups")


def add_share_groups_redirect(redirect: AdminRedirect, server: grpc.aio.Server) -> None:
    """ShareGroups on a broker-only node: every call answered NOT_CONTROLLER, as Admin's."""
    add_service(redirect, server, spb, "ShareGroups")
