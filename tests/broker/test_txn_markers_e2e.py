"""A transaction over two partitions, committed through the controller's Transactions
service on real broker processes: the coordinator has each partition's leader append
its COMMIT marker (Broker.WriteTxnMarkers) and the transaction completes, with no marker
left pending. Needs the partition side's WriteTxnMarkers handler (built on another
branch): until it is merged, the leaders answer UNIMPLEMENTED and the transaction stays
in prepare_commit."""

from __future__ import annotations

import time

import grpc
import pytest

from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from tests.broker import test_controller_layouts as layouts
from tests.broker.conftest import ClusterFactory

pytestmark = pytest.mark.timeout(120)
MARKERS_WRITTEN_S = 30.0


def test_a_committed_transaction_gets_its_markers_on_every_partition(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"out": 2})
    leader = layouts.controller_leader(cluster.controller_addresses)
    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        stub = tpb_grpc.TransactionsStub(channel)
        init = stub.InitTransactions(
            tpb.InitTransactionsRequest(transactional_id="e2e"), timeout=10
        )
        ids = dict(
            transactional_id="e2e",
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
        )
        stub.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(
                **ids, partitions=[gpb.GroupTopicPartitions(topic="out", partitions=[0, 1])]
            ),
            timeout=10,
        )
        ended = stub.EndTxn(tpb.EndTxnRequest(**ids, commit=True), timeout=10)
        assert ended.producer_epoch == init.producer_epoch + 1
        deadline = time.monotonic() + MARKERS_WRITTEN_S
        while True:
            described = stub.DescribeTransaction(
                tpb.DescribeTransactionRequest(transactional_id="e2e"), timeout=10
            )
            if described.state == "complete_commit" and not described.pending_markers:
                break
            assert time.monotonic() < deadline, f"markers still pending: {described}"
            time.sleep(0.1)
