"""Fixtures for the broker integration tests: clusters of real broker processes on 127.0.0.1
with fast Raft ticks, always torn down even when a test fails (a test's own cluster with
SIGKILL, the shared one gracefully). When a test fails, the tail of every broker's log is
printed with the failure report (the shared cluster's at the end of the module)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.controller.cluster_file import ClusterSpec
from raftmq.devtools.local_cluster import LocalCluster, local_spec

# The shared cluster tests no failover: a longer election timeout keeps a loaded machine's
# scheduling hiccups from moving leaders under tests that talk to a leader directly.
# Leader hand-backs scaled down like the ticks; test clusters start once every partition is
# led by its preferred replica, so none moves mid-test unless the test kills a broker.
REBALANCE_ARGS = ["--leader-rebalance-ms", "500"]
SHARED_BROKER_ARGS = ["--tick-ms", "20", "--election-ticks", "30", *REBALANCE_ARGS]
LEADER_TIMEOUT = 30.0
LOG_TAIL_LINES = 40


def cluster_spec(
    topics: dict[str, int], *, single_replica: dict[str, int] | None = None
) -> ClusterSpec:
    """Three brokers; ``topics`` with 3 replicas each, ``single_replica`` topics with one
    replica per partition (partition p on broker p % 3 + 1, round-robin)."""
    spec = local_spec(3, topics, name="raftmq-test")
    if single_replica:
        extra = local_spec(3, single_replica, replication=1)
        spec = ClusterSpec(spec.name, spec.brokers, {**spec.topics, **extra.topics})
    return spec


def log_tails(cluster: LocalCluster, lines: int = LOG_TAIL_LINES) -> str:
    out = []
    for bid in cluster.spec.brokers:
        path = cluster.log_path(bid)
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        out.append(f"--- {path} (last {lines} lines) ---")
        out += text[-lines:]
    return "\n".join(out)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _failed(node: pytest.Item) -> bool:
    return any(
        getattr(node, f"rep_{when}", None) is not None and getattr(node, f"rep_{when}").failed
        for when in ("setup", "call")
    )


ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture
def make_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    """``make_cluster({"t": 1})`` starts a fresh 3-broker cluster in tmp_path (20 ms ticks,
    an election timeout of ``election_ticks``) and waits until every partition is led by its
    preferred replica; it is killed after the test. ``extra_args`` go to every broker,
    ``per_broker_args`` to one (a rack, say)."""
    clusters: list[LocalCluster] = []

    def make(
        topics: dict[str, int],
        *,
        single_replica: dict[str, int] | None = None,
        election_ticks: int = 10,
        extra_args: list[str] | None = None,
        per_broker_args: dict[int, list[str]] | None = None,
    ) -> LocalCluster:
        data = tmp_path / f"cluster-{len(clusters)}"
        args = ["--tick-ms", "20", "--election-ticks", str(election_ticks), *REBALANCE_ARGS]
        args += extra_args or []
        cluster = LocalCluster(
            data,
            cluster_spec(topics, single_replica=single_replica),
            broker_args=args,
            per_broker_args=per_broker_args,
        )
        clusters.append(cluster)
        cluster.start()
        cluster.wait_for_leaders(timeout=LEADER_TIMEOUT, preferred=True)
        return cluster

    yield make
    for cluster in clusters:
        if _failed(request.node):
            print(log_tails(cluster))
        # Throwaway data: SIGKILL is faster than a graceful hand-over and flush.
        for bid in list(cluster.procs):
            cluster.kill(bid)
        cluster.close()


SHARED_TOPICS = {
    "rt": 3,
    "multi": 1,
    "conc": 1,
    "bad": 1,
    "poll": 1,
    "redirect": 1,
    "lo": 1,
    "acks": 1,
    "stream": 2,
}
SHARED_SINGLE = {"solo": 3}


@contextlib.contextmanager
def module_cluster(
    data: Path,
    spec: ClusterSpec,
    broker_args: list[str],
    request: pytest.FixtureRequest,
    **cluster_options: Any,
) -> Iterator[LocalCluster]:
    """A cluster that serves a whole module: started, every partition led by its preferred
    replica, stopped gracefully at the end, its brokers' logs shown if a test failed.
    ``cluster_options`` go to LocalCluster (TLS: ``pki=``, ``client_auth=``)."""
    failed_before = request.session.testsfailed
    cluster = LocalCluster(data, spec, broker_args=broker_args, **cluster_options)
    try:
        cluster.start()
        cluster.wait_for_leaders(timeout=LEADER_TIMEOUT, preferred=True)
        yield cluster
    finally:
        if request.session.testsfailed > failed_before:
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line("\nshared cluster broker logs:\n" + log_tails(cluster))
        cluster.close()


@pytest.fixture(scope="module")
def shared_cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    """One cluster for the tests that do not kill brokers; each test uses its own topic."""
    with module_cluster(
        tmp_path_factory.mktemp("shared"),
        cluster_spec(SHARED_TOPICS, single_replica=SHARED_SINGLE),
        SHARED_BROKER_ARGS,
        request,
    ) as cluster:
        yield cluster
