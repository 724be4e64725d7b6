"""The pure steps of the delay movers (docs/delayed-delivery.md), apart from their I/O
(raftmq.broker.delay_mover): where a released record goes next, the cursor a level's
mover records its progress in, and a level's count for ``topic describe``. Each step is a
function of the record alone, never of the clock, so a mover that takes over a level
repeats its predecessor's steps exactly."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from raftmq.format import delay
from raftmq.format.records import Record

Destination = tuple[str, int]
"""(topic, partition)."""


@dataclass(slots=True)
class Cursor:
    """A level's progress: every record below ``offset`` was moved and acknowledged, and
    ``sequences`` holds the next sequence per destination at that point."""

    offset: int
    sequences: dict[Destination, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        seqs = [[t, p, n] for (t, p), n in sorted(self.sequences.items())]
        return json.dumps({"offset": self.offset, "sequences": seqs}).encode()

    @staticmethod
    def decode(data: bytes) -> Cursor:
        raw = json.loads(data)
        seqs = {(str(t), int(p)): int(n) for t, p, n in raw["sequences"]}
        return Cursor(int(raw["offset"]), seqs)


@dataclass(frozen=True, slots=True)
class LevelPending:
    """A target topic's delayed messages in one level (DescribeDelayed)."""

    level: int
    pending: int
    next_due_ms: int
    """-1: none."""
    complete: bool


@dataclass(frozen=True, slots=True)
class Move:
    """One record's next step: its destination and the record as it goes there."""

    destination: Destination
    record: Record
    source_offset: int


def next_step(record: Record) -> Move | None:
    """Where a released record goes: its target once due (internal headers dropped,
    deliver-at kept), else the level its remaining wait calls for (hop-at renewed). None
    for a record that is no delayed record (refused on produce; skipped if met).

    Computed from the record's own hop-at, never from the clock: a mover that takes over
    sends every record where its predecessor sent it, with the same sequence, so the
    destination recognises what is already stored. Released no earlier than hop-at, and
    hop-at never passes deliver-at, so a record is delivered only once due."""
    try:
        topic, partition, deliver_at, hop_at = delay.parse_route(record.headers)
    except delay.DelayHeaderError:
        return None
    hop = delay.route(deliver_at, hop_at)
    if hop is None:
        headers = tuple(h for h in record.headers if h[0] not in delay.INTERNAL_HEADERS)
        moved = Record(record.key, record.value, record.timestamp, headers)
        return Move((topic, partition), moved, record.offset)
    level, hop_at = hop
    headers = tuple(
        (name, str(hop_at).encode() if name == delay.HOP_AT else value)
        for name, value in record.headers
    )
    return Move(
        (delay.DELAY_TOPIC, level),
        Record(record.key, record.value, record.timestamp, headers),
        record.offset,
    )


def hop_at_of(record: Record) -> int | None:
    for name, value in record.headers:
        if name == delay.HOP_AT and value is not None and value.isdigit():
            return int(value)
    return None
