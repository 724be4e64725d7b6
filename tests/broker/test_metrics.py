"""Each broker serves Prometheus metrics at the address its ready.json names, with real
brokers: requests are counted by method and error code, a refusal under its code, the
produced and fetched bytes and records per topic match what was sent and read, each
hosted replica's high watermark and leadership are exported as the partition has them,
the controller voters say which of them leads, and ``--no-metrics`` opens no listener.
Every scrape is parsed with prometheus-client's own parser, so the exposition is checked
as valid text format on the way."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import AdminClient, Producer
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import ClusterFactory, log_tails
from tests.broker.test_broker_cluster import RPC_TIMEOUT, address_of, leader_of, wait_until

TOPIC = "metered"
BATCHES = 5
RECORDS_PER_BATCH = 7
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> Samples:
    """Every sample at http://``address``/metrics, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=RPC_TIMEOUT) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value, 0 when absent (a counter not incremented yet has no series)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (Linux: its socket inodes matched with
    /proc/net/tcp{,6} entries in state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_metrics_follow_requests_traffic_and_partition_state(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({TOPIC: 1})
    bound = cluster.wait_ready()
    for bid, addresses in bound.items():
        assert addresses.metrics, f"broker {bid}'s ready.json names no metrics address"
        assert port_of(addresses.metrics) in listening_ports(addresses.pid)
    with LowLevelClient(cluster.addresses) as client:
        leader = leader_of(client, TOPIC)
        at_leader = bound[leader].metrics
        before = scrape(at_leader)
        sent_bytes = 0
        for b in range(BATCHES):
            entries = build_batch(
                [Record(None, f"v{b}-{i}".encode(), 1_000 + i) for i in range(RECORDS_PER_BATCH)]
            )
            answer = client.produce(TOPIC, 0, entries)
            sent_bytes += len(entries)
        high_watermark = answer.high_watermark
        assert high_watermark == BATCHES * RECORDS_PER_BATCH

        fetched = client.fetch(TOPIC, 0, 0, max_bytes=1 << 20)
        assert fetched.next_offset == high_watermark
        stub = client.stub(address_of(cluster, leader))
        with pytest.raises(grpc.RpcError) as refused:
            stub.Fetch(pb.FetchRequest(topic="no-such-topic", partition=0), timeout=RPC_TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND

    after = scrape(at_leader)
    part = {"topic": TOPIC, "partition": "0"}
    produce_ok = {"method": "Broker/Produce", "code": "OK"}
    assert value(after, "raftmq_rpc_requests_total", **produce_ok) - value(
        before, "raftmq_rpc_requests_total", **produce_ok
    ) == pytest.approx(BATCHES)
    assert value(after, "raftmq_rpc_latency_seconds_count", method="Broker/Produce") >= BATCHES
    assert (
        value(after, "raftmq_rpc_requests_total", method="Broker/Fetch", code="UNKNOWN_TOPIC") == 1
    )
    assert value(after, "raftmq_topic_produced_bytes_total", topic=TOPIC) == sent_bytes
    assert (
        value(after, "raftmq_topic_produced_records_total", topic=TOPIC)
        == BATCHES * RECORDS_PER_BATCH
    )
    assert value(after, "raftmq_topic_fetched_bytes_total", topic=TOPIC) == len(fetched.entries)
    assert (
        value(after, "raftmq_topic_fetched_records_total", topic=TOPIC)
        == BATCHES * RECORDS_PER_BATCH
    )
    assert value(after, "raftmq_partition_high_watermark", **part) == high_watermark
    assert value(after, "raftmq_partition_log_end_offset", **part) >= high_watermark
    assert value(after, "raftmq_partition_log_size_bytes", **part) >= sent_bytes
    assert value(after, "raftmq_partition_leader", **part) == 1
    assert value(after, "raftmq_broker_under_replicated_partitions") == 0
    assert value(after, "raftmq_broker_failed_replicas") == 0
    assert value(after, "process_open_fds") > 0
    # The Raft host's own figures: every produce was a proposal committed here, every
    # commit needed durable rounds, and this broker won at least this partition's election.
    assert (
        value(after, "raftmq_raft_commit_seconds_count")
        - value(before, "raftmq_raft_commit_seconds_count")
        >= BATCHES
    )
    assert value(after, "raftmq_raft_persist_seconds_count") > value(
        before, "raftmq_raft_persist_seconds_count"
    )
    assert value(after, "raftmq_raft_elections_won_total") >= 1
    assert value(after, "raftmq_raft_snapshots_installed_total") == 0

    # The followers: not leading, and their high watermark reaches the leader's.
    for bid in bound:
        if bid == leader:
            continue
        follower = bound[bid].metrics
        wait_until(
            lambda address=follower: (
                value(scrape(address), "raftmq_partition_high_watermark", **part) == high_watermark
            ),
            10,
            f"broker {bid}'s exported high watermark to reach {high_watermark}",
        )
        assert value(scrape(follower), "raftmq_partition_leader", **part) == 0

    # Every broker of this cluster is a controller voter: one leads, all applied metadata.
    controllers = [scrape(b.metrics) for b in bound.values()]
    assert sum(value(s, "raftmq_controller_leader") for s in controllers) == 1
    assert all(value(s, "raftmq_controller_metadata_version") > 0 for s in controllers)
    assert all(value(s, "raftmq_broker_metadata_version") > 0 for s in controllers)


def test_produce_stream_requests_are_counted_one_by_one(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({TOPIC: 1})
    bound = cluster.wait_ready()
    with LowLevelClient(cluster.addresses) as client:
        leader = leader_of(client, TOPIC)
    at_leader, at_leader_client = bound[leader].metrics, address_of(cluster, leader)
    with Producer(cluster.addresses[0], linger_ms=0) as producer:
        futures = []
        for i in range(20):
            futures.append(producer.send(TOPIC, f"r{i}".encode(), partition=0))
            producer.flush()
        for future in futures:
            future.result(timeout=RPC_TIMEOUT)
    # One stream: a request refused inside it (the stream goes on), one stored, then a
    # message that is no protobuf, which ends the stream with its own code.
    entries = build_batch([Record(None, b"x", 1_000)])
    refused_and_stored = pb.ProduceStreamRequest(
        requests=[
            pb.ProduceRequest(request_id=1, topic=TOPIC, partition=9, entries=entries),
            pb.ProduceRequest(request_id=2, topic=TOPIC, partition=0, entries=entries),
        ]
    ).SerializeToString()
    with grpc.insecure_channel(at_leader_client) as channel:
        call = channel.stream_stream("/raftmq.v1.Broker/ProduceStream")
        answers = []
        with pytest.raises(grpc.RpcError) as ended:
            for raw in call(iter([refused_and_stored, b"\xff\xff\xff"]), timeout=RPC_TIMEOUT):
                answers += pb.ProduceStreamResponse.FromString(raw).responses
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted((a.request_id, a.error.code) for a in answers) == [
        (1, "UNKNOWN_PARTITION"),
        (2, ""),
    ]

    stream = {"method": "Broker/ProduceStream"}
    # The stream's end is counted once the broker's handler has finished aborting it,
    # which can be just after the client has seen the status.
    wait_until(
        lambda: value(
            scrape(at_leader), "raftmq_rpc_requests_total", code="MALFORMED_REQUEST", **stream
        ),
        RPC_TIMEOUT,
        "the malformed message to be counted",
    )
    samples = scrape(at_leader)
    assert value(samples, "raftmq_rpc_requests_total", code="OK", **stream) == 21
    assert value(samples, "raftmq_rpc_requests_total", code="UNKNOWN_PARTITION", **stream) == 1
    assert value(samples, "raftmq_rpc_requests_total", code="MALFORMED_REQUEST", **stream) == 1
    assert value(samples, "raftmq_rpc_latency_seconds_count", **stream) == 22
    assert value(samples, "raftmq_topic_produced_records_total", topic=TOPIC) == 21


def test_metrics_off_opens_no_listener(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path, local_spec(1, {}), broker_args=["--tick-ms", "20", "--no-metrics"]
    ) as cluster:
        cluster.start()
        try:
            (addresses,) = cluster.wait_ready(timeout=60).values()
            assert addresses.metrics == ""
            assert listening_ports(addresses.pid) == {
                port_of(addresses.client),
                port_of(addresses.raft),
            }
        except BaseException:
            print(log_tails(cluster))
            raise


def test_group_lag_is_exported_by_the_partitions_leader(make_cluster: ClusterFactory) -> None:
    """Lag = the leader's high watermark - the group's committed offset, from the leader
    alone (each (group, partition) once over the cluster), following new records and
    new commits."""
    cluster = make_cluster({TOPIC: 1})
    bound = cluster.wait_ready()
    with LowLevelClient(cluster.addresses) as client, AdminClient(cluster.addresses) as admin:
        records = [Record(None, b"x", 1_000 + i) for i in range(10)]
        client.produce(TOPIC, 0, build_batch(records))
        admin.reset_group_offsets("lagging", {(TOPIC, 0): 4})
        leader = leader_of(client, TOPIC)

        def lags() -> dict[int, float]:
            return {
                bid: value(scrape(a.metrics), "raftmq_group_lag_records", **LAG_LABELS)
                for bid, a in bound.items()
            }

        wait_until(lambda: lags()[leader] == 6, 30, "the leader's lag of 6 records")
        assert sum(lags().values()) == 6  # the followers export none
        client.produce(TOPIC, 0, build_batch(records[:3]))
        admin.reset_group_offsets("lagging", {(TOPIC, 0): 13})
        wait_until(lambda: lags()[leader] == 0, 30, "no lag once the group caught up")


LAG_LABELS = {"group": "lagging", "topic": TOPIC, "partition": "0"}
