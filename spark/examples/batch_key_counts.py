"""Batch job: count the records of a raftmq topic per key and write the counts to parquet.

Against `make dev` (or `raftmq dev`), from the repository root:

    .venv/bin/python spark/examples/batch_key_counts.py --out ./key-counts

It reads every committed record of the topic (up to each partition's high watermark when
the job starts), exactly as the same job would with ``format("kafka")``.
"""

from __future__ import annotations

import argparse

from pyspark.sql import functions as F

from raftmq.spark.session import local_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093")
    parser.add_argument("--topic", default="demo")
    parser.add_argument("--out", default="./key-counts", help="parquet folder (overwritten)")
    args = parser.parse_args()
    spark = local_session("raftmq-key-counts")  # registers format("raftmq")
    try:
        records = (
            spark.read.format("raftmq")
            .option("bootstrap", args.bootstrap)
            .option("subscribe", args.topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        counts = records.groupBy(F.col("key").cast("string").alias("key")).count()
        counts.write.mode("overwrite").parquet(args.out)
        written = spark.read.parquet(args.out)
        print(f"{written.count()} keys, {records.count()} records -> {args.out}")
        written.orderBy(F.desc("count"), "key").show(10, truncate=False)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
