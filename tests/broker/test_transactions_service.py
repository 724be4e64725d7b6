"""The transaction coordinator served by real broker processes (raftmq.v1.Transactions on
the controller voters), driven through raw stubs as a transactional producer would: a
consume-process-produce transaction commits its consumer offsets exactly when EndTxn
answers (FetchOffsets sees them at once), an aborted one's never; a follower voter
redirects; the controller leader's SIGKILL right after a commit loses neither the
decision nor its offsets, and the producer goes on at the epoch EndTxn handed out.

The markers themselves need the partitions' WriteTxnMarkers handler (another branch):
tests/broker/test_txn_markers_e2e.py checks that they land."""

from __future__ import annotations

import grpc
import pytest

from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from tests.broker import test_controller_layouts as layouts
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import assert_error, rpc_error, wait_until
from tests.broker.test_controller_wiring import CONTROLLER_FAILOVER_S

pytestmark = pytest.mark.timeout(180)


def committed(stub: gpb_grpc.GroupsStub, group: str) -> dict[tuple[str, int], int]:
    answer = stub.FetchOffsets(gpb.FetchOffsetsRequest(group_id=group), timeout=10)
    return {(o.topic, o.partition): o.offset for o in answer.offsets}


class Producer:
    """A transactional producer's calls to the coordinator, over a raw stub."""

    def __init__(self, channel: grpc.Channel, tid: str) -> None:
        self.stub, self.tid = tpb_grpc.TransactionsStub(channel), tid
        init = self.stub.InitTransactions(
            tpb.InitTransactionsRequest(transactional_id=tid), timeout=10
        )
        self.pid, self.epoch = init.producer_id, init.producer_epoch

    def ids(self) -> dict[str, object]:
        return dict(transactional_id=self.tid, producer_id=self.pid, producer_epoch=self.epoch)

    def add(self, topic: str, *partitions: int) -> None:
        listed = [gpb.GroupTopicPartitions(topic=topic, partitions=list(partitions))]
        self.stub.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(**self.ids(), partitions=listed), timeout=10
        )

    def add_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        self.stub.AddOffsetsToTxn(
            tpb.AddOffsetsToTxnRequest(
                **self.ids(),
                group_id=group,
                offsets=[
                    gpb.OffsetToCommit(topic=t, partition=p, offset=o)
                    for (t, p), o in sorted(offsets.items())
                ],
            ),
            timeout=10,
        )

    def end(self, commit: bool) -> None:
        ended = self.stub.EndTxn(tpb.EndTxnRequest(**self.ids(), commit=commit), timeout=10)
        assert ended.producer_id == self.pid and ended.producer_epoch == self.epoch + 1
        self.epoch = ended.producer_epoch


def test_offsets_commit_with_the_transaction_and_survive_a_controller_leader_kill(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"in": 2, "out": 2})
    leader = layouts.controller_leader(cluster.controller_addresses)
    follower = next(b for b in cluster.spec.voters if b != leader)
    with grpc.insecure_channel(cluster.spec.brokers[follower].address) as channel:
        err = rpc_error(
            lambda: tpb_grpc.TransactionsStub(channel).ListTransactions(
                tpb.ListTransactionsRequest(), timeout=10
            )
        )
        assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER", "resend to")
        assert err.meta["raftmq-leader-address"] == cluster.spec.brokers[leader].address

    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        groups = gpb_grpc.GroupsStub(channel)
        producer = Producer(channel, "pipeline")
        # An aborted transaction: its offsets are never committed. (Offsets only: the
        # partitions' marker handler may not be there, and a transaction with no
        # partition needs no marker, so the next one can begin at once.)
        producer.add_offsets("readers", {("in", 0): 5, ("in", 1): 6})
        producer.end(commit=False)
        assert committed(groups, "readers") == {}
        producer.add_offsets("readers", {("in", 0): 7, ("in", 1): 8})
        producer.end(commit=True)
        assert committed(groups, "readers") == {("in", 0): 7, ("in", 1): 8}

    cluster.kill(leader)
    survivors = [cluster.spec.brokers[v].address for v in cluster.spec.voters if v != leader]
    new_leader = wait_until(
        lambda: layouts.controller_leader(survivors), CONTROLLER_FAILOVER_S, "a new leader"
    )
    with grpc.insecure_channel(cluster.spec.brokers[new_leader].address) as channel:
        assert committed(gpb_grpc.GroupsStub(channel), "readers") == {
            ("in", 0): 7,
            ("in", 1): 8,
        }
        stub = tpb_grpc.TransactionsStub(channel)
        described = stub.DescribeTransaction(
            tpb.DescribeTransactionRequest(transactional_id="pipeline"), timeout=10
        )
        assert (described.producer_id, described.producer_epoch) == (
            producer.pid,
            producer.epoch,
        )
        assert described.state == "complete_commit"  # offsets only: no marker to wait for
        # The old epoch's retry answers the same; another instance fences this one.
        again = stub.EndTxn(
            tpb.EndTxnRequest(
                transactional_id="pipeline",
                producer_id=producer.pid,
                producer_epoch=producer.epoch - 1,
                commit=True,
            ),
            timeout=10,
        )
        assert again.producer_epoch == producer.epoch
        other = Producer(channel, "pipeline")
        assert (other.pid, other.epoch) == (producer.pid, producer.epoch + 1)
        producer.stub = stub
        err = rpc_error(lambda: producer.add_offsets("readers", {("in", 0): 9}))
        assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "PRODUCER_FENCED", "another")
