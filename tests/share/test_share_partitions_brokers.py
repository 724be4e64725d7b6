"""The SharePartitions service on real brokers: registered beside Broker on every broker,
under the server's error contract (the member's group unknown to the broker's metadata, a
bad group id, a follower naming its leader, an unknown topic, request bytes that are not a
message: each a documented status with its raftmq-error code, and no traceback in any
broker's log); and a member that leaves its group has its records released by the
partition's leader at once, not after their locks expire (the leader's share gauges
count them while they are held)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client import AdminClient, LowLevelClient, Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import SHARED_BROKER_ARGS, cluster_spec, module_cluster
from tests.broker.test_broker_cluster import (
    RPC_TIMEOUT,
    address_of,
    assert_error,
    leader_of,
    rpc_error,
)
from tests.broker.test_error_contract import BrokerLogs
from tests.broker.test_metrics import scrape, value

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("share-partitions"),
        cluster_spec({"sp": 1}),
        SHARED_BROKER_ARGS,
        request,
    ) as cluster:
        yield cluster


def fetch(group: str = "g", topic: str = "sp") -> spb.ShareFetchRequest:
    return spb.ShareFetchRequest(
        group_id=group, member_id="m", metadata_version=1, topic=topic, partition=0
    )


def test_refusals_follow_the_error_contract(cluster: LocalCluster) -> None:
    logs = BrokerLogs(cluster)
    with cluster.client() as client:
        leader = leader_of(client, "sp")
        follower = next(b for b in cluster.spec.brokers if b != leader)
        stubs = {
            bid: spb_grpc.SharePartitionsStub(client._channel(address_of(cluster, bid)))
            for bid in cluster.spec.brokers
        }
        at_leader = stubs[leader]
        err = rpc_error(lambda: at_leader.ShareFetch(fetch(), timeout=RPC_TIMEOUT))
        assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_GROUP", "share group", "'g'")
        err = rpc_error(lambda: at_leader.ShareFetch(fetch("bad id!"), timeout=RPC_TIMEOUT))
        assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GROUP", "group id")
        err = rpc_error(lambda: at_leader.ShareFetch(fetch(topic="nope"), timeout=RPC_TIMEOUT))
        assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC", "nope")
        err = rpc_error(lambda: stubs[follower].ShareFetch(fetch(), timeout=RPC_TIMEOUT))
        assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "NOT_LEADER", "not the leader")
        assert err.meta.get("raftmq-leader-address") == address_of(cluster, leader)
        describe = spb.DescribeSharePartitionRequest(group_id="g", topic="sp", partition=0)
        err = rpc_error(lambda: at_leader.DescribeSharePartition(describe, timeout=RPC_TIMEOUT))
        assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_GROUP", "share group")
        with grpc.insecure_channel(address_of(cluster, leader)) as channel:
            raw = channel.unary_unary("/raftmq.v1.SharePartitions/ShareFetch")
            with pytest.raises(grpc.RpcError) as info:
                raw(b"\xff\xff\xff", timeout=RPC_TIMEOUT)
        trailers = dict(info.value.trailing_metadata() or ())  # type: ignore[attr-defined]
        assert trailers.get("raftmq-error") == "MALFORMED_REQUEST"
    logs.assert_quiet()


def heartbeat(
    admin: AdminClient, group: str, member_id: str = "", epoch: int = 0
) -> spb.ShareGroupHeartbeatResponse:
    request = spb.ShareGroupHeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=epoch, subscriptions=["sp"]
    )
    answer: spb.ShareGroupHeartbeatResponse = admin._call(
        "ShareGroupHeartbeat", request, spb_grpc.ShareGroupsStub
    )
    return answer


def test_a_member_that_leaves_has_its_records_released_at_once(cluster: LocalCluster) -> None:
    group = "g-leaves"
    with (
        AdminClient(cluster.addresses) as admin,
        LowLevelClient(cluster.addresses) as client,
        Producer(cluster.addresses) as producer,
    ):
        admin.alter_share_group_config(
            group, {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "60000"}
        )
        for i in range(5):
            producer.send("sp", b"%d" % i, partition=0)
        producer.flush()

        def fetch(member: spb.ShareGroupHeartbeatResponse) -> spb.ShareFetchResponse:
            request = spb.ShareFetchRequest(
                group_id=group,
                member_id=member.member_id,
                metadata_version=member.metadata_version,
                topic="sp",
                partition=0,
                max_wait_ms=5000,
            )
            answer: spb.ShareFetchResponse = client.call_leader(
                "sp", 0, spb_grpc.SharePartitionsStub, "ShareFetch", request
            )
            return answer

        a = heartbeat(admin, group)
        got = fetch(a)
        assert [(r.first_offset, r.last_offset, r.delivery_count) for r in got.acquired] == [
            (0, 4, 1)
        ]
        bound = cluster.wait_ready()
        held = {
            bid: value(scrape(b.metrics), "raftmq_share_records_acquired")
            for bid, b in bound.items()
        }
        assert held[leader_of(client, "sp")] == 5 and sum(held.values()) == 5  # the leader's
        b = heartbeat(admin, group)
        assert not fetch(b).acquired  # a holds them all, for a minute
        heartbeat(admin, group, a.member_id, -1)  # a leaves
        t0 = time.monotonic()
        again = fetch(heartbeat(admin, group, b.member_id, b.member_epoch))
        assert [(r.first_offset, r.last_offset, r.delivery_count) for r in again.acquired] == [
            (0, 4, 2)
        ]
        assert time.monotonic() - t0 < 10, "released by the leader, not by the lock's end"
