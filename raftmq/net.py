"""Every network endpoint raftmq opens, made in one place: gRPC servers, their ports and
client channels (sync and asyncio), and the Raft transport's TCP listener and connections.

Why one module: how a connection is protected is decided per endpoint kind, not per
caller, and what every request passes through is decided per server, not per service.
:class:`Security` says how: plaintext (:data:`PLAINTEXT`, the default, which costs nothing
more than a plain socket), or TLS from a CA file, a certificate and a key, with client
certificates required or not (mutual TLS, per listener). These functions pick gRPC's
secure channel and port and an ``ssl`` context for the Raft sockets from it; no caller
opens a socket or channel another way (tests/test_net.py checks that no other module of
raftmq does). The files are re-read when they change (raftmq.tls_files), so a rotated
certificate is served to the next connection while the open ones carry on. The channel
options every client uses live here too (:data:`CHANNEL_OPTIONS`), so that a limit is set
once.

It sits at the top of the package, beside ``raftmq.tasks``, so that every layer, from the
Raft host to the client, may import it; so it imports only the standard library, grpc and
the top-level helper raftmq.tls_files.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from raftmq.tls_files import CLIENT, SERVER, TlsFiles

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

HANDSHAKE_TIMEOUT_S = 10.0
"""How long a TLS handshake on the Raft transport may take before the connection is
dropped (a peer that connects and says nothing must not hold a task)."""

ChannelOptions = Sequence[tuple[str, Any]]
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class CallLogin(Protocol):
    """A client's credentials, added to every call of its channels by an interceptor (one
    per channel, so a login that holds a session per broker knows which): what
    raftmq.client.sasl provides for Kafka's ``sasl_mechanism``."""

    def sync_interceptor(self, address: str, channel: grpc.Channel) -> Any:
        """The interceptor of a synchronous channel to ``address``; ``channel`` is the
        channel without it (for a handshake of its own)."""
        ...

    def aio_interceptors(self, address: str) -> Any:
        """The interceptors of an asyncio channel to ``address`` (``.interceptors``, one
        per kind of call: grpc.aio files each under one kind), given the channel once made
        (``.bind(channel)``)."""
        ...


@dataclass(frozen=True)
class Security:
    """How an endpoint is protected: plaintext (no files), or TLS.

    A listener (server side) needs ``cert_file`` and ``key_file``; with
    ``require_client_cert`` it also needs ``ca_file``, and refuses a client that presents
    no certificate signed by it (mutual TLS). A client (a channel, a Raft dial) trusts the
    servers ``ca_file`` signed (the system's CAs without one), and presents ``cert_file``
    when set (what a mutual-TLS listener asks for). A broker uses one value both ways: its
    certificate is its server certificate and its client certificate to its peers."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    require_client_cert: bool = False
    login: CallLogin | None = field(default=None, compare=False)
    """A client's credentials for its calls (None: the calls carry none); a listener
    ignores it. Not part of equality: the TLS files are shared whatever the login."""

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "a TLS certificate file needs its key file, and a key file its certificate "
                "(ssl_certfile and ssl_keyfile, or --tls-cert and --tls-key)"
            )

    @property
    def tls(self) -> bool:
        """Whether connections are TLS (any file set) rather than plaintext."""
        return any(p is not None for p in (self.ca_file, self.cert_file, self.key_file))

    def files(self, side: str) -> TlsFiles:
        """The files loaded for ``side`` (tls_files.SERVER or CLIENT), checked."""
        return TlsFiles(
            self.ca_file,
            self.cert_file,
            self.key_file,
            side=side,
            require_client_cert=self.require_client_cert and side == SERVER,
        )


PLAINTEXT = Security()

_client_files: dict[Security, TlsFiles] = {}
"""The client-side material of each Security in use, shared by every channel and dial of
this process (each checks it for changes when it opens a connection)."""


def _client(security: Security) -> TlsFiles:
    """The client-side files of ``security``, refreshed if they changed."""
    files = _client_files.get(security)
    if files is None:
        files = _client_files[security] = security.files(CLIENT)
    else:
        files.refresh()
    return files


def _channel_credentials(security: Security) -> grpc.ChannelCredentials:
    pem = _client(security).pem
    return grpc.ssl_channel_credentials(
        root_certificates=pem.ca, private_key=pem.key, certificate_chain=pem.cert
    )


def _options(extra: ChannelOptions) -> list[tuple[str, Any]]:
    """:data:`CHANNEL_OPTIONS` with ``extra`` on top (a key in both takes ``extra``'s)."""
    return list({**dict(CHANNEL_OPTIONS), **dict(extra)}.items())


Headers = tuple[tuple[str, str], ...]
"""gRPC metadata a client sends on every call of a channel (its client id, say)."""


def channel(
    address: str,
    *,
    options: ChannelOptions = (),
    security: Security = PLAINTEXT,
    headers: Headers = (),
) -> grpc.Channel:
    """A synchronous gRPC channel to ``address`` (host:port), sending ``headers`` on every
    call."""
    if security.tls:
        creds = _channel_credentials(security)
        made = grpc.secure_channel(address, creds, options=_options(options))
    else:
        made = grpc.insecure_channel(address, options=_options(options))
    if headers:
        made = grpc.intercept_channel(made, _SyncHeaders(headers))
    if security.login is None:
        return made
    return grpc.intercept_channel(made, security.login.sync_interceptor(address, made))


def aio_channel(
    address: str,
    *,
    options: ChannelOptions = (),
    security: Security = PLAINTEXT,
    headers: Headers = (),
) -> grpc.aio.Channel:
    """An asyncio gRPC channel to ``address`` (host:port), sending ``headers`` on every
    call, and the login's credentials when ``security`` has one; use it in one event
    loop."""
    login = None if security.login is None else security.login.aio_interceptors(address)
    interceptors = [
        *(_aio_headers(headers) if headers else ()),
        *(login.interceptors if login is not None else ()),
    ]
    if security.tls:
        creds = _channel_credentials(security)
        made = grpc.aio.secure_channel(
            address, creds, options=_options(options), interceptors=interceptors
        )
    else:
        made = grpc.aio.insecure_channel(
            address, options=_options(options), interceptors=interceptors
        )
    if login is not None:
        login.bind(made)
    return made


def _with_headers(metadata: Any, headers: Headers) -> tuple[tuple[str, Any], ...]:
    """A call's own metadata (None, a tuple or gRPC's Metadata) with ``headers`` added."""
    return (*tuple(metadata or ()), *headers)


class _SyncHeaders(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the same headers to every call of a synchronous channel."""

    def __init__(self, headers: Headers) -> None:
        self.headers = headers

    def _details(self, details: Any) -> grpc.ClientCallDetails:
        return with_metadata(details, _with_headers(details.metadata, self.headers))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def with_metadata(details: Any, metadata: Any) -> grpc.ClientCallDetails:
    """A synchronous call's ``details`` with ``metadata`` in place of its own: what a
    synchronous client interceptor passes on (this module's, and the logins')."""
    return _CallDetails(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


class _CallDetails(grpc.ClientCallDetails):
    """A synchronous call's details with other metadata (gRPC gives no constructor)."""

    def __init__(
        self,
        method: str,
        timeout: float | None,
        metadata: Any,
        credentials: Any,
        wait_for_ready: bool | None,
        compression: Any,
    ) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def _aio_headers(headers: Headers) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors adding the same headers to every call of an asyncio channel."""

    def details(d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return grpc.aio.ClientCallDetails(
            d.method, d.timeout, _with_headers(d.metadata, headers), d.credentials, d.wait_for_ready
        )

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation: Any, d: Any, request: Any) -> Any:
            return await continuation(details(d), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation: Any, d: Any, request: Any) -> Any:
            return await continuation(details(d), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation: Any, d: Any, requests: Any) -> Any:
            return await continuation(details(d), requests)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation: Any, d: Any, requests: Any) -> Any:
            return await continuation(details(d), requests)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]


class Channels:
    """One synchronous channel per address, opened on first use and kept (gRPC reconnects
    a channel by itself): the synchronous clients' twin of :class:`AioChannels`."""

    def __init__(self, *, security: Security = PLAINTEXT, headers: Headers = ()) -> None:
        self.security = security
        self.headers = headers
        self._channels: dict[str, grpc.Channel] = {}

    def of(self, address: str) -> grpc.Channel:
        """The channel to ``address``."""
        found = self._channels.get(address)
        if found is None:
            found = self._channels[address] = channel(
                address, security=self.security, headers=self.headers
            )
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

    def __init__(
        self,
        *,
        max_channels: int | None = None,
        security: Security = PLAINTEXT,
        headers: Headers = (),
    ) -> None:
        self.max_channels = max_channels
        self.security = security
        self.headers = headers
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
            channel = self._channels[address] = aio_channel(
                address, security=self.security, headers=self.headers
            )
        return channel

    async def close(self) -> None:
        """Close every channel (errors of one do not stop the others)."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            with contextlib.suppress(Exception):
                await channel.close()


SERVER_HANDSHAKE_TIMEOUT_MS = 10_000
"""How long a new connection may take to finish its handshake (TLS and HTTP/2 settings);
gRPC's default is two minutes, during which a connection stuck in a hung link holds a
descriptor, and clients that retry through such a link open a new one each time."""
SERVER_MAX_IDLE_MS = 600_000
"""A connection with no call for this long is closed (Kafka's connections.max.idle.ms):
clients reconnect on their next call, and descriptors of clients gone quiet come back."""


def aio_server(
    *,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    max_connections: int | None = None,
) -> grpc.aio.Server:
    """An asyncio gRPC server whose messages may be up to ``max_message_bytes`` both ways.
    Every server raftmq runs is made here, so what every request must pass through (the
    interceptors that count, and later authenticate, authorize and throttle) is added
    once; ``interceptors`` run in order, the first outermost. ``max_connections`` bounds
    the connections it accepts at once (a broker derives it from its open-file limit);
    one more is closed as it arrives, and its client retries."""
    options: list[tuple[str, int]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.server_handshake_timeout_ms", SERVER_HANDSHAKE_TIMEOUT_MS),
        ("grpc.max_connection_idle_ms", SERVER_MAX_IDLE_MS),
    ]
    if max_connections is not None:
        assert max_connections > 0, max_connections
        options.append(("grpc.max_allowed_incoming_connections", max_connections))
    return grpc.aio.server(interceptors=list(interceptors), options=options)


def add_port(
    server: grpc.Server | grpc.aio.Server, host_port: str, *, security: Security = PLAINTEXT
) -> int:
    """Make ``server`` listen on ``host_port`` (port 0: one the kernel picks); returns the
    port it bound. With TLS, the certificate and key are re-read when their files change
    (gRPC asks at each new connection), so a rotation reaches the next client while the
    connections open, and their streams, carry on."""
    if not security.tls:
        return int(server.add_insecure_port(host_port))
    return int(server.add_secure_port(host_port, _server_credentials(security)))


def _server_credentials(security: Security) -> grpc.ServerCredentials:
    files = security.files(SERVER)

    def configuration() -> Any:
        pem = files.pem
        assert pem.cert is not None and pem.key is not None, "a server has both (TlsFiles)"
        return grpc.ssl_server_certificate_configuration(
            [(pem.key, pem.cert)],
            root_certificates=pem.ca if security.require_client_cert else None,
        )

    def fetch() -> Any:
        """gRPC's question at each handshake: new material, or None to keep the last."""
        return configuration() if files.refresh() else None

    return grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=security.require_client_cert
    )


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
    reserved by raftmq.devtools.ports needs. With TLS, each handshake takes the files as
    they are now (:func:`_rotating_server_context`)."""
    if not security.tls:
        return await asyncio.start_server(handler, host, port, reuse_port=reuse_port)
    return await asyncio.start_server(
        handler,
        host,
        port,
        reuse_port=reuse_port,
        ssl=_rotating_server_context(security.files(SERVER)),
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
    )


def _rotating_server_context(files: TlsFiles) -> ssl.SSLContext:
    """A listener's context whose connections each get the files' current context: the
    listener's own is fixed when it starts, so at each ClientHello the connection is moved
    onto the latest (``sni_callback`` runs with or without a server name)."""
    listener = files.context

    def latest(conn: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: Any) -> None:
        files.refresh()
        if files.context is not listener:
            conn.context = files.context

    listener.sni_callback = latest
    return listener


async def connect_tcp(
    host: str, port: int, *, security: Security = PLAINTEXT
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to ``host``:``port`` (the Raft transport's dial). With TLS, the
    peer's certificate must be signed by the CA and name ``host``."""
    if not security.tls:
        return await asyncio.open_connection(host, port)
    return await asyncio.open_connection(
        host,
        port,
        ssl=_client(security).context,
        server_hostname=host,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
    )
