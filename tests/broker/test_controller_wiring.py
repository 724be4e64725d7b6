"""Brokers take their topics from the controller (real processes, combined mode): a topic
created through the admin API on a running cluster is produced to and consumed from, with
its own config; a deleted topic's data goes from every broker, also one that was down
during the delete; killing the controller's leader elects another and topics can be
created again within seconds; a whole-cluster restart keeps the topics; partitions added
later take records."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import batch, read_all, wait_for_broker_state, wait_until

RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]
CONTROLLER_FAILOVER_S = 10.0
"""Killing the controller's leader to a topic created through another: an election
(20 ms ticks here) plus the admin client's retries."""


def replica_dir(cluster: LocalCluster, broker_id: int, topic: str, partition: int) -> Path:
    return cluster.data / f"broker-{broker_id}" / f"{topic}-{partition}"


def wait_led(client: LowLevelClient, topic: str, partitions: int, timeout: float = 30.0) -> None:
    wait_until(
        lambda: all((topic, p) in client.refresh_leaders(timeout=1.0) for p in range(partitions)),
        timeout,
        f"a leader for every partition of {topic}",
    )


def produce_and_read(
    client: LowLevelClient, topic: str, partition: int, values: list[bytes]
) -> None:
    client.produce(topic, partition, batch(values))
    records, _ = read_all(client, topic, partition)
    assert [r.value for r in records][-len(values) :] == values


def test_a_topic_created_through_the_admin_api_takes_records_with_its_config(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({})
    with cluster.admin() as admin, cluster.client() as client:
        created = admin.create_topic("fresh", 3, 3, {"segment.bytes": "4096"})
        assert len(created.topic.partitions) == 3
        assert all(len(p.replicas) == 3 for p in created.topic.partitions)
        wait_led(client, "fresh", 3)
        for p in range(3):
            produce_and_read(client, "fresh", p, [f"v{p}-{i}".encode() * 50 for i in range(40)])
        md = client.stub(cluster.addresses[0]).Metadata(
            pb.MetadataRequest(topics=["fresh"]), timeout=5
        )
        assert md.metadata_version >= created.metadata_version
    # segment.bytes=4096 is the topic's, not the broker default (128 MiB): the log rolled
    for b in (1, 2, 3):
        segments = list(replica_dir(cluster, b, "fresh", 0).glob("*.log"))
        assert len(segments) > 1, (b, segments)


def test_a_deleted_topic_is_gone_from_every_broker_also_one_down_at_the_time(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"doomed": 2, "kept": 1})
    with cluster.client() as client:
        for p in range(2):
            produce_and_read(client, "doomed", p, [b"a", b"b"])
        produce_and_read(client, "kept", 0, [b"k"])
    cluster.kill(3)
    with cluster.admin() as admin:
        admin.delete_topic("doomed")
        names = [t.name for t in admin.list_topics().topics]
        assert names == ["kept"]
    for b in (1, 2):
        wait_until(
            lambda b=b: not any(replica_dir(cluster, b, "doomed", p).exists() for p in range(2)),
            20,
            f"broker {b} deleting its doomed replicas",
        )
    assert replica_dir(cluster, 3, "doomed", 0).exists()  # it was down: still there
    cluster.start(3)
    wait_until(
        lambda: not any(replica_dir(cluster, 3, "doomed", p).exists() for p in range(2)),
        30,
        "the restarted broker 3 deleting its doomed replicas",
    )
    assert replica_dir(cluster, 3, "kept", 0).exists()
    with cluster.client() as client:
        records, _ = read_all(client, "kept", 0)
        assert [r.value for r in records] == [b"k"]
        with pytest.raises(ClientError) as refused:
            client.produce("doomed", 0, batch([b"late"]))
        assert refused.value.label == "UNKNOWN_TOPIC", refused.value


def test_killing_the_controller_leader_elects_another_and_topics_are_created_again(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"before": 1})
    with cluster.admin() as admin:
        leader = admin.describe_cluster().controller_leader_id
        assert leader in (1, 2, 3)
    cluster.kill(leader)
    survivors = [b.address for b in cluster.spec.brokers.values() if b.id != leader]
    started = time.monotonic()
    with AdminClient(survivors) as admin:
        admin.create_topic("after", 2, 2)
        took = time.monotonic() - started
        assert took < CONTROLLER_FAILOVER_S, took
        new_leader = admin.describe_cluster().controller_leader_id
        assert new_leader not in (0, leader)
        assert {t.name for t in admin.list_topics().topics} == {"before", "after"}
        # Until its session times out the dead broker may still get replicas (as in
        # Kafka); once fenced, new topics go to the live brokers only.
        wait_for_broker_state(admin, leader, apb.BROKER_STATE_FENCED, 30)
        placed = admin.create_topic("placed", 2, 2)
        assert all(leader not in p.replicas for p in placed.topic.partitions)
    with LowLevelClient(survivors) as client:
        wait_led(client, "placed", 2)
        produce_and_read(client, "placed", 1, [b"x"])


def test_a_whole_cluster_restart_keeps_topics_and_their_data(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({})
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("durable", 2, 3, {"retention.ms": "3600000"})
        wait_led(client, "durable", 2)
        produce_and_read(client, "durable", 0, [b"one", b"two"])
    for b in (1, 2, 3):
        cluster.kill(b)
    cluster.start()
    cluster.wait_ready()
    with cluster.admin() as admin, cluster.client() as client:
        topics = {t.name: t for t in admin.list_topics().topics}
        assert set(topics) == {"durable"}
        assert dict(topics["durable"].config) == {"retention.ms": "3600000"}
        wait_led(client, "durable", 2)
        records, _ = read_all(client, "durable", 0)
        assert [r.value for r in records] == [b"one", b"two"]
        produce_and_read(client, "durable", 1, [b"three"])


def test_partitions_added_later_take_records(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"grow": 2})
    with cluster.admin() as admin, cluster.client() as client:
        produce_and_read(client, "grow", 0, [b"old"])
        added = admin.add_partitions("grow", 5)
        assert len(added.topic.partitions) == 5
        wait_led(client, "grow", 5)
        for p in (2, 3, 4):
            produce_and_read(client, "grow", p, [f"new-{p}".encode()])
        records, _ = read_all(client, "grow", 0)
        assert [r.value for r in records] == [b"old"]


def test_topic_commands_create_list_describe_and_delete(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({})
    bootstrap = ["--bootstrap", ",".join(cluster.addresses)]

    def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RAFTMQ, "topic", *args, *bootstrap], capture_output=True, text=True, timeout=60
        )

    made = raftmq("create", "cli", "--partitions", "2", "--config", "retention.ms=60000")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "Created topic cli with 2 partitions" in made.stdout
    listed = json.loads(raftmq("list", "--json").stdout)
    assert [t["name"] for t in listed["topics"]] == ["cli"]
    described = json.loads(raftmq("describe", "cli", "--json").stdout)
    assert len(described["partitions"]) == 2
    assert described["config"] == {"retention.ms": "60000"}
    table = raftmq("describe", "cli").stdout
    assert "topic cli" in table and "retention.ms" in table
    again = raftmq("create", "cli")
    assert again.returncode == 1
    assert "exists already" in again.stdout and "TOPIC_ALREADY_EXISTS" in again.stdout
    assert raftmq("delete", "cli").returncode == 0
    missing = raftmq("describe", "cli")
    assert missing.returncode == 1 and "UNKNOWN_TOPIC" in missing.stdout
    assert "Traceback" not in missing.stdout + missing.stderr
