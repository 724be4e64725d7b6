"""Every network endpoint raftmq opens, made in one place: gRPC servers, their ports and
client channels (sync and asyncio), and the Raft transport's TCP listener and connections.

Why one module: how a connection is protected is decided per endpoint kind, not per
caller, and what every request passes through is decided per server, not per service.
Everything is plaintext today. TLS will add certificates to :class:`Security`, and these
functions will then pick gRPC's secure channel and port and an ``ssl`` context for the
Raft sockets from it; no caller opens a socket or channel another way (tests/test_net.py
checks that no other module of raftmq does). The channel options every client uses live
here too (:data:`CHANNEL_OPTIONS`), so that a limit is set once.

It sits at the top of the package, beside ``raftmq.tasks``, so that every layer, from the
Raft host to the client, may import it; so it imports only the standard library and grpc.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.registry import Collector

MAX_MESSAGE_BYTES = 72 << 20
"""A client's gRPC message limit, both ways: above a broker's largest answer (a Fetch of up
to 64 MiB of records, plus its framing), which gRPC's default of 4 MiB would refuse."""
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)
"""The options every channel gets; a caller's own (``options=``) are added, and win."""

ChannelOptions = Sequence[tuple[str, Any]]
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass(frozen=True)
class Security:
    """How an endpoint is protected. Only plaintext exists yet, so it has no fields; TLS
    adds its certificates here, and every function below already takes one."""


PLAINTEXT = Security()


def _options(extra: ChannelOptions) -> list[tuple[str, Any]]:
    """:data:`CHANNEL_OPTIONS` with ``extra`` on top (a key in both takes ``extra``'s)."""
    return list({**dict(CHANNEL_OPTIONS), **dict(extra)}.items())


def channel(
    address: str, *, options: ChannelOptions = (), security: Security = PLAINTEXT
) -> grpc.Channel:
    """A synchronous gRPC channel to ``address`` (host:port)."""
    return grpc.insecure_channel(address, options=_options(options))


def aio_channel(
    address: str, *, options: ChannelOptions = (), security: Security = PLAINTEXT
) -> grpc.aio.Channel:
    """An asyncio gRPC channel to ``address`` (host:port); use it in one event loop."""
    return grpc.aio.insecure_channel(address, options=_options(options))


class Channels:
    """One synchronous channel per address, opened on first use and kept (gRPC reconnects
    a channel by itself): the synchronous clients' twin of :class:`AioChannels`."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}

    def of(self, address: str) -> grpc.Channel:
        """The channel to ``address``."""
        found = self._channels.get(address)
        if found is None:
            found = self._channels[address] = channel(address)
        return found

    def close(self) -> None:
        """Close every channel (errors of one do not stop the others)."""
        channels, self._channels = self._channels, {}
        for each in channels.values():
            with contextlib.suppress(Exception):
                each.close()


class AioChannels:
    """One asyncio channel per address, opened on first use and kept (gRPC reconnects a
    channel by itself): what every caller that talks to many brokers keeps. With
    ``max_channels``, reaching it closes them all first (addresses change only when
    brokers move, so the set is rebuilt from those in use). Use it in one event loop."""

    def __init__(self, *, max_channels: int | None = None) -> None:
        self.max_channels = max_channels
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def get(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address``, bounded by ``max_channels``."""
        if (
            address not in self._channels
            and self.max_channels is not None
            and len(self._channels) >= self.max_channels
        ):
            await self.close()
        return self.of(address)

    def of(self, address: str) -> grpc.aio.Channel:
        """The channel to ``address``, without a bound (for callers that name few)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = aio_channel(address)
        return channel

    async def close(self) -> None:
        """Close every channel (errors of one do not stop the others)."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            with contextlib.suppress(Exception):
                await channel.close()


def aio_server(
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> grpc.aio.Server:
    """An asyncio gRPC server whose messages may be up to ``max_message_bytes`` both ways.
    Every server raftmq runs is made here, so what every request must pass through (the
    interceptors that count, and later authenticate, authorize and throttle) is added
    once; ``interceptors`` run in order, the first outermost."""
    return grpc.aio.server(
        interceptors=list(interceptors),
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ],
    )


def add_port(
    server: grpc.Server | grpc.aio.Server, host_port: str, *, security: Security = PLAINTEXT
) -> int:
    """Make ``server`` listen on ``host_port`` (port 0: one the kernel picks); returns the
    port it bound."""
    return int(server.add_insecure_port(host_port))


def serve_metrics(
    registry: Collector, host: str, port: int, *, security: Security = PLAINTEXT
) -> WSGIServer:
    """Serve ``registry`` in Prometheus' text format over HTTP on ``host``:``port`` (port 0:
    one the kernel picks; the server's ``server_address`` says which), from
    prometheus-client's own server, in a daemon thread. Stop it with ``shutdown()`` (which
    waits for its loop, up to half a second: call it off the event loop) and
    ``server_close()``. prometheus-client is imported here, when asked for, so that this
    module stays importable with the standard library and grpc alone."""
    from prometheus_client.exposition import start_http_server

    server, _ = start_http_server(port, addr=host, registry=registry)
    return server


async def serve_tcp(
    handler: StreamHandler,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    security: Security = PLAINTEXT,
) -> asyncio.Server:
    """A listening TCP server on ``host``:``port`` that runs ``handler`` per connection
    (the Raft transport's listener). ``reuse_port`` sets ``SO_REUSEPORT``, which a port
    reserved by raftmq.devtools.ports needs."""
    return await asyncio.start_server(handler, host, port, reuse_port=reuse_port)


async def connect_tcp(
    host: str, port: int, *, security: Security = PLAINTEXT
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to ``host``:``port`` (the Raft transport's dial)."""
    return await asyncio.open_connection(host, port)
