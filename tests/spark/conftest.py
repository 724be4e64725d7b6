"""Fixtures for the Spark reader tests: one real ``local[2]`` SparkSession for the whole run
(starting one costs seconds; UI off, loopback only, UTC) and one real 3-broker raftmq
cluster per module (raftmq.spark.session says how the session reaches this checkout)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import (
    SHARED_BROKER_ARGS,
    cluster_spec,
    make_cluster,  # a fresh cluster per test, for the one that stops brokers
    module_cluster,
)

__all__ = ["make_cluster"]

# Topics of the shared cluster, one per test. Its brokers keep at most RETENTION_BYTES per
# partition in SEGMENT_BYTES segments so the data-loss test can make retention delete
# records; every other test writes far less than that to its topic.
SPARK_TOPICS = {
    "batch": 3,
    "stream": 2,
    "errors": 1,
    "gone": 1,
    "capped": 2,
    "grown": 2,
    "added": 1,
    "spread": 1,
    "txn": 2,
    "tagged": 2,
}
SEGMENT_BYTES = 32 * 1024
RETENTION_BYTES = 256 * 1024
RETENTION_ARGS = [
    "--segment-bytes",
    str(SEGMENT_BYTES),
    "--retention-bytes",
    str(RETENTION_BYTES),
    "--retention-check-ms",
    "200",
]


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from raftmq.spark.session import local_session

    session = local_session("raftmq-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("spark-cluster"),
        cluster_spec(SPARK_TOPICS),
        [*SHARED_BROKER_ARGS, *RETENTION_ARGS],
        request,
    ) as cluster:
        yield cluster
