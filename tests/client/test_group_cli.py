"""``raftmq group list|describe|reset-offsets|delete`` as an operator runs them, against
real brokers: committed offsets beside the log end and the lag, resets refused while the
group has members (unless --force), a dry run that changes nothing, each way to say
where to reset to, and errors as sentences."""

from __future__ import annotations

import json

import grpc
import pytest

from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.client.admin import AdminClient
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import batch
from tests.client.test_records_cli import raftmq

pytestmark = pytest.mark.timeout(180)


def run_json(cluster: LocalCluster, *args: str) -> dict:
    done = raftmq(cluster, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def committed(cluster: LocalCluster, group: str) -> dict[int, int]:
    with AdminClient(cluster.addresses) as admin:
        answer = admin.fetch_group_offsets(group)
    return {o.partition: o.offset for o in answer.offsets}


def test_group_commands(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"gc": 2})
    with cluster.client() as client:
        client.produce("gc", 0, batch([b"x"] * 10, ts=1_000))
        client.produce("gc", 0, batch([b"y"] * 5, ts=5_000))  # offsets 10-14 from 5 s on
        client.produce("gc", 1, batch([b"z"] * 4))
    with AdminClient(cluster.addresses) as admin:
        leader = admin.describe_cluster().controller_leader_id
    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        stub = gpb_grpc.GroupsStub(channel)
        member = stub.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(group_id="cg", subscriptions=["gc"]), timeout=10
        )
        stub.CommitOffsets(
            gpb.CommitOffsetsRequest(
                group_id="cg",
                member_id=member.member_id,
                member_epoch=member.member_epoch,
                offsets=[gpb.OffsetToCommit(topic="gc", partition=0, offset=6)],
            ),
            timeout=10,
        )

        listed = run_json(cluster, "group", "list")
        assert [(g["group_id"], g["member_count"]) for g in listed["groups"]] == [("cg", 1)]
        described = run_json(cluster, "group", "describe", "cg")
        assert [m["member_id"] for m in described["members"]] == [member.member_id]
        lags = {p["partition"]: p for p in described["partitions"]}
        assert lags[0]["committed_offset"] == 6 and lags[0]["log_end_offset"] == 15
        assert lags[0]["lag"] == 9 and lags[0]["member_id"] == member.member_id
        assert lags[1]["committed_offset"] == -1 and lags[1]["lag"] == 4
        table = raftmq(cluster, "group", "describe", "cg")
        assert table.returncode == 0 and b"lag" in table.stdout

        refused = raftmq(cluster, "group", "reset-offsets", "cg", "--topic", "gc", "--to-latest")
        assert refused.returncode == 1 and b"--force" in refused.stdout, refused.stdout
        gone = raftmq(cluster, "group", "delete", "cg")
        assert gone.returncode == 1 and b"GROUP_NOT_EMPTY" in gone.stdout, gone.stdout
        preview = run_json(
            cluster, "group", "reset-offsets", "cg", "--topic", "gc", "--to-latest", "--dry-run"
        )
        assert preview["dry_run"] and [r["after"] for r in preview["offsets"]] == [15, 4]
        assert committed(cluster, "gc-none") == {} and committed(cluster, "cg") == {0: 6}
        forced = raftmq(
            cluster, "group", "reset-offsets", "cg", "--topic", "gc", "--partition", "1",
            "--to-offset", "2", "--force",
        )  # fmt: skip
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert committed(cluster, "cg") == {0: 6, 1: 2}
        stub.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(
                group_id="cg", member_id=member.member_id, member_epoch=-1
            ),
            timeout=10,
        )

    for where, want in (
        (["--to-earliest"], {0: 0, 1: 0}),
        (["--to-latest"], {0: 15, 1: 4}),
        (["--to-offset", "99"], {0: 15, 1: 4}),  # clamped to the log end
        (["--to-timestamp", "4000"], {0: 10, 1: 4}),
        (["--to-timestamp", "1970-01-01T00:00:01"], {0: 0, 1: 0}),
    ):
        done = raftmq(cluster, "group", "reset-offsets", "cg", "--topic", "gc", *where)
        assert done.returncode == 0, done.stdout + done.stderr
        assert committed(cluster, "cg") == want, where

    usage = raftmq(cluster, "group", "reset-offsets", "cg", "--topic", "gc")
    assert usage.returncode == 2 and b"exactly one of" in usage.stdout
    unknown = raftmq(cluster, "group", "reset-offsets", "cg", "--topic", "nope", "--to-latest")
    assert unknown.returncode == 1 and b"UNKNOWN_TOPIC" in unknown.stdout, unknown.stdout
    assert raftmq(cluster, "group", "delete", "cg").returncode == 0
    assert run_json(cluster, "group", "list") == {"groups": []}
    missing = raftmq(cluster, "group", "describe", "cg")
    assert missing.returncode == 1 and b"no consumer group" in missing.stdout, missing.stdout
