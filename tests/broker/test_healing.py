"""The cluster heals itself, end to end with real brokers: a broker SIGKILLed for good is
replaced on the others; a broker added later gets its share from ``raftmq cluster
rebalance``; ``raftmq broker drain`` empties a broker. Each time, records are produced
with acks=all throughout, and afterwards every acknowledged record is read back from
every replica of its partition, on its own broker."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.errors import ClientError
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from tests.broker.conftest import REBALANCE_ARGS, log_tails
from tests.broker.test_broker_cluster import read_all, wait_until

pytestmark = pytest.mark.timeout(300)
TOPIC = "heal"
HEAL_TIMEOUT_S = 150.0
RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]
ARGS = ["--tick-ms", "20", "--election-ticks", "10", "--heal-delay-ms", "1000", *REBALANCE_ARGS]


@pytest.fixture
def make(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[LocalCluster]]:
    clusters: list[LocalCluster] = []
    yield clusters
    rep = getattr(request.node, "rep_call", None)
    for c in clusters:
        if rep is not None and rep.failed:
            print(log_tails(c, 60))
        for bid in list(c.procs):
            c.kill(bid)
        c.close()


def start(
    clusters: list[LocalCluster], tmp_path: Path, brokers: int, assignment: list[tuple[int, ...]]
) -> LocalCluster:
    cluster = LocalCluster(
        tmp_path / "c", local_spec(brokers, {}, name="raftmq-test"), broker_args=ARGS
    )
    clusters.append(cluster)
    cluster.start()
    cluster.wait_for_leaders()
    with cluster.admin() as admin:
        admin.create_topic(TOPIC, len(assignment), 3, {}, assignment=assignment)
    with cluster.client() as client:
        wait_until(
            lambda: all(
                (TOPIC, p) in client.refresh_leaders(timeout=1.0) for p in range(len(assignment))
            ),
            30,
            "a leader for every partition",
        )
    return cluster


class Load:
    """acks=all records to every partition from a thread, through the Producer (which
    follows leaders and retries); remembers what each acknowledged answer said."""

    def __init__(self, cluster: LocalCluster, partitions: int) -> None:
        self.producer = Producer(cluster.addresses, linger_ms=2, retries=100)
        self.partitions = partitions
        self.acked: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            sent = []
            for p in range(self.partitions):
                value = f"p{p}-r{n}".encode() * 10
                sent.append((p, value, self.producer.send(TOPIC, value, partition=p)))
            n += 1
            for p, value, fut in sent:
                try:
                    meta = fut.result(timeout=60)
                except (ClientError, TimeoutError):
                    self.failed += 1  # not acknowledged: not counted
                    continue
                self.acked[p][meta.offset] = value
            self._stop.wait(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self.producer.close(timeout=30)


def check_every_replica(cluster: LocalCluster, load: Load) -> None:
    """Each partition's every replica (as the metadata lists them now) holds every
    acknowledged record at the offset its answer gave."""
    assert all(load.acked.values()), f"a partition got no acknowledged record: {load.acked}"
    with cluster.admin() as admin:
        parts = admin.describe_topic(TOPIC).partitions
    with cluster.client() as client:
        for part in parts:
            acked = load.acked[part.partition]
            for b in part.replicas:
                address = cluster.spec.brokers[b].address

                def held(a: str = address, p: int = part.partition) -> dict[int, bytes | None]:
                    return {r.offset: r.value for r in read_all(client, TOPIC, p, address=a)[0]}

                last = max(acked)
                wait_until(
                    lambda last=last, held=held: last in held(),
                    30,
                    f"broker {b}'s replica of partition {part.partition} to catch up",
                )
                found = held()
                missing = [o for o, v in acked.items() if found.get(o) != v]
                assert not missing, (
                    f"broker {b}'s replica of {TOPIC}/{part.partition} lacks acknowledged "
                    f"offsets {missing[:5]} (of {len(missing)})"
                )


def status(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    with cluster.admin() as admin:
        return admin.cluster_status()


def replicas_per_broker(cluster: LocalCluster) -> Counter[int]:
    with cluster.admin() as admin:
        parts = admin.describe_topic(TOPIC).partitions
    return Counter(b for part in parts for b in part.replicas)


def test_a_broker_killed_for_good_is_replaced_on_the_others(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = start(make, tmp_path, 4, [(1, 2, 3), (2, 3, 1), (3, 1, 2)])
    with Load(cluster, 3) as load:
        wait_until(lambda: all(len(a) > 20 for a in load.acked.values()), 30, "records")
        cluster.kill(3)  # and never restarted

        def healed() -> bool:
            s = status(cluster)
            if s.under_replicated or s.moves:
                return False
            with cluster.admin() as admin:
                parts = admin.describe_topic(TOPIC).partitions
            return all(
                len(p.replicas) == 3 and set(p.replicas) <= {1, 2, 4} and not p.learners
                for p in parts
            )

        wait_until(healed, HEAL_TIMEOUT_S, "every partition back at 3 replicas on 1, 2, 4")
        before = {p: len(a) for p, a in load.acked.items()}
        wait_until(
            lambda: all(len(load.acked[p]) > before[p] + 5 for p in before),
            30,
            "records acknowledged after the healing",
        )
    check_every_replica(cluster, load)


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    bootstrap = ["--bootstrap", ",".join(cluster.controller_addresses)]
    return subprocess.run(
        [*RAFTMQ, *args, *bootstrap], capture_output=True, text=True, timeout=240, check=False
    )


def test_a_new_broker_gets_its_share_from_a_rebalance(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = start(make, tmp_path, 3, [(1, 2, 3), (2, 3, 1), (3, 1, 2)] * 2)
    with Load(cluster, 6) as load:
        wait_until(lambda: all(len(a) > 10 for a in load.acked.values()), 30, "records")
        new = cluster.add_broker()
        wait_until(
            lambda: any(b.id == new for b in status(cluster).cluster.brokers),
            30,
            f"broker {new} registered",
        )
        done = cli(cluster, "cluster", "rebalance")
        assert done.returncode == 0, done.stdout + done.stderr
    loads = replicas_per_broker(cluster)
    assert set(loads) == {1, 2, 3, 4} and max(loads.values()) - min(loads.values()) <= 1, loads
    assert not status(cluster).rebalance_requested
    check_every_replica(cluster, load)


def test_a_drained_broker_holds_nothing_and_nothing_is_lost(make, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = start(make, tmp_path, 4, [(1, 2, 4), (2, 4, 3), (4, 3, 1), (3, 1, 2)])
    with Load(cluster, 4) as load:
        wait_until(lambda: all(len(a) > 10 for a in load.acked.values()), 30, "records")
        done = cli(cluster, "broker", "drain", "4")
        assert done.returncode == 0, done.stdout + done.stderr
    loads = replicas_per_broker(cluster)
    assert loads[4] == 0 and sum(loads.values()) == 12, loads
    check_every_replica(cluster, load)
