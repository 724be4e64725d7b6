"""At-most-once: no record is processed twice, and a crash loses some.

The producer does not retry (acks=1: the leader's append, retries=0: a failed send is
dropped); the consumer commits the offsets of what it polled before processing it. A
crash after the commit and before processing skips those records: the member that takes
the partition over starts after them.

Against `raftmq dev` (`make dev`), from the repository root:

    .venv/bin/python examples/at_most_once.py --crash-after 7    # dies mid-stream (exit 3)
    .venv/bin/python examples/at_most_once.py --records 0        # processes what is left

The second run starts from the last commit, past the records the first run polled but
never processed: those are lost, none is processed twice.
"""

from __future__ import annotations

import os
import sys

from _shared import batches, ensure_topic, group_consumer, output, parse_args, process, produce

from raftmq.client import Producer


def main() -> None:
    args = parse_args(__doc__ or "", "metrics")
    bootstrap = args.bootstrap.split(",")
    ensure_topic(bootstrap, args.topic)
    if args.records:
        with Producer(bootstrap, acks=1, retries=0) as producer:
            produce(producer, args.topic, args.records)
    out = output(args.out)
    processed = 0
    with group_consumer(args) as consumer:  # we commit, before processing
        for records in batches(consumer, args.idle_s):
            consumer.commit()  # first: these records will not come again
            for record in records:
                if processed == args.crash_after > 0:
                    os._exit(3)  # committed, not processed: these records are lost
                process(out, record)
                processed += 1
    print(f"processed {processed} records", file=sys.stderr)


if __name__ == "__main__":
    main()
