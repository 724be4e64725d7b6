"""Per-RPC metrics from one gRPC server interceptor: how many calls each method answered,
by the raftmq error code they ended with, and how long unary calls and each request of a
produce stream took.

Why an interceptor: every service of the broker (Broker, Admin, Groups, Controller,
Transactions, their redirects, grpc.health.v1) is counted the same way without a line in
any of them, and the interceptor slot of :func:`raftmq.net.aio_server` is where
authentication, authorization and throttling will sit too.

The code label is the ``raftmq-error`` trailer the service sets when it refuses a call
(:func:`raftmq.broker.rpc.abort`), ``OK`` for an answer, and a gRPC status name when a
call ended without that trailer (``CANCELLED``: the client went away). Label values are
bounded: method names registered on the server, code names of the error contract.

Why counted in plain lists and dicts rather than prometheus-client's Counter and
Histogram: those take a lock and a label lookup per update, and ProduceStream's requests
are the broker's hottest path. Here an update is a dict increment and a ``bisect``; the
event loop is the only writer, and a scrape copies each method's figures (the histogram's
count is read from its own buckets, so a scrape never shows them disagreeing).

Streams: a stream's lifetime is no latency, so a stream is counted once, when it ends,
and has no latency sample; the exception is ProduceStream, whose requests are the unit a
producer waits on: each request in it is counted with the code of its own answer, and
timed from the message that brought it to the answer that carries its ``request_id``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from itertools import accumulate
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from raftmq.api.error_codes import RULES, name_of
from raftmq.broker.rpc import Malformed

OK = "OK"
PRODUCE_STREAM = "/raftmq.v1.Broker/ProduceStream"
"""The stream whose requests are counted and timed one by one."""
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""From half a millisecond (a Metadata answered from memory) to 30 s (a produce's default
timeout); a long-poll Fetch lands near its max_wait_ms."""
CODE_NAMES = frozenset(name_of(code) for code in RULES) | {s.name for s in grpc.StatusCode}
"""Every value the code label may take; anything else is counted as ``UNKNOWN``."""

Handler = Callable[..., Any]


def method_label(full_method: str) -> str:
    """``/raftmq.v1.Broker/Produce`` -> ``Broker/Produce``: the service's last name and the
    method, short enough to read on a dashboard and unique across the services."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return f"{service.rpartition('.')[2]}/{method}"


def _ended_code(context: grpc.aio.ServicerContext) -> str:
    """The code an aborted call ended with: its ``raftmq-error`` trailer, else its status."""
    for key, value in context.trailing_metadata() or ():
        if key == "raftmq-error":
            return value if value in CODE_NAMES else "UNKNOWN"
    code = context.code()
    name = getattr(code, "name", None)
    return name if name in CODE_NAMES else "UNKNOWN"


def _failed_code(exc: BaseException, context: grpc.aio.ServicerContext) -> str:
    """The code of a call whose behaviour raised ``exc``."""
    if isinstance(exc, grpc.aio.AbortError):
        return _ended_code(context)
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the client went away
        return grpc.StatusCode.CANCELLED.name
    return grpc.StatusCode.UNKNOWN.name


class MethodStats:
    """One method's figures: calls by code, and a latency histogram (a count per bucket of
    LATENCY_BUCKETS_S, the last one above them all, and the sum of the samples)."""

    __slots__ = ("buckets", "counts", "sum_s")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def count(self, code: str, calls: int = 1) -> None:
        self.counts[code] = self.counts.get(code, 0) + calls

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds


class RpcMetrics(grpc.aio.ServerInterceptor, Collector):
    """Counts and times the calls of the server it is given to (net.aio_server); register
    it on the broker's registry to export the figures."""

    def __init__(self) -> None:
        self._methods: dict[str, MethodStats] = {}
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily(
            "raftmq_rpc_requests",
            "RPCs answered, by method and the raftmq error code they ended with (OK: an "
            "answer); ProduceStream counts each request in the stream",
            labels=("method", "code"),
        )
        latency = HistogramMetricFamily(
            "raftmq_rpc_latency_seconds",
            "Time from a unary call's arrival to its answer (ProduceStream: per request, "
            "from the message that brought it to its answer)",
            labels=("method",),
        )
        for method, stats in sorted(list(self._methods.items())):
            for code, calls in sorted(list(stats.counts.items())):
                requests.add_metric((method, code), calls)
            buckets, sum_s = list(stats.buckets), stats.sum_s
            if not any(buckets):
                continue  # a stream: counted, never timed
            cumulative = list(accumulate(buckets))
            bounds = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]
            latency.add_metric((method,), list(zip(bounds, cumulative, strict=True)), sum_s)
        yield requests
        yield latency

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED, nothing to count
            return handler
        full_method = handler_call_details.method
        cached = self._wrapped.get(full_method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(full_method, handler)
        self._wrapped[full_method] = (handler, wrapped)
        return wrapped

    def _wrap(self, full_method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        method = method_label(full_method)
        serialization = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **serialization
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler.unary_stream), **serialization
            )
        if handler.stream_stream is not None:
            behaviour = (
                self._produce_stream(method, handler.stream_stream)
                if full_method == PRODUCE_STREAM
                else self._stream(method, handler.stream_stream)
            )
            return grpc.stream_stream_rpc_method_handler(behaviour, **serialization)
        return grpc.stream_unary_rpc_method_handler(
            self._unary(method, handler.stream_unary), **serialization
        )

    def _stats(self, method: str) -> MethodStats:
        found = self._methods.get(method)
        if found is None:
            found = self._methods[method] = MethodStats()
        return found

    def _unary(self, method: str, behaviour: Handler, *, timed: bool = True) -> Handler:
        """A call whose behaviour is a coroutine: counted when it returns, and timed unless
        it is a stream that writes its answers on the context (grpc.health's Watch)."""
        stats = self._stats(method)

        async def called(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start_s = time.perf_counter()
            code = OK
            try:
                return await behaviour(request, context)
            except BaseException as exc:
                code = _failed_code(exc, context)
                raise
            finally:
                if timed:
                    stats.observe(time.perf_counter() - start_s)
                stats.count(code)

        return called

    def _stream(self, method: str, behaviour: Handler) -> Handler:
        """A stream, counted once when it ends. Its behaviour is an async generator (ours,
        raftmq.broker.rpc) or a coroutine that writes on the context (grpc.health's Watch)."""
        if not inspect.isasyncgenfunction(behaviour):
            return self._unary(method, behaviour, timed=False)
        stats = self._stats(method)

        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            code = OK
            try:
                async for answer in behaviour(request, context):
                    yield answer
            except BaseException as exc:
                code = _failed_code(exc, context)
                raise
            finally:
                stats.count(code)

        return streamed

    def _produce_stream(self, method: str, behaviour: Handler) -> Handler:
        """ProduceStream: each request counted by its answer's code and timed. Per answer
        message this costs a loop over its answers; per request, a dict entry and a
        histogram sample, about a microsecond (never anything per record)."""
        stats = self._stats(method)

        async def streamed(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            arrived_s: dict[int, float] = {}

            async def noted() -> AsyncIterator[Any]:
                async for message in requests:
                    if not isinstance(message, Malformed):
                        now_s = time.perf_counter()
                        for request in message.requests:
                            arrived_s[request.request_id] = now_s
                    yield message

            try:
                async for message in behaviour(noted(), context):
                    now_s = time.perf_counter()
                    answered = 0
                    for answer in message.responses:
                        start_s = arrived_s.pop(answer.request_id, None)
                        if start_s is not None:
                            stats.observe(now_s - start_s)
                        code = answer.error.code
                        if code:
                            stats.count(code if code in CODE_NAMES else "UNKNOWN")
                        else:
                            answered += 1
                    if answered:
                        stats.count(OK, answered)
                    yield message
            except grpc.aio.AbortError:  # the stream itself refused (a malformed message)
                stats.count(_ended_code(context))
                raise

        return streamed
