"""The Admin and Controller gRPC services (admin.proto, controller.proto) on three
controller voters in this process: real Raft hosts over TCP and real gRPC servers on port
0, driven through raftmq.client.admin.AdminClient and raw stubs. The topic lifecycle from
any voter, every bad input answered with its status, code and a sentence (and nothing
applied), no quorum, registration and heartbeats, and the watch stream resumed on
another voter."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

from raftmq.api.error_codes import RULES, code_of
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import controller_pb2 as cpb
from raftmq.api.v1 import controller_pb2_grpc as cpb_grpc
from raftmq.client.admin import AdminClient
from raftmq.client.errors import ClientError, error_of
from raftmq.controller.errors import RefusalCode
from raftmq.controller.state_machine import decode_snapshot
from tests.broker.test_broker_cluster import assert_error, rpc_error
from tests.controller.quorum_cluster import QuorumCluster
from tests.raft.test_driver import wait_for

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")
IA, NF, FP, UA = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
)


def metadata_only(described: apb.TopicDescription) -> apb.TopicDescription:
    """DescribeTopic's answer without the live fields its leaders' answers (or their
    absence) filled in: what CreateTopic and AddPartitions describe."""
    for p in described.partitions:
        for field in ("live", "live_unknown_reason", "high_watermark", "log_start_offset"):
            p.ClearField(field)
        del p.replica_states[:]
    return described


async def refused(call: Callable[[], object]) -> ClientError:
    """The error of a blocking client call, run off the loop the servers run on."""
    err = await asyncio.to_thread(rpc_error, call)
    assert len(str(err)) < 1000, f"a message of {len(str(err))} chars"
    return err


async def in_thread(call: Callable[[], T]) -> T:
    return await asyncio.to_thread(call)


async def register_brokers(cluster: QuorumCluster, count: int = 3) -> None:
    """Through the Controller service of the leader (a follower redirects)."""
    leader = await cluster.leader()
    follower = cluster.follower()
    async with grpc.aio.insecure_channel(cluster.addresses[follower.node_id]) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await cpb_grpc.ControllerStub(channel).RegisterBroker(
                cpb.RegisterBrokerRequest(broker_id=1, host="h", port=1, raft_host="h", raft_port=2)
            )
        err = error_of(caught.value)
        assert_error(err, UA, "NOT_CONTROLLER", "resend to")
        assert err.meta["raftmq-leader-address"] == cluster.addresses[leader.node_id]
        assert err.meta["raftmq-leader-id"] == str(leader.node_id)
    async with grpc.aio.insecure_channel(cluster.addresses[leader.node_id]) as channel:
        stub = cpb_grpc.ControllerStub(channel)
        for b in range(1, count + 1):
            answer = await stub.RegisterBroker(
                cpb.RegisterBrokerRequest(
                    broker_id=b,
                    host="127.0.0.1",
                    port=9000 + b,
                    raft_host="127.0.0.1",
                    raft_port=9100 + b,
                    rack=f"r{b}",
                    incarnation=1,
                )
            )
            assert answer.epoch > 0


async def test_topic_lifecycle_from_any_voter(tmp_path):
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        await register_brokers(cluster)
        follower = cluster.follower()
        admin = AdminClient([cluster.addresses[follower.node_id]])  # redirected to the leader
        created = await in_thread(
            lambda: admin.create_topic("orders", 6, 3, {"retention.ms": "3600000"})
        )
        assert isinstance(created, apb.CreateTopicResponse)
        topic = created.topic
        assert topic.name == "orders" and len(topic.partitions) == 6
        assert all(sorted(p.replicas) == [1, 2, 3] for p in topic.partitions)
        assert sorted(p.replicas[0] for p in topic.partitions) == [1, 1, 2, 2, 3, 3]
        assert dict(topic.config) == {"retention.ms": "3600000"}
        assert topic.effective_config["retention.ms"] == "3600000"
        assert topic.effective_config["min.insync.replicas"] == "1"
        assert created.metadata_version >= topic.topic_id > 0

        described = await in_thread(lambda: admin.describe_topic("orders"))
        # no broker serves these partitions here: their live state is unknown, not an error
        assert all(not p.live and p.live_unknown_reason for p in described.partitions)
        assert all(p.high_watermark == -1 for p in described.partitions)
        assert metadata_only(described) == topic
        await in_thread(lambda: admin.create_topic("audit", 1, 1))
        listed = await in_thread(admin.list_topics)
        assert [t.name for t in listed.topics] == ["audit", "orders"]

        await in_thread(
            lambda: admin.alter_topic_config(
                "orders", {"segment.bytes": "1048576"}, reset=["retention.ms"]
            )
        )
        described = await in_thread(lambda: admin.describe_topic("orders"))
        assert dict(described.config) == {"segment.bytes": "1048576"}

        grown = await in_thread(lambda: admin.add_partitions("orders", 8))
        grown_topic = grown.topic
        assert len(grown_topic.partitions) == 8
        assert list(grown_topic.partitions[:6]) == list(metadata_only(described).partitions)

        await in_thread(lambda: admin.decommission_partitions("orders", [6, 7]))
        described = await in_thread(lambda: admin.describe_topic("orders"))
        states = [p.state for p in described.partitions]
        assert states == [apb.PARTITION_STATE_ACTIVE] * 6 + [apb.PARTITION_STATE_DECOMMISSIONED] * 2
        assert described.partitions[6].delete_after_ms > 0

        await in_thread(lambda: admin.delete_topic("orders"))
        err = await refused(lambda: admin.describe_topic("orders"))
        assert_error(err, NF, "UNKNOWN_TOPIC", "orders")

        cluster_view = await in_thread(admin.describe_cluster)
        assert isinstance(cluster_view, apb.DescribeClusterResponse)
        assert list(cluster_view.controller_voters) == [1, 2, 3]
        assert cluster_view.controller_leader_id == (await cluster.leader()).node_id
        assert [(b.id, b.state, b.rack) for b in cluster_view.brokers] == [
            (1, apb.BROKER_STATE_ALIVE, "r1"),
            (2, apb.BROKER_STATE_ALIVE, "r2"),
            (3, apb.BROKER_STATE_ALIVE, "r3"),
        ]
        admin.close()
    finally:
        await cluster.stop()


async def test_the_admin_client_follows_a_new_controller_leader(tmp_path):
    """The leader's voter stops (its gRPC server and its host, as a crash would end them):
    the same client, bootstrapped with every voter, finds the new leader, and the metadata
    written through the old one is all there."""
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        await register_brokers(cluster)
        admin = AdminClient(list(cluster.addresses.values()))
        await in_thread(lambda: admin.create_topic("before", 3, 2))
        old = await cluster.leader()
        await cluster.stop(old.node_id)
        await in_thread(lambda: admin.create_topic("after", 2, 2))
        listed = await in_thread(admin.list_topics)
        assert [t.name for t in listed.topics] == ["after", "before"]
        assert len(listed.topics[1].partitions) == 3
        view = await in_thread(admin.describe_cluster)
        assert view.controller_leader_id not in (0, old.node_id)
        admin.close()
    finally:
        await cluster.stop()


async def test_bad_input_is_refused_with_its_code_and_nothing_applied(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        await register_brokers(cluster)
        admin = AdminClient(list(cluster.addresses.values()))
        await in_thread(lambda: admin.create_topic("t", 2, 2))
        leader = await cluster.leader()
        before = leader.local_state()[1].topics
        huge = "x" * 100_000
        cases: list[tuple[Callable[[], object], grpc.StatusCode, str, tuple[str, ...]]] = [
            (lambda: admin.create_topic("no spaces", 1, 1), IA, "INVALID_TOPIC_NAME", ("1-200",)),
            (lambda: admin.create_topic(huge, 1, 1), IA, "INVALID_TOPIC_NAME", ("100000 chars",)),
            (
                lambda: admin.create_topic("t", 1, 1),
                grpc.StatusCode.ALREADY_EXISTS,
                "TOPIC_ALREADY_EXISTS",
                ("exists already",),
            ),
            (lambda: admin.create_topic("u", 0, 1), IA, "INVALID_PARTITIONS", ("1-10000",)),
            (lambda: admin.create_topic("u", 10_001, 1), IA, "INVALID_PARTITIONS", ("10001",)),
            (lambda: admin.create_topic("u", 1, 0), IA, "INVALID_REPLICATION_FACTOR", ("1-16",)),
            (lambda: admin.create_topic("u", 1, 17), IA, "INVALID_REPLICATION_FACTOR", ("17",)),
            (lambda: admin.create_topic("u", 1, 4), FP, "NOT_ENOUGH_BROKERS", ("start more",)),
            (
                lambda: admin.create_topic("u", 1, 1, {"retention.hours": "1"}),
                IA,
                "INVALID_CONFIG",
                ("not a topic setting", "retention.ms"),
            ),
            (
                lambda: admin.create_topic("u", 1, 1, {"segment.bytes": "ten"}),
                IA,
                "INVALID_CONFIG",
                ("whole number",),
            ),
            (
                lambda: admin.create_topic("u", 1, 1, {"segment.bytes": "9" * 100}),
                IA,
                "INVALID_CONFIG",
                ("100 chars",),
            ),
            (
                lambda: admin.create_topic("u", 1, 2, {"min.insync.replicas": "3"}),
                IA,
                "INVALID_CONFIG",
                ("min.insync.replicas",),
            ),
            (
                lambda: admin.create_topic("u", 1, 1, {huge: "1"}),
                IA,
                "INVALID_CONFIG",
                ("not a topic setting",),
            ),
            (lambda: admin.delete_topic("nope"), NF, "UNKNOWN_TOPIC", ("nope",)),
            (lambda: admin.describe_topic("nope"), NF, "UNKNOWN_TOPIC", ("nope",)),
            (lambda: admin.describe_topic("bad/name"), IA, "INVALID_TOPIC_NAME", ("bad/name",)),
            (
                lambda: admin.alter_topic_config("nope", {"retention.ms": "1"}),
                NF,
                "UNKNOWN_TOPIC",
                (),
            ),
            (
                lambda: admin.alter_topic_config("t", {"retention.ms": "-7"}),
                IA,
                "INVALID_CONFIG",
                ("retention.ms",),
            ),
            (
                lambda: admin.alter_topic_config("t", {}, ["bogus"]),
                IA,
                "INVALID_CONFIG",
                ("bogus",),
            ),
            (lambda: admin.add_partitions("t", 1), IA, "INVALID_PARTITIONS", ("only grow",)),
            (lambda: admin.add_partitions("nope", 3), NF, "UNKNOWN_TOPIC", ()),
            (lambda: admin.decommission_partitions("t", [5]), NF, "UNKNOWN_PARTITION", ("0-1",)),
            (
                lambda: admin.decommission_partitions("t", [0, 1]),
                IA,
                "INVALID_PARTITIONS",
                ("delete the topic",),
            ),
            (lambda: admin.decommission_partitions("t", []), IA, "INVALID_PARTITIONS", ()),
            (
                lambda: admin.decommission_partitions("t", list(range(10_001))),
                IA,
                "INVALID_PARTITIONS",
                ("at most",),
            ),
        ]
        for call, status, code, words in cases:
            assert_error(await refused(call), status, code, *words)
        await in_thread(lambda: admin.decommission_partitions("t", [1]))
        err = await refused(lambda: admin.decommission_partitions("t", [1]))
        assert_error(err, FP, "PARTITION_DECOMMISSIONED", "already")
        after = leader.local_state()[1].topics
        assert set(after) == set(before) == {"t"}
        assert after["t"].config == before["t"].config
        assert after["t"].partitions[0] == before["t"].partitions[0]

        # Bytes that are no request of the proto: MALFORMED_REQUEST, not INTERNAL.
        address = cluster.addresses[leader.node_id]
        async with grpc.aio.insecure_channel(address) as channel:
            for method in ("/raftmq.v1.Admin/CreateTopic", "/raftmq.v1.Controller/Heartbeat"):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(method)(b"\xff\xff\xff")
                assert_error(error_of(caught.value), IA, "MALFORMED_REQUEST", "protobuf")
        admin.close()
        loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
        assert not loud, f"a client's mistake logged as an error: {loud}"
    finally:
        await cluster.stop()


async def test_without_a_quorum_changes_and_reads_are_unavailable(tmp_path):
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        await register_brokers(cluster)
        leader = await cluster.leader()
        others = [n for n in cluster.quorums if n != leader.node_id]
        await cluster.stop(*others)
        # check-quorum: the lone former leader steps down within an election timeout.
        await wait_for(lambda: not leader.is_leader, 10, "the leader to step down")
        admin = AdminClient([cluster.addresses[leader.node_id]], attempts=2)
        err = await refused(lambda: admin.create_topic("t", 1, 1))
        assert_error(err, UA, "CONTROLLER_NOT_AVAILABLE", "no leader")
        err = await refused(admin.list_topics)
        assert_error(err, UA, "CONTROLLER_NOT_AVAILABLE", "read")
        assert leader.local_state()[1].topics == {}
        admin.close()
    finally:
        await cluster.stop()


async def test_heartbeats_and_a_watch_resumed_on_another_voter(tmp_path):
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        await register_brokers(cluster)
        leader = await cluster.leader()
        follower = cluster.follower()
        async with grpc.aio.insecure_channel(cluster.addresses[leader.node_id]) as channel:
            stub = cpb_grpc.ControllerStub(channel)
            beat = await stub.Heartbeat(
                cpb.HeartbeatRequest(broker_id=1, incarnation=1, metadata_version=0)
            )
            assert not beat.fenced and beat.metadata_version == leader.local_state()[0]
            for request, status, code in (
                (cpb.HeartbeatRequest(broker_id=7, incarnation=1), NF, "UNKNOWN_BROKER"),
                (cpb.HeartbeatRequest(broker_id=1, incarnation=0), FP, "STALE_BROKER_INCARNATION"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Heartbeat(request)
                assert_error(error_of(caught.value), status, code, "broker")
            for request in (
                cpb.RegisterBrokerRequest(
                    broker_id=0, host="h", port=1, raft_host="h", raft_port=1
                ),
                cpb.RegisterBrokerRequest(broker_id=5, host="h" * 300, port=1, raft_host="h"),
                cpb.RegisterBrokerRequest(
                    broker_id=5, host="h", port=0, raft_host="h", raft_port=1
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.RegisterBroker(request)
                assert_error(error_of(caught.value), IA, "INVALID_BROKER")

        admin = AdminClient(list(cluster.addresses.values()))
        await in_thread(lambda: admin.create_topic("a", 1, 1))
        got: list[cpb.MetadataUpdate] = []
        async with grpc.aio.insecure_channel(cluster.addresses[leader.node_id]) as channel:
            stream = cpb_grpc.ControllerStub(channel).WatchMetadata(
                cpb.WatchMetadataRequest(from_version=0)
            )
            async for update in stream:
                got.append(update)
                if "a" in decode_snapshot(update.state).topics:
                    break
            stream.cancel()
        last = got[-1].version
        assert [u.version for u in got] == sorted({u.version for u in got})
        assert decode_snapshot(got[-1].state).version == last
        await in_thread(lambda: admin.create_topic("b", 1, 1))
        async with grpc.aio.insecure_channel(cluster.addresses[follower.node_id]) as channel:
            stream = cpb_grpc.ControllerStub(channel).WatchMetadata(
                cpb.WatchMetadataRequest(from_version=last)
            )
            update = await stream.read()
            assert isinstance(update, cpb.MetadataUpdate) and update.version > last
            state = decode_snapshot(update.state)
            assert {"a", "b"} <= set(state.topics) and sorted(state.brokers) == [1, 2, 3]
            stream.cancel()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in cpb_grpc.ControllerStub(channel).WatchMetadata(
                    cpb.WatchMetadataRequest(from_version=-1)
                ):
                    pass
            assert_error(error_of(caught.value), IA, "INVALID_ARGUMENT", "negative")
        admin.close()
    finally:
        await cluster.stop()


def test_every_refusal_of_the_state_machine_has_an_error_code_with_a_rule():
    for refusal in RefusalCode:
        if refusal == RefusalCode.MALFORMED_COMMAND:
            continue  # only the controller encodes commands: INTERNAL if one is refused
        code = code_of(refusal.value)
        assert code != pb.ERROR_CODE_UNSPECIFIED and code in RULES, refusal


async def test_drain_rebalance_and_cluster_status_through_the_admin_api(tmp_path):
    """No mover runs here: the answers come from the metadata and the forecast alone."""
    cluster = await QuorumCluster(tmp_path, grpc_servers=True).start()
    try:
        await register_brokers(cluster, 3)
        with AdminClient(list(cluster.addresses.values())) as admin:
            await in_thread(lambda: admin.create_topic("t", 4, 3))
            await register_brokers_more(cluster, 4)
            err = await refused(lambda: admin.drain_broker(7))
            assert_error(err, NF, "UNKNOWN_BROKER", "broker 7 has not registered")
            planned = await in_thread(admin.rebalance_cluster)
            # 12 replicas over 4 brokers: 3 each, so 3 move to broker 4
            assert sorted((m.learner, m.reason) for m in planned.moves) == [(4, "rebalance")] * 3
            status = await in_thread(admin.cluster_status)
            assert status.rebalance_requested and not status.moves
            assert [(x.broker_id, x.replicas) for x in status.loads] == [
                (1, 4),
                (2, 4),
                (3, 4),
                (4, 0),
            ]
            assert not status.under_replicated
            assert len(status.leaderless) == 4  # nobody reports leaders here
            leader = await cluster.leader()
            await leader.add_replica("t", 0, 4, replacing=1)
            await in_thread(lambda: admin.drain_broker(2))
            status = await in_thread(admin.cluster_status)
            assert [(m.topic, m.partition, m.learner, m.replacing) for m in status.moves] == [
                ("t", 0, 4, 1)
            ]
            assert [b.state for b in status.cluster.brokers][1] == apb.BROKER_STATE_DRAINING
            # with 2 draining, 1 and 4 are all that would be left for 3 replicas: refused
            err = await refused(lambda: admin.drain_broker(3))
            assert_error(err, FP, "NOT_ENOUGH_BROKERS", "start another broker")
    finally:
        await cluster.stop()


async def register_brokers_more(cluster: QuorumCluster, broker_id: int) -> None:
    leader = await cluster.leader()
    await leader.register_broker(
        broker_id, "127.0.0.1", 9000 + broker_id, "127.0.0.1", 9100 + broker_id, f"r{broker_id}", 1
    )
