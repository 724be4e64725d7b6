"""What every RPC passes before its method runs: who calls (authentication), and whether
they may (authorization).

Every service is registered through :func:`raftmq.broker.rpc.add_service`, whose wrappers
ask the server's guard (:func:`raftmq.broker.rpc.guard_server`) first: one place, so no
RPC can be added that skips it. A unary call is authenticated and authorized once; a
stream is authenticated when it opens and authorized request by request, since each
request of a stream may name another topic.

The default guard (:data:`OPEN`) admits everyone and establishes nothing: the principal a
log line shows is then read lazily from the mutual-TLS certificate, if any
(:class:`raftmq.log_records.CallContext`), so a cluster without authentication pays
nothing on the request path.
"""

from __future__ import annotations

import grpc


class Guard:
    """Admits every call; subclasses (or a composition) authenticate and authorize."""

    async def authenticate(self, rpc: str, context: grpc.aio.ServicerContext) -> str | None:
        """The caller's principal (``User:NAME``), or None when this guard does not
        establish one; raises :class:`raftmq.broker.refusals.Refusal` (UNAUTHENTICATED)
        for a caller it cannot identify."""
        return None

    def authorize(self, rpc: str, request: object, principal: str | None) -> None:
        """Raises a Refusal (PERMISSION_DENIED, naming the resource and operation) when
        ``principal`` may not make this ``request``; nothing may have been changed yet."""
        return None


OPEN = Guard()
