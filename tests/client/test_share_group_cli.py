"""``raftmq share-group list|describe|alter-config|reset-offsets|delete`` as an operator runs
them, against real brokers: a member that joined and acquired records shows up in
describe with its partitions' in-flight and acquired counts and the age of the oldest
acquisition (asked of each partition's leader); settings altered and refused; resets and
deletes refused while the group has members, then done; errors as sentences."""

from __future__ import annotations

import json

import grpc
import pytest

from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client.admin import AdminClient
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import batch, wait_until
from tests.client.test_records_cli import raftmq

pytestmark = pytest.mark.timeout(180)


def run_json(cluster: LocalCluster, *args: str) -> dict:
    done = raftmq(cluster, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def partitions(cluster: LocalCluster, group: str) -> dict[int, dict]:
    described = run_json(cluster, "share-group", "describe", group)
    return {p["partition"]: p for p in described["partitions"]}


def test_share_group_commands(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"work": 2})
    with cluster.client() as client:
        client.produce("work", 0, batch([b"x"] * 10))
        client.produce("work", 1, batch([b"y"] * 4))

    usage = raftmq(cluster, "share-group", "alter-config", "sq")
    assert usage.returncode == 2 and b"at least one" in usage.stdout, usage.stdout
    usage = raftmq(cluster, "share-group", "alter-config", "sq", "--set", "oops")
    assert usage.returncode == 2 and b"not key=value" in usage.stdout, usage.stdout
    bad = raftmq(
        cluster, "share-group", "alter-config", "sq", "--config", "share.delivery.count.limit=0"
    )
    assert bad.returncode == 1 and b"INVALID_SHARE_SETTING" in bad.stdout, bad.stdout
    assert b"between 1 and 10" in bad.stdout
    done = raftmq(
        cluster, "share-group", "alter-config", "sq",
        "--set", "share.auto.offset.reset=earliest",
        "--config", "share.record.lock.duration.ms=60000",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    with AdminClient(cluster.addresses) as admin:
        leader = admin.describe_cluster().controller_leader_id
    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        joined = spb_grpc.ShareGroupsStub(channel).ShareGroupHeartbeat(
            spb.ShareGroupHeartbeatRequest(group_id="sq", subscriptions=["work"]), timeout=10
        )
    assert {(tp.topic, p) for tp in joined.assigned for p in tp.partitions} == {
        ("work", 0),
        ("work", 1),
    }
    with cluster.client() as client:
        client.refresh_leaders()
        fetched = client.call_leader(
            "work",
            0,
            spb_grpc.SharePartitionsStub,
            "ShareFetch",
            spb.ShareFetchRequest(
                group_id="sq",
                member_id=joined.member_id,
                metadata_version=joined.metadata_version,
                topic="work",
                partition=0,
                max_records=6,
            ),
        )
    assert sum(a.last_offset - a.first_offset + 1 for a in fetched.acquired) == 6

    listed = run_json(cluster, "share-group", "list")
    assert [(g["group_id"], g["member_count"]) for g in listed["groups"]] == [("sq", 1)]
    described = run_json(cluster, "share-group", "describe", "sq")
    assert [m["member_id"] for m in described["members"]] == [joined.member_id]
    settings = {s["name"]: s["value"] for s in described["settings"]}
    assert settings["share.auto.offset.reset"] == "earliest"
    assert settings["share.record.lock.duration.ms"] == "60000"
    assert described["topics"] == ["work"]
    held = partitions(cluster, "sq")
    assert held[0]["exists"] and held[0]["start_offset"] == 0 and held[0]["end_offset"] == 6
    assert held[0]["in_flight"] == 6 and held[0]["acquired"] == 6
    assert held[0]["oldest_acquired_age_ms"] >= 0
    assert held[0]["high_watermark"] == 10
    assert not held[1]["exists"]  # never fetched from
    table = raftmq(cluster, "share-group", "describe", "sq")
    assert table.returncode == 0 and b"in flight" in table.stdout, table.stdout

    refused = raftmq(cluster, "share-group", "reset-offsets", "sq", "--to-latest")
    assert refused.returncode == 1 and b"--force" in refused.stdout, refused.stdout
    gone = raftmq(cluster, "share-group", "delete", "sq")
    assert gone.returncode == 1 and b"GROUP_NOT_EMPTY" in gone.stdout, gone.stdout
    usage = raftmq(cluster, "share-group", "reset-offsets", "sq")
    assert usage.returncode == 2 and b"exactly one of" in usage.stdout

    # Forced while the member holds records: they are behind the new start, so done.
    forced = run_json(cluster, "share-group", "reset-offsets", "sq", "--to-offset", "8", "--force")
    assert {(o["partition"], o["start_offset"]) for o in forced["offsets"]} == {(0, 8), (1, 4)}
    held = partitions(cluster, "sq")
    assert held[0]["start_offset"] == 8 and held[0]["acquired"] == 0

    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        spb_grpc.ShareGroupsStub(channel).ShareGroupHeartbeat(
            spb.ShareGroupHeartbeatRequest(
                group_id="sq", member_id=joined.member_id, member_epoch=-1
            ),
            timeout=10,
        )
    earliest = raftmq(
        cluster, "share-group", "reset-offsets", "sq", "--topic", "work", "--to-earliest"
    )
    assert earliest.returncode == 0, earliest.stdout + earliest.stderr
    wait_until(lambda: partitions(cluster, "sq")[0]["start_offset"] == 0, 10, "the reset to show")
    unknown = raftmq(
        cluster, "share-group", "reset-offsets", "sq", "--topic", "nope", "--to-latest"
    )
    assert unknown.returncode == 1 and b"UNKNOWN_TOPIC" in unknown.stdout, unknown.stdout

    assert raftmq(cluster, "share-group", "delete", "sq").returncode == 0
    assert run_json(cluster, "share-group", "list") == {"groups": []}
    missing = raftmq(cluster, "share-group", "describe", "sq")
    assert missing.returncode == 1 and b"no share group" in missing.stdout, missing.stdout
    assert b"UNKNOWN_GROUP" in missing.stdout
