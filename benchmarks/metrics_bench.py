"""Metrics overhead benchmark: publish throughput of a 3-broker cluster with Prometheus
metrics on (and scraped every second, as a Prometheus server would) against an identical
cluster started with ``--no-metrics``, in the same run (issue 24's target: metrics cost at
most 5% of publish throughput, a ratio of at least 0.95). The two clusters and their
alternating windows are benchmarks/ab_clusters.py's.

Usage: ``python -m benchmarks.metrics_bench [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import threading
import urllib.request
from typing import Any

from benchmarks import ab_clusters
from benchmarks.harness import add_run_options, kill_on_exit, print_json_last

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
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Scraper:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_options(parser, "3 rounds of 4 s windows per cluster; under a minute")
    args = parser.parse_args(argv)
    kill_on_exit()
    rounds, warmup_s, seconds = (3, 1.0, 4.0) if args.quick else (5, 2.0, 10.0)
    on = ab_clusters.start_side("metrics on", [])
    off = ab_clusters.start_side("metrics off", ["--no-metrics"])
    assert on.metrics_urls and not off.metrics_urls
    print(
        f"3 brokers x 2 clusters, {ab_clusters.PARTITIONS} partitions, "
        f"{ab_clusters.PROCS} load processes, {ab_clusters.INFLIGHT} ProduceStream requests "
        f"of {ab_clusters.BATCH} x {ab_clusters.VALUE_BYTES} B in flight, acks=all; "
        f"metrics scraped every {SCRAPE_EVERY_S:.0f} s on the 'on' cluster"
    )
    scraper = Scraper(on.metrics_urls)
    ratio = ab_clusters.alternate(on, off, rounds, warmup_s, seconds, around_a=lambda: scraper)
    figures: dict[str, Any] = {
        "quick": args.quick,
        "on_rec_per_s": on.rec_per_s,
        "off_rec_per_s": off.rec_per_s,
        "ratio": ratio,
        "ratio_ok": ratio >= TARGET_RATIO,
        "scrapes": scraper.scrapes,
        "scrape_failures": scraper.failures,
    }
    print("\n" + ab_clusters.table(on, off) + "\n")
    verdict = "met" if figures["ratio_ok"] else "MISSED"
    print(
        f"target: publish with metrics >= {TARGET_RATIO}x without: {ratio:.3f}x ({verdict}); "
        f"{scraper.scrapes} scrapes, {scraper.failures} failed; "
        f"machine load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        print_json_last(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
