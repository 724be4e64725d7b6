"""The gRPC plumbing every raftmq service shares (Broker, Admin, Groups, Controller and the
admin redirect): how a service is registered, how request bytes are parsed, and how an
answer that is not a message becomes a status.

Every RPC is registered through :func:`add_service`, not the generated registration: its
request deserializers let a method refuse bytes that are not a valid message
(MALFORMED_REQUEST) instead of gRPC answering INTERNAL, and its wrappers turn a Refusal
into a status with trailers and anything unexpected into one INTERNAL answer and one log
line with the traceback (a bug of ours, never the client's mistake)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.guard import OPEN, Guard
from raftmq.broker.refusals import Refusal
from raftmq.log_records import CallContext, bind_call, unbind_call

log = logging.getLogger(__name__)


class Malformed:
    """What the deserializer hands a method for request bytes that are not a valid message:
    the method refuses it (MALFORMED_REQUEST) as it refuses any other bad field."""

    def __init__(self, message_type: type[Message], exc: Exception) -> None:
        self.refusal = Refusal(
            pb.ERROR_CODE_MALFORMED_REQUEST,
            f"the request bytes are not a valid protobuf encoding of "
            f"{message_type.DESCRIPTOR.full_name} ({exc}); build it from "
            f"{message_type.DESCRIPTOR.file.name}",
        )


def deserializer(message_type: type[Message]) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Malformed(message_type, exc)

    return parse


def _well_formed(request: object) -> None:
    if isinstance(request, Malformed):
        raise request.refusal


def internal_error(rpc: str, exc: BaseException) -> Refusal:
    log.error("%s failed on a bug of the broker", rpc, exc_info=exc)
    return Refusal(
        pb.ERROR_CODE_INTERNAL,
        f"internal error in {rpc} ({type(exc).__name__}); this is a bug in the broker, "
        "not in the request: its log has the details",
    )


_guards: weakref.WeakKeyDictionary[grpc.aio.Server, Guard] = weakref.WeakKeyDictionary()


def guard_server(server: grpc.aio.Server, guard: Guard) -> None:
    """Every service added to ``server`` from now on admits its calls through ``guard``
    (before this, or never: :data:`raftmq.broker.guard.OPEN`)."""
    _guards[server] = guard


async def _admitted(
    guard: Guard, call: CallContext, context: grpc.aio.ServicerContext, request: object
) -> str | None:
    principal = await guard.authenticate(call.rpc, context)
    if principal is not None:
        call.principal = principal
    if request is not None:
        _well_formed(request)
        guard.authorize(call.rpc, request, principal)
    return principal


def unary(
    rpc: str,
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]],
    guard: Guard = OPEN,
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]]:
    async def handle(request: object, context: grpc.aio.ServicerContext) -> Message:
        call = CallContext(
            rpc, context.invocation_metadata, request, context.auth_context, context.peer
        )
        token = bind_call(call)
        try:
            principal = await _admitted(guard, call, context, request)
            return guard.shown(rpc, request, await method(request, context), principal)
        except Refusal as refusal:
            failure = refusal
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            failure = internal_error(rpc, exc)
        finally:
            unbind_call(token)
        await abort(context, failure)

    return handle


def streaming(
    rpc: str,
    method: Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Message]],
    guard: Guard = OPEN,
) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncIterator[Message]]:
    async def checked(
        requests: AsyncIterator[object], principal: str | None
    ) -> AsyncIterator[object]:
        async for request in requests:
            _well_formed(request)
            guard.authorize(rpc, request, principal)
            yield request

    async def handle(
        requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Message]:
        # A stream's task serves only it: no reset needed (an async generator cannot
        # reset a token across its yields anyway).
        call = CallContext(
            rpc, context.invocation_metadata, auth=context.auth_context, peer=context.peer
        )
        bind_call(call)
        try:
            principal = await _admitted(guard, call, context, None)
            async for answer in method(checked(requests, principal), context):
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
            failure = internal_error(rpc, exc)
        await abort(context, failure)

    return handle


def server_streaming(
    rpc: str,
    method: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Message]],
    guard: Guard = OPEN,
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Message]]:
    """One request, a stream of answers: the bidi wrapper over a stream of one request,
    so both kinds of stream end with the same error handling."""

    async def each(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Message]:
        async for request in requests:  # exactly one, checked well-formed by _streaming
            async for answer in method(request, context):
                yield answer

    bidi = streaming(rpc, each, guard)

    async def handle(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
        async def one() -> AsyncIterator[object]:
            yield request

        async for answer in bidi(one(), context):
            yield answer

    return handle


def add_service(service: object, server: grpc.aio.Server, module: Any, name: str) -> None:
    """Register ``service`` as raftmq.v1.``name`` (declared in the generated ``module``)
    on ``server``: one handler per method of the proto's service, with the generated
    message classes (stubs stay unchanged); only the deserializers and the error handling
    are ours, so every service answers with the same error contract, and every call
    passes the server's guard (:func:`guard_server`) first."""
    guard = _guards.get(server, OPEN)
    handlers = {}
    for method in module.DESCRIPTOR.services_by_name[name].methods:
        behaviour = getattr(service, method.name)
        make: Callable[..., grpc.RpcMethodHandler]
        handle: Callable[..., Any]  # a coroutine (unary) or an async generator (stream)
        if method.client_streaming:
            assert method.server_streaming, f"{method.name}: only bidi streams are wrapped"
            make, handle = (
                grpc.stream_stream_rpc_method_handler,
                streaming(method.name, behaviour, guard),
            )
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
            handle = server_streaming(method.name, behaviour, guard)
        else:
            make, handle = grpc.unary_unary_rpc_method_handler, unary(method.name, behaviour, guard)
        handlers[method.name] = make(
            handle,
            # The classes of the method's own types, wherever defined (share.proto answers
            # with groups.proto's ChangeDoneResponse): not looked up in ``module`` by name.
            request_deserializer=deserializer(GetMessageClass(method.input_type)),
            response_serializer=GetMessageClass(method.output_type).SerializeToString,
        )
    full_name = f"{module.DESCRIPTOR.package}.{name}"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(full_name, handlers),))
    server.add_registered_method_handlers(full_name, handlers)


async def abort(context: grpc.aio.ServicerContext, refusal: Refusal) -> NoReturn:
    """End the call with the refusal's status, message and trailers."""
    await context.abort(refusal.status, refusal.message, trailing_metadata=refusal.trailers())
    raise AssertionError("unreachable: abort raises")
