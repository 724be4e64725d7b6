"""Failures stay small and visible, with real broker processes: one partition's replica
whose disk refuses a write is quarantined while every other partition keeps producing;
Metadata, grpc.health.v1 and ``raftmq status`` say which replica failed and why; it comes
back once the fault is gone. A broker whose Raft host fails exits with status 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format.records import Record, build_batch, iter_records
from raftmq.log.segment import LOG_SUFFIX, segment_name
from tests.broker.conftest import SHARED_BROKER_ARGS, ClusterFactory, log_tails
from tests.broker.test_broker_cluster import RPC_TIMEOUT, address_of, wait_until

ROOT = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 64 * 1024
BIG = b"x" * (40 * 1024)  # two of these never fit one segment: the second rolls it


def values(n: int, tag: str) -> bytes:
    return build_batch([Record(None, f"{tag}-{i}".encode(), 1_000 + i) for i in range(n)])


def own_status(client: LowLevelClient, address: str, topic: str, partition: int):
    """(the partition's info, the answering broker's report on its own replica)."""
    md = client.stub(address).Metadata(pb.MetadataRequest(topics=[topic]), timeout=RPC_TIMEOUT)
    info = md.topics[0].partitions[partition]
    mine = [rs for rs in info.replica_status if rs.broker_id == md.broker_id]
    assert len(mine) == 1, info
    return info, mine[0]


def run_status(cluster: LocalCluster) -> tuple[int, dict]:
    bootstrap = ",".join(cluster.addresses)
    proc = subprocess.run(
        [sys.executable, "-m", "raftmq.cli.main", "status", "--bootstrap", bootstrap, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return proc.returncode, json.loads(proc.stdout)


def block_segments(directory: Path) -> list[Path]:
    """Directories where the replica's next segment files would go (a few offsets ahead,
    for any count of no-op entries before them): creating the segment then fails with
    EEXIST, a fault that stops root too, and reopening the log fails until they are gone."""
    made = []
    for offset in range(6):
        for delta in range(1, 40):
            path = directory / (segment_name(offset, offset + delta) + LOG_SUFFIX)
            if not path.exists():
                path.mkdir()
                made.append(path)
    return made


def is_blocked_reason(reason: str) -> bool:
    """The fault, as first met (a segment cannot be created) or as a reopen attempt meets
    it (the blocking directory is named), whichever happened last."""
    return "FileExistsError" in reason or "not a regular file" in reason


def test_a_failed_replica_is_isolated_reported_and_recovers(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"iso": 6}, extra_args=["--segment-bytes", str(SEGMENT_BYTES)])
    bad = address_of(cluster, 1)  # broker 1 leads iso/0 and iso/3 (its preferred replicas)
    blocked = block_segments(cluster.data / "broker-1" / "iso-0")
    with cluster.client() as client:
        assert client.health(bad) == "SERVING"
        with pytest.raises(ClientError):
            for i in range(5):
                client.produce("iso", 0, build_batch([Record(None, BIG, i)]))

        info, mine = wait_until(
            lambda: (r := own_status(client, bad, "iso", 0))[1].state == pb.REPLICA_FAILED and r,
            10,
            "broker 1 to report its replica of iso/0 failed",
        )
        assert is_blocked_reason(mine.reason), mine
        assert info.leader_id != 1
        # One failed replica does not make the broker unhealthy, nor stop its other partitions:
        # it still leads iso/3 and takes writes for it.
        assert client.health(bad) == "SERVING"
        for p in range(6):
            client.produce("iso", p, values(10, f"after-{p}"))
        answer = client.stub(bad).Produce(
            pb.ProduceRequest(topic="iso", partition=3, entries=values(1, "direct")),
            timeout=RPC_TIMEOUT,
        )
        assert answer.last_offset >= 10
        info3, other = own_status(client, bad, "iso", 3)
        assert other.state == pb.REPLICA_OK and info3.leader_id == 1

        # Requests to the failed replica are refused with a code and the truth.
        stub = client.stub(bad)
        for call, request in (
            (stub.Produce, pb.ProduceRequest(topic="iso", partition=0, entries=values(1, "x"))),
            (stub.Fetch, pb.FetchRequest(topic="iso", partition=0, offset=0)),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call(request, timeout=RPC_TIMEOUT)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(err.value.trailing_metadata())["raftmq-error"] == "REPLICA_FAILED"
            assert "failed: write failed: FileExistsError" in (err.value.details() or "")

        code, report = run_status(cluster)
        assert code == 1, report
        part = next(p for p in report["partitions"] if (p["topic"], p["partition"]) == ("iso", 0))
        assert part["leader"] in (2, 3)
        failed = [r for r in part["replicas"] if r["state"] == "failed"]
        assert [r["broker_id"] for r in failed] == [1] and is_blocked_reason(failed[0]["reason"])
        assert any("broker 1 failed" in problem for problem in report["problems"])
        assert all(b["health"] == "SERVING" for b in report["brokers"])

        # The fault goes away: the replica is reopened from disk and catches up.
        for path in blocked:
            shutil.rmtree(path)
        wait_until(
            lambda: own_status(client, bad, "iso", 0)[1].state != pb.REPLICA_FAILED,
            30,
            "broker 1 to reopen its replica of iso/0",
        )
        leader = address_of(cluster, client.refresh_leaders()["iso", 0].broker_id)
        hw = client.fetch("iso", 0, 0, address=leader).high_watermark

        def read_from_bad() -> list[bytes]:
            resp = client.fetch("iso", 0, 0, address=bad, max_bytes=1 << 20)
            return [r.value or b"" for r in iter_records(resp.entries)]

        got = wait_until(
            lambda: (v := read_from_bad()) and len(v) >= hw and v, 30, "broker 1 to catch up"
        )
        assert [v for v in got if v.startswith(b"after-0")] == [
            f"after-0-{i}".encode() for i in range(10)
        ]
        code, report = run_status(cluster)
        assert code == 0, report


def test_a_broker_whose_raft_host_fails_exits_with_status_3(tmp_path: Path) -> None:
    spec = local_spec(1, {"solo": 1}, replication=1, name="raftmq-test")
    args = [*SHARED_BROKER_ARGS, "--inject-host-fault-after-ms", "4000"]
    cluster = LocalCluster(tmp_path, spec, broker_args=args)
    try:
        cluster.start()
        cluster.wait_for_leaders(timeout=30)
        with cluster.client() as client:
            assert client.health(address_of(cluster, 1)) == "SERVING"
            client.produce("solo", 0, values(3, "before"))
        proc = cluster.procs[1]
        assert proc.wait(timeout=30) == 3, log_tails(cluster)
        text = cluster.log_path(1).read_text()
        assert "Raft host stopped: RuntimeError: injected host fault" in text
        assert "its Raft host failed" in text and "exiting with status 3" in text
    finally:
        cluster.close()


def test_status_reports_a_healthy_cluster_and_exits_0(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"fine": 2})
    with cluster.client() as client:
        client.produce("fine", 0, values(5, "v"))
    deadline = time.monotonic() + 20
    while True:
        code, report = run_status(cluster)
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 0, report
    assert report["ok"] and not report["problems"]
    assert {b["id"]: b["health"] for b in report["brokers"]} == {
        1: "SERVING",
        2: "SERVING",
        3: "SERVING",
    }
    p0 = next(p for p in report["partitions"] if p["partition"] == 0)
    assert p0["leader"] == 1 and p0["high_watermark"] == 5 and p0["term"] > 0
    assert sorted(r["broker_id"] for r in p0["replicas"]) == [1, 2, 3]
    assert all(r["state"] in ("ok", "catching_up") for r in p0["replicas"])
