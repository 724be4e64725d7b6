"""Exactly-once: consume, transform, produce, and commit the input offsets in one
transaction.

A transactional producer writes the outputs of a batch of input records and, in the
same transaction, the consumer group's new positions on the input
(send_offsets_to_transaction). The commit makes both visible together: a crash before it
aborts both (the next instance with the same transactional id aborts what the dead one
left open), so the records are processed again from the last committed offsets and
their earlier outputs are never seen by a read_committed reader. Each input record then
has exactly one output in what such a reader sees, however often the service crashes.

Against `raftmq dev` (`make dev`), from the repository root:

    .venv/bin/python examples/exactly_once.py --crash-after 7   # dies mid-transaction (exit 3)
    .venv/bin/python examples/exactly_once.py --records 0       # processes the rest
    .venv/bin/raftmq consume orders-out --from-beginning --isolation read_committed \\
        --idle-timeout-ms 2000                                  # each record once

The output records are the input's values in upper case, keyed by the input's
partition and offset.
"""

from __future__ import annotations

import os
import sys

from _shared import batches, ensure_topic, group_consumer, parse_args, produce

from raftmq.client import Producer, TransactionAbortableError


def main() -> None:
    args = parse_args(__doc__ or "", "orders", extra_out_topic=True)
    bootstrap = args.bootstrap.split(",")
    out_topic = args.out_topic or f"{args.topic}-out"
    ensure_topic(bootstrap, args.topic)
    ensure_topic(bootstrap, out_topic)
    if args.records:
        with Producer(bootstrap) as producer:
            produce(producer, args.topic, args.records)
    processed = 0
    # One transactional id per instance of the task: a restarted instance with the same id
    # fences the old one and aborts its open transaction.
    with (
        Producer(bootstrap, transactional_id=f"{args.group}-0") as producer,
        group_consumer(args, isolation_level="read_committed") as consumer,
    ):
        producer.init_transactions()
        for records in batches(consumer, args.idle_s):
            producer.begin_transaction()
            try:
                positions = {}
                for record in records:
                    producer.send(
                        out_topic,
                        (record.value or b"").upper(),
                        key=f"{record.partition}:{record.offset}".encode(),
                    )
                    positions[record.topic, record.partition] = record.offset + 1
                    processed += 1
                    if processed == args.crash_after:
                        producer.flush()  # the outputs are stored, but not committed
                        os._exit(3)
                producer.send_offsets_to_transaction(positions, consumer.group_metadata())
                producer.commit_transaction()
            except TransactionAbortableError as err:
                # Nothing of it is visible: abort, and read again from the last commit.
                print(f"aborting a transaction: {err}", file=sys.stderr)
                producer.abort_transaction()
                committed = consumer.committed(set(consumer.assignment()))
                for tp, offset in committed.items():
                    if offset is not None:
                        consumer.seek(tp, offset)
    print(f"processed {processed} records", file=sys.stderr)


if __name__ == "__main__":
    main()
