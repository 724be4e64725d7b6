"""Fixtures for the client tests that need brokers: one real 3-broker cluster per module,
and a fresh cluster per test for the tests that kill brokers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import (
    SHARED_BROKER_ARGS,
    cluster_spec,
    make_cluster,  # a fresh cluster per test, for those that kill brokers
    module_cluster,
)

__all__ = ["make_cluster"]

# One topic per test of the shared cluster.
CLIENT_TOPICS = {
    "p": 3,
    "z": 2,
    "a0": 1,
    "hold": 1,
    "async": 2,
    "c": 2,
    "cl": 1,
    "cs": 1,
    "cp": 2,
    "ce": 1,
    "cb": 3,
    "ca": 1,
    "cli": 2,
    "clig": 2,
    "clit": 2,
    "tg": 1,
    "tgbad": 1,
    "tgpoll": 1,
    "tgcli": 1,
    "rq": 1,
    "rk": 1,
    "rc": 2,
    "rb": 1,
    "rw": 1,
    "rf": 1,
    "ra": 1,
}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("client-cluster"),
        cluster_spec(CLIENT_TOPICS),
        SHARED_BROKER_ARGS,
        request,
    ) as cluster:
        yield cluster
