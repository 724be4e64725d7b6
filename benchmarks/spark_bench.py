"""Spark read benchmark: 1 million 1 KiB records read with ``spark.read.format("raftmq")``
on ``local[2]``, beside the same records read by the plain Python client (Fetch + decode of
every record), so the Spark path's cost is a ratio rather than a machine-dependent number.

Why this shape: a Spark job reads a whole topic in parallel tasks, each fetching large
batches from a partition and handing Arrow batches to the JVM; the plain client is the
floor any Python reader pays (one process fetching and decoding every record). Both read
from the same three brokers (one partition each, one replica: replication does not change
a read), after the data is written and committed, so neither waits for the other.

The Spark query sums the value lengths, so every value crosses into the JVM (a count could
let Spark skip columns; this source does not, but the figure should not depend on that).
The plain client runs in one process on one core; Spark has two task slots, so a ratio
over 1 means Spark's two workers outpaced one client, not that Spark is free.

Usage: ``python -m benchmarks.spark_bench [--quick] [--json] [--records N]``; needs the
``spark`` extra (pyspark, pyarrow) and Java 17+.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    kill_on_exit,
    print_json_last,
)
from raftmq.client import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format.records import Record, build_batch, iter_records
from raftmq.spark.session import local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "bench"
PARTITIONS = 3
RECORD_BYTES = 1024
PER_ENTRY = 900  # 900 KiB entries: under the default max.message.bytes of 1 MiB
ENTRIES_PER_REQUEST = 8
FETCH_BYTES = 8 << 20


def fill(client: LowLevelClient, records: int) -> float:
    """Produce ``records`` 1 KiB records spread over the partitions; seconds taken."""
    started = time.monotonic()
    value = os.urandom(RECORD_BYTES)
    now_ms = int(time.time() * 1000)
    per_partition = records // PARTITIONS
    for p in range(PARTITIONS):
        left = per_partition + (1 if p < records % PARTITIONS else 0)
        while left:
            entries = []
            for _ in range(ENTRIES_PER_REQUEST):
                n = min(PER_ENTRY, left)
                if n == 0:
                    break
                keys = [f"k{left - i}".encode() for i in range(n)]
                entries.append(build_batch([Record(k, value, now_ms) for k in keys]))
                left -= n
            client.produce(TOPIC, p, b"".join(entries))
    return time.monotonic() - started


def read_plain(client: LowLevelClient) -> tuple[int, int, float]:
    """Every record of every partition with the plain client: (records, value bytes, s)."""
    started = time.monotonic()
    count = nbytes = 0
    for p in range(PARTITIONS):
        end = client.fetch(TOPIC, p, 0, max_bytes=1).high_watermark
        offset = 0
        while offset < end:
            resp = client.fetch(TOPIC, p, offset, max_bytes=FETCH_BYTES)
            for rec in iter_records(resp.entries):
                if rec.offset < end:
                    count += 1
                    nbytes += len(rec.value or b"")
            offset = resp.next_offset
    return count, nbytes, time.monotonic() - started


def read_spark(spark: SparkSession, bootstrap: str, ending: str | None) -> tuple[int, int, float]:
    started = time.monotonic()
    reader = spark.read.format("raftmq").option("bootstrap", bootstrap)
    reader = reader.option("subscribe", TOPIC).option("fetchMaxBytes", str(FETCH_BYTES))
    if ending:
        reader = reader.option("endingOffsets", ending)
    row = reader.load().selectExpr("count(*) as n", "sum(length(value)) as b").collect()[0]
    return row.n, row.b or 0, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, "100,000 records instead of 1,000,000; under a minute")
    parser.add_argument("--records", type=int, help="how many 1 KiB records (overrides)")
    parser.add_argument("--dir", help="where the brokers keep data (default: a real disk)")
    args = parser.parse_args(argv)
    kill_on_exit()
    records = args.records or (100_000 if args.quick else 1_000_000)
    work = disk_tempdir("spark-bench-", args.dir)
    cluster = LocalCluster(work, local_spec(3, {TOPIC: PARTITIONS}, replication=1))
    add_cleanup(cluster.close)
    cluster.start()
    cluster.wait_for_leaders(timeout=60)
    bootstrap = ",".join(cluster.addresses)
    print(f"data: {work}; {records:,} records of {RECORD_BYTES} B in {PARTITIONS} partitions")
    with cluster.client() as client:
        fill_s = fill(client, records)
        print(f"produced in {fill_s:.1f} s")
        plain = read_plain(client)
    spark = local_session("raftmq-spark-bench")
    add_cleanup(spark.stop)
    # Warm-up: the first query starts Spark's Python workers and JIT-compiles its code.
    warm = read_spark(spark, bootstrap, json.dumps({TOPIC: {"0": 1000}}))
    figures_spark = read_spark(spark, bootstrap, None)
    for name, (n, _, _) in (("plain client", plain), ("spark", figures_spark)):
        if n != records:
            print(f"error: {name} read {n:,} records, expected {records:,}", file=sys.stderr)
            return 1
    rate_plain = plain[0] / plain[2]
    rate_spark = figures_spark[0] / figures_spark[2]
    ratio = rate_spark / rate_plain
    print()
    print(f"{'reader':<28} {'records':>10} {'seconds':>8} {'records/s':>11} {'MiB/s':>7}")
    for name, (n, b, s) in (
        ("plain Python client (1 core)", plain),
        ("spark local[2]", figures_spark),
    ):
        print(f"{name:<28} {n:>10,} {s:>8.2f} {n / s:>11,.0f} {b / s / 2**20:>7.1f}")
    print(f"\nspark / plain client: {ratio:.2f}x  (warm-up query: {warm[2]:.1f} s)")
    print_json_last(
        {
            "records": records,
            "record_bytes": RECORD_BYTES,
            "partitions": PARTITIONS,
            "quick": args.quick,
            "produce_s": fill_s,
            "plain_s": plain[2],
            "plain_records_per_s": rate_plain,
            "spark_s": figures_spark[2],
            "spark_records_per_s": rate_spark,
            "spark_warmup_s": warm[2],
            "ratio_spark_to_plain": ratio,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
