"""The client-facing gRPC service (raftmq.v1.Broker): each RPC turns its request message into
a call of the protocol-neutral request layer (raftmq.broker.routing, which validates every
field and finds the replica) and its result back into a message. A Refusal becomes a gRPC
status with a sentence and machine-readable trailing metadata (the table is in
raftmq.broker.refusals; the plumbing, raftmq.broker.rpc). Only ProduceStream's flow control
is this module's own: it belongs to the gRPC stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.broker.client_quotas import FETCH, PRODUCE, REQUEST, ClientQuotas
from raftmq.broker.refusals import Refusal
from raftmq.broker.routing import (
    DEFAULT_FETCH_BYTES,
    OPENING,
    MarkerRequest,
    Offsets,
    Produced,
    ReplicaInfo,
    Router,
)
from raftmq.broker.rpc import add_service, internal_error

MAX_STREAM_INFLIGHT = 1024
"""Requests of one ProduceStream worked on at once; past it the stream is not read."""
MAX_STREAM_ANSWERS = 256
"""Answers in one ProduceStream message at most (they are small: offsets and an id)."""


def add_to_server(service: BrokerService, server: grpc.aio.Server) -> None:
    """Register ``service`` as raftmq.v1.Broker on ``server``."""
    add_service(service, server, pb, "Broker")


_REPLICA_STATE = {
    "ok": pb.REPLICA_OK,
    "catching_up": pb.REPLICA_CATCHING_UP,
    "failed": pb.REPLICA_FAILED,
    OPENING: pb.REPLICA_OPENING,
}


def _status(info: ReplicaInfo) -> pb.ReplicaStatus:
    return pb.ReplicaStatus(
        broker_id=info.broker_id, state=_REPLICA_STATE[info.state], reason=info.reason
    )


class BrokerService(pb_grpc.BrokerServicer):
    """The RPCs, each a translation of its messages to a call of the request layer
    (:class:`~raftmq.broker.routing.Router`) and back. Each returns its answer or raises
    Refusal; :func:`add_to_server` turns that into the call's status (or, in
    ProduceStream, into the request's answer). The clients' calls pass the client quotas
    (``quotas.call``: held while the caller is in debt, charged, and answered with
    throttle_time_ms); RebuildReplica and WriteTxnMarkers, an operator's and the
    coordinator's, do not."""

    def __init__(
        self,
        router: Router,
        quotas: ClientQuotas,
        authorize: Callable[[pb.ProduceRequest], None] | None = None,
    ) -> None:
        """``authorize``: raises the Refusal for a ProduceStream request its caller may not
        make (the server's guard judging it as a Produce), so it is answered on its own
        and the stream goes on (None: all allowed)."""
        self.router = router
        self.quotas = quotas
        self.authorize = authorize

    async def _produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        """One produce request, for both Produce and ProduceStream; raises Refusal."""
        done, throttle_ms = await self.quotas.call(
            PRODUCE,
            self.router.produce(
                request.topic, request.partition, request.entries, request.acks, request.timeout_ms
            ),
            len(request.entries),
        )
        return _produced(done, throttle_ms)

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        return await self._produce(request)

    async def ProduceDelayed(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        """A delay mover's produce (internal; no client quota applies to it)."""
        done = await self.router.produce(
            request.topic,
            request.partition,
            request.entries,
            request.acks,
            request.timeout_ms,
            mover=True,
        )
        return _produced(done, 0)

    async def ProduceInternal(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        """A broker's own produce (the share dead-letter writer; no client quota)."""
        done = await self.router.produce(
            request.topic, request.partition, request.entries, request.acks, request.timeout_ms
        )
        return _produced(done, 0)

    def _refused(self, request: pb.ProduceRequest, refusal: Refusal) -> pb.ProduceResponse:
        """A ProduceStream request's answer for a refusal, with the partition's offsets as
        this broker knows them (-1 when it hosts no replica of it)."""
        high_watermark, log_start_offset = self.router.offsets_here(
            request.topic, request.partition
        )
        return pb.ProduceResponse(
            base_offset=-1,
            last_offset=-1,
            high_watermark=high_watermark,
            log_start_offset=log_start_offset,
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
                if self.authorize is not None:
                    self.authorize(request)
                answer = await self._produce(request)
                answer.request_id = request.request_id
            except Refusal as refusal:
                answer = self._refused(request, refusal)
            except Exception as exc:  # a bug must not leave the client waiting forever
                answer = self._refused(request, internal_error("ProduceStream", exc))
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
        if request.isolation_level not in (pb.READ_UNCOMMITTED, pb.READ_COMMITTED):
            raise Refusal(
                pb.ERROR_CODE_INVALID_ARGUMENT,
                f"unknown isolation_level {request.isolation_level}; use READ_UNCOMMITTED (0) "
                "or READ_COMMITTED (1)",
            )
        got, throttle_ms = await self.quotas.call(
            FETCH,
            self.router.fetch(
                request.topic,
                request.partition,
                request.offset,
                max_bytes=self.quotas.fetch_limit_bytes(request.max_bytes or DEFAULT_FETCH_BYTES),
                max_wait_ms=request.max_wait_ms,
                min_bytes=request.min_bytes,
                replica_read=request.replica_read,
                read_committed=request.isolation_level == pb.READ_COMMITTED,
                tag_filter=request.tag_filter,
            ),
            lambda fetched: len(fetched.entries),
        )
        return pb.FetchResponse(
            throttle_time_ms=throttle_ms,
            entries=got.entries,
            next_offset=got.next_offset,
            high_watermark=got.high_watermark,
            log_start_offset=got.log_start_offset,
            broker_id=got.broker_id,
            last_stable_offset=got.last_stable_offset,
            aborted_transactions=[
                pb.AbortedTransaction(
                    producer_id=t.producer_id,
                    first_offset=t.first_offset,
                    last_offset=t.last_offset,
                )
                for t in got.aborted_transactions
            ],
        )

    async def WriteTxnMarkers(
        self, request: pb.WriteTxnMarkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteTxnMarkersResponse:
        refusals = await self.router.write_txn_markers(
            [
                MarkerRequest(m.topic, m.partition, m.producer_id, m.producer_epoch, m.commit)
                for m in request.markers
            ],
            request.timeout_ms,
        )
        return pb.WriteTxnMarkersResponse(
            results=[
                pb.TxnMarkerResult(index=i, error=r.to_pb() if r is not None else None)
                for i, r in enumerate(refusals)
            ]
        )

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        which = request.WhichOneof("spec")

        async def list_offsets() -> Offsets:
            return self.router.list_offsets(
                request.topic,
                request.partition,
                position=request.position if which == "position" else None,
                timestamp_ms=request.timestamp_ms if which == "timestamp_ms" else None,
            )

        found, throttle_ms = await self.quotas.call(REQUEST, list_offsets())
        return pb.ListOffsetsResponse(
            offset=found.offset,
            log_start_offset=found.log_start_offset,
            high_watermark=found.high_watermark,
            last_stable_offset=found.last_stable_offset,
            throttle_time_ms=throttle_ms,
        )

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        info, throttle_ms = await self.quotas.call(
            REQUEST,
            self.router.metadata(
                list(request.topics), request.allow_auto_create, routing_only=request.routing_only
            ),
        )
        return pb.MetadataResponse(
            throttle_time_ms=throttle_ms,
            cluster=info.cluster,
            brokers=[
                pb.BrokerInfo(id=b.id, host=b.host, port=b.port, rack=b.rack) for b in info.brokers
            ],
            topics=[
                pb.TopicInfo(
                    name=t.name,
                    partitions=[
                        pb.PartitionInfo(
                            partition=p.partition,
                            leader_id=p.leader_id,
                            replicas=p.replicas,
                            leader_term=p.leader_term,
                            high_watermark=p.high_watermark,
                            replica_status=[_status(r) for r in p.replica_status],
                            log_start_offset=p.log_start_offset,
                            in_sync_replicas=p.in_sync_replicas,
                        )
                        for p in t.partitions
                    ],
                )
                for t in info.topics
            ],
            broker_id=info.broker_id,
            metadata_version=info.metadata_version,
        )

    async def RebuildReplica(
        self, request: pb.RebuildReplicaRequest, context: grpc.aio.ServicerContext
    ) -> pb.RebuildReplicaResponse:
        status, deleted = await self.router.rebuild(request.topic, request.partition, request.force)
        return pb.RebuildReplicaResponse(status=_status(status), deleted_bytes=deleted)

    async def DescribeDelayed(
        self, request: pb.DescribeDelayedRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeDelayedResponse:
        levels = await self.router.describe_delayed(request.topic)
        return pb.DescribeDelayedResponse(
            levels=[
                pb.DelayedLevel(
                    level=x.level,
                    pending=x.pending,
                    next_due_ms=x.next_due_ms,
                    complete=x.complete,
                )
                for x in levels
            ]
        )

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        producer_id, throttle_ms = await self.quotas.call(REQUEST, self.router.init_producer_id())
        return pb.InitProducerIdResponse(
            producer_id=producer_id, producer_epoch=0, throttle_time_ms=throttle_ms
        )


def _produced(done: Produced, throttle_ms: int) -> pb.ProduceResponse:
    return pb.ProduceResponse(
        base_offset=done.base_offset,
        last_offset=done.last_offset,
        high_watermark=done.high_watermark,
        log_start_offset=done.log_start_offset,
        throttle_time_ms=throttle_ms,
    )


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a finished task's exception as seen (it is re-raised where it matters)."""
    if not task.cancelled():
        task.exception()
