"""A group member in a process of its own, for the group tests that crash members: it
subscribes, and writes a JSON line per event to ``--out`` (flushed at once, so a SIGKILL
keeps what it wrote): each record received (partition, offset, receipt time, stint),
each assign / revoke / lost, and each refused commit. It commits after each poll's
records are written (unless ``--no-commit``), and stops cleanly (close: leave) on
SIGTERM.

``--crash-after N``: after writing the N-th record, exit at once (status 3) before
committing it: a crash between processing and commit.

On SIGCONT (after a SIGSTOP: a zombie waking up) it commits what it had processed before
it stalled, as a member that does not know it was replaced would, and notes the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Callable
from typing import TextIO

from raftmq.client.consumer import CommitFailedError, Consumer

STINT: dict[tuple[str, int], int] = {}
"""Per partition, how many times this member was given it: its records are checked per
stint against other members' (no two consume a partition at once)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=2000)
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--crash-after", type=int, default=0)
    parser.add_argument("--no-commit", action="store_true")
    args = parser.parse_args()
    out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 - flushed per line
    stop = woke = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    def on_cont(signum: int, frame: object) -> None:
        nonlocal woke
        woke = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCONT, on_cont)

    def note(kind: str, **fields: object) -> None:
        out.write(json.dumps({"kind": kind, "t": time.time(), **fields}) + "\n")
        out.flush()

    def on_assign(tps: set[tuple[str, int]]) -> None:
        for tp in tps:
            STINT[tp] = STINT.get(tp, 0) + 1
        note("assign", ps=sorted(p for _, p in tps))

    consumer = Consumer(
        args.bootstrap.split(","),
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=args.session_timeout_ms,
        group_instance_id=args.instance_id,
        fetch_max_wait_ms=100,
    )
    consumer.subscribe(
        [args.topic],
        on_assign=on_assign,
        on_revoke=lambda tps: note("revoke", ps=sorted(p for _, p in tps)),
        on_lost=lambda tps: note("lost", ps=sorted(p for _, p in tps)),
    )
    note("started", pid=os.getpid())
    received = 0
    processed: dict[tuple[str, int], int] = {}
    while not stop:
        if woke:
            woke = False
            commit(consumer, dict(processed), note)
        records = consumer.poll(0.2)
        for r in records:
            tp = (r.topic, r.partition)
            note("record", p=r.partition, o=r.offset, stint=STINT.get(tp, 0))
            processed[tp] = r.offset + 1
            received += 1
            if received == args.crash_after:
                os._exit(3)
        if records and not args.no_commit:
            commit(consumer, None, note)
    consumer.close()
    note("closed")
    _close(out)


def commit(
    consumer: Consumer, offsets: dict[tuple[str, int], int] | None, note: Callable[..., None]
) -> None:
    try:
        consumer.commit(offsets)
        note("committed", offsets=None if offsets is None else sorted(offsets.items()))
    except CommitFailedError as exc:
        note("commit_failed", error=str(exc), code=exc.code_name)


def _close(out: TextIO) -> None:
    out.flush()
    out.close()


if __name__ == "__main__":
    main()
