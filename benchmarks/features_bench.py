"""Message-feature benchmarks (issue 25), one section per feature, on a 3-broker local
cluster (3 replicas, acks=all).

Sections (``--section NAME``, repeatable; all by default):

- ``tags``: a topic where 1% of the records carry a tag that matches. A consumer with
  ``tag_filter`` reads the whole topic, and so does one without; compared: the bytes the
  brokers read from segment files for them (``raftmq_fetch_read_bytes_total``, target:
  the filtered one reads at most 5% of the unfiltered one's) and the time from the first
  poll to the position at the log end (target: at least 10x faster), with the records the
  filtered consumer got checked against what was sent.
- ``delayed``: N delayed messages with random delays (100,000 up to 60 s; ``--quick``
  5,000 up to 5 s) all delivered once and never early, their lateness p50/p99 (target
  p99 <= 1 s on a quiet machine), the brokers' RSS while they wait, and delayed against
  plain produce throughput in the same run (benchmarks/features_delayed.py).

Usage: ``python -m benchmarks.features_bench [--quick] [--json] [--section tags|delayed]``;
``--json`` prints every figure as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks import features_delayed
from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    kill_on_exit,
    print_json_last,
    say,
)
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import Consumer, Producer
from raftmq.devtools.local_cluster import LocalCluster, local_spec

TAG_TOPIC = "tagged"
MATCH_EVERY = 100  # 1% of the records carry the tag that matches
READ_RATIO_TARGET = 0.05
SPEEDUP_TARGET = 10.0


@dataclass(frozen=True, slots=True)
class Context:
    """What every section gets: the running cluster, its metrics addresses, the mode."""

    cluster: LocalCluster
    metrics: dict[int, str]
    quick: bool


def read_bytes(ctx: Context) -> dict[str, float]:
    """``raftmq_fetch_read_bytes_total`` summed over the brokers, by ``filtered``."""
    out = {"true": 0.0, "false": 0.0}
    for address in ctx.metrics.values():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "raftmq_fetch_read_bytes_total":
                    out[s.labels["filtered"]] += s.value
    return out


def read_to_end(ctx: Context, end: int, tag_filter: str | None) -> tuple[float, int]:
    """(seconds, records polled) for a consumer to reach ``end`` from the beginning."""
    with Consumer(
        ctx.cluster.addresses,
        auto_offset_reset="earliest",
        max_poll_records=10_000,
        tag_filter=tag_filter,
    ) as consumer:
        tp = (TAG_TOPIC, 0)
        consumer.assign([tp])
        got = 0
        t0 = time.perf_counter()
        while (consumer.position(tp) or 0) < end:
            got += len(consumer.poll(0.2))
            if time.perf_counter() - t0 > 300:
                raise TimeoutError(f"reading {TAG_TOPIC} did not reach offset {end} in 300 s")
        return time.perf_counter() - t0, got


def tags_section(ctx: Context) -> dict[str, Any]:
    records = 100_000 if ctx.quick else 400_000
    value = os.urandom(512)
    say(f"tags: producing {records:,} records of {len(value)} B, 1 in {MATCH_EVERY} tagged")
    with Producer(ctx.cluster.addresses, linger_ms=5) as producer:
        for i in range(records):
            tags = ["match"] if i % MATCH_EVERY == 0 else None
            producer.send(TAG_TOPIC, value, tags=tags, partition=0)
        producer.flush()
    matching = len(range(0, records, MATCH_EVERY))
    with ctx.cluster.client() as client:
        end = client.list_offsets(TAG_TOPIC, 0, position=pb.LATEST).high_watermark
    runs: dict[str, dict[str, float]] = {}
    for name, expression in (("unfiltered", None), ("filtered", "match"), ("unfiltered", None)):
        before = read_bytes(ctx)
        seconds, got = read_to_end(ctx, end, expression)
        after = read_bytes(ctx)
        key = "true" if expression else "false"
        if expression and got != matching:
            raise AssertionError(f"the filtered consumer got {got} records, {matching} match")
        if not expression and got != records:
            raise AssertionError(f"the unfiltered consumer got {got} of {records} records")
        run = {"seconds": seconds, "read_bytes": after[key] - before[key], "records": got}
        # The second unfiltered run reads a warm page cache, as the filtered one does:
        # the better of the two is the one compared.
        if name not in runs or run["seconds"] < runs[name]["seconds"]:
            runs[name] = run
        say(f"tags: {name}: {got:,} records in {seconds:.3f} s, {run['read_bytes']:,.0f} B read")
    read_ratio = runs["filtered"]["read_bytes"] / max(runs["unfiltered"]["read_bytes"], 1)
    speedup = runs["unfiltered"]["seconds"] / max(runs["filtered"]["seconds"], 1e-9)
    figures = {
        "records": records,
        "matching": matching,
        "unfiltered": runs["unfiltered"],
        "filtered": runs["filtered"],
        "read_ratio": read_ratio,
        "read_ratio_ok": read_ratio <= READ_RATIO_TARGET,
        "speedup": speedup,
        "speedup_ok": speedup >= SPEEDUP_TARGET,
    }
    u, f = runs["unfiltered"], runs["filtered"]
    print(f"\ntags: {records:,} records, {matching:,} matching (1 in {MATCH_EVERY})")
    print(f"{'':12} {'records':>9} {'seconds':>9} {'bytes read by brokers':>22}")
    print(f"{'unfiltered':12} {u['records']:>9,.0f} {u['seconds']:>9.3f} {u['read_bytes']:>22,.0f}")
    print(f"{'filtered':12} {f['records']:>9,.0f} {f['seconds']:>9.3f} {f['read_bytes']:>22,.0f}")
    print(
        f"bytes read: filtered / unfiltered = {read_ratio:.4f} (target <= {READ_RATIO_TARGET}: "
        f"{'met' if figures['read_ratio_ok'] else 'MISSED'}); end to end: {speedup:.1f}x faster "
        f"(target >= {SPEEDUP_TARGET:.0f}x: {'met' if figures['speedup_ok'] else 'MISSED'})"
    )
    return figures


SECTIONS: dict[str, tuple[dict[str, int], Callable[[Context], dict[str, Any]]]] = {
    "tags": ({TAG_TOPIC: 1}, tags_section),
    "delayed": (
        {features_delayed.TARGET: features_delayed.PARTITIONS, features_delayed.PLAIN: 6},
        lambda ctx: features_delayed.delayed_section(ctx.cluster, ctx.quick),
    ),
}
"""Each section: the topics it needs (name: partitions) and what it runs."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_options(parser, "fewer records per section; under a minute")
    parser.add_argument(
        "--section",
        action="append",
        choices=sorted(SECTIONS),
        help="run only this section (repeatable; default: every one)",
    )
    parser.add_argument("--dir", help="where the brokers keep data (default: a real disk)")
    args = parser.parse_args(argv)
    kill_on_exit()
    chosen = args.section or list(SECTIONS)
    topics: dict[str, int] = {}
    for name in chosen:
        topics.update(SECTIONS[name][0])
    work = disk_tempdir("features-bench-", args.dir)
    cluster = LocalCluster(work, local_spec(3, topics))
    add_cleanup(cluster.close)
    cluster.start()
    bound = cluster.wait_ready()
    cluster.wait_for_leaders(timeout=60, preferred=True)
    metrics = {bid: a.metrics for bid, a in bound.items() if a.metrics}
    ctx = Context(cluster, metrics, args.quick)
    print(f"data: {work}; sections: {', '.join(chosen)}")
    figures: dict[str, Any] = {"quick": args.quick}
    for name in chosen:
        figures[name] = SECTIONS[name][1](ctx)
    print(f"machine load average: {os.getloadavg()[0]:.2f}")
    print_json_last(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
