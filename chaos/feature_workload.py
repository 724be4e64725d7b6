"""The message features under faults (``raftmq chaos run --delayed``, ``--tags``): delayed
delivery and broker-side tag filtering, as a service built on raftmq uses them, and the
readers that hold them to their promises (chaos/feature_checker.py checks what they
record; the ops are described in chaos/history.py).

- **Delayed** (``--delayed``): a producer sends numbered records to a topic of their own
  (:data:`DELAYED_TOPIC`, retention off, so a record due late is still there to read),
  each due at a random time up to :data:`MAX_DELAY_MS` ahead (``deliver_at``); a
  consumer assigned every partition reads them from the beginning and notes the wall
  clock at which each arrived. After the run the workload keeps reading until every
  record sent is past due by :data:`DRAIN_GRACE_S`.
- **Tags** (``--tags``): the clients' producers tag each record of the main topic by its
  sequence number (:func:`tags_of`), and a consumer with the tag filter
  :data:`TAG_FILTER` reads every partition of the main topic from the beginning; after
  the run it notes where it stopped on each partition.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from chaos.history import Op, send_value
from chaos.workload import (
    DELIVERY_TIMEOUT_MS,
    NumberedSend,
    Recorder,
    chaos_producer,
    send_numbered,
)
from raftmq.client import AdminClient, Consumer, ConsumerRecord

DELAYED_TOPIC = "delayed"
"""Not named ``chaos-...``, so the nemesis's file faults, which look for the main topic's
directories, leave it alone (the internal ``__delay`` topic faces them with the others)."""
DELAYED_PARTITIONS = 3
MAX_DELAY_MS = 8_000
SEND_INTERVAL_S = 0.02
QUIET_SENDING_S = 15.0
"""After the faults, how long the delayed producer goes on: its records are due in quiet
time, where lateness is held to its bound."""
DRAIN_GRACE_S = 20.0
"""After the run, how long past the last record's due time the delayed reader keeps
reading: leaders elected after healing, the movers' cursors resumed."""

TAGS = ("red", "green", "blue")
TAG_FILTER = "red && !blue"
"""The filtered consumer's expression; the checker evaluates it on its own
(:func:`matches`), not with the library under test."""


def tags_of(seq: int) -> list[str]:
    """The tags of a producer's record ``seq``: a fixed pseudo-random subset of
    :data:`TAGS` (a multiplicative hash of ``seq``), so neighbouring records of a
    partition differ and the checker knows every record's tags from its value."""
    bits = (seq * 2654435761 >> 7) & 0b111
    return [tag for i, tag in enumerate(TAGS) if bits >> i & 1]


def matches(seq: int) -> bool:
    tags = tags_of(seq)
    return "red" in tags and "blue" not in tags


def delayed_value(process: str, partition: int, seq: int, due_ms: int) -> str:
    return f"{send_value(process, partition, seq)}@{due_ms}"


def due_of(value: str) -> int | None:
    """The due time (ms since the epoch) a :func:`delayed_value` names; None otherwise."""
    _, at, due = value.rpartition("@")
    return int(due) if at and due.isdigit() else None


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class FeatureWorkloadOptions:
    delayed: bool = False
    tags: bool = False
    idempotent: bool = False
    seed: int = 0


class FeatureWorkload:
    def __init__(
        self,
        addresses: list[str],
        topic: str,
        partitions: int,
        recorder: Recorder,
        options: FeatureWorkloadOptions,
        client_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.addresses = addresses
        self.topic = topic
        self.partitions = partitions
        self.recorder = recorder
        self.options = options
        self.client_settings = dict(client_settings or {})
        self.stop_sending = threading.Event()
        self.stop_reading = threading.Event()
        self.last_due_ms = 0
        self.rng = random.Random(options.seed)
        self.senders: list[threading.Thread] = []
        self.readers: list[threading.Thread] = []
        self.positions: dict[int, int] = {}

    def start(self) -> None:
        if self.options.delayed:
            with AdminClient(self.addresses, **self.client_settings) as admin:  # type: ignore[arg-type]
                admin.create_topic(
                    DELAYED_TOPIC,
                    DELAYED_PARTITIONS,
                    min(3, len(self.addresses)),
                    config={"retention.bytes": "-1", "retention.ms": "-1"},
                )
            self._spawn(self.senders, "delayed-producer-0", self._produce_delayed)
            self._spawn(self.readers, "delayed-consumer-0", self._read_delayed)
        if self.options.tags:
            self._spawn(self.readers, "tag-consumer-0", self._read_tagged)

    def _spawn(self, into: list[threading.Thread], name: str, target: object) -> None:
        t = threading.Thread(target=target, args=(name,), name=name, daemon=True)  # type: ignore[arg-type]
        t.start()
        into.append(t)

    # --- delayed delivery ---------------------------------------------------------------

    def _produce_delayed(self, process: str) -> None:
        def make(seq: int) -> NumberedSend:
            partition = seq % DELAYED_PARTITIONS
            sent_ms = wall_ms()
            due_ms = sent_ms + self.rng.randrange(MAX_DELAY_MS)
            self.last_due_ms = max(self.last_due_ms, due_ms)
            value = delayed_value(process, partition, seq, due_ms)
            return NumberedSend(
                DELAYED_TOPIC, partition, value, {"deliver_at": due_ms}, wall_ms=sent_ms
            )

        producer = chaos_producer(
            self.addresses, self.client_settings, idempotent=self.options.idempotent
        )
        with producer:
            # Its offset is the internal topic's, so none is kept.
            send_numbered(
                producer,
                self.stop_sending,
                self.recorder,
                "delayed-send",
                process,
                make,
                interval_s=SEND_INTERVAL_S,
                keep_offset=False,
            )

    def _read_delayed(self, process: str) -> None:
        tps = [(DELAYED_TOPIC, p) for p in range(DELAYED_PARTITIONS)]
        self._read(process, tps, "delayed-consume", None)

    # --- tags -----------------------------------------------------------------------------

    def _read_tagged(self, process: str) -> None:
        tps = [(self.topic, p) for p in range(self.partitions)]
        self._read(process, tps, "tag-consume", TAG_FILTER)

    # --- both -----------------------------------------------------------------------------

    def _read(
        self, process: str, tps: list[tuple[str, int]], kind: str, tag_filter: str | None
    ) -> None:
        """Read ``tps`` from the beginning until told to stop, one ``kind`` op per record;
        a consumer that breaks is noted (``feature-error``) and replaced by one that starts
        where the last record seen left off."""
        next_offsets: dict[tuple[str, int], int] = {}
        while not self.stop_reading.is_set():
            settings: dict[str, object] = {
                **self.client_settings,
                "auto_offset_reset": "earliest",
                "fetch_max_wait_ms": 200,
                "max_poll_records": 500,
            }
            if tag_filter is not None:
                settings["tag_filter"] = tag_filter
            try:
                with Consumer(self.addresses, **settings) as consumer:  # type: ignore[arg-type]
                    consumer.assign(tps)
                    for tp, offset in next_offsets.items():
                        consumer.seek(tp, offset)
                    while not self.stop_reading.is_set():
                        records = consumer.poll(0.5)
                        self._record_consumed(process, kind, records)
                        for r in records:
                            next_offsets[(r.topic, r.partition)] = r.offset + 1
                    if tag_filter is not None:
                        for tp in tps:
                            position = consumer.position(tp)
                            if position is not None:
                                self.positions[tp[1]] = position
                    return
            except Exception as exc:
                now = self.recorder.now()
                self.recorder.add(
                    Op(
                        "feature-error",
                        process,
                        status="info",
                        start=now,
                        end=now,
                        error=f"{type(exc).__name__}: {exc}"[:300],
                    )
                )
                self.stop_reading.wait(0.5)

    def _record_consumed(self, process: str, kind: str, records: list[ConsumerRecord]) -> None:
        now, at_ms = self.recorder.now(), wall_ms()
        for r in records:
            self.recorder.add(
                Op(
                    kind,
                    process,
                    r.partition,
                    (r.value or b"").decode(),
                    r.offset,
                    "ok",
                    now,
                    now,
                    wall_ms=at_ms,
                )
            )

    # --- the end --------------------------------------------------------------------------

    def finish(self, timeout: float = 30.0) -> None:
        """Send delayed records a while longer (the faults are healed), then stop; keep
        reading until every delayed record sent is past due by :data:`DRAIN_GRACE_S`; then
        stop the readers and note where the filtered one stopped (``tag-position`` ops)."""
        if self.options.delayed:
            # Faults are over: records sent now are due in quiet time, where the checker
            # holds them to the lateness bound (during faults it cannot).
            time.sleep(QUIET_SENDING_S)
        self.stop_sending.set()
        for t in self.senders:
            t.join(timeout + DELIVERY_TIMEOUT_MS / 1000)
        if self.options.delayed:
            wait_s = (self.last_due_ms - wall_ms()) / 1000 + DRAIN_GRACE_S
            time.sleep(max(0.0, wait_s))
        self.stop_reading.set()
        for t in self.readers:
            t.join(timeout)
        now = self.recorder.now()
        for partition, offset in sorted(self.positions.items()):
            self.recorder.add(
                Op("tag-position", "tag-consumer-0", partition, None, offset, "ok", now, now)
            )


__all__ = [
    "DELAYED_TOPIC",
    "TAG_FILTER",
    "FeatureWorkload",
    "FeatureWorkloadOptions",
    "due_of",
    "matches",
    "tags_of",
]
