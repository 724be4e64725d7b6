"""Cluster status, drains and rebalances through the admin API and the CLI, on real broker
processes (combined mode): a balanced cluster's rebalance plans nothing and the controller
leader's mover clears the request; drains of an unknown broker, or of one the others
cannot stand in for, are refused with a code and a sentence; a killed broker shows up
fenced, with its partitions under-replicated.

Moves themselves (a learner added, caught up, promoted) need the partition leaders to
execute them; their end-to-end tests live with that executor."""

from __future__ import annotations

import json
import subprocess

from raftmq.api.v1 import admin_pb2 as apb
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import wait_until
from tests.broker.test_controller_wiring import RAFTMQ

FENCE_S = 30.0  # the session timeout (6 s) plus a loaded machine's slack


def test_status_drain_and_rebalance_through_the_cli(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"t": 3})
    bootstrap = ["--bootstrap", ",".join(cluster.addresses)]

    def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RAFTMQ, *args, *bootstrap], capture_output=True, text=True, timeout=90
        )

    def said(answer: subprocess.CompletedProcess[str]) -> str:
        """The output as one line (rich wraps long sentences)."""
        return " ".join(answer.stdout.split())

    def status() -> dict:  # type: ignore[type-arg]
        answer = raftmq("cluster", "status", "--json")
        assert answer.returncode == 0, answer.stdout + answer.stderr
        return json.loads(answer.stdout)  # type: ignore[no-any-return]

    first = status()
    assert [b["state"] for b in first["cluster"]["brokers"]] == ["BROKER_STATE_ALIVE"] * 3
    assert first["under_replicated"] == [] and first["moves"] == []
    assert [x["replicas"] for x in first["loads"]] == [3, 3, 3]
    assert first["cluster"]["controller_leader_id"] in (1, 2, 3)

    unknown = raftmq("broker", "drain", "9")
    assert unknown.returncode == 1
    assert "UNKNOWN_BROKER" in unknown.stdout and "broker 9 has not registered" in said(unknown)
    no_room = raftmq("broker", "drain", "2", "--no-wait")
    assert no_room.returncode == 1 and "NOT_ENOUGH_BROKERS" in no_room.stdout
    assert "start another broker" in said(no_room)
    assert "Traceback" not in unknown.stdout + unknown.stderr + no_room.stdout + no_room.stderr

    # Balanced already: nothing planned, and the leader's mover clears the request.
    rebalanced = raftmq("cluster", "rebalance")
    assert rebalanced.returncode == 0, rebalanced.stdout + rebalanced.stderr
    assert "0 replica moves and 0 preferred-leader changes planned" in said(rebalanced)
    assert "The cluster is balanced." in said(rebalanced)
    assert status()["rebalance_requested"] is False

    cluster.kill(3)
    with cluster.admin() as admin:
        wait_until(
            lambda: any(
                b.id == 3 and b.state == apb.BROKER_STATE_FENCED
                for b in admin.cluster_status().cluster.brokers
            ),
            FENCE_S,
            "broker 3 fenced",
        )
        answer = admin.cluster_status()
        assert [(r.topic, r.partition) for r in answer.under_replicated] == [
            ("t", 0),
            ("t", 1),
            ("t", 2),
        ]
    table = raftmq("cluster", "status")
    assert table.returncode == 0 and "fenced" in table.stdout
    assert "Under-replicated partitions: t/0, t/1, t/2" in said(table)
    # With broker 3 fenced, broker 1 has a single peer to stand in for it: refused.
    still = raftmq("broker", "drain", "1", "--no-wait")
    assert still.returncode == 1 and "NOT_ENOUGH_BROKERS" in still.stdout
