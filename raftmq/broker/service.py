"""The client-facing gRPC service (raftmq.v1.Broker): validates every field, maps partition
errors to gRPC statuses with a sentence and machine-readable trailing metadata."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, NoReturn

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.broker.cluster_file import TOPIC_NAME
from raftmq.partition.errors import (
    NotLeaderError,
    OffsetOutOfRangeError,
    PartitionError,
)
from raftmq.partition.replica import Acks, PartitionReplica

if TYPE_CHECKING:
    from raftmq.broker.server import Broker

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 300_000
DEFAULT_FETCH_BYTES = 1 << 20
MAX_FETCH_BYTES = 64 << 20
MAX_WAIT_MS = 60_000
MAX_PARKED_FETCHES = 10_000

_STATUS = {
    "UNKNOWN_TOPIC": grpc.StatusCode.NOT_FOUND,
    "UNKNOWN_PARTITION": grpc.StatusCode.NOT_FOUND,
    "NOT_HOSTED": grpc.StatusCode.NOT_FOUND,
    "NOT_LEADER": grpc.StatusCode.FAILED_PRECONDITION,
    "LEADER_NOT_AVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "INVALID_BATCH": grpc.StatusCode.INVALID_ARGUMENT,
    "CORRUPT_BATCH": grpc.StatusCode.INVALID_ARGUMENT,
    "BATCH_TOO_LARGE": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "OFFSET_OUT_OF_RANGE": grpc.StatusCode.OUT_OF_RANGE,
    "TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "OUTCOME_UNKNOWN": grpc.StatusCode.UNAVAILABLE,
}


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._parked = asyncio.Semaphore(MAX_PARKED_FETCHES)

    async def _abort(
        self, context: grpc.aio.ServicerContext, code: str, message: str, **meta: object
    ) -> NoReturn:
        metadata = [("raftmq-error", code)] + [
            (f"raftmq-{k.replace('_', '-')}", str(v)) for k, v in meta.items() if v is not None
        ]
        await context.abort(_STATUS[code], message, trailing_metadata=tuple(metadata))
        raise AssertionError("unreachable: abort raises")

    async def _at_most(
        self, context: grpc.aio.ServicerContext, name: str, value: int, limit: int
    ) -> None:
        if value > limit:
            await self._abort(context, "INVALID_ARGUMENT", f"{name} {value} is over {limit}")

    async def _fail(self, context: grpc.aio.ServicerContext, exc: PartitionError) -> NoReturn:
        if isinstance(exc, NotLeaderError):
            leader = self.broker.spec.brokers.get(exc.leader)
            if exc.leader == 0 or leader is None:
                await self._abort(context, "LEADER_NOT_AVAILABLE", str(exc))
            await self._abort(
                context,
                "NOT_LEADER",
                str(exc),
                leader_id=exc.leader,
                leader_address=leader.address,
            )
        if isinstance(exc, OffsetOutOfRangeError):
            await self._abort(
                context,
                exc.code,
                str(exc),
                log_start_offset=exc.start,
                high_watermark=exc.high_watermark,
            )
        await self._abort(context, exc.code, str(exc))

    async def _replica(
        self, context: grpc.aio.ServicerContext, topic: str, partition: int
    ) -> PartitionReplica:
        if self.broker.stopping:
            await self._abort(
                context, "SHUTTING_DOWN", f"broker {self.broker.id} is shutting down; use another"
            )
        spec = self.broker.spec.topics.get(topic)
        if spec is None:
            if not TOPIC_NAME.match(topic):
                await self._abort(
                    context,
                    "INVALID_ARGUMENT",
                    f"{topic!r} is not a valid topic name: use 1-200 characters of "
                    "A-Z a-z 0-9 . _ -",
                )
            known = ", ".join(sorted(self.broker.spec.topics)) or "none"
            await self._abort(
                context, "UNKNOWN_TOPIC", f"topic {topic!r} does not exist; known topics: {known}"
            )
        if partition >= spec.partitions:
            await self._abort(
                context,
                "UNKNOWN_PARTITION",
                f"topic {topic!r} has {spec.partitions} partitions (0 to {spec.partitions - 1}); "
                f"there is no partition {partition}",
            )
        replica = self.broker.replicas.get((topic, partition))
        if replica is None:
            owners = ", ".join(map(str, spec.replicas[partition]))
            await self._abort(
                context,
                "NOT_HOSTED",
                f"broker {self.broker.id} hosts no replica of {topic}/{partition}; "
                f"its replicas are on brokers {owners}",
            )
        return replica

    # --- RPCs ---------------------------------------------------------------------------

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        replica = await self._replica(context, request.topic, request.partition)
        timeout_ms = request.timeout_ms or DEFAULT_TIMEOUT_MS
        await self._at_most(context, "timeout_ms", timeout_ms, MAX_TIMEOUT_MS)
        try:
            acks = Acks(request.acks)
        except ValueError:
            await self._abort(context, "INVALID_ARGUMENT", f"unknown acks value {request.acks}")
        try:
            result = await replica.produce(request.entries, acks, timeout_ms / 1000)
        except PartitionError as exc:
            await self._fail(context, exc)
        return pb.ProduceResponse(
            base_offset=result.base_offset,
            last_offset=result.last_offset,
            high_watermark=replica.high_watermark,
            log_start_offset=replica.log_start_offset,
        )

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        replica = await self._replica(context, request.topic, request.partition)
        max_bytes = request.max_bytes or DEFAULT_FETCH_BYTES
        await self._at_most(context, "max_bytes", max_bytes, MAX_FETCH_BYTES)
        await self._at_most(context, "max_wait_ms", request.max_wait_ms, MAX_WAIT_MS)
        if request.offset < 0:
            await self._abort(context, "INVALID_ARGUMENT", f"offset {request.offset} is negative")
        wait = request.max_wait_ms / 1000
        try:
            if wait and not self._parked.locked():
                async with self._parked:
                    result = await replica.fetch(request.offset, max_bytes, request.min_bytes, wait)
            else:
                result = replica.read(request.offset, max_bytes)
        except PartitionError as exc:
            await self._fail(context, exc)
        next_offset = result.next_offset if result.entries else request.offset
        return pb.FetchResponse(
            entries=result.data,
            next_offset=next_offset,
            high_watermark=replica.high_watermark,
            log_start_offset=replica.log_start_offset,
            broker_id=self.broker.id,
        )

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        replica = await self._replica(context, request.topic, request.partition)
        hw = replica.high_watermark
        which = request.WhichOneof("spec")
        if which == "timestamp_ms":
            found = replica.log.offset_for_timestamp(request.timestamp_ms)
            offset = hw if found is None else min(found, hw)
        elif request.position == pb.LATEST:
            offset = hw
        else:
            offset = replica.log_start_offset
        return pb.ListOffsetsResponse(
            offset=offset, log_start_offset=replica.log_start_offset, high_watermark=hw
        )

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        spec = self.broker.spec
        names = list(request.topics) or sorted(spec.topics)
        unknown = [n for n in names if n not in spec.topics]
        if unknown:
            await self._abort(
                context,
                "UNKNOWN_TOPIC",
                f"unknown topics: {', '.join(unknown)}; known: {', '.join(sorted(spec.topics))}",
            )
        topics = []
        for name in names:
            parts = []
            for p, replicas in enumerate(spec.topics[name].replicas):
                replica = self.broker.replicas.get((name, p))
                parts.append(
                    pb.PartitionInfo(
                        partition=p,
                        leader_id=replica.leader_id if replica else 0,
                        replicas=list(replicas),
                        leader_term=replica.leader_term if replica else 0,
                        high_watermark=replica.high_watermark if replica else -1,
                    )
                )
            topics.append(pb.TopicInfo(name=name, partitions=parts))
        brokers = [pb.BrokerInfo(id=b.id, host=b.host, port=b.port) for b in spec.brokers.values()]
        return pb.MetadataResponse(
            cluster=spec.name, brokers=brokers, topics=topics, broker_id=self.broker.id
        )
