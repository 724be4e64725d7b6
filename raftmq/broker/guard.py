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

from dataclasses import dataclass
from typing import Protocol

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
        if principal is None:  # no authenticator: the certificate's name, or anonymous
            call = current_call()
            principal = call.principal if call is not None else ANONYMOUS
        self.authorizer.authorize(rpc, request, principal)


OPEN = Guard()
"""Admits every call and establishes nothing."""
