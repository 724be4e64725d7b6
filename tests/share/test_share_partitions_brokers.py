"""The SharePartitions service on real brokers: registered beside Broker on every broker,
under the server's error contract. Until a share group can be created through the
controller (the ShareGroups service), what a real cluster can show is its refusals: the
member's group unknown to the broker's metadata, a bad group id, a follower naming its
leader, an unknown topic, request bytes that are not a message; each a documented status
with its raftmq-error code, and no traceback in any broker's log. The acquisitions
themselves are tested on real replicas in tests/partition/test_share_partition.py and
through gRPC in tests/share/test_share_service.py."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
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
