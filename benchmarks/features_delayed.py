"""The ``delayed`` section of benchmarks.features_bench: delayed delivery
(docs/delayed-delivery.md; issue 25's targets): N delayed messages with random delays up
to 60 s all delivered once, their lateness (p50/p99, target
p99 <= 1 s on a quiet machine), the brokers' memory while they wait (bounded: it must not
grow with N), and the throughput of producing delayed messages against plain ones in the
same run.

On a 3-broker local cluster (one target topic of 6 partitions, 3 replicas, acks=all,
idempotent producer, 100 B records):

1. plain: N records to a plain topic, send and flush; records per second.
2. delayed: N records to the target topic with ``delay_ms`` uniform in [0, max delay]
   (seeded), send and flush; records per second. A consumer reads the target topic
   meanwhile and stamps each record as it arrives: lateness = arrival - deliver-at.
3. wait until all N have arrived (or a deadline): every one delivered, none twice, none
   early; the brokers' RSS is sampled every second, from before the delayed run to the end.

Run as a section of benchmarks.features_bench: ``python -m benchmarks.features_bench
--section delayed [--quick] [--json]`` (``--quick``: 5,000 messages, delays up to 5 s).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    add_cleanup,
    latency_summary,
    say,
)
from raftmq.client import Consumer, Producer
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import delay

TARGET = "delayed"
PLAIN = "plain"
PARTITIONS = 6
RECORD_BYTES = 100
TARGET_P99_S = 1.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Arrivals:
    """A consumer of the target topic on a thread of its own: when each record arrived."""

    def __init__(self, bootstrap: tuple[str, ...]) -> None:
        self.lateness_s: list[float] = []
        self.due_ms: list[int] = []
        self.early = 0
        self.seen: set[bytes] = set()
        self.duplicates = 0
        self._stop = threading.Event()
        self._consumer = Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50)
        self._consumer.assign([(TARGET, p) for p in range(PARTITIONS)])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for r in self._consumer.poll(0.2):
                now_ms = time.time_ns() // 1_000_000
                due = int(dict(r.headers)[delay.DELIVER_AT] or b"0")
                if now_ms < due:
                    self.early += 1
                self.lateness_s.append((now_ms - due) / 1000)
                self.due_ms.append(due)
                value = r.value or b""
                if value in self.seen:
                    self.duplicates += 1
                self.seen.add(value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def produce_run(
    bootstrap: tuple[str, ...], topic: str, delays_ms: list[int] | None, n: int
) -> float:
    """Seconds to send ``n`` records (delayed by ``delays_ms`` when given) and flush."""
    with Producer(bootstrap, linger_ms=5) as producer:
        producer.send(PLAIN, b"warm", partition=0).result(30)
        t0 = time.perf_counter()
        for i in range(n):
            value = b"%09d" % i + b"." * (RECORD_BYTES - 9)
            if delays_ms is None:
                producer.send(topic, value, key=value[:9])
            else:
                producer.send(topic, value, key=value[:9], delay_ms=delays_ms[i])
        producer.flush()
        return time.perf_counter() - t0


def delayed_section(cluster: LocalCluster, quick: bool) -> dict[str, Any]:
    """The ``delayed`` section of benchmarks.features_bench: its figures (printed as a
    table on the way)."""
    n = 5_000 if quick else 100_000
    max_delay_ms = 5_000 if quick else 60_000
    bootstrap = tuple(cluster.addresses)
    pids = {bid: p.pid for bid, p in cluster.procs.items()}
    rng = random.Random(25)
    delays_ms = [rng.randint(0, max_delay_ms) for _ in range(n)]
    print(f"delayed: {n:,} records of {RECORD_BYTES} B, delays 0-{max_delay_ms:,} ms")

    say("plain produce")
    plain_s = produce_run(bootstrap, PLAIN, None, n)
    rss_before = {bid: rss_bytes(pid) for bid, pid in pids.items()}
    arrivals = Arrivals(bootstrap)
    add_cleanup(arrivals.close)
    say("delayed produce")
    delayed_s = produce_run(bootstrap, TARGET, delays_ms, n)
    produced_ms = time.time_ns() // 1_000_000
    rss_peak = dict(rss_before)
    deadline = time.monotonic() + max_delay_ms / 1000 + 120
    say("waiting for every delayed record")
    while len(arrivals.seen) < n and time.monotonic() < deadline:
        time.sleep(1)
        for bid, pid in pids.items():
            rss_peak[bid] = max(rss_peak[bid], rss_bytes(pid))
    time.sleep(1)  # a duplicate arriving late would show now
    arrivals.close()

    lateness = latency_summary([max(0.0, x) for x in arrivals.lateness_s])
    # Records due once every send was stored: their lateness is the movers' alone, not
    # the wait of records queued behind the producer's (a loaded machine's ingest).
    after = [
        max(0.0, x)
        for x, due in zip(arrivals.lateness_s, arrivals.due_ms, strict=True)
        if due > produced_ms + 1_000
    ]
    lateness_after = latency_summary(after)
    figures: dict[str, Any] = {
        "messages": n,
        "max_delay_ms": max_delay_ms,
        "quick": quick,
        "delivered": len(arrivals.seen),
        "duplicates": arrivals.duplicates,
        "early": arrivals.early,
        "lateness": lateness,
        "lateness_due_after_produce": lateness_after,
        "p99_ok": lateness["p99_ms"] <= TARGET_P99_S * 1000,
        "plain_rec_per_s": n / plain_s,
        "delayed_rec_per_s": n / delayed_s,
        "delayed_vs_plain": plain_s / delayed_s,
        "rss_before_mib": {str(b): v / 2**20 for b, v in rss_before.items()},
        "rss_peak_mib": {str(b): v / 2**20 for b, v in rss_peak.items()},
    }
    print(
        f"\ndelivered {len(arrivals.seen):,} of {n:,}; duplicates {arrivals.duplicates}; "
        f"early {arrivals.early}"
    )
    print(
        f"lateness p50 {lateness['p50_ms']:.0f} ms, p99 {lateness['p99_ms']:.0f} ms, "
        f"max {lateness['max_ms']:.0f} ms (target p99 <= {TARGET_P99_S * 1000:.0f} ms: "
        f"{'met' if figures['p99_ok'] else 'MISSED'})"
    )
    print(
        f"  of the {lateness_after['count']:,} due after the last send was stored: p50 "
        f"{lateness_after['p50_ms']:.0f} ms, p99 {lateness_after['p99_ms']:.0f} ms"
    )
    print(
        f"produce: plain {n / plain_s:,.0f} rec/s, delayed {n / delayed_s:,.0f} rec/s "
        f"({plain_s / delayed_s:.2f}x)"
    )
    for bid in sorted(pids):
        print(
            f"broker {bid} RSS: {rss_before[bid] / 2**20:.0f} MiB before, "
            f"{rss_peak[bid] / 2**20:.0f} MiB peak"
        )
    figures["all_once_never_early"] = (
        len(arrivals.seen) == n and not arrivals.duplicates and not arrivals.early
    )
    return figures
