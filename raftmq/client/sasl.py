"""A client's credentials, by Kafka's names (``sasl_mechanism``, ``sasl_username``,
``sasl_password``, ``sasl_oauth_token``), added to every call in one place: an interceptor
on each channel (raftmq.net.CallLogin), so no call site of any client knows about them.

- ``OAUTHBEARER``: every call carries ``authorization: Bearer TOKEN``.
- ``SCRAM-SHA-256``: before its first call to a broker, the channel runs the SCRAM
  handshake with that broker (authentication.proto, raftmq.scram) and keeps the session
  token it gets; every call carries ``authorization: Session TOKEN``. A session nearing
  its end is renewed before a call; one the broker no longer knows (it restarted:
  SESSION_EXPIRED) is dropped, and a unary call is sent once more after a new handshake
  (a stream fails with the retriable SESSION_EXPIRED, and the next attempt
  authenticates).

A handshake the broker refuses fails the call that needed it, with the broker's code and
sentence (wrong password, unknown user: SASL_AUTHENTICATION_FAILED).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict

import grpc

from raftmq import net, scram
from raftmq.api.v1 import authentication_pb2 as apb
from raftmq.api.v1 import authentication_pb2_grpc as apb_grpc

SCRAM_SHA_256 = scram.MECHANISM
OAUTHBEARER = "OAUTHBEARER"
MECHANISMS = (SCRAM_SHA_256, OAUTHBEARER)
AUTHORIZATION = "authorization"
HANDSHAKE_METHODS = ("/raftmq.v1.Authentication/",)
RENEW_BEFORE_S = 30.0
"""A session with less left than this (or a tenth of its life) is renewed before a call."""
HANDSHAKE_TIMEOUT_S = 10.0
EXPIRED = "SESSION_EXPIRED"


class SaslSettings(TypedDict, total=False):
    """The authentication keyword settings every client takes (docs/security.md)."""

    sasl_mechanism: str | None
    sasl_username: str | None
    sasl_password: str | None
    sasl_oauth_token: str | None


def _refused(sentence: str) -> grpc.aio.AioRpcError:
    """A login that fails on the client's side, as the broker's refusals read."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(("raftmq-error", "SASL_AUTHENTICATION_FAILED")),
        sentence,
    )


class _Session(NamedTuple):
    header: str
    renew_at: float


class SaslLogin:
    """One client's credentials (raftmq.net.CallLogin), with a SCRAM session per broker."""

    def __init__(
        self,
        mechanism: str,
        *,
        username: str | None = None,
        password: str | None = None,
        oauth_token: str | None = None,
    ) -> None:
        mechanism = mechanism.upper()
        if mechanism not in MECHANISMS:
            raise ValueError(
                f"sasl_mechanism {mechanism!r} is not supported; use {' or '.join(MECHANISMS)}"
            )
        if mechanism == SCRAM_SHA_256 and not (username and password is not None):
            raise ValueError("sasl_mechanism SCRAM-SHA-256 needs sasl_username and sasl_password")
        if mechanism == OAUTHBEARER and not oauth_token:
            raise ValueError("sasl_mechanism OAUTHBEARER needs sasl_oauth_token")
        self.mechanism = mechanism
        self.username = username or ""
        self._password = password or ""
        self._bearer = f"Bearer {oauth_token}" if oauth_token else ""
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the password or the token
        return f"SaslLogin({self.mechanism}, user={self.username!r})"

    # --- raftmq.net.CallLogin -----------------------------------------------------------

    def sync_interceptor(self, address: str, channel: grpc.Channel) -> Any:
        return _SyncInterceptor(self, address, channel)

    def aio_interceptors(self, address: str) -> Any:
        return _AioLink(self, address)

    # --- sessions -----------------------------------------------------------------------

    def current(self, address: str) -> str | None:
        if self._bearer:
            return self._bearer
        session = self._sessions.get(address)
        if session is None or time.monotonic() >= session.renew_at:
            return None
        return session.header

    def forget(self, address: str) -> None:
        self._sessions.pop(address, None)

    def _first(self) -> tuple[str, str, str]:
        nonce = scram.new_nonce()
        message, bare = scram.client_first(self.username, nonce)
        return nonce, message, bare

    def _final(self, nonce: str, bare: str, server_first: str) -> tuple[str, bytes]:
        try:
            combined, salt, iterations = scram.parse_server_first(server_first, nonce)
        except scram.ScramError as exc:
            raise _refused(f"the broker's SCRAM answer is not acceptable: {exc}") from None
        return scram.client_final(self._password, bare, server_first, combined, salt, iterations)

    def _keep(self, address: str, answer: apb.ScramClientFinalResponse, expected: bytes) -> str:
        try:
            scram.check_server_final(answer.message, expected)
        except scram.ScramError as exc:
            raise _refused(f"the broker failed to prove it holds the credential: {exc}") from None
        lifetime_s = answer.session_lifetime_ms / 1000
        renew_at = time.monotonic() + lifetime_s - min(RENEW_BEFORE_S, lifetime_s / 10)
        header = f"Session {answer.session_token}"
        self._sessions[address] = _Session(header, renew_at)
        return header

    def header_sync(self, address: str, channel: grpc.Channel) -> str:
        found = self.current(address)
        if found is not None:
            return found
        with self._lock:
            found = self.current(address)
            if found is not None:
                return found
            stub = apb_grpc.AuthenticationStub(channel)
            nonce, message, bare = self._first()
            first = stub.ScramClientFirst(
                apb.ScramClientFirstRequest(mechanism=self.mechanism, message=message),
                timeout=HANDSHAKE_TIMEOUT_S,
            )
            final, expected = self._final(nonce, bare, first.message)
            answer = stub.ScramClientFinal(
                apb.ScramClientFinalRequest(message=final), timeout=HANDSHAKE_TIMEOUT_S
            )
            return self._keep(address, answer, expected)

    async def header_aio(self, address: str, channel: grpc.aio.Channel) -> str:
        found = self.current(address)
        if found is not None:
            return found
        stub = apb_grpc.AuthenticationStub(channel)
        nonce, message, bare = self._first()
        first = await stub.ScramClientFirst(
            apb.ScramClientFirstRequest(mechanism=self.mechanism, message=message),
            timeout=HANDSHAKE_TIMEOUT_S,
        )
        final, expected = self._final(nonce, bare, first.message)
        answer = await stub.ScramClientFinal(
            apb.ScramClientFinalRequest(message=final), timeout=HANDSHAKE_TIMEOUT_S
        )
        return self._keep(address, answer, expected)


def _expired(error: object) -> bool:
    """Whether a failed call says the session is gone (the broker restarted)."""
    if not isinstance(error, grpc.RpcError) or not hasattr(error, "trailing_metadata"):
        return False
    return any(k == "raftmq-error" and v == EXPIRED for k, v in error.trailing_metadata() or ())


def _handshake(method: str | bytes) -> bool:
    text = method.decode() if isinstance(method, bytes) else method
    return text.startswith(HANDSHAKE_METHODS)


def _with_header(metadata: Any, header: str) -> list[tuple[str, Any]]:
    kept = [(k, v) for k, v in (metadata or ()) if k != AUTHORIZATION]
    return [*kept, (AUTHORIZATION, header)]


class _SyncInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, login: SaslLogin, address: str, channel: grpc.Channel) -> None:
        self.login = login
        self.address = address
        self.channel = channel

    def _details(self, details: Any) -> Any:
        header = self.login.header_sync(self.address, self.channel)
        return net.with_metadata(details, _with_header(details.metadata, header))

    def _call(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        if _handshake(details.method):
            return continuation(details, request)
        return self._watched(continuation(self._details(details), request))

    def _watched(self, call: Any) -> Any:
        def done(finished: Any) -> None:
            if _expired(finished):
                self.login.forget(self.address)

        call.add_done_callback(done)  # a stream's call is a grpc.Future too
        return call

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if _handshake(details.method):
            return continuation(details, request)
        outcome = continuation(self._details(details), request)
        if _expired(outcome.exception()):
            self.login.forget(self.address)
            outcome = continuation(self._details(details), request)
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)


class _AioLink:
    """What the four asyncio interceptors of one channel share (grpc.aio files an
    interceptor under one kind only, so each kind has its own class)."""

    def __init__(self, login: SaslLogin, address: str) -> None:
        self.login = login
        self.address = address
        self.channel: grpc.aio.Channel | None = None
        self._handshaking: asyncio.Lock | None = None
        self.interceptors = [
            _AioUnaryUnary(self),
            _AioUnaryStream(self),
            _AioStreamUnary(self),
            _AioStreamStream(self),
        ]

    def bind(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    async def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        assert self.channel is not None, "raftmq.net binds the channel once made"
        header = self.login.current(self.address)
        if header is None:
            if self._handshaking is None:
                self._handshaking = asyncio.Lock()
            async with self._handshaking:  # one handshake per broker at a time
                header = await self.login.header_aio(self.address, self.channel)
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*_with_header(details.metadata, header)),
            details.credentials,
            details.wait_for_ready,
        )

    def watch(self, call: Any) -> Any:
        def done(finished: Any) -> None:
            task = asyncio.get_running_loop().create_task(self._check(finished))
            _pending.add(task)
            task.add_done_callback(_pending.discard)

        call.add_done_callback(done)
        return call

    async def _check(self, call: Any) -> None:
        try:
            trailers = await call.trailing_metadata()
        except (grpc.RpcError, asyncio.CancelledError):
            return
        if any(k == "raftmq-error" and v == EXPIRED for k, v in trailers or ()):
            self.login.forget(self.address)


class _AioUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, link: _AioLink) -> None:
        self.link = link

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if _handshake(details.method):
            return await continuation(details, request)
        call = await continuation(await self.link.details(details), request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if not _expired(exc):
                return call
            self.link.login.forget(self.link.address)
            return await continuation(await self.link.details(details), request)
        return call


class _AioUnaryStream(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, link: _AioLink) -> None:
        self.link = link

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self.link.watch(await continuation(await self.link.details(details), request))


class _AioStreamUnary(grpc.aio.StreamUnaryClientInterceptor):
    def __init__(self, link: _AioLink) -> None:
        self.link = link

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self.link.watch(await continuation(await self.link.details(details), requests))


class _AioStreamStream(grpc.aio.StreamStreamClientInterceptor):
    def __init__(self, link: _AioLink) -> None:
        self.link = link

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self.link.watch(await continuation(await self.link.details(details), requests))


_pending: set[asyncio.Task[None]] = set()
"""The checks of finished streams still running (kept so they are not collected)."""


def client_security(
    ssl_cafile: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    *,
    sasl_mechanism: str | None = None,
    sasl_username: str | None = None,
    sasl_password: str | None = None,
    sasl_oauth_token: str | None = None,
) -> net.Security:
    """How a client connects, from its Kafka-named settings: TLS from the ``ssl_`` files,
    and its calls' credentials from the ``sasl_`` ones (none: no credentials). Raises
    ValueError for settings that do not go together."""
    login = None
    if sasl_mechanism:
        login = SaslLogin(
            sasl_mechanism,
            username=sasl_username,
            password=sasl_password,
            oauth_token=sasl_oauth_token,
        )
    elif sasl_username or sasl_password or sasl_oauth_token:
        raise ValueError(
            "sasl_username, sasl_password and sasl_oauth_token need sasl_mechanism "
            "('SCRAM-SHA-256' or 'OAUTHBEARER')"
        )
    return net.Security(ssl_cafile, ssl_certfile, ssl_keyfile, login=login)


SECURITY_KEYS = (
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "sasl_oauth_token",
)


def security_of(config: object) -> net.Security:
    """:func:`client_security` of a client's configuration (its ``ssl_`` and ``sasl_``
    attributes)."""
    return client_security(**{key: getattr(config, key, None) for key in SECURITY_KEYS})
