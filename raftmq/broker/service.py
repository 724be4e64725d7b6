"""The client-facing gRPC service (raftmq.v1.Broker): validates every field, maps partition
errors to gRPC statuses with a sentence and machine-readable trailing metadata."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
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

log = logging.getLogger(__name__)

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
    "REPLICA_FAILED": grpc.StatusCode.UNAVAILABLE,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}


MAX_STREAM_INFLIGHT = 1024
"""Requests of one ProduceStream worked on at once; past it the stream is not read."""
MAX_STREAM_ANSWERS = 256
"""Answers in one ProduceStream message at most (they are small: offsets and an id)."""


class Refusal(Exception):
    """A request refused with a symbolic code (the ``raftmq-error`` vocabulary), a sentence,
    and fields a client acts on. Unary calls turn it into a gRPC status with trailing
    metadata; ProduceStream into a ProduceError in the answer."""

    def __init__(self, code: str, message: str, **meta: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.meta = {k: v for k, v in meta.items() if v is not None}

    @classmethod
    def of(cls, exc: PartitionError, broker: Broker) -> Refusal:
        if isinstance(exc, NotLeaderError):
            leader = broker.spec.brokers.get(exc.leader)
            if exc.leader == 0 or leader is None:
                return cls("LEADER_NOT_AVAILABLE", str(exc))
            return cls("NOT_LEADER", str(exc), leader_id=exc.leader, leader_address=leader.address)
        if isinstance(exc, OffsetOutOfRangeError):
            return cls(
                exc.code,
                str(exc),
                log_start_offset=exc.start,
                high_watermark=exc.high_watermark,
            )
        return cls(exc.code, str(exc))

    def to_pb(self) -> pb.ProduceError:
        return pb.ProduceError(
            code=self.code,
            message=self.message,
            leader_id=int(self.meta.get("leader_id", 0)),  # type: ignore[call-overload]
            leader_address=str(self.meta.get("leader_address", "")),
        )


async def _abort(context: grpc.aio.ServicerContext, refusal: Refusal) -> NoReturn:
    metadata = [("raftmq-error", refusal.code)] + [
        (f"raftmq-{k.replace('_', '-')}", str(v)) for k, v in refusal.meta.items()
    ]
    await context.abort(_STATUS[refusal.code], refusal.message, trailing_metadata=tuple(metadata))
    raise AssertionError("unreachable: abort raises")


def _at_most(name: str, value: int, limit: int) -> None:
    if value > limit:
        raise Refusal("INVALID_ARGUMENT", f"{name} {value} is over {limit}")


_REPLICA_STATE = {
    "ok": pb.REPLICA_OK,
    "catching_up": pb.REPLICA_CATCHING_UP,
    "failed": pb.REPLICA_FAILED,
}


def _replica_status(replica: PartitionReplica) -> list[pb.ReplicaStatus]:
    return [
        pb.ReplicaStatus(broker_id=broker_id, state=_REPLICA_STATE[state], reason=reason)
        for broker_id, (state, reason) in replica.replica_states().items()
    ]


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._parked = asyncio.Semaphore(MAX_PARKED_FETCHES)

    def _replica(self, topic: str, partition: int) -> PartitionReplica:
        if self.broker.stopping:
            raise Refusal("SHUTTING_DOWN", f"broker {self.broker.id} is shutting down; use another")
        spec = self.broker.spec.topics.get(topic)
        if spec is None:
            if not TOPIC_NAME.match(topic):
                raise Refusal(
                    "INVALID_ARGUMENT",
                    f"{topic!r} is not a valid topic name: use 1-200 characters of "
                    "A-Z a-z 0-9 . _ -",
                )
            known = ", ".join(sorted(self.broker.spec.topics)) or "none"
            raise Refusal("UNKNOWN_TOPIC", f"topic {topic!r} does not exist; known topics: {known}")
        if partition >= spec.partitions:
            raise Refusal(
                "UNKNOWN_PARTITION",
                f"topic {topic!r} has {spec.partitions} partitions (0 to {spec.partitions - 1}); "
                f"there is no partition {partition}",
            )
        replica = self.broker.replicas.get((topic, partition))
        if replica is None:
            owners = ", ".join(map(str, spec.replicas[partition]))
            raise Refusal(
                "NOT_HOSTED",
                f"broker {self.broker.id} hosts no replica of {topic}/{partition}; "
                f"its replicas are on brokers {owners}",
            )
        try:
            replica.check_serving()
        except PartitionError as exc:
            raise Refusal.of(exc, self.broker) from None
        return replica

    # --- RPCs ---------------------------------------------------------------------------

    async def _produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        """One produce request, for both Produce and ProduceStream; raises Refusal."""
        replica = self._replica(request.topic, request.partition)
        timeout_ms = request.timeout_ms or DEFAULT_TIMEOUT_MS
        _at_most("timeout_ms", timeout_ms, MAX_TIMEOUT_MS)
        try:
            acks = Acks(request.acks)
        except ValueError:
            raise Refusal("INVALID_ARGUMENT", f"unknown acks value {request.acks}") from None
        try:
            result = await replica.produce(request.entries, acks, timeout_ms / 1000)
        except PartitionError as exc:
            raise Refusal.of(exc, self.broker) from None
        return pb.ProduceResponse(
            base_offset=result.base_offset,
            last_offset=result.last_offset,
            high_watermark=replica.high_watermark,
            log_start_offset=replica.log_start_offset,
        )

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        try:
            return await self._produce(request)
        except Refusal as refusal:
            await _abort(context, refusal)

    async def ProduceStream(
        self,
        request_iterator: AsyncIterator[pb.ProduceStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceStreamResponse]:
        """Read requests as they come and work on up to MAX_STREAM_INFLIGHT at once (counting
        answers not yet sent), each in its own task; send the answers that are ready
        together, in one message."""
        answers: asyncio.Queue[pb.ProduceResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(MAX_STREAM_INFLIGHT)
        working: set[asyncio.Task[None]] = set()

        async def work(request: pb.ProduceRequest) -> None:
            try:
                answer = await self._produce(request)
            except Refusal as refusal:
                answer = pb.ProduceResponse(base_offset=-1, last_offset=-1, error=refusal.to_pb())
            except Exception as exc:  # a bug must not leave the client waiting forever
                log.exception("ProduceStream request %d failed", request.request_id)
                answer = pb.ProduceResponse(
                    base_offset=-1,
                    last_offset=-1,
                    error=pb.ProduceError(code="INTERNAL", message=f"internal error: {exc!r}"),
                )
            answer.request_id = request.request_id
            answers.put_nowait(answer)

        async def read() -> None:
            try:
                async for message in request_iterator:
                    for request in message.requests:
                        await slots.acquire()
                        task = asyncio.create_task(work(request))
                        working.add(task)
                        task.add_done_callback(working.discard)
                while working:
                    await asyncio.wait(set(working))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            ended = False
            while not ended:
                answer = await answers.get()
                ready: list[pb.ProduceResponse] = []
                while answer is not None:
                    ready.append(answer)
                    if len(ready) == MAX_STREAM_ANSWERS or answers.empty():
                        break
                    answer = answers.get_nowait()
                ended = answer is None
                if ready:
                    yield pb.ProduceStreamResponse(responses=ready)
                # A slot is free only once its answer is sent: a client that writes but
                # never reads stalls the stream instead of filling the broker's memory.
                for _ in ready:
                    slots.release()
            await reader  # re-raises what ended the reading, if anything did
        finally:
            reader.cancel()
            for task in list(working):
                task.cancel()

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        try:
            return await self._fetch(request)
        except Refusal as refusal:
            await _abort(context, refusal)

    async def _fetch(self, request: pb.FetchRequest) -> pb.FetchResponse:
        replica = self._replica(request.topic, request.partition)
        max_bytes = request.max_bytes or DEFAULT_FETCH_BYTES
        _at_most("max_bytes", max_bytes, MAX_FETCH_BYTES)
        _at_most("max_wait_ms", request.max_wait_ms, MAX_WAIT_MS)
        if request.offset < 0:
            raise Refusal("INVALID_ARGUMENT", f"offset {request.offset} is negative")
        wait = request.max_wait_ms / 1000
        try:
            if wait and not self._parked.locked():
                async with self._parked:
                    result = await replica.fetch(request.offset, max_bytes, request.min_bytes, wait)
            else:
                result = replica.read(request.offset, max_bytes)
        except PartitionError as exc:
            raise Refusal.of(exc, self.broker) from None
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
        try:
            replica = self._replica(request.topic, request.partition)
        except Refusal as refusal:
            await _abort(context, refusal)
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
            await _abort(
                context,
                Refusal(
                    "UNKNOWN_TOPIC",
                    f"unknown topics: {', '.join(unknown)}; "
                    f"known: {', '.join(sorted(spec.topics))}",
                ),
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
                        replica_status=_replica_status(replica) if replica else [],
                    )
                )
            topics.append(pb.TopicInfo(name=name, partitions=parts))
        brokers = [pb.BrokerInfo(id=b.id, host=b.host, port=b.port) for b in spec.brokers.values()]
        return pb.MetadataResponse(
            cluster=spec.name, brokers=brokers, topics=topics, broker_id=self.broker.id
        )
