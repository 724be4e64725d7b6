"""deploy/: the Prometheus alert rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``: each alert fires after its ``for`` and not before), and every
metric the rules and the Grafana dashboard query is one a real broker exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.client import AdminClient, LowLevelClient
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULES_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "raftmq.json"
METRIC = re.compile(r"\b((?:raftmq|process)_[a-z0-9_]+)\b")
"""The names the brokers export (Prometheus' own ``up`` is not one)."""
ALERTS = {
    "RaftmqUnderReplicatedPartitions",
    "RaftmqLeaderlessPartition",
    "RaftmqFailedReplica",
    "RaftmqDiskAlmostFull",
    "RaftmqBrokerDown",
    "RaftmqControllerWithoutLeader",
    "RaftmqConsumerLagGrowing",
}


def promtool(*args: str) -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (.ci/run installs Debian's prometheus)")
    done = subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=60, cwd=RULES.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_alert_rules_check_and_their_unit_tests_pass() -> None:
    assert "SUCCESS: 7 rules found" in promtool("check", "rules", RULES.name)
    promtool("test", "rules", RULES_TESTS.name)
    named = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M))
    assert named == ALERTS


def queried_metrics() -> set[str]:
    exprs = re.findall(r"^\s+expr: (.+)$", RULES.read_text(), re.M)
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    for panel in panels:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        exprs += [t["expr"] for t in panel.get("targets", ())]
    assert len(exprs) > 20
    return {name for expr in exprs for name in METRIC.findall(expr)}


def test_every_queried_metric_is_exported(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"t": 1})
    # The per-topic series need traffic, the lag series a group's commit.
    with LowLevelClient(cluster.addresses) as client, AdminClient(cluster.addresses) as admin:
        client.produce("t", 0, build_batch([Record(None, b"x", 1_700_000_000_000)]))
        assert client.fetch("t", 0, 0).entries
        admin.reset_group_offsets("g", {("t", 0): 0})

    def exported() -> set[str]:
        names: set[str] = set()
        for addresses in cluster.wait_ready().values():
            url = f"http://{addresses.metrics}/metrics"
            with urllib.request.urlopen(url, timeout=30) as got:
                text = got.read().decode()
            for family in text_string_to_metric_families(text):
                names |= {sample.name for sample in family.samples}
        return names

    # The leader sees the commit once the metadata reaches it: wait for its lag series.
    names = wait_until(
        lambda: (n := exported()) and "raftmq_group_lag_records" in n and n,
        30,
        "the group's lag series",
    )
    assert isinstance(names, set)
    queried = queried_metrics()
    assert queried and not (queried - names), sorted(queried - names)
