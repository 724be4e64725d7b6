"""raftmq.v1.Transactions (transactions.proto): the transaction coordinator's gRPC face, on
every controller voter, as Groups is (raftmq.broker.groups_service). A thin adapter over
:class:`~raftmq.controller.txn_coordinator.TransactionCoordinator`: what could make a
command huge (long ids, long lists, long metadata) is refused here, quoted short, before
anything is proposed; the state (producer ids, epochs, transactions, groups, topics) is
the transitions' to judge (raftmq.controller.transactions). A voter that does not lead
answers NOT_CONTROLLER with the leader's address; a broker-only node answers through
:class:`~raftmq.broker.admin_redirect.AdminRedirect`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.broker.admin_redirect import AdminRedirect
from raftmq.broker.controller_service import ControllerFace
from raftmq.broker.groups_service import checked_commit, wire
from raftmq.broker.refusals import Refusal, shorten
from raftmq.broker.rpc import add_service
from raftmq.broker.txn_markers import MarkerSender
from raftmq.controller import commands as c
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import MetadataState, TopicPartition, Transaction
from raftmq.controller.quorum import ControllerQuorum
from raftmq.controller.transactions import (
    DEFAULT_TXN_TIMEOUT_MS,
    MAX_TXN_PARTITIONS,
    TRANSACTIONAL_ID,
)
from raftmq.controller.txn_coordinator import (
    RETRY_FIRST_S,
    SendMarkers,
    TransactionCoordinator,
)


def _check_id(transactional_id: str) -> str:
    if not TRANSACTIONAL_ID.fullmatch(transactional_id):
        raise Refusal(
            pb.ERROR_CODE_INVALID_TRANSACTIONAL_ID,
            f"transactional id {shorten(transactional_id)} is not 1-200 of A-Z a-z 0-9 . _ -",
        )
    return transactional_id


def _partitions(listed: Iterable[gpb.GroupTopicPartitions]) -> tuple[TopicPartition, ...]:
    tps = {TopicPartition(tp.topic, p) for tp in listed for p in tp.partitions}
    if len(tps) > MAX_TXN_PARTITIONS:
        raise Refusal(
            pb.ERROR_CODE_TOO_MANY_TXN_PARTITIONS,
            f"{len(tps)} partitions named; a transaction writes to at most "
            f"{MAX_TXN_PARTITIONS}: abort it and use smaller transactions",
        )
    for tp in tps:
        if not TOPIC_NAME.fullmatch(tp.topic):
            raise Refusal(pb.ERROR_CODE_UNKNOWN_TOPIC, f"there is no topic {shorten(tp.topic)}")
    return tuple(sorted(tps))


def describe(txn: Transaction) -> tpb.TransactionDescription:
    return tpb.TransactionDescription(
        transactional_id=txn.transactional_id,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        state=txn.state.value,
        transaction_timeout_ms=txn.timeout_ms,
        started_ms=txn.started_ms,
        partitions=wire(txn.partitions),
        group_id=txn.group_id,
        pending_markers=wire(txn.pending_markers),
    )


def _transaction(state: MetadataState, transactional_id: str) -> Transaction:
    txn = state.transactions.get(_check_id(transactional_id))
    if txn is None:
        raise Refusal(
            pb.ERROR_CODE_UNKNOWN_TRANSACTIONAL_ID,
            f"there is no transactional id {shorten(transactional_id)}",
        )
    return txn


class TransactionsService(ControllerFace):
    """Call :meth:`start` on the running loop (the marker driver), :meth:`close` before
    the quorum stops."""

    def __init__(
        self,
        quorum: ControllerQuorum,
        addresses: Mapping[int, str],
        *,
        send: SendMarkers | None = None,
        retry_first_s: float = RETRY_FIRST_S,
        security: net.Security = net.PLAINTEXT,
    ) -> None:
        """``send``: how markers reach partition leaders (tests put a double of a peer's
        RPC there); Broker.WriteTxnMarkers over gRPC by default."""
        super().__init__(quorum, addresses)
        self._sender = MarkerSender(security=security)
        self.coordinator = TransactionCoordinator(
            quorum, send or self._sender, retry_first_s=retry_first_s
        )

    def start(self) -> None:
        self.coordinator.start()

    async def close(self) -> None:
        await self.coordinator.close()
        await self._sender.close()

    async def _call(self, call: c.TxnCall) -> c.TxnOutcome:
        return await self.call(self.coordinator.call(call))

    async def InitTransactions(
        self, request: tpb.InitTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> tpb.InitTransactionsResponse:
        timeout_ms = request.transaction_timeout_ms or DEFAULT_TXN_TIMEOUT_MS
        init = c.InitTransactions(_check_id(request.transactional_id), timeout_ms)
        outcome = await self._call(c.TxnCall(init=init))
        return tpb.InitTransactionsResponse(
            producer_id=outcome.producer_id, producer_epoch=outcome.producer_epoch
        )

    async def AddPartitionsToTxn(
        self, request: tpb.AddPartitionsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> tpb.AddPartitionsToTxnResponse:
        add = c.AddPartitionsToTxn(
            _check_id(request.transactional_id),
            request.producer_id,
            request.producer_epoch,
            _partitions(request.partitions),
        )
        await self._call(c.TxnCall(add_partitions=add))
        return tpb.AddPartitionsToTxnResponse()

    async def AddOffsetsToTxn(
        self, request: tpb.AddOffsetsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> tpb.AddOffsetsToTxnResponse:
        add = c.AddOffsetsToTxn(
            _check_id(request.transactional_id),
            request.producer_id,
            request.producer_epoch,
            checked_commit(request),
        )
        await self._call(c.TxnCall(add_offsets=add))
        return tpb.AddOffsetsToTxnResponse()

    async def EndTxn(
        self, request: tpb.EndTxnRequest, context: grpc.aio.ServicerContext
    ) -> tpb.EndTxnResponse:
        end = c.EndTxn(
            _check_id(request.transactional_id),
            request.producer_id,
            request.producer_epoch,
            request.commit,
        )
        outcome = await self._call(c.TxnCall(end=end))
        return tpb.EndTxnResponse(
            producer_id=outcome.producer_id, producer_epoch=outcome.producer_epoch
        )

    async def ListTransactions(
        self, request: tpb.ListTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> tpb.ListTransactionsResponse:
        state = await self.call(self.coordinator.current())
        return tpb.ListTransactionsResponse(
            transactions=[describe(t) for _, t in sorted(state.transactions.items())]
        )

    async def DescribeTransaction(
        self, request: tpb.DescribeTransactionRequest, context: grpc.aio.ServicerContext
    ) -> tpb.TransactionDescription:
        _check_id(request.transactional_id)
        state = await self.call(self.coordinator.current())
        return describe(_transaction(state, request.transactional_id))

    async def AbortTransaction(
        self, request: tpb.AbortTransactionRequest, context: grpc.aio.ServicerContext
    ) -> tpb.AbortTransactionResponse:
        abort = c.AbortTxn(_check_id(request.transactional_id), -1, -1)
        await self._call(c.TxnCall(abort=abort))
        return tpb.AbortTransactionResponse()


def add_transactions_service(service: TransactionsService, server: grpc.aio.Server) -> None:
    add_service(service, server, tpb, "Transactions")


def add_transactions_redirect(redirect: AdminRedirect, server: grpc.aio.Server) -> None:
    """Transactions on a broker-only node: every call answered NOT_CONTROLLER."""
    add_service(redirect, server, tpb, "Transactions")
