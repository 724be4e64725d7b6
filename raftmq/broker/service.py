"""The client-facing gRPC service (raftmq.v1.Broker): validates every field, maps partition
errors to gRPC statuses with a sentence and machine-readable trailing metadata (the table
is in raftmq.broker.errors).

Every RPC is registered through :func:`add_to_server`, not the generated registration:
its request deserializers let a method refuse bytes that are not a valid message
(MALFORMED_REQUEST) instead of gRPC answering INTERNAL, and its wrappers turn a Refusal
into a status with trailers and anything unexpected into one INTERNAL answer and one log
line with the traceback (a bug of ours, never the client's mistake)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError, Message

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.broker.auto_create import MAX_CREATIONS, unknown_topic
from raftmq.broker.controller_link import LinkRefusal
from raftmq.broker.errors import Refusal, abort, name_list, shorten
from raftmq.broker.producer_ids import ALLOCATE_TIMEOUT_S, ProducerIdBlocks
from raftmq.broker.topic_settings import expired, reported_leader
from raftmq.broker.unopened import OpenState, RebuildRefused, Unopened
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import Broker as RegisteredBroker
from raftmq.controller.model import Partition
from raftmq.log.config import LogConfig
from raftmq.partition.errors import PartitionError
from raftmq.partition.replica import Acks, PartitionReplica

if TYPE_CHECKING:
    from raftmq.broker.server import Broker

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 300_000
DEFAULT_FETCH_BYTES = 1 << 20
"""What a Fetch with max_bytes 0 reads at most. With one entry of the default max.message.bytes
(1 MiB) over it and the message overhead, the answer fits the 4 MiB that gRPC clients in
other languages receive by default (FETCH_OVERHEAD_BYTES, broker.proto's Fetch comment)."""
MAX_FETCH_BYTES = 64 << 20
"""The largest max_bytes a Fetch may ask for; a client asking for it must raise its receive
limit to max_bytes + max.message.bytes + FETCH_OVERHEAD_BYTES."""
FETCH_OVERHEAD_BYTES = 64 << 10
"""What a FetchResponse adds to its entries (fields, framing), with room to spare."""
CLIENT_DEFAULT_RECEIVE_BYTES = 4 << 20
"""gRPC's default receive limit in most languages (Java, Go, Node.js, C++)."""
assert (
    DEFAULT_FETCH_BYTES + LogConfig().max_message_bytes + FETCH_OVERHEAD_BYTES
    <= CLIENT_DEFAULT_RECEIVE_BYTES
), "a Fetch with the default max_bytes must fit a gRPC client's default receive limit"
MAX_WAIT_MS = 60_000
MAX_PARKED_FETCHES = 10_000

MAX_STREAM_INFLIGHT = 1024
"""Requests of one ProduceStream worked on at once; past it the stream is not read."""
MAX_STREAM_ANSWERS = 256
"""Answers in one ProduceStream message at most (they are small: offsets and an id)."""


def _at_most(name: str, value: int, limit: int, unit: str = "") -> None:
    if value > limit:
        raise Refusal(
            pb.ERROR_CODE_INVALID_ARGUMENT,
            f"{name} {value} is over this broker's limit of {limit}{unit}",
        )


class _Malformed:
    """What the deserializer hands a method for request bytes that are not a valid message:
    the method refuses it (MALFORMED_REQUEST) as it refuses any other bad field."""

    def __init__(self, message_type: type[Message], exc: Exception) -> None:
        self.refusal = Refusal(
            pb.ERROR_CODE_MALFORMED_REQUEST,
            f"the request bytes are not a valid protobuf encoding of "
            f"{message_type.DESCRIPTOR.full_name} ({exc}); build it from "
            f"{message_type.DESCRIPTOR.file.name}",
        )


def _deserializer(message_type: type[Message]) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return _Malformed(message_type, exc)

    return parse


def _well_formed(request: object) -> None:
    if isinstance(request, _Malformed):
        raise request.refusal


def _internal(rpc: str, exc: BaseException) -> Refusal:
    log.error("%s failed on a bug of the broker", rpc, exc_info=exc)
    return Refusal(
        pb.ERROR_CODE_INTERNAL,
        f"internal error in {rpc} ({type(exc).__name__}); this is a bug in the broker, "
        "not in the request: its log has the details",
    )


def _unary(
    rpc: str, method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]:
    async def handle(request: object, context: grpc.aio.ServicerContext) -> Message:
        try:
            _well_formed(request)
            return await method(request, context)
        except Refusal as refusal:
            failure = refusal
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            failure = _internal(rpc, exc)
        await abort(context, failure)

    return handle


def _streaming(
    rpc: str,
    method: Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Message]],
) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Message]]:
    async def checked(requests: AsyncIterator[object]) -> AsyncIterator[object]:
        async for request in requests:
            _well_formed(request)
            yield request

    async def handle(
        requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Message]:
        try:
            async for answer in method(checked(requests), context):
                yield answer
            return
        except Refusal as refusal:
            failure = refusal
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if context.cancelled() or context.done():
                # The client went away (cancelled, or its deadline passed): nothing to
                # answer and nothing wrong with the broker.
                log.debug("%s ended by the client: %r", rpc, exc)
                return
            failure = _internal(rpc, exc)
        await abort(context, failure)

    return handle


def _server_streaming(
    rpc: str,
    method: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Message]],
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Message]]:
    """One request, a stream of answers: the bidi wrapper over a stream of one request,
    so both kinds of stream end with the same error handling."""

    async def each(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Message]:
        async for request in requests:  # exactly one, checked well-formed by _streaming
            async for answer in method(request, context):
                yield answer

    bidi = _streaming(rpc, each)

    async def handle(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        async def one() -> AsyncIterator[object]:
            yield request

        async for answer in bidi(one(), context):
            yield answer

    return handle


def add_to_server(service: BrokerService, server: grpc.aio.Server) -> None:
    """Register ``service`` as raftmq.v1.Broker on ``server``."""
    add_service(service, server, pb, "Broker")


def add_service(service: object, server: grpc.aio.Server, module: Any, name: str) -> None:
    """Register ``service`` as raftmq.v1.``name`` (declared in the generated ``module``)
    on ``server``: one handler per method of the proto's service, with the generated
    message classes (stubs stay unchanged); only the deserializers and the error handling
    are ours, so every service answers with the same error contract."""
    handlers = {}
    for method in module.DESCRIPTOR.services_by_name[name].methods:
        behaviour = getattr(service, method.name)
        make: Callable[..., grpc.RpcMethodHandler]
        handle: Callable[..., Any]  # a coroutine (unary) or an async generator (stream)
        if method.client_streaming:
            assert method.server_streaming, f"{method.name}: only bidi streams are wrapped"
            make, handle = grpc.stream_stream_rpc_method_handler, _streaming(method.name, behaviour)
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
            handle = _server_streaming(method.name, behaviour)
        else:
            make, handle = grpc.unary_unary_rpc_method_handler, _unary(method.name, behaviour)
        handlers[method.name] = make(
            handle,
            request_deserializer=_deserializer(getattr(module, method.input_type.name)),
            response_serializer=getattr(module, method.output_type.name).SerializeToString,
        )
    full_name = f"{module.DESCRIPTOR.package}.{name}"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full_name, handlers),))
    server.add_registered_method_handlers(full_name, handlers)


SERVICE = "raftmq.v1.Broker"


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


def _unopened_status(broker_id: int, entry: Unopened | None) -> list[pb.ReplicaStatus]:
    """The status of a replica the metadata assigns here that is not open: failed (why),
    or opening / being repaired. Never left out, so that a replica that cannot open is
    seen (``raftmq status`` exits 1 for it)."""
    if entry is None:  # assigned by a version whose replicas are being opened right now
        return [pb.ReplicaStatus(broker_id=broker_id, state=pb.REPLICA_OPENING, reason="opening")]
    state = pb.REPLICA_FAILED if entry.state is OpenState.FAILED else pb.REPLICA_OPENING
    reason = (
        entry.reason if entry.state is not OpenState.REPAIRING else f"repairing: {entry.reason}"
    )
    return [pb.ReplicaStatus(broker_id=broker_id, state=state, reason=reason)]


class BrokerService(pb_grpc.BrokerServicer):
    """The RPCs. Each returns its answer or raises Refusal; :func:`add_to_server` turns that
    into the call's status (or, in ProduceStream, into the request's answer)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._parked = asyncio.Semaphore(MAX_PARKED_FETCHES)
        self._producer_ids = ProducerIdBlocks(
            lambda count: broker.link.allocate_producer_ids(broker.id, count)
        )

    def _check_has_metadata(self) -> None:
        """A broker that has no metadata yet (just started, registering with the
        controller) cannot tell an unknown topic from one it will host in a moment."""
        if self.broker.metadata_version == 0:
            raise Refusal(
                pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
                f"broker {self.broker.id} has no cluster metadata yet (it is joining the "
                "controller); retry shortly",
            )

    def _replica(self, topic: str, partition: int) -> PartitionReplica:
        if self.broker.stopping:
            raise Refusal(
                pb.ERROR_CODE_SHUTTING_DOWN,
                f"broker {self.broker.id} is shutting down; use another",
            )
        spec = self.broker.spec.topics.get(topic)
        if spec is None:
            self._check_has_metadata()
            if not TOPIC_NAME.fullmatch(topic):
                raise Refusal(
                    pb.ERROR_CODE_INVALID_ARGUMENT,
                    f"{shorten(topic)} is not a valid topic name: use 1-200 characters of "
                    "A-Z a-z 0-9 . _ -",
                )
            raise unknown_topic(topic, name_list(sorted(self.broker.spec.topics)))
        if partition >= spec.partitions:
            raise Refusal(
                pb.ERROR_CODE_UNKNOWN_PARTITION,
                f"topic {topic!r} has {spec.partitions} partitions (0 to {spec.partitions - 1}); "
                f"there is no partition {partition}",
            )
        replica = self.broker.replicas.get((topic, partition))
        if replica is None:
            part = self.broker.spec.state.topics[topic].partitions[partition]
            if expired(part, time.time_ns() // 1_000_000):
                raise Refusal(
                    pb.ERROR_CODE_PARTITION_DECOMMISSIONED,
                    f"{topic}/{partition} was decommissioned and its retention has passed: "
                    "its data is deleted; read the topic's active partitions",
                )
            if self.broker.id in part.replicas or self.broker.id in part.learners:
                entry = self.broker.unopened.get((topic, partition))
                how = entry.reason if entry is not None else "opening"
                raise Refusal(
                    pb.ERROR_CODE_REPLICA_FAILED,
                    f"broker {self.broker.id}'s replica of {topic}/{partition} is not open "
                    f"({how}); use another replica, or retry later",
                )
            owners = ", ".join(map(str, spec.replicas[partition]))
            raise Refusal(
                pb.ERROR_CODE_NOT_HOSTED,
                f"broker {self.broker.id} hosts no replica of {topic}/{partition}; "
                f"its replicas are on brokers {owners}",
            )
        try:
            replica.check_serving()
        except PartitionError as exc:
            raise Refusal.of(exc, self.broker) from None
        return replica

    def _with_leader(self, refusal: Refusal, topic: str, partition: int) -> Refusal:
        """``refusal`` with the partition's leader (as reported to the controller) named
        in its trailers, for a consumer's replica read to go there at once."""
        leader, _ = reported_leader(self.broker.spec.state, topic, partition)
        spec = self.broker.spec.brokers.get(leader)
        if spec is None:
            return refusal
        return Refusal(
            refusal.code,
            f"{refusal.message}; its leader is broker {leader}",
            leader_id=leader,
            leader_address=spec.address,
        )

    def _refusal(self, exc: PartitionError) -> Refusal:
        return Refusal.of(exc, self.broker)

    # --- RPCs ---------------------------------------------------------------------------

    async def _auto_create(self, topic: str) -> None:
        """Create ``topic`` first when it does not exist and this broker auto-creates
        topics (``--auto-create-topics``); nothing otherwise."""
        creator = self.broker.topic_creator
        if (
            creator is not None
            and topic not in self.broker.spec.topics
            and self.broker.metadata_version
            and TOPIC_NAME.fullmatch(topic)
            and not self.broker.stopping
        ):
            await creator.ensure(topic)

    async def _produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        """One produce request, for both Produce and ProduceStream; raises Refusal."""
        await self._auto_create(request.topic)
        replica = self._replica(request.topic, request.partition)
        timeout_ms = request.timeout_ms or DEFAULT_TIMEOUT_MS
        _at_most("timeout_ms", timeout_ms, MAX_TIMEOUT_MS, " ms")
        try:
            acks = Acks(request.acks)
        except ValueError:
            raise Refusal(
                pb.ERROR_CODE_INVALID_ARGUMENT,
                f"unknown acks value {request.acks}; use ACKS_ALL (0), ACKS_LEADER (1) or "
                "ACKS_NONE (2)",
            ) from None
        try:
            result = await replica.produce(request.entries, acks, timeout_ms / 1000)
        except PartitionError as exc:
            raise self._refusal(exc) from None
        return pb.ProduceResponse(
            base_offset=result.base_offset,
            last_offset=result.last_offset,
            high_watermark=replica.high_watermark,
            log_start_offset=replica.log_start_offset,
        )

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        return await self._produce(request)

    def _refused(self, request: pb.ProduceRequest, refusal: Refusal) -> pb.ProduceResponse:
        """A ProduceStream request's answer for a refusal, with the partition's offsets as
        this broker knows them (-1 when it hosts no replica of it)."""
        replica = self.broker.replicas.get((request.topic, request.partition))
        return pb.ProduceResponse(
            base_offset=-1,
            last_offset=-1,
            high_watermark=replica.high_watermark if replica else -1,
            log_start_offset=replica.log_start_offset if replica else -1,
            request_id=request.request_id,
            error=refusal.to_pb(),
        )

    async def ProduceStream(
        self,
        request_iterator: AsyncIterator[pb.ProduceStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProduceStreamResponse]:
        """Read requests as they come and work on up to MAX_STREAM_INFLIGHT at once (counting
        answers not yet sent), each in its own task; send the answers that are ready
        together, in one message. A request whose request_id is still in progress on this
        stream is refused at once (DUPLICATE_REQUEST_ID): answers are matched by id, so two
        would be ambiguous. A message that is not valid protobuf ends the stream with
        MALFORMED_REQUEST once the requests in progress are answered."""
        answers: asyncio.Queue[pb.ProduceResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(MAX_STREAM_INFLIGHT)
        working: set[asyncio.Task[None]] = set()
        in_progress: set[int] = set()

        async def work(request: pb.ProduceRequest) -> None:
            try:
                answer = await self._produce(request)
                answer.request_id = request.request_id
            except Refusal as refusal:
                answer = self._refused(request, refusal)
            except Exception as exc:  # a bug must not leave the client waiting forever
                answer = self._refused(request, _internal("ProduceStream", exc))
            in_progress.discard(request.request_id)
            answers.put_nowait(answer)

        async def read() -> None:
            try:
                try:
                    async for message in request_iterator:
                        for request in message.requests:
                            await slots.acquire()
                            if request.request_id in in_progress:
                                refusal = Refusal(
                                    pb.ERROR_CODE_DUPLICATE_REQUEST_ID,
                                    f"request_id {request.request_id} is already in progress "
                                    "on this stream; give each request in progress its own id",
                                )
                                answers.put_nowait(self._refused(request, refusal))
                                continue
                            in_progress.add(request.request_id)
                            task = asyncio.create_task(work(request))
                            working.add(task)
                            task.add_done_callback(working.discard)
                except Refusal:
                    # A malformed message: answer what is in progress, then end the stream.
                    while working:
                        await asyncio.wait(set(working))
                    raise
                while working:
                    await asyncio.wait(set(working))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        # Whatever ends the reader (the client cancelling, say) is looked at below or, if
        # the stream ends first, here: never "Task exception was never retrieved".
        reader.add_done_callback(_retrieve)
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
            replica = self._replica(request.topic, request.partition)
        except Refusal as refusal:
            if request.replica_read and refusal.code == pb.ERROR_CODE_NOT_HOSTED:
                raise self._with_leader(refusal, request.topic, request.partition) from None
            raise
        max_bytes = request.max_bytes or DEFAULT_FETCH_BYTES
        _at_most("max_bytes", max_bytes, MAX_FETCH_BYTES, " bytes")
        _at_most("max_wait_ms", request.max_wait_ms, MAX_WAIT_MS, " ms")
        if request.offset < 0:
            raise Refusal(pb.ERROR_CODE_INVALID_ARGUMENT, f"offset {request.offset} is negative")
        wait = request.max_wait_ms / 1000
        try:
            if wait and not self._parked.locked():
                async with self._parked:
                    result = await replica.fetch(
                        request.offset,
                        max_bytes,
                        request.min_bytes,
                        wait,
                        replica_read=request.replica_read,
                    )
            else:
                result = replica.read(request.offset, max_bytes, replica_read=request.replica_read)
        except PartitionError as exc:
            raise self._refusal(exc) from None
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
        replica = self._replica(request.topic, request.partition)
        which = request.WhichOneof("spec")
        try:
            if which == "timestamp_ms":
                offset = replica.offset_for_timestamp(request.timestamp_ms)
            elif which == "position" and request.position == pb.LATEST:
                offset = replica.high_watermark
            elif which == "position" and request.position == pb.EARLIEST:
                offset = replica.log_start_offset
            elif which == "position":
                raise Refusal(
                    pb.ERROR_CODE_INVALID_ARGUMENT,
                    f"unknown position {request.position}; use EARLIEST (0) or LATEST (1)",
                )
            else:
                raise Refusal(
                    pb.ERROR_CODE_INVALID_ARGUMENT,
                    "the request sets neither position nor timestamp_ms; set one of them",
                )
        except PartitionError as exc:
            raise self._refusal(exc) from None
        return pb.ListOffsetsResponse(
            offset=offset,
            log_start_offset=replica.log_start_offset,
            high_watermark=replica.high_watermark,
        )

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        spec = self.broker.spec
        names = list(request.topics) or sorted(spec.topics)
        invalid = [n for n in names if not TOPIC_NAME.fullmatch(n)]
        if invalid:
            raise Refusal(
                pb.ERROR_CODE_INVALID_ARGUMENT,
                f"{name_list(invalid, 5)} are not valid topic names: use 1-200 characters of "
                "A-Z a-z 0-9 . _ -",
            )
        if request.allow_auto_create and request.topics:
            if len(request.topics) > MAX_CREATIONS:
                raise Refusal(
                    pb.ERROR_CODE_INVALID_ARGUMENT,
                    f"a Metadata request may ask to auto-create at most {MAX_CREATIONS} "
                    f"topics, not {len(request.topics)}; ask in smaller groups",
                )
            for name in dict.fromkeys(request.topics):
                await self._auto_create(name)
            spec = self.broker.spec
        unknown = [n for n in names if n not in spec.topics]
        if unknown:
            self._check_has_metadata()
            raise Refusal(
                pb.ERROR_CODE_UNKNOWN_TOPIC,
                f"unknown topics: {name_list(unknown, 5)}; known: {name_list(sorted(spec.topics))}",
            )
        topics = []
        for name in names:
            parts = []
            assigned = spec.state.topics[name].partitions
            for p, replicas in enumerate(spec.topics[name].replicas):
                replica = self.broker.replicas.get((name, p))
                # No replica here: the leader as reported to the controller. A replica
                # that knows no leader says so (an election is under way: a report is
                # from before it).
                if replica is not None:
                    leader, term = replica.leader_id, replica.leader_term
                else:
                    leader, term = reported_leader(spec.state, name, p)
                parts.append(
                    pb.PartitionInfo(
                        partition=p,
                        leader_id=leader,
                        replicas=list(replicas),
                        leader_term=term,
                        high_watermark=replica.high_watermark if replica else -1,
                        replica_status=_replica_status(replica)
                        if replica
                        else self._unassigned_or_unopened(name, p, assigned),
                        log_start_offset=replica.log_start_offset if replica else -1,
                        in_sync_replicas=replica.in_sync_voters() if replica else [],
                    )
                )
            topics.append(pb.TopicInfo(name=name, partitions=parts))
        registered = spec.state.brokers
        brokers = [
            pb.BrokerInfo(id=b.id, host=b.host, port=b.port, rack=_rack(registered.get(b.id)))
            for b in spec.brokers.values()
        ]
        return pb.MetadataResponse(
            cluster=spec.name,
            brokers=brokers,
            topics=topics,
            broker_id=self.broker.id,
            metadata_version=self.broker.metadata_version,
        )

    def _unassigned_or_unopened(
        self, topic: str, p: int, parts: Sequence[Partition]
    ) -> list[pb.ReplicaStatus]:
        me = self.broker.id
        part = parts[p] if p < len(parts) else None
        if part is None or (me not in part.replicas and me not in part.learners):
            return []
        if expired(part, time.time_ns() // 1_000_000):
            return []
        return _unopened_status(me, self.broker.unopened.get((topic, p)))

    async def RebuildReplica(
        self, request: pb.RebuildReplicaRequest, context: grpc.aio.ServicerContext
    ) -> pb.RebuildReplicaResponse:
        self._check_has_metadata()
        try:
            deleted = await self.broker.rebuild_replica(
                request.topic, request.partition, force=request.force
            )
        except RebuildRefused as exc:
            code = (
                pb.ERROR_CODE_NOT_HOSTED
                if exc.kind == "not-hosted"
                else pb.ERROR_CODE_UNSAFE_REBUILD
            )
            raise Refusal(code, str(exc)) from None
        key = (request.topic, request.partition)
        replica = self.broker.replicas.get(key)
        if replica is not None:
            state, reason = replica.state
            status = pb.ReplicaStatus(
                broker_id=self.broker.id, state=_REPLICA_STATE[state], reason=reason
            )
        else:
            status = _unopened_status(self.broker.id, self.broker.unopened.get(key))[0]
        return pb.RebuildReplicaResponse(status=status, deleted_bytes=deleted)

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        if self.broker.stopping:
            raise Refusal(
                pb.ERROR_CODE_SHUTTING_DOWN,
                f"broker {self.broker.id} is shutting down; use another",
            )
        try:
            producer_id = await self._producer_ids.next_id()
        except TimeoutError:
            raise Refusal(
                pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
                f"broker {self.broker.id} could not reach a controller leader within "
                f"{ALLOCATE_TIMEOUT_S:.0f} s to take a block of producer ids; retry shortly",
            ) from None
        except LinkRefusal as exc:
            raise Refusal(exc.code, str(exc)) from None
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)


def _rack(broker: RegisteredBroker | None) -> str:
    return (broker.rack or "") if broker is not None else ""


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a finished task's exception as seen (it is re-raised where it matters)."""
    if not task.cancelled():
        task.exception()
