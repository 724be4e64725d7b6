"""What the delivery-semantics examples share: their flags, the topic they create, the
records they produce first, and the "processing" they do (a line appended to a file,
flushed, so a crash shows exactly what was processed)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import AdminClient, ClientError, Consumer, ConsumerRecord, Producer
from raftmq.client.consumer import IsolationLevel

DEV_BOOTSTRAP = "127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093"
"""The brokers of `raftmq dev` (`make dev`)."""


def parse_args(doc: str, topic: str, *, extra_out_topic: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if extra_out_topic:
        parser.add_argument("--out-topic", default="", help="where outputs go (TOPIC-out)")
    parser.add_argument("--bootstrap", default=DEV_BOOTSTRAP, help="brokers host:port,...")
    parser.add_argument("--topic", default=topic)
    parser.add_argument("--group", default=f"{topic}-processor")
    parser.add_argument("--records", type=int, default=20, help="produce this many first")
    parser.add_argument(
        "--crash-after", type=int, default=0, help="die (exit 3) after this many records"
    )
    parser.add_argument("--idle-s", type=float, default=5.0, help="stop after this long idle")
    parser.add_argument("--session-timeout-ms", type=int, default=10_000)
    parser.add_argument("--out", default="-", help="append processed records here (- stdout)")
    return parser.parse_args()


def ensure_topic(bootstrap: list[str], topic: str, partitions: int = 3) -> None:
    """Create the topic if it is new, and wait until each partition has a leader (a
    producer without retries would lose what it sends before)."""
    with AdminClient(bootstrap) as admin:
        try:
            admin.create_topic(topic, partitions, min(3, len(bootstrap)))
        except ClientError as err:
            if err.code != pb.ERROR_CODE_TOPIC_ALREADY_EXISTS:
                raise
        deadline = time.monotonic() + 30
        while not all(p.leader_id for p in admin.describe_topic(topic).partitions):
            if time.monotonic() > deadline:
                raise SystemExit(f"topic {topic} has partitions without a leader after 30 s")
            time.sleep(0.2)


def produce(producer: Producer, topic: str, count: int) -> None:
    futures = [
        producer.send(topic, f"record-{i}".encode(), key=str(i).encode()) for i in range(count)
    ]
    producer.flush()
    failed = sum(1 for f in futures if f.exception() is not None)
    print(f"produced {count - failed} records ({failed} failed)", file=sys.stderr)


def process(out: TextIO, record: ConsumerRecord) -> None:
    """The work: here a line per record, flushed to the OS so a crash keeps it."""
    out.write(f"{record.partition} {record.offset} {record.value!r}\n")
    out.flush()


def output(path: str) -> TextIO:
    return sys.stdout if path == "-" else open(path, "a", encoding="utf-8")


def group_consumer(
    args: argparse.Namespace, isolation_level: IsolationLevel = "read_uncommitted"
) -> Consumer:
    """A member of ``--group`` that commits only when told (``commit()``), subscribed to
    ``--topic``; a partition the group never committed starts at its beginning."""
    consumer = Consumer(
        args.bootstrap.split(","),
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=args.session_timeout_ms,
        isolation_level=isolation_level,
    )
    consumer.subscribe([args.topic])
    return consumer


def batches(consumer: Consumer, idle_s: float) -> Iterator[list[ConsumerRecord]]:
    """What each poll returns, until none came for ``idle_s`` while the consumer had
    partitions (a restarted member waits for the dead one's session to expire first)."""
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < idle_s:
        records = consumer.poll(0.5)
        if records or not consumer.assignment():
            idle_since = time.monotonic()
        if records:
            yield records
