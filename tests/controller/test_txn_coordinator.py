"""The transaction coordinator (raftmq/controller/txn_coordinator.py, served by
raftmq/broker/transactions_service.py) on three controller voters in this process (real
Raft over TCP, real gRPC servers on port 0), driven through raw Transactions and Groups
stubs. Partition leaders are stood in for by real in-process gRPC servers that implement
only Broker.WriteTxnMarkers (the partition side is another slice's): they record the
markers they are sent, and can refuse them, point elsewhere, or not answer.

Checked: a commit's offsets are visible to FetchOffsets as soon as EndTxn answers and an
abort's never; markers reach each partition's leader with the bumped epoch, follow a
NOT_LEADER answer, are retried while a leader is unreachable, and complete the
transaction; the next transaction begins meanwhile but ends only after them
(CONCURRENT_TRANSACTIONS); a timed-out
transaction is aborted (TRANSACTION_ABORTED, then EndTxn(abort) succeeds); a new
controller leader finishes a transaction left in prepare_commit; concurrent calls share
metadata entries; a follower voter redirects; bad requests are refused with their codes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from raftmq.client.errors import error_of
from raftmq.controller.quorum import ControllerQuorum
from tests.broker.test_broker_cluster import assert_error
from tests.controller.quorum_cluster import QuorumCluster, retry

pytestmark = pytest.mark.timeout(120)
IA, FP, UA, NF = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.NOT_FOUND,
)


@dataclass
class FakeLeader:
    """A partition leader's WriteTxnMarkers and nothing else (a double of a peer's RPC)."""

    mode: str = "accept"  # "accept", "unavailable", or "redirect:<address>"
    markers: list[pb.TxnMarker] = field(default_factory=list)
    server: grpc.aio.Server | None = None
    port: int = 0

    async def start(self) -> FakeLeader:
        async def write(request: pb.WriteTxnMarkersRequest, context) -> pb.WriteTxnMarkersResponse:
            if self.mode == "unavailable":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "down for the test")
            results = []
            for i, marker in enumerate(request.markers):
                if self.mode.startswith("redirect:"):
                    error = pb.ProduceError(
                        code="NOT_LEADER", message="not me", leader_address=self.mode[9:]
                    )
                    results.append(pb.TxnMarkerResult(index=i, error=error))
                else:
                    self.markers.append(marker)
                    results.append(pb.TxnMarkerResult(index=i))
            return pb.WriteTxnMarkersResponse(results=results)

        handler = grpc.unary_unary_rpc_method_handler(
            write,
            request_deserializer=pb.WriteTxnMarkersRequest.FromString,
            response_serializer=pb.WriteTxnMarkersResponse.SerializeToString,
        )
        self.server = net.aio_server()
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "raftmq.v1.Broker", {"WriteTxnMarkers": handler}
                ),
            )
        )
        self.port = net.add_port(self.server, "127.0.0.1:0")
        await self.server.start()
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def seen(self) -> set[tuple[str, int, int, int, bool]]:
        return {
            (m.topic, m.partition, m.producer_id, m.producer_epoch, m.commit) for m in self.markers
        }

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


@dataclass
class Env:
    cluster: QuorumCluster
    leader: ControllerQuorum
    txns: tpb_grpc.TransactionsStub
    groups: gpb_grpc.GroupsStub
    brokers: dict[int, FakeLeader]


@contextlib.asynccontextmanager
async def environment(tmp_path, partitions: int = 2) -> AsyncIterator[Env]:
    """Two fake partition leaders registered as brokers 1 and 2; topic "t" with
    ``partitions`` partitions, each led by broker 1; stubs to the controller leader."""
    brokers = {b: await FakeLeader().start() for b in (1, 2)}
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        leader = await cluster.leader()
        for b, fake in brokers.items():
            await leader.register_broker(b, "127.0.0.1", fake.port, "127.0.0.1", 1, None, 1)
        await leader.create_topic("t", partitions, 1, assignment=[[1]] * partitions)
        for p in range(partitions):
            await leader.report_leader("t", p, 1, 1)
        async with grpc.aio.insecure_channel(cluster.addresses[leader.node_id]) as channel:
            yield Env(
                cluster,
                leader,
                tpb_grpc.TransactionsStub(channel),
                gpb_grpc.GroupsStub(channel),
                brokers,
            )
    finally:
        await cluster.stop()
        for fake in brokers.values():
            await fake.stop()


def tps(*ps: int) -> list[gpb.GroupTopicPartitions]:
    return [gpb.GroupTopicPartitions(topic="t", partitions=list(ps))]


async def refusal(call) -> object:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return error_of(caught.value)


async def state_of(stub: tpb_grpc.TransactionsStub, tid: str) -> tpb.TransactionDescription:
    return await stub.DescribeTransaction(tpb.DescribeTransactionRequest(transactional_id=tid))


async def completed(stub: tpb_grpc.TransactionsStub, tid: str, state: str) -> None:
    async def done() -> bool:
        d = await state_of(stub, tid)
        return d.state == state and not d.pending_markers

    for _ in range(400):
        if await done():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{tid} never reached {state}: {await state_of(stub, tid)}")


async def committed(stub: gpb_grpc.GroupsStub, group: str) -> dict[tuple[str, int], int]:
    answer = await stub.FetchOffsets(gpb.FetchOffsetsRequest(group_id=group))
    return {(o.topic, o.partition): o.offset for o in answer.offsets}


async def test_commit_and_abort_with_offsets_and_markers(tmp_path):
    async with environment(tmp_path) as env:
        stub, fake = env.txns, env.brokers[1]
        member = await env.groups.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(group_id="g", subscriptions=["t"])
        )
        init = await stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="tx"))
        pid, epoch = init.producer_id, init.producer_epoch
        ids = dict(transactional_id="tx", producer_id=pid)
        await stub.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(**ids, producer_epoch=epoch, partitions=tps(0, 1))
        )

        def offsets(at: int) -> tpb.AddOffsetsToTxnRequest:
            return tpb.AddOffsetsToTxnRequest(
                **ids,
                producer_epoch=epoch,
                group_id="g",
                member_id=member.member_id,
                member_epoch=member.member_epoch,
                offsets=[gpb.OffsetToCommit(topic="t", partition=p, offset=at) for p in (0, 1)],
            )

        await stub.AddOffsetsToTxn(offsets(10))
        described = await state_of(stub, "tx")
        assert described.state == "ongoing" and described.started_ms > 0
        assert described.group_id == "g" and described.transaction_timeout_ms == 60000
        assert await committed(env.groups, "g") == {}
        ended = await stub.EndTxn(tpb.EndTxnRequest(**ids, producer_epoch=epoch, commit=True))
        assert (ended.producer_id, ended.producer_epoch) == (pid, epoch + 1)
        # Visible as soon as EndTxn answered: the decision and the offsets share an entry.
        assert await committed(env.groups, "g") == {("t", 0): 10, ("t", 1): 10}
        await completed(stub, "tx", "complete_commit")
        assert fake.seen() == {("t", p, pid, epoch + 1, True) for p in (0, 1)}
        again = await stub.EndTxn(tpb.EndTxnRequest(**ids, producer_epoch=epoch, commit=True))
        assert again == ended  # a retry answers the same

        # The next transaction (epoch + 1) aborts: its offsets never become visible.
        epoch += 1
        await stub.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(**ids, producer_epoch=epoch, partitions=tps(1))
        )
        await stub.AddOffsetsToTxn(offsets(20))
        ended = await stub.EndTxn(tpb.EndTxnRequest(**ids, producer_epoch=epoch, commit=False))
        assert ended.producer_epoch == epoch + 1
        await completed(stub, "tx", "complete_abort")
        assert await committed(env.groups, "g") == {("t", 0): 10, ("t", 1): 10}
        assert ("t", 1, pid, epoch + 1, False) in fake.seen()
        listed = await stub.ListTransactions(tpb.ListTransactionsRequest())
        assert [t.transactional_id for t in listed.transactions] == ["tx"]


async def test_markers_follow_not_leader_wait_out_an_unreachable_leader_and_hold_back_the_next(
    tmp_path,
):
    async with environment(tmp_path) as env:
        stub, one, two = env.txns, env.brokers[1], env.brokers[2]
        one.mode = "unavailable"
        init = await stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="tx"))
        ids = dict(transactional_id="tx", producer_id=init.producer_id)
        await stub.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(**ids, producer_epoch=0, partitions=tps(0, 1))
        )
        await stub.EndTxn(tpb.EndTxnRequest(**ids, producer_epoch=0, commit=True))
        await asyncio.sleep(0.5)  # several attempts, all unanswered
        described = await state_of(stub, "tx")
        assert (
            described.state == "prepare_commit"
            and len(described.pending_markers[0].partitions) == 2
        )
        # The next transaction begins (its partitions hold its batches until their
        # markers land), but it cannot end, nor can an Init, until every marker is in.
        await stub.AddPartitionsToTxn(
            tpb.AddPartitionsToTxnRequest(**ids, producer_epoch=1, partitions=tps(0))
        )
        for call in (
            stub.EndTxn(tpb.EndTxnRequest(**ids, producer_epoch=1, commit=True)),
            stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="tx")),
        ):
            assert_error(await refusal(call), UA, "CONCURRENT_TRANSACTIONS", "retry")
        one.mode = f"redirect:{two.address}"  # it answers now, and points at broker 2
        await completed(stub, "tx", "ongoing")
        assert two.seen() == {("t", p, init.producer_id, 1, True) for p in (0, 1)}
        assert not one.markers
        ended = await stub.EndTxn(tpb.EndTxnRequest(**ids, producer_epoch=1, commit=True))
        assert ended.producer_epoch == 2
        await completed(stub, "tx", "complete_commit")
        assert ("t", 0, init.producer_id, 2, True) in two.seen()


async def test_a_timed_out_transaction_is_aborted_and_its_producer_told(tmp_path):
    async with environment(tmp_path) as env:
        stub = env.txns
        init = await stub.InitTransactions(
            tpb.InitTransactionsRequest(transactional_id="slow", transaction_timeout_ms=1000)
        )
        ids = dict(transactional_id="slow", producer_id=init.producer_id, producer_epoch=0)
        await stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=tps(0)))
        await completed(stub, "slow", "complete_abort")
        assert ("t", 0, init.producer_id, 1, False) in env.brokers[1].seen()
        for call in (
            stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=tps(1))),
            stub.EndTxn(tpb.EndTxnRequest(**ids, commit=True)),
        ):
            assert_error(await refusal(call), FP, "TRANSACTION_ABORTED", "abort")
        ended = await stub.EndTxn(tpb.EndTxnRequest(**ids, commit=False))
        assert (ended.producer_id, ended.producer_epoch) == (init.producer_id, 1)


async def test_an_operator_abort_and_the_refusals(tmp_path):
    async with environment(tmp_path) as env:
        stub = env.txns
        cases = [
            (
                stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="a b")),
                IA,
                "INVALID_TRANSACTIONAL_ID",
            ),
            (
                stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="x" * 10_000)),
                IA,
                "INVALID_TRANSACTIONAL_ID",
            ),
            (
                stub.InitTransactions(
                    tpb.InitTransactionsRequest(transactional_id="a", transaction_timeout_ms=10)
                ),
                IA,
                "INVALID_TXN_TIMEOUT",
            ),
            (
                stub.DescribeTransaction(tpb.DescribeTransactionRequest(transactional_id="no")),
                NF,
                "UNKNOWN_TRANSACTIONAL_ID",
            ),
            (
                stub.AbortTransaction(tpb.AbortTransactionRequest(transactional_id="no")),
                NF,
                "UNKNOWN_TRANSACTIONAL_ID",
            ),
            (
                stub.EndTxn(tpb.EndTxnRequest(transactional_id="no", commit=True)),
                FP,
                "INVALID_TXN_STATE",
            ),
        ]
        for call, status, code in cases:
            assert_error(await refusal(call), status, code)
        init = await stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="op"))
        ids = dict(transactional_id="op", producer_id=init.producer_id, producer_epoch=0)
        err = await refusal(
            stub.AbortTransaction(tpb.AbortTransactionRequest(transactional_id="op"))
        )
        assert_error(err, FP, "INVALID_TXN_STATE", "no transaction open")
        too_many = [gpb.GroupTopicPartitions(topic="t", partitions=list(range(1001)))]
        err = await refusal(
            stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=too_many))
        )
        assert_error(err, IA, "TOO_MANY_TXN_PARTITIONS", "smaller transactions")
        err = await refusal(
            stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=tps(7)))
        )
        assert_error(err, NF, "UNKNOWN_PARTITION")
        await stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=tps(0)))
        await stub.AbortTransaction(tpb.AbortTransactionRequest(transactional_id="op"))
        await completed(stub, "op", "complete_abort")
        again = await stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="op"))
        assert (again.producer_id, again.producer_epoch) == (init.producer_id, 2)
        err = await refusal(
            stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=tps(0)))
        )
        assert_error(err, FP, "PRODUCER_FENCED", "another instance")
        follower = env.cluster.follower()
        async with grpc.aio.insecure_channel(env.cluster.addresses[follower.node_id]) as channel:
            err = await refusal(
                tpb_grpc.TransactionsStub(channel).ListTransactions(tpb.ListTransactionsRequest())
            )
            assert_error(err, UA, "NOT_CONTROLLER", "resend to")
            assert err.meta["raftmq-leader-address"] == env.cluster.addresses[env.leader.node_id]


async def test_concurrent_calls_share_entries(tmp_path):
    async with environment(tmp_path) as env:
        stub = env.txns
        coordinator = env.cluster.transactions[env.leader.node_id].coordinator
        before = coordinator.batcher.batches
        inits = await asyncio.gather(
            *(
                stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id=f"tx{i}"))
                for i in range(200)
            )
        )
        assert len({i.producer_id for i in inits}) == 200
        # Batched: far fewer entries than calls. How many depends on how fast the Raft
        # rounds go while calls arrive (under 50 on a quiet machine, more under the
        # parallel suite's load), as for offset commits (test_coordinator.py).
        assert coordinator.batcher.batches - before < 100


async def test_a_new_controller_leader_finishes_a_transaction_left_in_prepare(tmp_path):
    async with environment(tmp_path) as env:
        stub, fake = env.txns, env.brokers[1]
        fake.mode = "unavailable"
        init = await stub.InitTransactions(tpb.InitTransactionsRequest(transactional_id="tx"))
        ids = dict(transactional_id="tx", producer_id=init.producer_id, producer_epoch=0)
        await stub.AddPartitionsToTxn(tpb.AddPartitionsToTxnRequest(**ids, partitions=tps(0, 1)))
        await stub.EndTxn(tpb.EndTxnRequest(**ids, commit=True))
        assert (await state_of(stub, "tx")).state == "prepare_commit"
        old = env.leader.node_id
        await env.cluster.stop(old)
        fake.mode = "accept"
        leader = await env.cluster.leader()
        assert leader.node_id != old

        async def done() -> bool:
            _, state = await retry(lambda: leader.metadata(linearizable=True))
            return state.transactions["tx"].state.value == "complete_commit"

        for _ in range(400):
            if await done():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the new controller leader did not finish the transaction")
        assert fake.seen() == {("t", p, init.producer_id, 1, True) for p in (0, 1)}
