"""Transactions benchmark: what exactly-once costs, against the idempotent producer in the
same run, so the price is a ratio (issue 23's target: at least 0.8x the idempotent
producer's throughput with 1,000 records per transaction).

Phases, on a 3-broker local cluster (one topic, 3 partitions, 3 replicas, acks=all,
1 KiB records):

1. throughput: the idempotent Producer sends N records and flushes; a transactional
   Producer sends the same N records in transactions of 10, 100 and 1,000 records
   (begin, sends, commit), over the same partitions. The two alternate per size, so a
   load that comes and goes on a shared machine falls on both alike. Between them, the
   *flush floor*: the idempotent Producer flushing after every 10, 100 or 1,000 records.
   A transaction must have every record stored before it commits, so the pipeline
   empties once per transaction whatever the protocol; the floor's ratio to the
   idempotent run is the most any transactional producer could reach here, and the
   transactional run's ratio to the floor is the price of the protocol itself.
2. commit latency: a transaction of one record to each of the 3 partitions, committed
   and waited for, one after another: the time of ``commit_transaction()`` alone (the
   flush of its records, EndTxn on the controller, the decision made durable) and of
   the whole transaction (begin to commit).

Usage: ``python -m benchmarks.txn_bench [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    kill_on_exit,
    latency_summary,
    print_json_last,
)
from raftmq.client import Producer
from raftmq.devtools.local_cluster import LocalCluster, local_spec

TOPIC = "bench"
PARTITIONS = 3
RECORD_BYTES = 1024
SIZES = (10, 100, 1000)
TARGET_RATIO_AT_1000 = 0.8


def idempotent_run(
    bootstrap: tuple[str, ...], records: int, value: bytes, flush_every: int | None = None
) -> float:
    """Seconds to store ``records`` with the idempotent producer: send all and flush, or
    with ``flush_every``, flush after each that many (the points where a transaction must
    have its records stored before it commits)."""
    step = flush_every or records
    with Producer(bootstrap, linger_ms=5) as producer:
        producer.send(TOPIC, value, partition=0).result(30)  # connections warm, untimed
        t0 = time.perf_counter()
        for start in range(0, records, step):
            for i in range(start, min(start + step, records)):
                producer.send(TOPIC, value, partition=i % PARTITIONS)
            producer.flush()
        return time.perf_counter() - t0


def transactional_run(
    bootstrap: tuple[str, ...], records: int, per_txn: int, value: bytes, txn_id: str
) -> float:
    """Seconds to store ``records`` in committed transactions of ``per_txn`` records."""
    with Producer(bootstrap, linger_ms=5, transactional_id=txn_id) as producer:
        producer.init_transactions()
        t0 = time.perf_counter()
        sent = 0
        while sent < records:
            producer.begin_transaction()
            for i in range(min(per_txn, records - sent)):
                producer.send(TOPIC, value, partition=(sent + i) % PARTITIONS)
            sent += min(per_txn, records - sent)
            producer.commit_transaction()
        return time.perf_counter() - t0


def commit_latency(
    bootstrap: tuple[str, ...], samples: int, value: bytes
) -> tuple[list[float], list[float]]:
    """(commit_transaction() seconds, whole transaction seconds) per sample: one record
    to each partition per transaction."""
    commits, wholes = [], []
    with Producer(bootstrap, linger_ms=0, transactional_id="bench-latency") as producer:
        producer.init_transactions()
        for i in range(samples + 5):
            t0 = time.perf_counter()
            producer.begin_transaction()
            for p in range(PARTITIONS):
                producer.send(TOPIC, value, partition=p)
            t1 = time.perf_counter()
            producer.commit_transaction()
            t2 = time.perf_counter()
            if i >= 5:  # the first few warm connections and the coordinator's caches
                commits.append(t2 - t1)
                wholes.append(t2 - t0)
    return commits, wholes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_options(parser, "3,000 records per run and 50 commit samples; under a minute")
    parser.add_argument("--dir", help="where the brokers keep data (default: a real disk)")
    args = parser.parse_args(argv)
    kill_on_exit()
    records = 3_000 if args.quick else 30_000
    samples = 50 if args.quick else 500
    work = disk_tempdir("txn-bench-", args.dir)
    cluster = LocalCluster(work, local_spec(3, {TOPIC: PARTITIONS}))
    add_cleanup(cluster.close)
    cluster.start()
    cluster.wait_for_leaders(timeout=60, preferred=True)
    bootstrap = tuple(cluster.addresses)
    value = os.urandom(RECORD_BYTES)
    print(
        f"data: {work}; {records:,} records of {RECORD_BYTES} B per run over {PARTITIONS} "
        "partitions, acks=all"
    )

    figures: dict[str, Any] = {"records": records, "quick": args.quick, "sizes": {}}
    rows = []
    for n in SIZES:
        idem_s = idempotent_run(bootstrap, records, value)
        floor_s = idempotent_run(bootstrap, records, value, flush_every=n)
        txn_s = transactional_run(bootstrap, records, n, value, f"bench-{n}")
        ratio = idem_s / txn_s
        figures["sizes"][str(n)] = {
            "idempotent_rec_per_s": records / idem_s,
            "flush_floor_rec_per_s": records / floor_s,
            "transactional_rec_per_s": records / txn_s,
            "ratio": ratio,
            "ceiling": idem_s / floor_s,
            "ratio_to_floor": floor_s / txn_s,
            "transactions_per_s": records / n / txn_s,
        }
        rows.append((n, idem_s, floor_s, txn_s))
    commits, wholes = commit_latency(bootstrap, samples, value)
    figures["commit"] = latency_summary(commits)
    figures["transaction"] = latency_summary(wholes)
    figures["ratio_at_1000"] = figures["sizes"]["1000"]["ratio"]
    figures["ratio_at_1000_ok"] = figures["ratio_at_1000"] >= TARGET_RATIO_AT_1000

    print(
        f"\n{'records/txn':>11} {'idempotent':>11} {'flush floor':>12} {'transactional':>14} "
        f"{'txn/s':>7} {'ratio':>6} {'ceiling':>8} {'vs floor':>9}"
    )
    for n, idem_s, floor_s, txn_s in rows:
        print(
            f"{n:>11,} {records / idem_s:>11,.0f} {records / floor_s:>12,.0f} "
            f"{records / txn_s:>14,.0f} {records / n / txn_s:>7,.1f} {idem_s / txn_s:>5.2f}x "
            f"{idem_s / floor_s:>7.2f}x {floor_s / txn_s:>8.2f}x"
        )
    print(
        "(records per second; ratio = transactional / idempotent; ceiling = flush floor / "
        "idempotent, the most\n a producer that stores its records at each commit can reach; "
        "vs floor = transactional / flush floor)"
    )
    c, w = figures["commit"], figures["transaction"]
    print(f"\ntransactions of 1 record to each of {PARTITIONS} partitions, {samples} samples:")
    print(f"  commit_transaction()   p50 {c['p50_ms']:6.2f} ms   p99 {c['p99_ms']:6.2f} ms")
    print(f"  begin .. commit        p50 {w['p50_ms']:6.2f} ms   p99 {w['p99_ms']:6.2f} ms")
    verdict = "met" if figures["ratio_at_1000_ok"] else "MISSED"
    at_1000 = figures["sizes"]["1000"]
    print(
        f"\ntarget: transactional >= {TARGET_RATIO_AT_1000}x idempotent at 1,000 records per "
        f"transaction: {figures['ratio_at_1000']:.2f}x ({verdict}; the flush floor's ceiling "
        f"is {at_1000['ceiling']:.2f}x, and the transactions reach "
        f"{at_1000['ratio_to_floor']:.2f}x of it)"
    )
    print(f"machine load average: {os.getloadavg()[0]:.2f}")
    print_json_last(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
