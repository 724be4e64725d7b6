"""A broker's link to the controller quorum (controller.proto): register, heartbeat, and
follow the metadata, over gRPC to the voters' client addresses.

Calls go to the leader the last answer named (``raftmq-leader-address`` on a
NOT_CONTROLLER refusal), else to the voters in turn, and are retried while the quorum has
no leader or a voter does not answer: a broker cannot do anything useful without the
controller, so it waits for one rather than giving up. A refusal that says the request
itself is wrong (an unknown or stale broker) is raised as :class:`LinkRefusal`.

The watch needs no leader: any voter streams its applied copy, and a stream that breaks
resumes from the last version on the next voter (each message is a whole state).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from raftmq import net
from raftmq.api.error_codes import code_of
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import admin_pb2_grpc as apb_grpc
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import controller_pb2 as cpb
from raftmq.api.v1 import controller_pb2_grpc as cpb_grpc
from raftmq.controller.model import MetadataState
from raftmq.controller.state_machine import decode_snapshot

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
RETRY_S = 0.2
_RETRIED = (
    pb.ERROR_CODE_NOT_CONTROLLER,
    pb.ERROR_CODE_CONTROLLER_NOT_AVAILABLE,
    # Leadership moved while the command was in flight: it may or may not commit. Every
    # call here may be resent: a registration of the same incarnation answers the epoch it
    # got, a beat is a beat, a leader report carries its term, and a promotion that did
    # commit is then refused as NOT_A_REPLICA (no learner any more), which a caller must
    # handle anyway. (Taken for a refusal, it made a broker restarted while the controller
    # moved log an ERROR and wait 5 s before registering again: chaos, ``controller``.)
    pb.ERROR_CODE_OUTCOME_UNKNOWN,
)


class LinkRefusal(Exception):
    """The controller refused the request itself (not for want of a leader)."""

    def __init__(self, code: pb.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ControllerLink:
    def __init__(
        self, voters: Mapping[int, str], *, security: net.Security = net.PLAINTEXT
    ) -> None:
        """``voters``: each controller voter's client address (host:port); ``security``:
        how to reach them (raftmq.net)."""
        assert voters, "a broker needs at least one controller voter"
        self.voters = dict(sorted(voters.items()))
        self._channels = net.AioChannels(security=security)
        self._leader: str | None = None
        self._turn = 0
        self.controller_version = 0
        """The highest metadata version a heartbeat's answer named (the leader's at the
        time): a local copy older than it is known to lag."""

    @property
    def leader_address(self) -> str | None:
        """The quorum leader's client address as the last answer named it, if any."""
        return self._leader

    def _stub(self, address: str, *, admin: bool = False) -> Any:
        """The Controller service's stub at ``address``, or with ``admin`` the Admin's."""
        channel = self._channels.of(address)
        return apb_grpc.AdminStub(channel) if admin else cpb_grpc.ControllerStub(channel)

    def _next_voter(self) -> str:
        addresses = list(self.voters.values())
        self._turn += 1
        return addresses[self._turn % len(addresses)]

    async def close(self) -> None:
        await self._channels.close()

    async def call(self, rpc: str, request: Any, *, admin: bool = False) -> Any:
        """``rpc`` on the quorum's leader (of the Controller service, or with ``admin`` of
        the Admin service), retried until it answers; raises LinkRefusal for a refusal of
        the request itself."""
        while True:
            address = self._leader or self._next_voter()
            try:
                stub = self._stub(address, admin=admin)
                return await getattr(stub, rpc)(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                meta = dict(exc.trailing_metadata() or ())
                code = code_of(str(meta.get("raftmq-error", "")))
                hint = str(meta.get("raftmq-leader-address", ""))
                if code == pb.ERROR_CODE_NOT_CONTROLLER and hint and hint != address:
                    self._leader = hint
                    continue
                self._leader = None
                if code in _RETRIED or code == pb.ERROR_CODE_UNSPECIFIED:
                    # no leader yet, or no answer (UNAVAILABLE, a deadline): another voter
                    await asyncio.sleep(RETRY_S)
                    continue
                raise LinkRefusal(code, exc.details() or str(exc.code())) from None

    async def register(
        self,
        broker_id: int,
        client: tuple[str, int],
        raft: tuple[str, int],
        rack: str | None,
        incarnation: int,
    ) -> int:
        """Register this process; returns its epoch."""
        answer = await self.call(
            "RegisterBroker",
            cpb.RegisterBrokerRequest(
                broker_id=broker_id,
                host=client[0],
                port=client[1],
                raft_host=raft[0],
                raft_port=raft[1],
                rack=rack or "",
                incarnation=incarnation,
            ),
        )
        return int(answer.epoch)

    async def heartbeat(self, broker_id: int, incarnation: int, version: int) -> bool:
        """One beat; True while the broker is fenced."""
        answer = await self.call(
            "Heartbeat",
            cpb.HeartbeatRequest(
                broker_id=broker_id, incarnation=incarnation, metadata_version=version
            ),
        )
        self.controller_version = max(self.controller_version, int(answer.metadata_version))
        return bool(answer.fenced)

    async def report_leader(self, topic: str, partition: int, leader: int, term: int) -> int:
        """Say this broker leads the partition in ``term``; the metadata version holding it."""
        answer = await self.call(
            "ReportLeader",
            cpb.ReportLeaderRequest(topic=topic, partition=partition, leader_id=leader, term=term),
        )
        return int(answer.metadata_version)

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: dict[str, str] | None = None,
    ) -> int:
        """Create a topic with the controller's placement (admin.proto CreateTopic); the
        metadata version holding it."""
        answer = await self.call(
            "CreateTopic",
            apb.CreateTopicRequest(
                name=name,
                partitions=partitions,
                replication_factor=replication_factor,
                config=config or {},
            ),
            admin=True,
        )
        return int(answer.metadata_version)

    async def promote_replica(self, topic: str, partition: int, broker_id: int) -> int:
        """Say the learner ``broker_id`` caught up; the metadata version that promotes it."""
        answer = await self.call(
            "PromoteReplica",
            cpb.PromoteReplicaRequest(topic=topic, partition=partition, broker_id=broker_id),
        )
        return int(answer.metadata_version)

    async def allocate_producer_ids(self, broker_id: int, count: int) -> tuple[int, int]:
        """A block of producer ids for this broker to hand out: (first id, count)."""
        answer = await self.call(
            "AllocateProducerIds",
            cpb.AllocateProducerIdsRequest(broker_id=broker_id, count=count),
        )
        return int(answer.first_id), int(answer.count)

    async def watch(self, from_version: int) -> AsyncIterator[tuple[int, MetadataState]]:
        """Every newer metadata state, from any voter, for ever (reconnecting)."""
        last = from_version
        while True:
            address = self._next_voter()
            try:
                stream = self._stub(address).WatchMetadata(
                    cpb.WatchMetadataRequest(from_version=last)
                )
                async for update in stream:
                    if update.version > last:
                        last = update.version
                        yield last, decode_snapshot(update.state)
            except grpc.aio.AioRpcError as exc:
                log.info("metadata watch on %s ended: %s", address, exc.details())
            await asyncio.sleep(RETRY_S)
