"""Two clusters that differ in one setting, measured against each other in the same run:
the shape of every overhead benchmark (metrics on or off: metrics_bench.py; TLS and
authentication on or off: ``produce_bench --secure``).

Why two clusters rather than one restarted: both are up for the whole run, and the
publish windows alternate between them (A, B, A, B, ...), so a load that comes and goes on
a shared machine falls on both alike; the ratio is of the medians. The load is
produce_bench's: separate processes with acks=all ProduceStream requests in flight to every
partition's leader.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness import add_cleanup, disk_tempdir
from benchmarks.produce_bench import TOPIC, raftmq_sequential, run_workers, split
from raftmq.devtools.dev_credentials import secure_cluster
from raftmq.devtools.local_cluster import LocalCluster, local_spec

PARTITIONS = 6
PROCS = 2
INFLIGHT = 32
BATCH = 16
VALUE_BYTES = 1024
SPAWN_S = 2.5
"""How long the load processes get to import before their window opens."""


@dataclass
class Side:
    """One of the two clusters: its name in the table, the leader address of each
    partition, its clients' TLS settings, its metrics URLs and its publish rounds."""

    name: str
    cluster: LocalCluster
    targets: list[tuple[str, int]]
    client_settings: dict[str, str]
    metrics_urls: list[str]
    rec_per_s: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rec_per_s)


def start_side(name: str, broker_args: list[str], *, secure: bool = False) -> Side:
    """A 3-broker cluster of PARTITIONS partitions with ``broker_args``; with ``secure``,
    as ``raftmq dev --secure`` runs one: TLS everywhere (mutual), clients authenticated
    (the load by bearer token), the ACL authorizer judging every request."""
    data = disk_tempdir(f"ab-{name.replace(' ', '-')}-", None)
    protected = secure_cluster(data / "tls") if secure else None
    cluster = LocalCluster(
        data,
        local_spec(3, {TOPIC: PARTITIONS}),
        broker_args=[*broker_args, *(protected.broker_args if protected else ())],
        **(protected.cluster_settings() if protected else {}),
    )
    add_cleanup(cluster.close)
    cluster.start()
    leaders = cluster.wait_for_leaders(timeout=60, preferred=True)
    targets = [(leaders[(TOPIC, p)].address, p) for p in range(PARTITIONS)]
    urls = [f"http://{a.metrics}/metrics" for a in cluster.wait_ready().values() if a.metrics]
    settings = {k: str(v) for k, v in cluster.client_tls.items() if v}
    return Side(name, cluster, targets, settings, urls)


def publish(side: Side, warmup_s: float, seconds: float) -> float:
    """Records per second ``side`` acknowledged inside the measured window."""
    start_at = time.monotonic() + SPAWN_S
    targets = side.targets
    kwargs = [
        {
            "targets": targets[i % len(targets) :] + targets[: i % len(targets)],
            "inflight": n,
            "batch": BATCH,
            "value_size": VALUE_BYTES,
            "start_at": start_at,
            "warmup": warmup_s,
            "seconds": seconds,
            "stream": True,
            "client_settings": side.client_settings,
        }
        for i, n in enumerate(split(INFLIGHT, PROCS))
    ]
    results = run_workers("raftmq_produce", kwargs, timeout=warmup_s + seconds + 90)
    errors = sum(r["error_count"] for r in results)
    assert errors == 0, [e for r in results for e in r["errors"]][:3]
    rate = sum(r["records"] for r in results) / seconds
    side.rec_per_s.append(rate)
    return rate


def alternate(
    a: Side,
    b: Side,
    rounds: int,
    warmup_s: float,
    seconds: float,
    around_a: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> float:
    """``rounds`` publish windows on each, alternating; prints each round; the ratio of
    the medians, a to b. ``around_a`` wraps a's windows (metrics_bench scrapes then)."""
    for r in range(rounds):
        with around_a():
            publish(a, warmup_s, seconds)
        publish(b, warmup_s, seconds)
        print(
            f"round {r + 1}: {a.name} {a.rec_per_s[-1]:,.0f} rec/s, "
            f"{b.name} {b.rec_per_s[-1]:,.0f} rec/s",
            flush=True,
        )
    return a.median / b.median


def one_record_latency(side: Side, count: int, max_seconds: float) -> dict[str, Any]:
    """Sequential acks=all one-record produces to partition 0's leader (produce_bench's)."""
    return raftmq_sequential(
        side.targets[0][0], count, max_seconds, VALUE_BYTES, client_settings=side.client_settings
    )


def table(a: Side, b: Side) -> str:
    """The medians and every round of both sides, readable."""
    width = max(len(a.name), len(b.name)) + 2
    lines = [f"{'':<{width}} {'median rec/s':>13}   rounds"]
    for side in (a, b):
        rounds = ", ".join(f"{x:,.0f}" for x in side.rec_per_s)
        lines.append(f"{side.name:<{width}} {side.median:>13,.0f}   {rounds}")
    return "\n".join(lines)
