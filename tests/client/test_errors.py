"""What a client makes of a refused call: the ErrorCode from the ``raftmq-error`` trailer,
whether it may retry, and a safe reading of a code newer than the client."""

from __future__ import annotations

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import errors
from raftmq.client.errors import ClientError, ErrorCode, error_of


class Failed(grpc.RpcError):
    """A failed call as grpc raises it: status, details and trailing metadata."""

    def __init__(self, status: grpc.StatusCode, details: str, trailers: tuple = ()) -> None:
        self._status, self._details, self._trailers = status, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers


def test_the_client_enum_is_the_generated_one() -> None:
    assert errors.ErrorCode is pb.ErrorCode
    assert ErrorCode.Name(ErrorCode.ERROR_CODE_CORRUPT_DATA) == "ERROR_CODE_CORRUPT_DATA"


def test_a_known_code_reads_as_its_enum_value_with_its_trailers() -> None:
    err = error_of(
        Failed(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this broker is not the leader",
            (("raftmq-error", "NOT_LEADER"), ("raftmq-leader-address", "h:1")),
        )
    )
    assert err.code == ErrorCode.ERROR_CODE_NOT_LEADER
    assert (err.code_name, err.label, err.retriable, err.unreachable) == (
        "NOT_LEADER",
        "NOT_LEADER",
        True,
        False,
    )
    assert err.meta["raftmq-leader-address"] == "h:1"
    assert str(err) == "this broker is not the leader"


def test_a_code_newer_than_the_client_is_unspecified_kept_by_name_and_not_retried() -> None:
    err = error_of(
        Failed(grpc.StatusCode.UNAVAILABLE, "a new reason", (("raftmq-error", "QUOTA_HIT"),))
    )
    assert err.code == ErrorCode.ERROR_CODE_UNSPECIFIED
    assert err.code_name == err.label == "QUOTA_HIT"
    assert not err.retriable and not err.unreachable


def test_a_failure_without_a_code_comes_from_grpc_itself() -> None:
    err = error_of(Failed(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"))
    assert err.code == ErrorCode.ERROR_CODE_UNSPECIFIED
    assert (err.code_name, err.label) == ("", "UNAVAILABLE")
    assert err.unreachable and not err.retriable
    deadline = error_of(Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    assert not deadline.unreachable and deadline.label == "DEADLINE_EXCEEDED"
    # A broker stopping under a call (a restart cancels its long polls) is one that did
    # not answer, not a refusal: a consumer's poll retried it instead of raising (chaos,
    # --faults all, seed 1001).
    cancelled = error_of(Failed(grpc.StatusCode.CANCELLED, "CANCELLED"))
    assert cancelled.unreachable and not cancelled.retriable
    coded = error_of(Failed(grpc.StatusCode.CANCELLED, "x", (("raftmq-error", "INTERNAL"),)))
    assert not coded.unreachable


def test_the_client_s_own_errors_name_their_code() -> None:
    err = ClientError("no leader", ErrorCode.ERROR_CODE_LEADER_NOT_AVAILABLE, None, {})
    assert err.code_name == "LEADER_NOT_AVAILABLE" and err.retriable
    assert ClientError("?", ErrorCode.ERROR_CODE_UNSPECIFIED, None, {}).label == "UNSPECIFIED"
