"""Metrics overhead benchmark: publish throughput of a 3-broker cluster with Prometheus
metrics on (and scraped every second, as a Prometheus server would) against an identical
cluster started with ``--no-metrics``, in the same run (issue 24's target: metrics cost at
most 5% of publish throughput, a ratio of at least 0.95).

Why two clusters rather than one restarted: both are up for the whole run, and the
publish windows alternate between them (on, off, on, off, ...), so a load that comes and
goes on a shared machine falls on both alike. The load is produce_bench's: separate
processes with acks=all ProduceStream requests in flight to every partition's leader.

Usage: ``python -m benchmarks.metrics_bench [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import urllib.request
from typing import Any

from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    kill_on_exit,
    print_json_last,
)
from benchmarks.produce_bench import TOPIC, run_workers, split
from raftmq.devtools.local_cluster import LocalCluster, local_spec

PARTITIONS = 6
PROCS = 2
INFLIGHT = 32
BATCH = 16
VALUE_BYTES = 1024
SCRAPE_EVERY_S = 1.0
TARGET_RATIO = 0.95


class Scraper:
    """Scrapes every broker's /metrics every SCRAPE_EVERY_S while running, as Prometheus
    would (a scrape costs the broker's event loop a read of every replica)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY_S):
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=5) as answer:
                        answer.read()
                    self.scrapes += 1
                except OSError:
                    self.failures += 1


def start(kind: str, metrics: bool) -> tuple[LocalCluster, list[tuple[str, int]], list[str]]:
    """A cluster, the leader address of each partition, and its metrics URLs."""
    data = disk_tempdir(f"metrics-bench-{kind}-", None)
    args = [] if metrics else ["--no-metrics"]
    cluster = LocalCluster(data, local_spec(3, {TOPIC: PARTITIONS}), broker_args=args)
    add_cleanup(cluster.close)
    cluster.start()
    leaders = cluster.wait_for_leaders(timeout=60, preferred=True)
    targets = [(leaders[(TOPIC, p)].address, p) for p in range(PARTITIONS)]
    urls = [f"http://{a.metrics}/metrics" for a in cluster.wait_ready().values() if a.metrics]
    assert bool(urls) == metrics, (kind, urls)
    return cluster, targets, urls


def publish(targets: list[tuple[str, int]], warmup_s: float, seconds: float) -> float:
    """Records per second acknowledged inside the measured window."""
    start_at = time.monotonic() + 3.0  # spawned processes need a moment to import
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
        }
        for i, n in enumerate(split(INFLIGHT, PROCS))
    ]
    results = run_workers("raftmq_produce", kwargs, timeout=warmup_s + seconds + 90)
    errors = sum(r["error_count"] for r in results)
    assert errors == 0, [e for r in results for e in r["errors"]][:3]
    return sum(r["records"] for r in results) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_options(parser, "3 rounds of 4 s windows per cluster; under a minute")
    args = parser.parse_args(argv)
    kill_on_exit()
    rounds, warmup_s, seconds = (3, 1.0, 4.0) if args.quick else (5, 2.0, 10.0)
    _, on_targets, urls = start("on", metrics=True)
    _, off_targets, _ = start("off", metrics=False)
    print(
        f"3 brokers x 2 clusters, {PARTITIONS} partitions, {PROCS} load processes, "
        f"{INFLIGHT} ProduceStream requests of {BATCH} x {VALUE_BYTES} B in flight, acks=all; "
        f"metrics scraped every {SCRAPE_EVERY_S:.0f} s on the 'on' cluster"
    )
    on: list[float] = []
    off: list[float] = []
    scrapes = failures = 0
    for r in range(rounds):
        with Scraper(urls) as scraper:
            on.append(publish(on_targets, warmup_s, seconds))
        scrapes += scraper.scrapes
        failures += scraper.failures
        off.append(publish(off_targets, warmup_s, seconds))
        print(f"round {r + 1}: metrics on {on[-1]:,.0f} rec/s, off {off[-1]:,.0f} rec/s")
    ratio = statistics.median(on) / statistics.median(off)
    figures: dict[str, Any] = {
        "quick": args.quick,
        "on_rec_per_s": on,
        "off_rec_per_s": off,
        "ratio": ratio,
        "ratio_ok": ratio >= TARGET_RATIO,
        "scrapes": scrapes,
        "scrape_failures": failures,
    }
    print(
        f"\n{'':<12} {'median rec/s':>13} {'rounds':>30}\n"
        f"{'metrics on':<12} {statistics.median(on):>13,.0f} "
        f"{', '.join(f'{x:,.0f}' for x in on):>30}\n"
        f"{'metrics off':<12} {statistics.median(off):>13,.0f} "
        f"{', '.join(f'{x:,.0f}' for x in off):>30}\n"
    )
    verdict = "met" if figures["ratio_ok"] else "MISSED"
    print(
        f"target: publish with metrics >= {TARGET_RATIO}x without: {ratio:.3f}x ({verdict}); "
        f"{scrapes} scrapes, {failures} failed; machine load average {os.getloadavg()[0]:.2f}"
    )
    print_json_last(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
