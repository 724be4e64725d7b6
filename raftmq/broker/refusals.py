"""The broker's side of the error contract in one place: the Refusal a handler raises, how a
partition's or the controller's error becomes one (from plain values: the error and the
brokers' addresses), and what reaches the client (a status with trailing metadata on unary
calls, sent by :func:`raftmq.broker.rpc.abort`; a ProduceError inside a ProduceStream
answer).

The codes themselves are broker.proto's ``ErrorCode``; their gRPC statuses are in
:data:`raftmq.api.error_codes.RULES`, the table the client's retry policy reads too. A code
added anywhere (an ErrorCode value, a partition error class with a ``code``) without a
rule and a documented status fails tests/broker/test_error_contract.py. Everything a
client sent that the broker will not take is a Refusal with one of these codes; INTERNAL
is kept for the broker's own bugs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import grpc

from raftmq.api.error_codes import RULES, code_of, name_of
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.controller.errors import RefusalCode
from raftmq.controller.quorum import (
    ControllerError,
    ControllerRefusal,
    NotControllerError,
    OutcomeUnknown,
)
from raftmq.partition.errors import CorruptDataError, NotLeaderError, OffsetOutOfRangeError

if TYPE_CHECKING:
    from raftmq.partition.errors import PartitionError

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
    """A request refused with an ErrorCode, a sentence, and fields a client acts on. Unary
    calls turn it into a gRPC status with trailing metadata; ProduceStream into a
    ProduceError in the answer."""

    def __init__(self, code: pb.ErrorCode, message: str, **meta: object) -> None:
        assert code in RULES, f"{code} has no rule in raftmq.api.error_codes.RULES"
        super().__init__(message)
        self.code = code
        self.message = message
        self.meta = {k: v for k, v in meta.items() if v is not None}

    @property
    def status(self) -> grpc.StatusCode:
        return RULES[self.code].status

    @property
    def name(self) -> str:
        """The code as the client reads it (``raftmq-error``, ``ProduceError.code``)."""
        return name_of(self.code)

    @classmethod
    def of(cls, exc: PartitionError, addresses: Mapping[int, str], me: int) -> Refusal:
        """The refusal for a partition's error on broker ``me``, with the leader's address
        (from ``addresses``, each broker's client address) where it helps the client go
        straight to another replica."""
        code = code_of(exc.code)  # the partition floor names codes; it cannot import api
        if isinstance(exc, NotLeaderError):
            address = addresses.get(exc.leader)
            if exc.leader == 0 or address is None:
                return cls(pb.ERROR_CODE_LEADER_NOT_AVAILABLE, str(exc))
            return cls(code, str(exc), leader_id=exc.leader, leader_address=address)
        if isinstance(exc, OffsetOutOfRangeError):
            return cls(
                code,
                str(exc),
                log_start_offset=exc.start,
                high_watermark=exc.high_watermark,
            )
        if isinstance(exc, CorruptDataError):
            address = addresses.get(exc.leader)
            if address is not None and exc.leader != me:
                return cls(code, str(exc), leader_id=exc.leader, leader_address=address)
        return cls(code, str(exc))

    def trailers(self) -> tuple[tuple[str, str], ...]:
        extra = ((f"raftmq-{k.replace('_', '-')}", str(v)) for k, v in self.meta.items())
        return (("raftmq-error", self.name), *extra)

    def to_pb(self) -> pb.ProduceError:
        return pb.ProduceError(
            code=self.name,
            message=self.message,
            leader_id=int(self.meta.get("leader_id", 0)),  # type: ignore[call-overload]
            leader_address=str(self.meta.get("leader_address", "")),
        )


def controller_refusal(exc: ControllerError, addresses: Mapping[int, str]) -> Refusal:
    """The refusal for what the controller quorum raised. ``addresses``: each voter's
    client address, for NOT_CONTROLLER's leader hint (without the leader's address the
    client is told there is no controller and retries any voter)."""
    if isinstance(exc, ControllerRefusal):
        if exc.code == RefusalCode.MALFORMED_COMMAND:  # only we encode commands: our bug
            return Refusal(pb.ERROR_CODE_INTERNAL, f"the controller refused its own command: {exc}")
        code = code_of(exc.code.value)  # every RefusalCode has an ErrorCode of its name
        assert code != pb.ERROR_CODE_UNSPECIFIED, f"{exc.code} has no ErrorCode"
        return Refusal(code, exc.message)
    if isinstance(exc, NotControllerError):
        address = addresses.get(exc.leader)
        if address is not None:
            return Refusal(
                pb.ERROR_CODE_NOT_CONTROLLER,
                f"{exc}: resend to {address}",
                leader_id=exc.leader,
                leader_address=address,
            )
        return Refusal(pb.ERROR_CODE_CONTROLLER_NOT_AVAILABLE, f"{exc}, at an unknown address")
    if isinstance(exc, OutcomeUnknown):
        return Refusal(pb.ERROR_CODE_OUTCOME_UNKNOWN, str(exc))
    return Refusal(pb.ERROR_CODE_CONTROLLER_NOT_AVAILABLE, str(exc))
