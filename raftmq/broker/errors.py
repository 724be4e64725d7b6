"""The broker's error contract in one place: which ``raftmq-error`` code goes with which gRPC
status, the Refusal a handler raises, and how it reaches the client (a status with trailing
metadata on unary calls, a ProduceError inside a ProduceStream answer).

Why one module: a code added anywhere else (a partition error class with a ``code``)
must get a status here and a line in broker.proto's error-contract comment, or a test
fails (tests/broker/test_error_contract.py compares the two). Everything a client sent
that the broker will not take is a Refusal with one of these codes; INTERNAL is kept for
the broker's own bugs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NoReturn

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.partition.errors import CorruptDataError, NotLeaderError, OffsetOutOfRangeError

if TYPE_CHECKING:
    from raftmq.broker.server import Broker
    from raftmq.partition.errors import PartitionError

STATUS: dict[str, grpc.StatusCode] = {
    "UNKNOWN_TOPIC": grpc.StatusCode.NOT_FOUND,
    "UNKNOWN_PARTITION": grpc.StatusCode.NOT_FOUND,
    "NOT_HOSTED": grpc.StatusCode.NOT_FOUND,
    "NOT_LEADER": grpc.StatusCode.FAILED_PRECONDITION,
    "LEADER_NOT_AVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "SHUTTING_DOWN": grpc.StatusCode.UNAVAILABLE,
    "REPLICA_FAILED": grpc.StatusCode.UNAVAILABLE,
    "OUTCOME_UNKNOWN": grpc.StatusCode.UNAVAILABLE,
    "INVALID_BATCH": grpc.StatusCode.INVALID_ARGUMENT,
    "CORRUPT_BATCH": grpc.StatusCode.INVALID_ARGUMENT,
    "BATCH_TOO_LARGE": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "MALFORMED_REQUEST": grpc.StatusCode.INVALID_ARGUMENT,
    "DUPLICATE_REQUEST_ID": grpc.StatusCode.INVALID_ARGUMENT,
    "OFFSET_OUT_OF_RANGE": grpc.StatusCode.OUT_OF_RANGE,
    "TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "CORRUPT_DATA": grpc.StatusCode.DATA_LOSS,
    "INTERNAL": grpc.StatusCode.INTERNAL,
}
"""``raftmq-error`` code -> gRPC status. Documented, with what a client should do, in
broker.proto's header comment."""

ECHO_CHARS = 64
"""How much of a client's string a message or trailer repeats: a 1 MB topic name echoed
whole would exceed gRPC's metadata limits (8 KiB by default) and lose the answer."""
LIST_ITEMS = 20
"""How many names a message lists (known topics, unknown ones) before "and N more"."""


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` as a message may quote it: repr'd (so a newline shows as ``\\n``), at most
    ``limit`` characters of it, then how long it really was."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} chars)"


def name_list(names: Iterable[str], limit: int = LIST_ITEMS) -> str:
    """Comma-separated shortened names, at most ``limit`` of them, "none" when empty."""
    items = list(names)
    shown = ", ".join(shorten(n) for n in items[:limit])
    if len(items) > limit:
        shown += f" and {len(items) - limit} more"
    return shown or "none"


class Refusal(Exception):
    """A request refused with a symbolic code (the ``raftmq-error`` vocabulary), a sentence,
    and fields a client acts on. Unary calls turn it into a gRPC status with trailing
    metadata; ProduceStream into a ProduceError in the answer."""

    def __init__(self, code: str, message: str, **meta: object) -> None:
        assert code in STATUS, f"{code} has no gRPC status in raftmq.broker.errors.STATUS"
        super().__init__(message)
        self.code = code
        self.message = message
        self.meta = {k: v for k, v in meta.items() if v is not None}

    @property
    def status(self) -> grpc.StatusCode:
        return STATUS[self.code]

    @classmethod
    def of(cls, exc: PartitionError, broker: Broker) -> Refusal:
        """The refusal for a partition's error, with the leader's address where it helps the
        client go straight to another replica."""
        if isinstance(exc, NotLeaderError):
            leader = broker.spec.brokers.get(exc.leader)
            if exc.leader == 0 or leader is None:
                return cls("LEADER_NOT_AVAILABLE", str(exc))
            return cls("NOT_LEADER", str(exc), leader_id=exc.leader, leader_address=leader.address)
        if isinstance(exc, OffsetOutOfRangeError):
            return cls(
                exc.code,
                str(exc),
                log_start_offset=exc.start,
                high_watermark=exc.high_watermark,
            )
        if isinstance(exc, CorruptDataError):
            leader = broker.spec.brokers.get(exc.leader)
            if leader is not None and exc.leader != broker.id:
                return cls(exc.code, str(exc), leader_id=exc.leader, leader_address=leader.address)
        return cls(exc.code, str(exc))

    def trailers(self) -> tuple[tuple[str, str], ...]:
        extra = ((f"raftmq-{k.replace('_', '-')}", str(v)) for k, v in self.meta.items())
        return (("raftmq-error", self.code), *extra)

    def to_pb(self) -> pb.ProduceError:
        return pb.ProduceError(
            code=self.code,
            message=self.message,
            leader_id=int(self.meta.get("leader_id", 0)),  # type: ignore[call-overload]
            leader_address=str(self.meta.get("leader_address", "")),
        )


async def abort(context: grpc.aio.ServicerContext, refusal: Refusal) -> NoReturn:
    """End the call with the refusal's status, message and trailers."""
    await context.abort(refusal.status, refusal.message, trailing_metadata=refusal.trailers())
    raise AssertionError("unreachable: abort raises")
