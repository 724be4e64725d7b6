"""Each broker's Prometheus metrics, scraped while the faults run, recorded beside the
workload's ops: a ``metrics`` op per broker and scrape, whose ``value`` is
``under_replicated,leaderless,failed`` (the broker's ``raftmq_broker_*`` gauges,
docs/metrics.md).

Why: an operator learns of faults from these series, not from a checker; a run shows
that they rise while faults hold replicas back and fall once the faults heal (the
checker's summary and the report say by how much, before and after healing). The
address comes from each broker's ``ready.json`` at every scrape, since a restarted broker
binds a new metrics port.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from chaos.history import Op
from chaos.workload import Recorder
from raftmq.broker import ready_file

SCRAPE_S = 1.0
TIMEOUT_S = 0.5
GAUGES = (
    "raftmq_broker_under_replicated_partitions",
    "raftmq_broker_leaderless_partitions",
    "raftmq_broker_failed_replicas",
)


def scrape(data_dir: Path, timeout_s: float = TIMEOUT_S) -> tuple[int, int, int] | None:
    """The broker's GAUGES, or None when it has no metrics address or does not answer."""
    bound = ready_file.read(data_dir)
    if bound is None or not bound.metrics:
        return None
    try:
        url = f"http://{bound.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            text = answer.read().decode()
    except (OSError, urllib.error.URLError, ValueError):
        return None
    values = dict.fromkeys(GAUGES, 0)
    for family in text_string_to_metric_families(text):
        if family.name in values and family.samples:
            values[family.name] = int(family.samples[0].value)
    under, leaderless, failed = (values[name] for name in GAUGES)
    return under, leaderless, failed


class MetricsWatch:
    """Scrapes every broker on a thread until :meth:`stop`."""

    def __init__(self, data_dirs: dict[int, Path], recorder: Recorder) -> None:
        self.data_dirs = data_dirs
        self.recorder = recorder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_S):
            for broker_id, data_dir in self.data_dirs.items():
                got = scrape(data_dir)
                if got is None:
                    continue
                now = self.recorder.now()
                value = ",".join(map(str, got))
                self.recorder.add(
                    Op("metrics", f"metrics-{broker_id}", -1, value, start=now, end=now)
                )
