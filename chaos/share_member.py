"""One share group member of the chaos run (``raftmq chaos run --share-group``), as a
process of its own so that a crash is a real SIGKILL: nothing released, no goodbye, its
locks left to expire and its session to end (chaos/share_workload.py starts and kills
these; chaos/share_checker.py checks what they print).

It prints one JSON object per line on stdout, flushed at once, so the parent sees each
delivery before anything else can happen to it:

- ``{"e": "recv", "p", "o", "v", "n", "deadline_ms", "wall_ms"}``: a record ``poll``
  gave it (partition, offset, value, delivery count, lock deadline, arrival);
- ``{"e": "ack", "p", "first", "last", "type", "ok", "code", "error", "start_ms",
  "end_ms"}``: one acknowledged range and its result (``code`` the refusal's name),
  ``start_ms`` when the commit was sent;
- ``{"e": "acking", "p", "o", "type", "start_ms"}``: it is about to commit this
  acknowledgement (a member killed before it printed the result leaves it unknown);
- ``{"e": "error", "error"}``: the consumer raised; the member starts a new one.

What it does with a record: ``drain`` members accept every record that is not poison;
others accept most, release some (given back at once), reject a few (archived and
dead-lettered) and leave a few alone (their locks expire). Poison records are always
released, so each one goes round until its delivery limit dead-letters it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from chaos.share_workload import is_poison
from raftmq.client import AcknowledgeType, ConsumerRecord, ShareConsumer


def _say(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _choice(rng: random.Random, record: ConsumerRecord, drain: bool) -> AcknowledgeType | None:
    value = (record.value or b"").decode(errors="replace")
    if is_poison(value):
        return AcknowledgeType.RELEASE
    if drain:
        return AcknowledgeType.ACCEPT
    roll = rng.random()
    if roll < 0.80:
        return AcknowledgeType.ACCEPT
    if roll < 0.88:
        return AcknowledgeType.RELEASE
    if roll < 0.91:
        return AcknowledgeType.REJECT
    return None  # left alone: its lock expires and it goes round again


def run(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    settings: dict[str, Any] = json.loads(args.settings)
    while True:
        try:
            with ShareConsumer(
                args.bootstrap.split(","),
                group_id=args.group,
                acknowledgement_mode="explicit",
                max_poll_records=50,
                fetch_max_wait_ms=200,
                session_timeout_ms=args.session_timeout_ms,
                **settings,
            ) as consumer:
                consumer.subscribe([args.topic])
                while True:
                    records = consumer.poll(0.5)
                    wall_ms = int(time.time() * 1000)
                    for r in records:
                        _say(
                            {
                                "e": "recv",
                                "p": r.partition,
                                "o": r.offset,
                                "v": (r.value or b"").decode(errors="replace"),
                                "n": r.delivery_count,
                                "deadline_ms": consumer.lock_deadline_ms(r),
                                "wall_ms": wall_ms,
                            }
                        )
                    start_ms = int(time.time() * 1000)
                    for r in records:
                        kind = _choice(rng, r, args.drain)
                        if kind is not None:
                            consumer.acknowledge(r, kind)
                            _say(
                                {
                                    "e": "acking",
                                    "p": r.partition,
                                    "o": r.offset,
                                    "type": kind.name,
                                    "start_ms": start_ms,
                                }
                            )
                    if not records:
                        continue
                    results = consumer.commit_sync()
                    end_ms = int(time.time() * 1000)
                    for res in results:
                        _say(
                            {
                                "e": "ack",
                                "p": res.partition,
                                "first": res.first_offset,
                                "last": res.last_offset,
                                "type": res.type.name,
                                "ok": res.ok,
                                "code": None if res.error is None else res.error.code_name,
                                "error": None if res.error is None else str(res.error)[:300],
                                "start_ms": start_ms,
                                "end_ms": end_ms,
                            }
                        )
        except Exception as exc:
            _say({"e": "error", "error": f"{type(exc).__name__}: {exc}"[:300]})
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--settings", default="{}", help="client settings, JSON (TLS files)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
