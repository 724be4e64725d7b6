"""What every RPC passes before its method runs: who calls (authentication), and whether
they may (authorization).

Every service is registered through :func:`raftmq.broker.rpc.add_service`, whose wrappers
ask the server's guard (:func:`raftmq.broker.rpc.guard_server`) first: one place, so no
RPC can be added that skips it. A unary call is authenticated and authorized once; a
stream is authenticated when it opens and authorized request by request, since each
request of a stream may name another topic.

A guard without an authenticator (the default, :data:`OPEN`) establishes no principal: the
one a log line shows is then read lazily from the mutual-TLS certificate, if any
(:class:`raftmq.log_records.CallContext`), so a cluster without authentication pays
nothing on the request path. Without an authorizer every call is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from raftmq.log_records import ANONYMOUS, current_call


class Authenticator(Protocol):
    async def authenticate(self, rpc: str, context: grpc.aio.ServicerContext) -> str:
        """The caller's principal (``User:NAME``); raises
        :class:`raftmq.broker.refusals.Refusal` (UNAUTHENTICATED, with a sentence naming
        the methods this listener accepts) for a caller it cannot identify."""
        ...


class Authorizer(Protocol):
    def authorize(self, rpc: str, request: object, principal: str) -> None:
        """Raises a Refusal (PERMISSION_DENIED, naming the resource and the operation)
        when ``principal`` may not make this ``request``; nothing is changed before."""
        ...

    def shown(self, rpc: str, request: object, response: Any, principal: str) -> Any:
        """``response`` as ``principal`` may see it: a listing without the resources it
        may not describe (never leaked); anything else as it is."""
        ...


@dataclass(frozen=True)
class Guard:
    authenticator: Authenticator | None = None
    authorizer: Authorizer | None = None

    async def authenticate(self, rpc: str, context: grpc.aio.ServicerContext) -> str | None:
        """The principal, or None when this guard establishes none."""
        if self.authenticator is None:
            return None
        return await self.authenticator.authenticate(rpc, context)

    def authorize(self, rpc: str, request: object, principal: str | None) -> None:
        if self.authorizer is None:
            return
        self.authorizer.authorize(rpc, request, _principal(principal))

    def authorize_each(self, rpc: str) -> Callable[[Any], None]:
        """For a stream whose requests are answered one by one (ProduceStream): the
        check of one request as ``rpc``, for the current call's principal, so a refused
        request gets its own answer and the stream goes on."""
        return lambda request: self.authorize(rpc, request, None)

    def shown(self, rpc: str, request: object, response: Any, principal: str | None) -> Any:
        """What a unary call answers once its method returned (streams list nothing)."""
        if self.authorizer is None:
            return response
        return self.authorizer.shown(rpc, request, response, _principal(principal))


def _principal(established: str | None) -> str:
    """The guard's principal, else (no authenticator) the certificate's name or anonymous."""
    if established is not None:
        return established
    call = current_call()
    return call.principal if call is not None else ANONYMOUS


OPEN = Guard()
"""Admits every call and establishes nothing."""
