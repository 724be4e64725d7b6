"""Share groups under faults (``raftmq chaos run --share-group``): a producer sends
numbered records to a topic of their own; share group members, each a process of its
own (chaos/share_member.py), accept, release, reject or ignore them, and some are
SIGKILLed mid-batch and replaced; after the faults, fresh members drain what is left,
and a reader collects the group's dead-letter topic. chaos/share_checker.py checks the
ops (described in chaos/history.py).

The group's lock duration is shorter than the members' session timeout, so a lock
always expires before a silent member's session ends: the checker may then hold every
acquisition to its lock deadline (a release by session end never comes first).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from chaos.history import Op, send_value
from chaos.workload import (
    DELIVERY_TIMEOUT_MS,
    NumberedSend,
    Recorder,
    chaos_producer,
    send_numbered,
)
from raftmq.client import AdminClient, Consumer
from raftmq.client.retry_headers import decode as decode_retry_headers
from raftmq.share_settings import (
    AUTO_OFFSET_RESET,
    DEAD_LETTER_TOPIC,
    DELIVERY_COUNT_LIMIT,
    LOCK_DURATION_MS,
)

SHARE_TOPIC = "shared"
"""Not named ``chaos-...``: the nemesis's file faults look for the main topic's folders."""
SHARE_DLQ_TOPIC = "shared-dlq"
SHARE_GROUP = "chaos-share"
SHARE_PARTITIONS = 3
MEMBERS = 4
LOCK_DURATION_MS_VALUE = 3_000
SESSION_TIMEOUT_MS = 6_000
DELIVERY_LIMIT = 4
SEND_INTERVAL_S = 0.03
CRASH_EVERY_S = (8.0, 20.0)
"""A member is SIGKILLed after a random time in this range, and replaced at once."""
DRAIN_MEMBERS = 2
DRAIN_LIMIT_S = 90.0
"""After the faults, how long the drain members may take to settle every record."""
DLQ_SETTLE_S = 2 * LOCK_DURATION_MS_VALUE / 1000 + 2.0
"""After the drain saw every record settled: time for one of unknown outcome that was
not done to come back at its lock's end and be settled, and for the last dead letters."""
POISON_EVERY = 40
"""Every this-many-th record the producer sends is poison: no member accepts it, so it
goes round until its delivery limit dead-letters it."""
QUIET_READ_S = 3.0
"""The dead-letter reader stops once it got nothing for this long."""


def is_poison(value: str) -> bool:
    """Values are chaos.history.send_value's ``producer:partition:seq``."""
    seq = value.rsplit(":", 1)[-1]
    return seq.isdigit() and int(seq) % POISON_EVERY == 0


@dataclass(slots=True)
class _Member:
    name: str
    process: subprocess.Popen[str]
    reader: threading.Thread


class ShareWorkload:
    def __init__(
        self,
        addresses: list[str],
        recorder: Recorder,
        *,
        idempotent: bool,
        seed: int,
        client_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.addresses = addresses
        self.recorder = recorder
        self.idempotent = idempotent
        self.client_settings = dict(client_settings or {})
        self.rng = random.Random(seed ^ 0x5A5E)
        self.stop_sending = threading.Event()
        self.stop_crashing = threading.Event()
        self.members: list[_Member] = []
        self.generation = 0
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.sent_ok: set[str] = set()
        self.settled: set[str] = set()
        """Values accepted (ok) or rejected (ok) so far, as the drain watches them."""
        self.recv_values: dict[tuple[int, int], str] = {}
        self.acking: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
        """Per member, the acknowledgements it is committing whose results it has not
        printed yet (a member killed meanwhile leaves their outcome unknown)."""

    # --- start ------------------------------------------------------------------------

    def start(self) -> None:
        with AdminClient(self.addresses, **self.client_settings) as admin:  # type: ignore[arg-type]
            for topic in (SHARE_TOPIC, SHARE_DLQ_TOPIC):
                admin.create_topic(
                    topic,
                    SHARE_PARTITIONS,
                    min(3, len(self.addresses)),
                    config={"retention.bytes": "-1", "retention.ms": "-1"},
                )
            admin.alter_share_group_config(
                SHARE_GROUP,
                {
                    LOCK_DURATION_MS: str(LOCK_DURATION_MS_VALUE),
                    DELIVERY_COUNT_LIMIT: str(DELIVERY_LIMIT),
                    AUTO_OFFSET_RESET: "earliest",
                    DEAD_LETTER_TOPIC: SHARE_DLQ_TOPIC,
                },
            )
        for _ in range(MEMBERS):
            self._spawn_member(drain=False)
        for target in (self._produce, self._crash_members):
            t = threading.Thread(target=target, name=f"share-{target.__name__}", daemon=True)
            t.start()
            self.threads.append(t)

    # --- members ----------------------------------------------------------------------

    def _spawn_member(self, *, drain: bool) -> None:
        with self._lock:
            self.generation += 1
            name = f"share-{'drain' if drain else 'member'}-{self.generation}"
        command = [
            sys.executable,
            "-m",
            "chaos.share_member",
            "--bootstrap",
            ",".join(self.addresses),
            "--group",
            SHARE_GROUP,
            "--topic",
            SHARE_TOPIC,
            "--seed",
            str(self.rng.randrange(1 << 30)),
            "--session-timeout-ms",
            str(SESSION_TIMEOUT_MS),
            "--settings",
            json.dumps(self.client_settings),
        ]
        if drain:
            command.append("--drain")
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stdout is not None
        reader = threading.Thread(
            target=self._read_member, args=(name, process.stdout), name=name, daemon=True
        )
        reader.start()
        with self._lock:
            self.members.append(_Member(name, process, reader))

    def _read_member(self, name: str, out: IO[str]) -> None:
        for line in out:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self._record(name, event)

    def _record(self, name: str, e: dict[str, Any]) -> None:
        now = self.recorder.now()
        kind = e.get("e")
        if kind == "acking":
            with self._lock:
                self.acking.setdefault(name, {})[(e["p"], e["o"])] = e
            return
        if kind == "recv":
            with self._lock:
                self.recv_values[(e["p"], e["o"])] = e["v"]
            self.recorder.add(
                Op(
                    "share-receive",
                    name,
                    e["p"],
                    e["v"],
                    e["o"],
                    "ok",
                    now,
                    now,
                    wall_ms=e["wall_ms"],
                    count=e["n"],
                    deadline_ms=e["deadline_ms"],
                )
            )
        elif kind == "ack":
            with self._lock:
                intents = self.acking.get(name, {})
                for o in range(e["first"], e["last"] + 1):
                    intents.pop((e["p"], o), None)
            self.recorder.add(
                Op(
                    "share-ack",
                    name,
                    e["p"],
                    e["type"],
                    e["first"],
                    "ok" if e["ok"] else ("info" if e.get("code") == "OUTCOME_UNKNOWN" else "fail"),
                    now,
                    now,
                    error=e["error"],
                    wall_ms=e["end_ms"],
                    start_ms=e["start_ms"],
                    last_offset=e["last"],
                )
            )
            # One of unknown outcome counts too: if it was not done, the record comes
            # back and is settled again; the drain only waits for what it can see.
            maybe = e.get("code") == "OUTCOME_UNKNOWN"
            if (e["ok"] or maybe) and e["type"] in ("ACCEPT", "REJECT"):
                with self._lock:
                    for o in range(e["first"], e["last"] + 1):
                        value = self.recv_values.get((e["p"], o))
                        if value is not None:
                            self.settled.add(value)
        elif kind == "error":
            self.recorder.add(
                Op("share-error", name, status="info", start=now, end=now, error=e["error"])
            )

    def _kill(self, member: _Member) -> None:
        wall_ms = int(time.time() * 1000)
        with contextlib.suppress(ProcessLookupError):
            member.process.send_signal(signal.SIGKILL)
        member.process.wait()
        member.reader.join(5.0)
        now = self.recorder.now()
        with self._lock:
            unanswered = self.acking.pop(member.name, {})
        for (partition, offset), e in sorted(unanswered.items()):
            # Asked for, and killed before it learned the outcome: done, perhaps.
            if e["type"] in ("ACCEPT", "REJECT"):
                with self._lock:
                    value = self.recv_values.get((partition, offset))
                    if value is not None:
                        self.settled.add(value)
            self.recorder.add(
                Op(
                    "share-ack",
                    member.name,
                    partition,
                    e["type"],
                    offset,
                    "info",
                    now,
                    now,
                    error="the member was killed before it learned the outcome",
                    wall_ms=wall_ms,
                    start_ms=e["start_ms"],
                    last_offset=offset,
                )
            )
        self.recorder.add(Op("share-crash", member.name, start=now, end=now, wall_ms=wall_ms))

    def _crash_members(self) -> None:
        while not self.stop_crashing.wait(self.rng.uniform(*CRASH_EVERY_S)):
            with self._lock:
                live = [m for m in self.members if m.process.poll() is None]
            if not live:
                continue
            victim = self.rng.choice(live)
            self._kill(victim)
            with self._lock:
                self.members.remove(victim)
            self._spawn_member(drain=False)

    # --- producing --------------------------------------------------------------------

    def _produce(self) -> None:
        process = "share-producer-0"

        def make(seq: int) -> NumberedSend:
            partition = seq % SHARE_PARTITIONS
            return NumberedSend(SHARE_TOPIC, partition, send_value(process, partition, seq))

        def acked(send: NumberedSend) -> None:
            with self._lock:
                self.sent_ok.add(send.value)

        producer = chaos_producer(self.addresses, self.client_settings, idempotent=self.idempotent)
        with producer:
            send_numbered(
                producer,
                self.stop_sending,
                self.recorder,
                "share-send",
                process,
                make,
                interval_s=SEND_INTERVAL_S,
                on_acked=acked,
            )

    # --- the end ----------------------------------------------------------------------

    def finish(self, say: Any = print) -> None:
        """Stop producing and crashing; replace the members by drain members that accept
        every record but poison; wait until every acknowledged record is settled (poison
        ones go to the dead-letter topic after the delivery limit) or DRAIN_LIMIT_S; then
        read the dead-letter topic."""
        self.stop_sending.set()
        self.stop_crashing.set()
        for t in self.threads:
            t.join(DELIVERY_TIMEOUT_MS / 1000 + 30)
        with self._lock:
            members, self.members = self.members, []
        for m in members:
            self._kill(m)
        for _ in range(DRAIN_MEMBERS):
            self._spawn_member(drain=True)
        deadline = time.monotonic() + DRAIN_LIMIT_S
        dead: set[str] = set()
        while time.monotonic() < deadline:
            dead = self._read_dead_letters(record=False)
            with self._lock:
                missing = self.sent_ok - self.settled - dead
            if not missing:
                break
            say(f"draining the share group: {len(missing)} record(s) not yet settled")
            time.sleep(3.0)
        time.sleep(DLQ_SETTLE_S)
        with self._lock:
            members, self.members = self.members, []
        for m in members:
            self._kill(m)
        self._read_dead_letters(record=True)

    def _read_dead_letters(self, *, record: bool) -> set[str]:
        """The values in the dead-letter topic (``share-dlq`` ops when ``record``)."""
        values: set[str] = set()
        tps = [(SHARE_DLQ_TOPIC, p) for p in range(SHARE_PARTITIONS)]
        with Consumer(
            self.addresses,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=200,
            **self.client_settings,  # type: ignore[arg-type]
        ) as consumer:
            consumer.assign(tps)
            deadline = time.monotonic() + 30.0
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < QUIET_READ_S and time.monotonic() < deadline:
                records = consumer.poll(0.5)
                if records:
                    quiet_since = time.monotonic()
                for r in records:
                    value = (r.value or b"").decode(errors="replace")
                    values.add(value)
                    if record:
                        info = decode_retry_headers(r.headers)
                        now = self.recorder.now()
                        self.recorder.add(
                            Op(
                                "share-dlq",
                                "share-dlq-reader",
                                -1 if info is None else info.original_partition,
                                value,
                                None if info is None else info.original_offset,
                                "ok",
                                now,
                                now,
                                count=None if info is None else info.attempts,
                                error=None if info is None else info.last_error,
                            )
                        )
        return values


__all__ = [
    "DELIVERY_LIMIT",
    "POISON_EVERY",
    "SHARE_DLQ_TOPIC",
    "SHARE_GROUP",
    "SHARE_TOPIC",
    "ShareWorkload",
    "is_poison",
]
