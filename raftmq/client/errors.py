"""What a client reads from a refused call: the broker's ``ErrorCode`` (the generated enum of
broker.proto, re-exported here so callers need not know the api package), the status, and
the trailing fields, in one :class:`ClientError`.

The code comes from the ``raftmq-error`` trailer, which carries its name; a name this client
does not know (a newer broker's) reads as ``ERROR_CODE_UNSPECIFIED`` with the name kept in
``code_name``, so an older client never fails on an answer, and never retries it.
"""

from __future__ import annotations

import grpc

from raftmq.api.error_codes import RULES, ErrorCode, code_of, name_of
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.tls_refusals import TlsRefusal, tls_refusal

__all__ = ["ClientError", "ErrorCode", "error_of"]


_NO_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class ClientError(Exception):
    """A broker refused a request, or no broker answered it.

    ``code``: the ErrorCode; UNSPECIFIED when the failure carries no ``raftmq-error`` (gRPC
    itself failed, see ``status``) or one newer than this client. ``code_name``: the code as
    received ("" without one). ``meta``: the trailing metadata (``raftmq-leader-address``
    and the rest, see broker.proto). ``tls_refusal``: set when TLS refused the connection
    (raftmq.client.tls_refusals): then the message says what to change."""

    tls_refusal: TlsRefusal | None = None

    def __init__(
        self,
        message: str,
        code: pb.ErrorCode,
        status: grpc.StatusCode | None,
        meta: dict[str, str],
        code_name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.code_name = code_name if code_name is not None else self._known_name(code)
        self.status = status
        self.meta = meta

    @staticmethod
    def _known_name(code: pb.ErrorCode) -> str:
        return "" if code == pb.ERROR_CODE_UNSPECIFIED else name_of(code)

    @property
    def retriable(self) -> bool:
        """Nothing was done and the same request may succeed elsewhere or later (the rule
        broker.proto documents for each code)."""
        rule = RULES.get(self.code)
        return rule is not None and rule.retriable

    @property
    def unreachable(self) -> bool:
        """No broker answered: gRPC's own UNAVAILABLE or CANCELLED, without a
        ``raftmq-error``. CANCELLED is what a call gets when its broker stops under it (a
        restart cancels the calls in flight, a long-poll fetch above all) or its channel
        closes: the next broker, or the same one back, may answer. A call may still have
        reached the broker before the connection broke."""
        return not self.code_name and self.status in _NO_ANSWER

    @property
    def timed_out(self) -> bool:
        """No answer within the call's deadline (gRPC's own DEADLINE_EXCEEDED, without a
        ``raftmq-error``): the server may be gone, or may have done the call; retry only
        what is safe to do twice."""
        return not self.code_name and self.status == grpc.StatusCode.DEADLINE_EXCEEDED

    @property
    def label(self) -> str:
        """A short name for logs and messages: the code's name, else the gRPC status's."""
        if self.code_name:
            return self.code_name
        return self.status.name if self.status is not None else "UNSPECIFIED"


def error_of(exc: grpc.RpcError) -> ClientError:
    """The ClientError a failed gRPC call stands for. A connection that TLS refused
    (raftmq.client.tls_refusals) says why in words, with its own label and status."""
    meta = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
    name = str(meta.get("raftmq-error", ""))
    details = exc.details() or str(exc.code())
    if not name and exc.code() == grpc.StatusCode.UNAVAILABLE:
        refusal = tls_refusal(details)
        if refusal is not None:
            err = ClientError(
                f"{refusal.sentence} ({details})",
                pb.ERROR_CODE_UNSPECIFIED,
                refusal.status,
                meta,
                refusal.label,
            )
            err.tls_refusal = refusal
            return err
    return ClientError(details, code_of(name), exc.code(), meta, name)
