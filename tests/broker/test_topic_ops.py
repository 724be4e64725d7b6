"""Topic operations reach the replicas (real broker processes, combined mode): an altered
config is taken live by every replica (size limit on leader and followers, retention);
min.insync.replicas refuses acks=all writes while too few voters are in sync; a
decommissioned partition takes no writes, stays readable, and is deleted once its deadline
passed; a produce auto-creates a topic only when the brokers are told to; partition
leaders report themselves, so describe shows a new leader after a kill, with each
partition's live state (high watermark, log start, replicas in sync)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import (
    REBALANCE_ARGS,
    ClusterFactory,
    cluster_spec,
    module_cluster,
)
from tests.broker.test_broker_cluster import (
    assert_error,
    batch,
    read_all,
    rpc_error,
    wait_until,
)
from tests.broker.test_controller_wiring import RAFTMQ, replica_dir, wait_led

RETENTION_CHECK_ARGS = ["--retention-check-ms", "300"]
LIVE_S = 20.0
"""Time for a change to reach every broker and be seen there, on a loaded machine."""


def now_batch(values: list[bytes]) -> bytes:
    return batch(values, ts=int(time.time() * 1000))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    """Three brokers that auto-create topics and run retention every 300 ms."""
    args = [
        "--tick-ms",
        "20",
        "--election-ticks",
        "20",
        *REBALANCE_ARGS,
        *RETENTION_CHECK_ARGS,
        "--auto-create-topics",
        "--auto-create-partitions",
        "2",
    ]
    with module_cluster(
        tmp_path_factory.mktemp("topicops"), cluster_spec({}), args, request
    ) as cluster:
        yield cluster


def leader_of(client: LowLevelClient, topic: str, partition: int) -> int:
    leaders = wait_until(
        lambda: client.refresh_leaders(timeout=1.0).get((topic, partition)),
        LIVE_S,
        f"a leader for {topic}/{partition}",
    )
    return leaders.broker_id  # type: ignore[attr-defined]


def produce_to(
    cluster: LocalCluster, broker_id: int, topic: str, entries: bytes, acks: int = pb.ACKS_ALL
) -> pb.ProduceResponse:
    """One Produce call to broker ``broker_id`` (no client retries: its answer as it is)."""
    with cluster.client() as client:
        return client.stub(cluster.spec.brokers[broker_id].address).Produce(
            pb.ProduceRequest(topic=topic, partition=0, entries=entries, acks=acks), timeout=10
        )


def test_an_altered_config_is_taken_live_by_every_replica(cluster: LocalCluster) -> None:
    config = {"max.message.bytes": "2048", "segment.bytes": "4096"}
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("alt", 1, 3, config)
        wait_led(client, "alt", 1)
        leader = leader_of(client, "alt", 0)
        big = now_batch([b"b" * 4000])
        err = rpc_error(lambda: produce_to(cluster, leader, "alt", big))
        assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "BATCH_TOO_LARGE")

        admin.alter_topic_config("alt", {"max.message.bytes": "8192"})

        def accepted() -> bool:
            try:
                produce_to(cluster, leader_of(client, "alt", 0), "alt", big)
            except grpc.RpcError:
                return False
            return True

        wait_until(accepted, LIVE_S, "the leader taking an entry over the old limit")
        too_big = now_batch([b"c" * 9000])
        err = rpc_error(lambda: produce_to(cluster, leader_of(client, "alt", 0), "alt", too_big))
        assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "BATCH_TOO_LARGE", "8192")
        # every follower's log took the big entry too (its log checks the limit as well)
        for b in cluster.spec.brokers.values():
            wait_until(
                lambda b=b: any(
                    r.value == b"b" * 4000 for r in read_all(client, "alt", 0, address=b.address)[0]
                ),
                LIVE_S,
                f"broker {b.id} holding the big entry",
            )

        # retention: many small segments, then retention.ms lowered: old segments go
        for i in range(30):
            client.produce("alt", 0, now_batch([f"r{i}".encode() * 200]))
        for b in cluster.spec.brokers:
            assert len(list(replica_dir(cluster, b, "alt", 0).glob("*.log"))) > 3
        time.sleep(1.0)  # every entry so far is older than the new retention
        admin.alter_topic_config("alt", {"retention.ms": "500"})
        for b in cluster.spec.brokers.values():
            wait_until(
                lambda b=b: _offset_zero_gone(client, b.address),
                LIVE_S,
                f"broker {b.id} deleting old segments after retention.ms was lowered",
            )
            # Past the producer state's checkpoint it waits for a newer one (a pass later).
            wait_until(
                lambda b=b: len(list(replica_dir(cluster, b.id, "alt", 0).glob("*.log"))) <= 2,
                LIVE_S,
                f"broker {b.id} deleting every expired segment",
            )


def _offset_zero_gone(client: LowLevelClient, address: str) -> bool:
    """Whether the replica at ``address`` no longer holds offset 0 (retention cut it)."""
    try:
        client.fetch("alt", 0, 0, address=address)
    except ClientError as exc:
        return exc.label == "OFFSET_OUT_OF_RANGE"
    return False


def test_a_decommissioned_partition_is_read_only_then_deleted(cluster: LocalCluster) -> None:
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("dec", 2, 3, {"retention.ms": "4000"})
        wait_led(client, "dec", 2)
        client.produce("dec", 1, now_batch([b"kept-until-retention"]))
        admin.decommission_partitions("dec", [1])
        described = admin.describe_topic("dec")
        deadline_ms = described.partitions[1].delete_after_ms
        assert described.partitions[1].state == apb.PARTITION_STATE_DECOMMISSIONED

        def refused() -> bool:
            try:
                client.produce("dec", 1, now_batch([b"late"]))
            except Exception as exc:
                return "PARTITION_DECOMMISSIONED" in repr(exc) or "decommissioned" in str(exc)
            return False

        # (writes taken before the leader's broker saw the decommission are kept: fine)
        wait_until(refused, LIVE_S, "a produce to the decommissioned partition refused")
        err = rpc_error(lambda: client.produce("dec", 1, now_batch([b"refused"])))
        assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "PARTITION_DECOMMISSIONED")
        assert "no new writes" in str(err)
        values = [r.value for r in read_all(client, "dec", 1)[0]]  # still readable
        assert values[0] == b"kept-until-retention" and b"refused" not in values, values
        client.produce("dec", 0, now_batch([b"active"]))  # the other partition takes writes

        wait_until(
            lambda: (
                time.time() * 1000 > deadline_ms
                and not any(
                    replica_dir(cluster, b, "dec", 1).exists() for b in cluster.spec.brokers
                )
            ),
            LIVE_S,
            "every broker deleting the decommissioned partition's data after its deadline",
        )
        assert all(replica_dir(cluster, b, "dec", 0).exists() for b in cluster.spec.brokers)
        err = rpc_error(lambda: client.fetch("dec", 1, 0))
        assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "PARTITION_DECOMMISSIONED")
        assert "deleted" in str(err)


def test_a_produce_auto_creates_its_topic_when_the_brokers_are_told_to(
    cluster: LocalCluster,
) -> None:
    with cluster.client() as client:
        client.produce("born-on-produce", 1, now_batch([b"first"]))
        records, _ = read_all(client, "born-on-produce", 1)
        assert [r.value for r in records] == [b"first"]
    with cluster.admin() as admin:
        described = admin.describe_topic("born-on-produce")
        assert len(described.partitions) == 2  # --auto-create-partitions
        assert described.replication_factor == 3  # automatic: three alive brokers


def test_a_producer_auto_creates_its_topic_before_it_partitions(cluster: LocalCluster) -> None:
    """The Producer needs the partition count before its first batch: its Metadata call
    asks the broker to create the topic (on a broker with auto-creation off it got
    UNKNOWN_TOPIC, as the test below shows for a produce)."""
    with Producer(cluster.addresses, linger_ms=0) as producer:
        sent = producer.send("born-on-send", b"v", key=b"k").result(LIVE_S)
    assert sent.topic == "born-on-send" and sent.offset == 0
    with cluster.admin() as admin:
        assert len(admin.describe_topic("born-on-send").partitions) == 2


def test_min_insync_replicas_refuses_acks_all_while_too_few_are_in_sync(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({})
    with cluster.admin() as admin, cluster.client() as client:
        # auto-creation is off by default: the sentence says how to create the topic
        err = rpc_error(lambda: produce_to(cluster, 1, "never-made", now_batch([b"x"])))
        assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC", "raftmq topic create")

        admin.create_topic("isr", 1, 3, {"min.insync.replicas": "3"})
        wait_led(client, "isr", 1)
        client.produce("isr", 0, now_batch([b"all-three"]))
        leader = leader_of(client, "isr", 0)
        follower = next(b for b in sorted(cluster.spec.brokers) if b != leader)
        cluster.kill(follower)

        def refused() -> grpc.RpcError | None:
            try:
                produce_to(cluster, leader, "isr", now_batch([b"two-only"]))
            except grpc.RpcError as exc:
                return exc
            return None

        # (writes the leader took before it saw the follower go are acknowledged: fine)
        wait_until(refused, LIVE_S, "an acks=all produce refused with a follower down")
        before = len(read_all(client, "isr", 0)[0])
        err = rpc_error(lambda: produce_to(cluster, leader, "isr", now_batch([b"refused"])))
        assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_ENOUGH_REPLICAS", "2 in-sync", "3")
        assert err.retriable
        # acks=1 is not held to min.insync.replicas
        produce_to(cluster, leader, "isr", now_batch([b"acks-one"]), acks=pb.ACKS_LEADER)
        tail = wait_until(  # acks=1 answers before the commit: wait for it
            lambda: [r.value for r in read_all(client, "isr", 0)[0]][before:],
            LIVE_S,
            "the acks=1 write committed",
        )
        assert tail == [b"acks-one"]  # and nothing of the refused write was kept
        # The live part of a describe is asked of the leader; an ask that reached a
        # broker the metadata still routed to (the one just killed) says "unknown": ask on.
        described = wait_until(
            lambda: next((d for d in [admin.describe_topic("isr")] if d.partitions[0].live), None),
            LIVE_S,
            "a describe with the partition's live state",
        )
        states = {s.broker_id: s.state for s in described.partitions[0].replica_states}
        assert states[follower] != "in_sync", states

        cluster.start(follower)
        wait_until(
            lambda: refused() is None, LIVE_S * 2, "acks=all accepted once the follower is back"
        )


def test_describe_shows_the_new_leader_and_live_state_after_a_leader_kill(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"led": 3})
    with cluster.admin() as admin, cluster.client() as client:
        for p in range(3):
            client.produce("led", p, now_batch([b"a", b"b"]))
        # every leader reported itself, and the leaders answer describe's live questions
        wait_until(
            lambda: all(
                p.leader_id
                and p.live
                and p.high_watermark == 2
                and all(s.state == "in_sync" for s in p.replica_states)
                for p in admin.describe_topic("led").partitions
            ),
            LIVE_S,
            "describe showing every partition's leader, high watermark and in-sync replicas",
        )
        described = admin.describe_topic("led")
        for p in described.partitions:
            assert p.log_start_offset == 0
            assert sorted(s.broker_id for s in p.replica_states) == sorted(p.replicas)
            assert all(s.state == "in_sync" for s in p.replica_states), p
        victim = described.partitions[0].leader_id
        # the CLI shows the same: JSON for scripts, a table for people
        cli = [*RAFTMQ, "topic", "describe", "led", "--bootstrap", ",".join(cluster.addresses)]
        as_json = json.loads(
            subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60).stdout
        )
        first = as_json["partitions"][0]
        assert first["live"] and first["high_watermark"] == "2", first
        assert {s["state"] for s in first["replica_states"]} == {"in_sync"}
        table = subprocess.run(cli, capture_output=True, text=True, timeout=60).stdout
        assert "high watermark" in table and "in sync" in table, table
        # a broker hosting no replica of a partition answers Metadata with the leader the
        # partition reported (here: one replica, on broker 1)
        admin.create_topic("solo", 1, 1, assignment=[[1]])
        other = cluster.spec.brokers[2].address

        def solo_leader() -> int:
            try:
                answer = client.stub(other).Metadata(pb.MetadataRequest(topics=["solo"]), timeout=5)
            except grpc.RpcError as exc:  # broker 2 has not heard of the topic yet
                assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
                return 0
            return answer.topics[0].partitions[0].leader_id

        wait_until(
            lambda: solo_leader() == 1,
            LIVE_S,
            "broker 2 naming broker 1 as the leader of solo/0 (it hosts no replica of it)",
        )
    cluster.kill(victim)
    survivors = [b.address for b in cluster.spec.brokers.values() if b.id != victim]
    started = time.monotonic()
    with AdminClient(survivors) as admin:
        wait_until(
            lambda: _led_elsewhere(admin.describe_topic("led"), victim),
            LIVE_S,
            "describe naming a new leader for the partitions the killed broker led",
        )
    print(f"describe named the new leaders {time.monotonic() - started:.1f} s after the kill")


def _led_elsewhere(described: apb.TopicDescription, victim: int) -> bool:
    return all(p.leader_id and p.leader_id != victim and p.live for p in described.partitions)
