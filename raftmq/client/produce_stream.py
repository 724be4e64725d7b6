"""One ProduceStream to one broker (broker.proto): produce requests from many tasks over
one long-lived gRPC stream, answers matched back by request id.

Why a stream and not unary calls: a unary Produce costs the broker about twice the CPU of
a stream message, and a stream message carries every request that became ready while the
previous write was on its way, as Kafka's producer packs the batches ready for one broker
into one request. Under load a message carries many requests; at low load each goes
alone and at once.

Bounded: at most ``max_in_flight`` requests are outstanding (the broker stops reading a
stream at 1024), so a producer with more ready waits here rather than queueing without
limit. A stream that ends fails every outstanding request as unreachable: it may or may
not have been written, which is the caller's to judge (an idempotent producer retries).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc

from raftmq.api.error_codes import RULES, code_of
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.client.errors import ClientError, error_of

MAX_PER_MESSAGE = 256
"""Requests per stream message: the broker answers at most as many per message too."""
DEFAULT_MAX_IN_FLIGHT = 512
"""Half the broker's per-stream limit (1024): room for a second stream of the same process
without ever hitting the broker's backpressure, which would stall every request on it."""


def stream_ended(address: str, why: str) -> ClientError:
    """The error each outstanding request gets when its stream ends: no answer came, so
    it may or may not have been written (gRPC's UNAVAILABLE, without a raftmq-error)."""
    return ClientError(
        f"the produce stream to {address} ended before the broker answered ({why})",
        pb.ERROR_CODE_UNSPECIFIED,
        grpc.StatusCode.UNAVAILABLE,
        {},
    )


def refusal(error: pb.ProduceError) -> ClientError:
    """A ProduceStream refusal as the ClientError a unary call would raise."""
    code = code_of(error.code)
    rule = RULES.get(code)
    meta = {"raftmq-error": error.code}
    if error.leader_address:
        meta["raftmq-leader-address"] = error.leader_address
        meta["raftmq-leader-id"] = str(error.leader_id)
    return ClientError(
        error.message, code, rule.status if rule else grpc.StatusCode.UNKNOWN, meta, error.code
    )


class ProduceStream:
    """Requests in, answers out; start it inside the event loop that will use it."""

    def __init__(
        self, channel: grpc.aio.Channel, address: str, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ) -> None:
        assert 0 < max_in_flight <= 1024, max_in_flight
        self.address = address
        self._call: Any = pb_grpc.BrokerStub(channel).ProduceStream()
        self._waiting: dict[int, asyncio.Future[pb.ProduceResponse]] = {}
        self._next_id = 0
        self._queued: list[pb.ProduceRequest] = []
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._ended: ClientError | None = None
        self._reader = asyncio.create_task(self._read())
        self._writer = asyncio.create_task(self._write())

    @property
    def ended(self) -> bool:
        return self._ended is not None

    async def produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        """Send ``request`` (its request_id is set here) and return the broker's answer;
        raises ClientError for a refusal or a stream that ended."""
        async with self._slots:
            if self._ended is not None:
                raise self._ended
            self._next_id += 1
            request.request_id = self._next_id
            fut: asyncio.Future[pb.ProduceResponse] = asyncio.get_running_loop().create_future()
            self._waiting[self._next_id] = fut
            self._queued.append(request)
            self._wake.set()
            answer = await fut
        if answer.HasField("error"):
            raise refusal(answer.error)
        return answer

    async def _read(self) -> None:
        why = "the broker closed it"
        try:
            async for message in self._call:
                for answer in message.responses:
                    fut = self._waiting.pop(answer.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(answer)
        except grpc.aio.AioRpcError as exc:
            err = error_of(exc)
            if err.status == grpc.StatusCode.UNAUTHENTICATED and err.code_name:
                # Refused at its opening (who calls), so nothing of it was written: the
                # requests fail with the refusal itself, retried only if it says so.
                self._ended = err
            why = err.label.lower() + ": " + (exc.details() or "")
        except asyncio.CancelledError:
            why = "the producer closed it"
            raise
        finally:
            self._end(why)

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queued:
                    now = self._queued[:MAX_PER_MESSAGE]
                    del self._queued[:MAX_PER_MESSAGE]
                    await self._call.write(pb.ProduceStreamRequest(requests=now))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
            self._end(f"writing failed: {exc}")

    def _end(self, why: str) -> None:
        if self._ended is None:
            self._ended = stream_ended(self.address, why)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(self._ended)
        self._waiting.clear()
        self._queued.clear()
        # An ended stream is replaced, not closed: its writer would wait for ever.
        if self._writer is not asyncio.current_task():
            self._writer.cancel()

    async def close(self) -> None:
        """Stop sending; outstanding requests fail as unreachable."""
        self._writer.cancel()
        with contextlib.suppress(BaseException):
            await self._writer
        with contextlib.suppress(Exception):
            await self._call.done_writing()
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        self._end("the producer closed it")
