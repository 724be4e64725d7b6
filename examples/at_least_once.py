"""At-least-once: every record is processed, and a crash processes some twice.

The producer waits for a majority (acks="all") and retries what failed; the consumer
commits a record's offset only after processing it. A crash between processing and
committing leaves the offset uncommitted, so the group hands the partition (after the
dead member's session timeout) to a member that starts from the last commit and
processes those records again. Make processing idempotent (or dedupe by partition and
offset) and nothing is lost nor doubled.

Against `raftmq dev` (`make dev`), from the repository root:

    .venv/bin/python examples/at_least_once.py --crash-after 7   # dies mid-stream (exit 3)
    .venv/bin/python examples/at_least_once.py --records 0       # processes the rest

The second run starts from the last commit: records processed before the crash but not
committed come again.
"""

from __future__ import annotations

import os
import sys

from _shared import batches, ensure_topic, group_consumer, output, parse_args, process, produce

from raftmq.client import Producer


def main() -> None:
    args = parse_args(__doc__ or "", "payments")
    bootstrap = args.bootstrap.split(",")
    ensure_topic(bootstrap, args.topic)
    if args.records:
        with Producer(bootstrap, acks="all", retries=10) as producer:
            produce(producer, args.topic, args.records)
    out = output(args.out)
    processed = 0
    with group_consumer(args) as consumer:  # we commit, after processing
        for records in batches(consumer, args.idle_s):
            for record in records:
                process(out, record)
                processed += 1
                if processed == args.crash_after:
                    os._exit(3)  # processed, not committed: redelivered after restart
            consumer.commit()  # the positions after what was just processed
    print(f"processed {processed} records", file=sys.stderr)


if __name__ == "__main__":
    main()
