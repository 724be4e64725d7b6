"""An acknowledged offset commit survives the controller quorum's worst days, with real
processes (issue 20): a voter's data directory wiped and a majority of voters killed and
restarted, in two orders. FetchOffsets then still answers the acknowledged offset, and a
member joining the group resumes there.

Dedicated layout (tests/broker/test_controller_layouts.py): voters 1-3 hold only the
controller's state, so wiping one loses group offsets and nothing of the partitions."""

from __future__ import annotations

import shutil
import time

import pytest

from raftmq.client.consumer import Consumer, ConsumerRecord
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.test_controller_layouts import Dedicated, controller_leader, dedicated

__all__ = ["dedicated"]  # the fixture

pytestmark = pytest.mark.timeout(240)

TOPIC, TP, GROUP = "d", ("d", 0), "g-disk"
SESSION_MS = 3000
NO_LEADER_S = 2.0
"""How long a wiped voter and one that missed the commit are watched not to elect a
leader (many election timeouts: 200 ms here)."""


def produce(cluster: LocalCluster, offsets: range) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in offsets:
            producer.send(TOPIC, f"d{i}".encode(), partition=0).result(timeout=30)


def member(cluster: LocalCluster) -> Consumer:
    return Consumer(
        cluster.addresses,
        group_id=GROUP,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS,
        fetch_max_wait_ms=100,
    )


def poll_count(c: Consumer, count: int, timeout_s: float = 60) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"polled {len(got)} of {count} records"
        got += c.poll(0.2)
    return got


def wipe(cluster: LocalCluster, voter: int) -> None:
    """The voter's whole data directory, as a replaced disk (it is stopped)."""
    shutil.rmtree(cluster.data / f"broker-{voter}")


def restart(cluster: LocalCluster, *voters: int) -> None:
    for v in voters:
        cluster.start(v)
    for v in voters:
        cluster.wait_ready(v)


@pytest.mark.parametrize(
    "order",
    [
        "wipe-then-kill-majority",
        "kill-majority-with-the-wiped",
        "kill-majority-with-the-wiped-starting-alone",
    ],
)
def test_an_acknowledged_commit_survives_a_wiped_voter_and_a_killed_majority(
    dedicated: Dedicated, order: str
) -> None:
    cluster = dedicated(brokers=1)
    with cluster.admin() as admin:
        admin.create_topic(TOPIC, 1, 1)
    produce(cluster, range(30))
    if order.startswith("kill-majority-with-the-wiped"):
        cluster.kill(3)  # the commit is then acknowledged by voters 1 and 2 alone
    with member(cluster) as c:
        c.subscribe([TOPIC])
        assert [r.offset for r in poll_count(c, 30)] == list(range(30))
        c.commit()
        assert c.committed([TP]) == {TP: 30}

    if order == "wipe-then-kill-majority":
        # Voter 1 loses its disk and rejoins; then 2 and 3 die together and come back.
        # Voter 3 may not hold the commit yet: only 2 does, besides the rejoining 1.
        cluster.kill(1)
        wipe(cluster, 1)
        restart(cluster, 1)
        cluster.kill(2)
        cluster.kill(3)
        restart(cluster, 2, 3)
    else:
        # Voters 1 and 2 (the commit's majority) die, 1 losing its disk. 1 and 3 alone
        # must not elect a leader: 3 lacks the commit, and 1 may vote only once it
        # rejoined from a voter holding everything.
        cluster.kill(1)
        cluster.kill(2)
        wipe(cluster, 1)
        # A voter with no data folder asks the others whether the quorum has a past:
        # with 3 serving first, 3 answers. Starting alone, 1 hears from nobody, so it
        # assumes a past and rejoins all the same.
        first, second = (1, 3) if order.endswith("starting-alone") else (3, 1)
        restart(cluster, first)
        restart(cluster, second)
        pair = [cluster.spec.brokers[v].address for v in (1, 3)]
        deadline = time.monotonic() + NO_LEADER_S
        while time.monotonic() < deadline:
            assert controller_leader(pair) == 0, "a wiped voter helped elect a stale leader"
            time.sleep(0.2)
        restart(cluster, 2)

    with Consumer(cluster.addresses, group_id=GROUP) as outside:
        assert outside.committed([TP]) == {TP: 30}  # FetchOffsets at the new leader
    produce(cluster, range(30, 40))
    with member(cluster) as c:
        c.subscribe([TOPIC])
        got = poll_count(c, 10)
        assert [r.offset for r in got] == list(range(30, 40))
        c.commit()
        assert c.committed([TP]) == {TP: 40}
