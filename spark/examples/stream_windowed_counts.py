"""Streaming job: records per key in 10-second windows of record time, with a 30-second
watermark for late records, printed to the console as micro-batches arrive.

Against `make dev` (or `raftmq dev`), from the repository root; then produce more in
another terminal (`.venv/bin/raftmq demo`) and watch the counts move. Ctrl-C stops it.

    .venv/bin/python spark/examples/stream_windowed_counts.py

``--checkpoint DIR`` keeps the query's offsets there: started again with the same folder
it resumes where it stopped, every record counted once.
"""

from __future__ import annotations

import argparse
import tempfile

from pyspark.sql import functions as F

from raftmq.spark.session import local_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093")
    parser.add_argument("--topic", default="demo")
    parser.add_argument("--checkpoint", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--max-per-batch", default="5000", help="maxOffsetsPerTrigger")
    args = parser.parse_args()
    spark = local_session("raftmq-windowed-counts")  # registers format("raftmq")
    records = (
        spark.readStream.format("raftmq")
        .option("bootstrap", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_per_batch)
        .load()
    )
    counts = (
        records.withWatermark("timestamp", "30 seconds")
        .groupBy(F.window("timestamp", "10 seconds"), F.col("key").cast("string").alias("key"))
        .count()
    )
    query = (
        counts.writeStream.outputMode("update")
        .format("console")
        .option("truncate", "false")
        .option("numRows", "20")
        .option("checkpointLocation", args.checkpoint or tempfile.mkdtemp(prefix="raftmq-"))
        .trigger(processingTime="5 seconds")
        .start()
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
