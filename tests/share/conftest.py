"""Fixtures and helpers for the share group tests with real brokers: one 3-broker cluster
per module (a topic per test), a fresh cluster per test for those that kill brokers, and
the few steps every test takes (set a group's settings, produce numbered records, read a
topic back)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client import AdminClient, Consumer, ConsumerRecord, Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import (
    SHARED_BROKER_ARGS,
    cluster_spec,
    make_cluster,  # a fresh cluster per test, for those that kill brokers
    module_cluster,
)

__all__ = ["make_cluster"]

SHARE_TOPICS = {
    "sbasic": 1,
    "scli": 1,
    "s8": 1,
    "s50": 3,
    "sdlq": 1,
    "sdlq-dead": 1,
    "sbad": 1,
    "srenew": 1,
    "skill": 1,
    "stype": 1,
}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("share-cluster"),
        cluster_spec(SHARE_TOPICS),
        SHARED_BROKER_ARGS,
        request,
    ) as cluster:
        yield cluster


def alter_share_config(cluster: LocalCluster, group: str, settings: dict[str, str]) -> None:
    """Set ``settings`` of share group ``group`` (creating it, empty), as
    ``raftmq share-group alter-config`` does."""
    request = spb.AlterShareGroupConfigRequest(
        group_id=group,
        settings=[spb.ShareGroupSetting(name=k, value=v) for k, v in settings.items()],
    )
    with AdminClient(cluster.addresses) as admin:
        admin._call("AlterShareGroupConfig", request, spb_grpc.ShareGroupsStub)


def earliest_group(cluster: LocalCluster, group: str, **settings: str) -> None:
    """A share group that starts at the log start, with ``settings`` (dots as _)."""
    extra = {"share." + k.replace("_", "."): v for k, v in settings.items()}
    alter_share_config(cluster, group, {"share.auto.offset.reset": "earliest", **extra})


def produce_numbered(
    cluster: LocalCluster, topic: str, count: int, *, partitions: int = 1, prefix: str = "r"
) -> list[bytes]:
    """``count`` records ``<prefix>-<i>`` spread round robin over ``partitions``."""
    values = [f"{prefix}-{i}".encode() for i in range(count)]
    with Producer(cluster.addresses, linger_ms=2) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, partition=i % partitions)
        producer.flush()
    return values


def read_topic(
    cluster: LocalCluster, topic: str, count: int, timeout_s: float = 60
) -> list[ConsumerRecord]:
    """At least ``count`` records of ``topic`` from the start (waiting up to
    ``timeout_s``), and any more that came by then."""
    out: list[ConsumerRecord] = []
    with Consumer(cluster.addresses, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in consumer.partitions_for(topic)])
        deadline = time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < deadline:
            out += consumer.poll(0.5)
        out += consumer.poll(0.3)
    return out


def now_ms() -> int:
    return time.time_ns() // 1_000_000
