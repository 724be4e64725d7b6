"""A large topic's creation settles: 1,000 partitions x 3 replicas created through the admin
API (the controller places them) on a 3-broker cluster are each led, by the replica the
first elections picked, and no leadership moves afterwards while nothing fails (issue 22:
with random first elections and early hand-backs, 931 of them were still leaderless after
120 s, and 201 were handed back twice).

Long (``-m long``): opening 3,000 replicas takes a while on a small machine."""

from __future__ import annotations

import time

import grpc
import pytest

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.broker.leadership import SETTLE_SECONDS
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import ClusterFactory

TOPIC = "big"
PARTITIONS = 1000
ALL_LED_TIMEOUT_S = 300.0
TICK_MS = 100
REBALANCE_S = 0.5
"""The test clusters' ``--leader-rebalance-ms``."""

Led = dict[int, tuple[int, int]]
"""Partition: (leader, term), as claimed by the broker that leads it."""


def leaders(cluster: LocalCluster) -> Led:
    """Each partition's leader as the brokers themselves say (the newest term wins): a
    broker's Metadata answer names itself for what it leads."""
    out: Led = {}
    for b in cluster.broker_ids:
        with net.channel(cluster.spec.brokers[b].address) as channel:
            try:
                answer = pb_grpc.BrokerStub(channel).Metadata(
                    pb.MetadataRequest(topics=[TOPIC]), timeout=10.0
                )
            except grpc.RpcError:
                continue
        for topic in answer.topics:
            for p in topic.partitions:
                if p.leader_id == b and p.leader_term > out.get(p.partition, (0, 0))[1]:
                    out[p.partition] = (b, p.leader_term)
    return out


def watch(cluster: LocalCluster, seen: dict[int, list[tuple[int, int]]]) -> Led:
    """One look at the leaders, each partition's new (leader, term) added to ``seen``."""
    now = leaders(cluster)
    for p, led in now.items():
        history = seen.setdefault(p, [])
        if not history or history[-1] != led:
            history.append(led)
    return now


@pytest.mark.long
@pytest.mark.timeout(900)
def test_a_large_creation_is_led_once_and_stays_so(make_cluster: ClusterFactory) -> None:
    # The brokers' default tick: the test clusters' 20 ms ticks make 3,000 groups' timers
    # alone a busy loop on a small machine, which is not what this measures.
    cluster = make_cluster({}, extra_args=["--tick-ms", str(TICK_MS)])
    with cluster.admin() as admin:
        created = admin.create_topic(TOPIC, PARTITIONS, 3)
    preferred = {p.partition: p.replicas[0] for p in created.topic.partitions}
    seen: dict[int, list[tuple[int, int]]] = {}
    deadline = time.monotonic() + ALL_LED_TIMEOUT_S
    while len(now := watch(cluster, seen)) < PARTITIONS:
        assert time.monotonic() < deadline, (
            f"{PARTITIONS - len(now)} partitions still leaderless after {ALL_LED_TIMEOUT_S} s"
        )
        time.sleep(0.5)
    at_all_led = now
    # Past the hand-backs' settle window and a few of their passes: a hand-back due
    # would have started by then.
    end = time.monotonic() + SETTLE_SECONDS + 10 * REBALANCE_S
    while time.monotonic() < end:
        watch(cluster, seen)
        time.sleep(0.5)
    after = watch(cluster, seen)
    moved = {p: (at_all_led[p], after.get(p)) for p in at_all_led if after.get(p) != at_all_led[p]}
    assert not moved, f"{len(moved)} leaderships moved with nothing failing: {moved}"
    twice = {p: h for p, h in seen.items() if len({leader for leader, _ in h}) > 2}
    assert not twice, f"{len(twice)} partitions changed leader more than once: {twice}"
    elsewhere = {p for p, (leader, _) in after.items() if leader != preferred[p]}
    assert not elsewhere, (
        f"{len(elsewhere)} partitions not led by their preferred replica: {sorted(elsewhere)}"
    )
