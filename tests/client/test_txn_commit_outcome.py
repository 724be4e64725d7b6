"""A commit_transaction() whose EndTxn got no answer may have committed: it must never
come back as TransactionAbortableError (an application would abort and redo a transaction
that is visible, writing its outputs twice), and asking again learns the outcome.

Found by chaos (seed 7412): a commit timed out, the client called it abortable, and the
abort was refused because the coordinator had committed it. A reproduction with brokers
needs an answer lost after the commit applied, which no fault injects on demand, so the
coordinator's side is played here by the manager's one call, and nothing else is faked."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.client import TransactionAbortableError
from raftmq.client.errors import ClientError
from raftmq.client.idempotence import Sequencer
from raftmq.client.transactions import TransactionManager, TransactionState


class _OneCoordinator(TransactionManager):
    """Answers the EndTxn calls from a script: an exception to raise or an answer."""

    def __init__(self, script: list[object]) -> None:
        super().__init__("t", 60_000, None, Sequencer(), deadline_s=1.0, wake=lambda: None)  # type: ignore[arg-type]
        self.script = script
        self.calls: list[str] = []

    async def _call(self, rpc: str, request: object) -> object:
        self.calls.append(rpc)
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


def _open(manager: TransactionManager) -> None:
    manager.state = TransactionState.IN_TRANSACTION
    manager._begun = True  # a partition was added: the coordinator holds the transaction


async def _nothing() -> None:
    return None


NO_ANSWERS = [
    ClientError(
        "Deadline Exceeded", pb.ERROR_CODE_UNSPECIFIED, grpc.StatusCode.DEADLINE_EXCEEDED, {}
    ),
    ClientError("unreachable", pb.ERROR_CODE_UNSPECIFIED, grpc.StatusCode.UNAVAILABLE, {}),
    ClientError(
        "leadership moved before it applied",
        pb.ERROR_CODE_OUTCOME_UNKNOWN,
        grpc.StatusCode.UNAVAILABLE,
        {},
        "OUTCOME_UNKNOWN",
    ),
]


@pytest.mark.parametrize("lost", NO_ANSWERS, ids=["timed-out", "unreachable", "outcome-unknown"])
def test_a_commit_without_an_answer_is_not_abortable_and_asking_again_ends_it(
    lost: ClientError,
) -> None:
    manager = _OneCoordinator([lost, tpb.EndTxnResponse(producer_id=7, producer_epoch=2)])
    _open(manager)

    async def commit() -> None:
        await manager.end(commit=True, flush=_nothing, fail_queued=lambda exc: None)

    with pytest.raises(ClientError) as raised:
        asyncio.run(commit())
    assert not isinstance(raised.value, TransactionAbortableError)
    assert manager.state == TransactionState.COMMITTING
    asyncio.run(commit())  # the same commit again: the coordinator answers it
    assert manager.state == TransactionState.READY
    assert manager.calls == ["EndTxn", "EndTxn"]


def test_a_commit_refused_for_good_is_abortable() -> None:
    refused = ClientError(
        "the transaction timed out and was aborted",
        pb.ERROR_CODE_INVALID_TXN_STATE,
        grpc.StatusCode.FAILED_PRECONDITION,
        {},
        "INVALID_TXN_STATE",
    )
    manager = _OneCoordinator([refused])
    _open(manager)
    with pytest.raises(TransactionAbortableError):
        asyncio.run(manager.end(commit=True, flush=_nothing, fail_queued=lambda exc: None))
