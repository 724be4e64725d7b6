"""raftmq.v1.SharePartitions (share.proto): a partition leader's share-group face. Each RPC
finds this broker's replica (raftmq.broker.routing: UNKNOWN_TOPIC, NOT_LEADER with the
leader's address, ...), judges the member against this broker's metadata, and calls the
replica's share operations (raftmq.partition.share_partition).

The membership check waits for the metadata the member was answered with: a heartbeat
answer names the metadata version that holds the member, the member sends it back, and a
broker whose copy is older waits for it (at most METADATA_WAIT_S, and never past the
call's deadline) rather than call a new member unknown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import share_pb2 as spb
from raftmq.broker.refusals import Refusal, shorten
from raftmq.broker.routing import BrokerState, Router, at_most
from raftmq.broker.rpc import add_service
from raftmq.controller.groups import GROUP_ID, MEMBER_ID
from raftmq.controller.model import MetadataState, ShareGroup
from raftmq.partition.errors import PartitionError
from raftmq.partition.replica import PartitionReplica
from raftmq.partition.share_partition import MAX_WAIT_S, AckTuple, ShareGroupView
from raftmq.partition.share_state import AckResult

METADATA_WAIT_S = 5.0
METADATA_POLL_S = 0.02
MAX_RECORDS = 10_000
MAX_ACKNOWLEDGEMENTS = 10_000
MAX_FETCH_BYTES = 64 * 1024 * 1024
ANSWER_SLACK_S = 1.0
"""How long before a call's deadline a long poll stops waiting (an acquisition then still
has time to commit and be answered)."""


def add_share_service(service: SharePartitionsService, server: grpc.aio.Server) -> None:
    add_service(service, server, spb, "SharePartitions")


def _check_ids(group_id: str, member_id: str | None) -> None:
    if not GROUP_ID.fullmatch(group_id):
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"group id {shorten(group_id)} is not 1-255 of A-Z a-z 0-9 . _ -",
        )
    if member_id is not None and not MEMBER_ID.fullmatch(member_id):
        raise Refusal(
            pb.ERROR_CODE_INVALID_GROUP,
            f"member id {shorten(member_id)} is not 1-255 of A-Z a-z 0-9 . _ : - (the id "
            "the share group heartbeat answered)",
        )


def _ack_results(
    results: list[AckResult], asked: list[spb.AcknowledgementBatch]
) -> list[spb.AcknowledgeResult]:
    return [
        spb.AcknowledgeResult(
            first_offset=a.first_offset,
            last_offset=a.last_offset,
            error=pb.ProduceError(code=r.error, message=r.message) if r.error else None,
            lock_deadline_ms=r.deadline_ms,
        )
        for r, a in zip(results, asked, strict=True)
    ]


def _wait_s(max_wait_ms: int, context: grpc.aio.ServicerContext) -> float:
    """The long poll's wait, ended in time to answer before the call's deadline: records
    acquired for a caller that gave up would stay locked to it until their lock ends."""
    remaining = context.time_remaining()
    wait_s = max_wait_ms / 1000
    return wait_s if remaining is None else max(0.0, min(wait_s, remaining - ANSWER_SLACK_S))


class SharePartitionsService:
    def __init__(
        self,
        router: Router,
        broker: BrokerState,
        share_groups: Callable[[MetadataState], Mapping[str, ShareGroup]] | None = None,
    ) -> None:
        """``share_groups``: where a metadata state keeps its share groups (the field, by
        default)."""
        self.router = router
        self.broker = broker
        self._share_groups = share_groups or (lambda state: state.share_groups)

    # --- membership ------------------------------------------------------------------------

    async def _group(
        self,
        group_id: str,
        member_id: str | None,
        metadata_version: int,
        context: grpc.aio.ServicerContext,
    ) -> ShareGroupView:
        """The group as this broker's metadata holds it (at ``metadata_version`` or later,
        waited for); refuses UNKNOWN_GROUP, UNKNOWN_MEMBER, INCONSISTENT_GROUP_TYPE."""
        _check_ids(group_id, member_id)
        remaining = context.time_remaining()
        wait_s = METADATA_WAIT_S if remaining is None else min(METADATA_WAIT_S, remaining)
        give_up = time.monotonic() + wait_s
        while self.broker.metadata_version < metadata_version and time.monotonic() < give_up:
            await asyncio.sleep(METADATA_POLL_S)
        state = self.broker.metadata
        have = self.broker.metadata_version
        group = self._share_groups(state).get(group_id)
        if group is None:
            if group_id in state.consumer_groups:
                raise Refusal(
                    pb.ERROR_CODE_INCONSISTENT_GROUP_TYPE,
                    f"{group_id!r} is a consumer group, not a share group; use another id",
                )
            raise Refusal(
                pb.ERROR_CODE_UNKNOWN_GROUP,
                f"share group {group_id!r} does not exist as of metadata version {have} on "
                f"broker {self.broker.id}; join it with a heartbeat first",
            )
        if member_id is not None and member_id not in group.members:
            raise Refusal(
                pb.ERROR_CODE_UNKNOWN_MEMBER,
                f"member {member_id!r} is not in share group {group_id!r} as of metadata "
                f"version {have} on broker {self.broker.id} (asked for {metadata_version}); "
                "heartbeat, and join again if the answer says so",
            )
        return ShareGroupView(group_id, group.created_version, group.settings, have)

    def _leader(self, topic: str, partition: int) -> PartitionReplica:
        replica = self.router.replica(topic, partition)
        if not replica.is_leader:
            raise self.router.refusal(replica._not_leader(replica.leader_id))
        return replica

    async def _member_request(
        self,
        request: spb.ShareFetchRequest | spb.ShareAcknowledgeRequest,
        context: grpc.aio.ServicerContext,
    ) -> tuple[PartitionReplica, ShareGroupView, list[AckTuple]]:
        """A member's request (fetch, acknowledge): its leader replica here, its group as
        the metadata holds it, its acknowledgements as (first, last, type, delivery count)."""
        at_most("acknowledgements", len(request.acknowledgements), MAX_ACKNOWLEDGEMENTS)
        replica = self._leader(request.topic, request.partition)
        group = await self._group(
            request.group_id, request.member_id, request.metadata_version, context
        )
        acks: list[AckTuple] = [
            (a.first_offset, a.last_offset, int(a.type), a.delivery_count)
            for a in request.acknowledgements
        ]
        return replica, group, acks

    # --- RPCs --------------------------------------------------------------------------------

    async def ShareFetch(
        self, request: spb.ShareFetchRequest, context: grpc.aio.ServicerContext
    ) -> spb.ShareFetchResponse:
        at_most("max_records", request.max_records, MAX_RECORDS)
        at_most("max_bytes", request.max_bytes, MAX_FETCH_BYTES, " bytes")
        at_most("max_wait_ms", request.max_wait_ms, int(MAX_WAIT_S * 1000), " ms")
        replica, group, acks = await self._member_request(request, context)
        try:
            got = await replica.share.fetch(
                group,
                request.member_id,
                max_records=request.max_records,
                max_bytes=request.max_bytes,
                max_wait_s=_wait_s(request.max_wait_ms, context),
                acknowledgements=acks,
            )
        except PartitionError as exc:
            raise self.router.refusal(exc) from None
        return spb.ShareFetchResponse(
            entries=got.entries,
            acquired=[
                spb.AcquiredRecords(first_offset=f, last_offset=last, delivery_count=n)
                for f, last, n in got.acquired
            ],
            lock_deadline_ms=got.lock_deadline_ms,
            acknowledge_results=_ack_results(got.acknowledged, list(request.acknowledgements)),
            high_watermark=got.high_watermark,
        )

    async def ShareAcknowledge(
        self, request: spb.ShareAcknowledgeRequest, context: grpc.aio.ServicerContext
    ) -> spb.ShareAcknowledgeResponse:
        replica, group, acks = await self._member_request(request, context)
        try:
            results = await replica.share.acknowledge(group, request.member_id, acks)
        except PartitionError as exc:
            raise self.router.refusal(exc) from None
        return spb.ShareAcknowledgeResponse(
            results=_ack_results(results, list(request.acknowledgements))
        )

    async def DescribeSharePartition(
        self, request: spb.DescribeSharePartitionRequest, context: grpc.aio.ServicerContext
    ) -> spb.SharePartitionDescription:
        replica = self._leader(request.topic, request.partition)
        group = await self._group(request.group_id, None, 0, context)
        d = replica.share.describe(group)
        return spb.SharePartitionDescription(
            exists=d.exists,
            start_offset=d.start_offset,
            end_offset=d.end_offset,
            in_flight=d.in_flight,
            acquired=d.acquired,
            available=d.available,
            archived_total=d.archived_total,
            dead_lettered_total=d.dead_lettered_total,
            oldest_acquired_age_ms=d.oldest_acquired_age_ms,
            high_watermark=d.high_watermark,
        )

    async def ResetSharePartition(
        self, request: spb.ResetSharePartitionRequest, context: grpc.aio.ServicerContext
    ) -> spb.ResetSharePartitionResponse:
        replica = self._leader(request.topic, request.partition)
        group = await self._group(request.group_id, None, 0, context)
        members = self._share_groups(self.broker.metadata)[request.group_id].members
        if members and not request.force:
            raise Refusal(
                pb.ERROR_CODE_GROUP_NOT_EMPTY,
                f"share group {request.group_id!r} has {len(members)} member(s): reset its "
                "offsets once they are gone, or with force",
            )
        try:
            start = await replica.share.reset(group, request.offset)
        except PartitionError as exc:
            raise self.router.refusal(exc) from None
        return spb.ResetSharePartitionResponse(start_offset=start)
