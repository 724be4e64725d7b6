"""The consumer group coordinator (raftmq/controller/coordinator.py) on three controller
voters in this process (real Raft over TCP, real gRPC servers on port 0), driven through
raw Groups stubs: steady heartbeats cost no metadata entry, many concurrent commits cost
a few, a silent member is removed after its session timeout and its partitions go to
the others, and bad requests are refused with their codes and write nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.client.errors import error_of
from raftmq.controller.quorum import ControllerQuorum
from tests.broker.test_broker_cluster import assert_error
from tests.controller.quorum_cluster import QuorumCluster
from tests.controller.test_quorum import register
from tests.raft.test_driver import wait_for

pytestmark = pytest.mark.timeout(120)
IA, FP = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION


async def started(tmp_path, partitions: int = 4) -> tuple[QuorumCluster, ControllerQuorum]:
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    leader = await cluster.leader()
    await register(leader, 1)
    await leader.create_topic("t", partitions, 1)
    return cluster, leader


@contextlib.asynccontextmanager
async def coordinator(
    tmp_path, partitions: int = 4
) -> AsyncIterator[tuple[QuorumCluster, ControllerQuorum, gpb_grpc.GroupsStub]]:
    """The cluster, its leader, and a Groups stub on the leader; stopped after."""
    cluster, leader = await started(tmp_path, partitions)
    try:
        async with grpc.aio.insecure_channel(cluster.addresses[leader.node_id]) as channel:
            yield cluster, leader, gpb_grpc.GroupsStub(channel)
    finally:
        await cluster.stop()


def owned(answer: gpb.ConsumerGroupHeartbeatResponse) -> list[gpb.GroupTopicPartitions]:
    return list(answer.assigned)


def held(listed) -> set[tuple[str, int]]:
    return {(tp.topic, p) for tp in listed for p in tp.partitions}


async def test_steady_heartbeats_write_nothing(tmp_path):
    async with coordinator(tmp_path) as (_cluster, leader, stub):
        joined = await stub.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(group_id="g", subscriptions=["t"])
        )
        assert joined.member_id and joined.member_epoch > 0
        assert held(joined.assigned) == {("t", p) for p in range(4)}
        assert not joined.revoke
        assert joined.heartbeat_interval_ms == 3000  # a third of 45 s, capped
        beat = gpb.ConsumerGroupHeartbeatRequest(
            group_id="g",
            member_id=joined.member_id,
            member_epoch=joined.member_epoch,
            subscriptions=["t"],
            owned=owned(joined),
            session_timeout_ms=6000,
        )
        first = await stub.ConsumerGroupHeartbeat(beat)  # reports what it holds: written
        version = leader.local_state()[0]
        for _ in range(20):
            again = await stub.ConsumerGroupHeartbeat(beat)
            assert again == first
        assert first.heartbeat_interval_ms == 2000
        assert leader.local_state()[0] == version, "a steady heartbeat was written"
        # ...and answered from the leader's own copy, without a read index's round.
        assert leader.applied_all_committed()

        # A zombie's stale epoch: refused, and nothing written either.
        stale = gpb.ConsumerGroupHeartbeatRequest()
        stale.CopyFrom(beat)
        stale.member_epoch = first.member_epoch + 5
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ConsumerGroupHeartbeat(stale)
        assert_error(error_of(caught.value), FP, "FENCED_MEMBER_EPOCH", "join again")
        for bad, code, words in (
            ({"session_timeout_ms": 999}, "INVALID_GROUP", ("session_timeout_ms",)),
            ({"group_id": "no spaces"}, "INVALID_GROUP", ("group id",)),
            ({"assignor": "best"}, "INVALID_GROUP", ("assignor",)),
        ):
            request = gpb.ConsumerGroupHeartbeatRequest()
            request.CopyFrom(beat)
            for k, v in bad.items():
                setattr(request, k, v)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ConsumerGroupHeartbeat(request)
            assert_error(error_of(caught.value), IA, code, *words)
        assert leader.local_state()[0] == version, "a refused heartbeat was written"


async def test_concurrent_commits_share_entries(tmp_path):
    commits = 400
    async with coordinator(tmp_path, partitions=8) as (cluster, leader, stub):
        before = leader.local_state()[0]
        answers = await asyncio.gather(
            *(
                stub.CommitOffsets(
                    gpb.CommitOffsetsRequest(
                        group_id=f"g{i // 8}",
                        offsets=[
                            gpb.OffsetToCommit(
                                topic="t", partition=i % 8, offset=i, metadata=f"m{i}"
                            )
                        ],
                    )
                )
                for i in range(commits)
            )
        )
        written = leader.local_state()[0] - before
        batches = cluster.groups[leader.node_id].coordinator.batches
        # One entry per commit would be 400; the linger bounds them by time instead (a
        # quiet machine takes 30-50 entries; one busy with other tests' brokers, where the
        # commits arrive more slowly, up to 120).
        assert written <= commits // 2, f"{commits} commits took {written} entries"
        assert batches == written
        assert all(a.metadata_version > before for a in answers)
        # Every commit landed (one per group and partition).
        for g in range(commits // 8):
            fetched = await stub.FetchOffsets(gpb.FetchOffsetsRequest(group_id=f"g{g}"))
            got = {o.partition: (o.offset, o.metadata) for o in fetched.offsets}
            assert got == {p: (g * 8 + p, f"m{g * 8 + p}") for p in range(8)}

        # One refused commit in a batch fails only its caller.
        good = gpb.CommitOffsetsRequest(
            group_id="h", offsets=[gpb.OffsetToCommit(topic="t", partition=0, offset=1)]
        )
        bad = gpb.CommitOffsetsRequest(
            group_id="h", offsets=[gpb.OffsetToCommit(topic="t", partition=99, offset=1)]
        )
        results = await asyncio.gather(
            stub.CommitOffsets(good), stub.CommitOffsets(bad), return_exceptions=True
        )
        assert isinstance(results[0], gpb.CommitOffsetsResponse)
        assert isinstance(results[1], grpc.aio.AioRpcError)
        assert_error(error_of(results[1]), grpc.StatusCode.NOT_FOUND, "UNKNOWN_PARTITION")


async def test_silent_member_removed_and_its_partitions_reassigned(tmp_path):
    async with coordinator(tmp_path) as (_cluster, leader, stub):

        async def beat(member_id: str, epoch: int, holds, timeout_ms: int):
            return await stub.ConsumerGroupHeartbeat(
                gpb.ConsumerGroupHeartbeatRequest(
                    group_id="g",
                    member_id=member_id,
                    member_epoch=epoch,
                    subscriptions=["t"],
                    owned=holds,
                    session_timeout_ms=timeout_ms,
                )
            )

        a = await beat("", 0, [], 1000)  # goes silent
        a = await beat(a.member_id, a.member_epoch, owned(a), 1000)
        b = await beat("", 0, [], 30000)
        assert not held(b.assigned)  # a holds everything until it gives some up
        deadline = asyncio.get_running_loop().time() + 10
        while len(held(b.assigned)) < 4:
            assert asyncio.get_running_loop().time() < deadline, "b never got a's partitions"
            await asyncio.sleep(0.2)
            b = await beat(b.member_id, b.member_epoch, owned(b), 30000)
        group = leader.local_state()[1].consumer_groups["g"]
        assert set(group.members) == {b.member_id}
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await beat(a.member_id, a.member_epoch, owned(a), 1000)
        assert_error(error_of(caught.value), FP, "UNKNOWN_MEMBER", "join again")


async def test_new_leader_counts_members_as_heard(tmp_path):
    """A member silent on the old leader is not removed by a new one before a whole
    session timeout of its own."""
    cluster, leader = await started(tmp_path)
    try:
        async with grpc.aio.insecure_channel(cluster.addresses[leader.node_id]) as channel:
            stub = gpb_grpc.GroupsStub(channel)
            joined = await stub.ConsumerGroupHeartbeat(
                gpb.ConsumerGroupHeartbeatRequest(
                    group_id="g", subscriptions=["t"], session_timeout_ms=3000
                )
            )
        await asyncio.sleep(2.0)  # most of its session timeout, silent
        await cluster.stop(leader.node_id)
        new = await cluster.leader()
        await asyncio.sleep(2.0)  # past the member's timeout on the old leader's clock
        assert joined.member_id in new.local_state()[1].consumer_groups["g"].members
        # ...but it is held to the default timeout until it beats again (45 s): still there
        await asyncio.sleep(2.0)
        await wait_for(lambda: new.is_leader, 5, "the new leader to keep leading")
        assert joined.member_id in new.local_state()[1].consumer_groups["g"].members
    finally:
        await cluster.stop()


async def test_a_restarted_static_member_takes_its_partitions_back(tmp_path):
    async with coordinator(tmp_path) as (_cluster, leader, stub):

        async def join(instance: str) -> gpb.ConsumerGroupHeartbeatResponse:
            return await stub.ConsumerGroupHeartbeat(
                gpb.ConsumerGroupHeartbeatRequest(
                    group_id="g", instance_id=instance, subscriptions=["t"]
                )
            )

        first = await join("i1")
        other = await join("i2")
        first = await stub.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(
                group_id="g",
                member_id=first.member_id,
                member_epoch=first.member_epoch,
                subscriptions=["t"],
                owned=owned(first),
            )
        )
        kept = held(first.assigned)
        assert len(kept) == 2, "the first member should have given half up"
        group_epoch = leader.local_state()[1].consumer_groups["g"].epoch
        again = await join("i1")  # the process restarted: a new id, the same instance
        assert again.member_id != first.member_id
        assert held(again.assigned) == kept and not again.revoke
        group = leader.local_state()[1].consumer_groups["g"]
        assert group.epoch == group_epoch, "a static member's restart rebalanced"
        assert set(group.members) == {again.member_id, other.member_id}


async def test_bad_commits_are_refused_and_write_nothing(tmp_path):
    async with coordinator(tmp_path) as (_cluster, leader, stub):
        ok = gpb.OffsetToCommit(topic="t", partition=0, offset=1)
        version = leader.local_state()[0]
        for request, words in (
            (gpb.CommitOffsetsRequest(group_id="g"), ("at least one",)),
            (gpb.CommitOffsetsRequest(group_id="g" * 300, offsets=[ok]), ("group id",)),
            (
                gpb.CommitOffsetsRequest(group_id="g", member_id="m" * 100_000, offsets=[ok]),
                ("member id", "100000 chars"),
            ),
            (gpb.CommitOffsetsRequest(group_id="g", offsets=[ok, ok]), ("twice",)),
            (
                gpb.CommitOffsetsRequest(
                    group_id="g",
                    offsets=[gpb.OffsetToCommit(topic="t", partition=0, metadata="x" * 4097)],
                ),
                ("4096",),
            ),
            (
                gpb.CommitOffsetsRequest(
                    group_id="g",
                    offsets=[
                        gpb.OffsetToCommit(topic="t", partition=p, metadata="\U0001f600" * 4000)
                        for p in range(20)
                    ],
                ),
                ("too large",),
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.CommitOffsets(request)
            err = error_of(caught.value)
            assert_error(err, IA, "INVALID_GROUP", *words)
            assert len(str(err)) < 500
        assert leader.local_state()[0] == version, "a refused commit was written"
        # A member id nobody has: refused by the state machine, and its own sentence.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CommitOffsets(
                gpb.CommitOffsetsRequest(
                    group_id="g", member_id="ghost", member_epoch=3, offsets=[ok]
                )
            )
        assert_error(error_of(caught.value), FP, "UNKNOWN_MEMBER", "join again")
