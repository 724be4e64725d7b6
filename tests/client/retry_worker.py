"""A RetryingConsumer in a process of its own, for the test that SIGKILLs one between
processing a record and handing it off: its handler writes a JSON line per call to
``--out`` (flushed at once, so a SIGKILL keeps what it wrote: the record's topic, offset,
value, retry headers and the time) and fails on every record whose value starts with
``poison``. With ``--hang-on VALUE`` the handler, after writing its line for that
record, hangs instead of returning or raising: the test kills the process there, after
the processing and before the hand-off. It stops cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time

from raftmq.client.consumer import ConsumerRecord
from raftmq.client.retrying import RetryingConsumer, RetryPolicy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-attempts", type=int, default=2)
    parser.add_argument("--backoff-ms", type=int, default=300)
    parser.add_argument("--hang-on", default=None)
    args = parser.parse_args()
    out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 - flushed per line
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def handle(record: ConsumerRecord) -> None:
        value = (record.value or b"").decode()
        line = {
            "topic": record.topic,
            "offset": record.offset,
            "value": value,
            "headers": {k: (v or b"").decode() for k, v in record.headers},
            "at_ms": time.time_ns() // 1_000_000,
        }
        out.write(json.dumps(line) + "\n")
        out.flush()
        if value == args.hang_on:
            threading.Event().wait()  # killed here: processed, not handed off
        if value.startswith("poison"):
            raise ValueError(f"cannot process {value}")

    policy = RetryPolicy(max_attempts=args.max_attempts, backoff_ms=[args.backoff_ms])
    with RetryingConsumer(
        args.bootstrap,
        [args.topic],
        handle,
        group_id=args.group,
        policy=policy,
        auto_offset_reset="earliest",
        session_timeout_ms=2000,
    ) as consumer:
        while not stop.is_set():
            consumer.process(0.2)


if __name__ == "__main__":
    main()
