"""A share consumer in a process of its own, for the test that SIGKILLs one mid-batch:
it writes a JSON line per record it receives to ``--out`` (flushed at once, so a SIGKILL
keeps what it wrote: offset, delivery count, when, and the lock deadline), accepts
nothing, and hangs after its first batch: the test kills it there."""

from __future__ import annotations

import argparse
import json
import threading
import time

from raftmq.client import ShareConsumer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-poll-records", type=int, default=20)
    args = parser.parse_args()
    out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 - flushed per line
    consumer = ShareConsumer(
        args.bootstrap,
        args.group,
        acknowledgement_mode="explicit",
        max_poll_records=args.max_poll_records,
    )
    consumer.subscribe(args.topic)
    while not (records := consumer.poll(0.5)):
        pass
    for r in records:
        line = {
            "offset": r.offset,
            "delivery_count": r.delivery_count,
            "received_ms": time.time_ns() // 1_000_000,
            "lock_deadline_ms": consumer.lock_deadline_ms(r),
        }
        out.write(json.dumps(line) + "\n")
    out.flush()
    threading.Event().wait()  # mid-batch: killed here, nothing acknowledged


if __name__ == "__main__":
    main()
