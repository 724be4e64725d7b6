"""raftmq.v1.Controller (controller.proto): the gRPC face of one controller voter that
brokers register, heartbeat and watch metadata through. A thin adapter over
:class:`~raftmq.controller.quorum.ControllerQuorum`: fields are checked here, everything
else is the quorum's.

Not forwarded: a voter that does not lead answers NOT_CONTROLLER with the leader's client
address in ``raftmq-leader-address`` and the client resends there. A proxy would hide
which voter leads, hold two calls open per request, and still need the same answer when
the leader is unreachable from this voter; the redirect costs one round trip, once per
leader change (docs/controller.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import controller_pb2 as cpb
from raftmq.broker.refusals import Refusal, controller_refusal, shorten
from raftmq.broker.rpc import add_service
from raftmq.controller.model import MetadataState
from raftmq.controller.quorum import ControllerError, ControllerQuorum
from raftmq.controller.state_machine import encode_snapshot

T = TypeVar("T")
MAX_HOST_CHARS = 253  # a DNS name


class ControllerFace:
    """What both controller services share: the quorum, the voters' client addresses
    (for the leader hint; a dict the caller may fill once its ports are bound), and the
    one translation of the quorum's errors into refusals."""

    def __init__(self, quorum: ControllerQuorum, addresses: Mapping[int, str]) -> None:
        self.quorum = quorum
        self.addresses = addresses

    async def call(self, work: Awaitable[T]) -> T:
        try:
            return await work
        except ControllerError as exc:
            raise controller_refusal(exc, self.addresses) from None


class ControllerService(ControllerFace):
    _last_encoded: tuple[int, bytes] | None = None
    """(version, bytes) of the last state sent to a watcher (see :meth:`_encoded`)."""

    async def RegisterBroker(
        self, request: cpb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> cpb.RegisterBrokerResponse:
        for what, host in (("host", request.host), ("raft_host", request.raft_host)):
            if not 1 <= len(host) <= MAX_HOST_CHARS:
                raise Refusal(
                    pb.ERROR_CODE_INVALID_BROKER,
                    f"{what} {shorten(host)} is not a host name of 1-{MAX_HOST_CHARS} characters",
                )
        registered = await self.call(
            self.quorum.register_broker(
                request.broker_id,
                request.host,
                request.port,
                request.raft_host,
                request.raft_port,
                request.rack or None,
                request.incarnation,
            )
        )
        return cpb.RegisterBrokerResponse(epoch=registered.epoch)

    async def Heartbeat(
        self, request: cpb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> cpb.HeartbeatResponse:
        fenced, version = await self.call(
            self.quorum.heartbeat(request.broker_id, request.incarnation, request.metadata_version)
        )
        return cpb.HeartbeatResponse(fenced=fenced, metadata_version=version)

    async def ReportLeader(
        self, request: cpb.ReportLeaderRequest, context: grpc.aio.ServicerContext
    ) -> cpb.ChangeDone:
        await self.call(
            self.quorum.report_leader(
                request.topic, request.partition, request.leader_id, request.term
            )
        )
        return cpb.ChangeDone(metadata_version=self.quorum.local_state()[0])

    async def PromoteReplica(
        self, request: cpb.PromoteReplicaRequest, context: grpc.aio.ServicerContext
    ) -> cpb.ChangeDone:
        await self.call(
            self.quorum.promote_replica(request.topic, request.partition, request.broker_id)
        )
        return cpb.ChangeDone(metadata_version=self.quorum.local_state()[0])

    async def WatchMetadata(
        self, request: cpb.WatchMetadataRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.MetadataUpdate]:
        if request.from_version < 0:
            raise Refusal(
                pb.ERROR_CODE_INVALID_ARGUMENT,
                f"from_version {request.from_version} is negative; send 0 for everything",
            )
        async for version, state in self.quorum.watch(request.from_version):
            yield cpb.MetadataUpdate(version=version, state=self._encoded(version, state))

    def _encoded(self, version: int, state: MetadataState) -> bytes:
        """The state as brokers get it, encoded once per version for every watcher (the
        encoding of 10,000 partitions is not free). Brokers need no transaction state (the
        coordinator reads the quorum's own): left out, a busy transactional workload does
        not grow every update."""
        cached = self._last_encoded
        if cached is not None and cached[0] == version:
            return cached[1]
        shown = dataclasses.replace(state, transactions={}) if state.transactions else state
        data = encode_snapshot(shown)
        self._last_encoded = (version, data)
        return data

    async def DescribeVoter(
        self, request: cpb.DescribeVoterRequest, context: grpc.aio.ServicerContext
    ) -> cpb.DescribeVoterResponse:
        status = self.quorum.raft_status()
        return cpb.DescribeVoterResponse(
            voter_id=self.quorum.node_id,
            term=status.term,
            last_index=status.last_index,
            leader_id=status.leader,
            rejoining=status.rejoining,
        )

    async def AllocateProducerIds(
        self, request: cpb.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.AllocateProducerIdsResponse:
        block = await self.call(self.quorum.allocate_producer_ids(request.broker_id, request.count))
        return cpb.AllocateProducerIdsResponse(first_id=block.first_id, count=block.count)


def add_controller_service(service: ControllerService, server: grpc.aio.Server) -> None:
    add_service(service, server, cpb, "Controller")
