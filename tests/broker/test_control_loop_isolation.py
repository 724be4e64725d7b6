"""One replica that cannot open never stops its broker's control loop, and never hides
(issue 20), with real broker processes: the replica is reported as failed, with why, in
Metadata, ``raftmq status --json`` (exit 1) and the chaos health check, while the same
broker goes on applying every other metadata change (a topic created, a config altered, a
topic deleted); once the cause is gone it opens by itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.lowlevel import LowLevelClient
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import RPC_TIMEOUT, address_of, read_all, wait_until
from tests.broker.test_broker_health import ROOT, own_status, run_status

LIVE_S = 30.0
"""Time for a change to reach a broker and be seen there, on a loaded machine."""
VICTIM = 2


def _own_state(client: LowLevelClient, address: str, topic: str, partition: int) -> tuple:
    try:
        _, mine = own_status(client, address, topic, partition)
    except (grpc.RpcError, IndexError, AssertionError):
        return (None, "")
    return (mine.state, mine.reason)


def _produce_direct(client: LowLevelClient, address: str, topic: str, partition: int, size: int):
    batch = build_batch([Record(None, b"v" * size, int(time.time() * 1000))])
    return client.stub(address).Produce(
        pb.ProduceRequest(topic=topic, partition=partition, entries=batch), timeout=RPC_TIMEOUT
    )


def test_a_replica_that_cannot_open_is_reported_and_the_broker_applies_the_rest(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"base": 1})
    victim = address_of(cluster, VICTIM)
    data = cluster.data / f"broker-{VICTIM}"
    # A regular file where the replica's directory goes: its log cannot open, a fault that
    # stops root too, and that no repair from a peer can fix.
    blocker = data / "stuck-0"
    blocker.write_bytes(b"not a directory")
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("stuck", 1, 3)
        _, reason = wait_until(
            lambda: (s := _own_state(client, victim, "stuck", 0))[0] == pb.REPLICA_FAILED and s,
            LIVE_S,
            f"broker {VICTIM} to report its replica of stuck/0 failed",
        )
        assert "cannot open" in reason, reason
        # Requests to it get a code and a sentence, not NOT_HOSTED.
        try:
            client.stub(victim).Fetch(
                pb.FetchRequest(topic="stuck", partition=0, offset=0), timeout=RPC_TIMEOUT
            )
            raise AssertionError("a fetch from the unopened replica was answered")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert dict(err.trailing_metadata())["raftmq-error"] == "REPLICA_FAILED"
            assert "is not open" in (err.details() or "")
        assert client.health(victim) == "SERVING"

        code, report = run_status(cluster)
        assert code == 1, report
        part = next(p for p in report["partitions"] if p["topic"] == "stuck")
        assert [r["broker_id"] for r in part["replicas"] if r["state"] == "failed"] == [VICTIM]
        assert any(f"on broker {VICTIM} failed" in p for p in report["problems"]), report

        # The same broker keeps applying metadata: a new topic opens there...
        admin.create_topic("other", 3, 3)
        for p in range(3):
            wait_until(
                lambda p=p: (
                    _own_state(client, victim, "other", p)[0]
                    in (pb.REPLICA_OK, pb.REPLICA_CATCHING_UP)
                ),
                LIVE_S,
                f"broker {VICTIM} opening its replica of other/{p}",
            )
        # ...an altered config reaches it (the partition it leads refuses an entry over
        # the new limit)...
        led = wait_until(
            lambda: next(
                (
                    p
                    for p in range(3)
                    if client.stub(victim)
                    .Metadata(pb.MetadataRequest(topics=["other"]), timeout=RPC_TIMEOUT)
                    .topics[0]
                    .partitions[p]
                    .leader_id
                    == VICTIM
                ),
                None,
            ),
            LIVE_S,
            f"broker {VICTIM} leading a partition of 'other'",
        )
        _produce_direct(client, victim, "other", led, 3000)
        admin.alter_topic_config("other", {"max.message.bytes": "2048"})

        def refused_over_limit() -> bool:
            try:
                _produce_direct(client, victim, "other", led, 3000)
            except grpc.RpcError as err:
                return dict(err.trailing_metadata()).get("raftmq-error") == "BATCH_TOO_LARGE"
            return False

        wait_until(refused_over_limit, LIVE_S, f"broker {VICTIM} taking the altered config")
        # ...and a deleted topic's replicas go from it.
        admin.delete_topic("other")
        wait_until(
            lambda: not any(data.glob("other-*")),
            LIVE_S,
            f"broker {VICTIM} deleting its replicas of 'other'",
        )
        # Still reported failed meanwhile, never left out.
        assert _own_state(client, victim, "stuck", 0)[0] == pb.REPLICA_FAILED

        # The cause gone, it opens by itself (retried with backoff) and catches up.
        blocker.unlink()
        wait_until(
            lambda: _own_state(client, victim, "stuck", 0)[0] == pb.REPLICA_OK,
            90.0,
            f"broker {VICTIM}'s replica of stuck/0 opening once the blocker is gone",
        )
        code, report = run_status(cluster)
        assert code == 0, report
    shutil.rmtree(cluster.data, ignore_errors=True)


def _rebuild(cluster, *args: str) -> subprocess.CompletedProcess[str]:
    bootstrap = ",".join(cluster.addresses)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "raftmq.cli.main",
            "broker",
            "rebuild-replica",
            *args,
            "--bootstrap",
            bootstrap,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_an_operator_rebuilds_a_replica_no_peer_could_repair(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"base": 1})
    victim = address_of(cluster, VICTIM)
    (cluster.data / f"broker-{VICTIM}" / "stuck-0").write_bytes(b"not a directory")
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("stuck", 1, 3)
        for i in range(3):
            client.produce("stuck", 0, build_batch([Record(None, f"v{i}".encode(), 1000 + i)]))
        wait_until(
            lambda: _own_state(client, victim, "stuck", 0)[0] == pb.REPLICA_FAILED,
            LIVE_S,
            f"broker {VICTIM} to report its replica of stuck/0 failed",
        )
        # A replica that leads is not rebuilt unless forced: its data may be the only copy.
        leader = wait_until(
            lambda: client.refresh_leaders(timeout=1.0).get(("stuck", 0)),
            LIVE_S,
            "a leader for stuck/0",
        )
        refused = _rebuild(cluster, str(leader.broker_id), "stuck", "0")  # type: ignore[attr-defined]
        assert refused.returncode == 1, refused
        assert "UNSAFE_REBUILD" in refused.stdout and "--force" in refused.stdout, refused.stdout

        done = _rebuild(cluster, str(VICTIM), "stuck", "0")
        assert done.returncode == 0, (done.stdout, done.stderr)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["state"] == "ok" and answer["deleted_bytes"] == len(b"not a directory")
        assert _own_state(client, victim, "stuck", 0)[0] == pb.REPLICA_OK
        records = wait_until(
            lambda: (
                (got := read_all(client, "stuck", 0, address=victim)[0]) and len(got) == 3 and got
            ),
            LIVE_S,
            f"broker {VICTIM} serving the three records again",
        )
        assert [r.value for r in records] == [b"v0", b"v1", b"v2"]
    code, report = run_status(cluster)
    assert code == 0, report
