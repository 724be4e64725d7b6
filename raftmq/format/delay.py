"""Delayed delivery's shared vocabulary (docs/delayed-delivery.md): the internal topic, its
levels, the record headers that carry a delayed message's route, and the reserved
producer ids of the brokers' movers.

Why at the format floor: the producer (which routes a delayed record into a level) and
the broker (which checks and moves it) must agree on every number here, and both may
import the format. Pure arithmetic, no I/O.

The timing function is a hierarchical wheel over the partitions of :data:`DELAY_TOPIC`:
partition ``L`` holds records that wait ``2**L * UNIT_MS`` from the time they entered it,
so each partition is a FIFO by release time and its mover only looks at the head.
"""

from __future__ import annotations

from collections.abc import Sequence

DELAY_TOPIC = "__delay"
"""The internal topic that holds delayed messages until they are due."""
UNIT_MS = 100
"""The wheel's tick: level 0 holds a record at most this long. The delivery precision."""
LEVELS = 26
"""Partitions of DELAY_TOPIC: level 25 holds a record 2**25 * 100 ms (38.8 days), so any
delay up to the default maximum of 40 days takes at most 26 hops; longer delays (a topic
may allow up to MAX_DELIVERY_DELAY_MS) cascade through the top level more than once."""
TOP_LEVEL = LEVELS - 1
DEFAULT_MAX_DELAY_MS = 40 * 24 * 3600 * 1000
"""The default of a topic's ``delivery.max.delay.ms``: 40 days."""
MAX_DELIVERY_DELAY_MS = 3650 * 24 * 3600 * 1000
"""The largest ``delivery.max.delay.ms`` a topic may set (10 years): a deliver_at past it
is absurd and the producer refuses it before asking a broker."""

DELIVER_AT = "deliver-at"
"""ms since the epoch, decimal ASCII: when the message is due (kept on delivery)."""
TARGET_TOPIC = "delay-target"
"""UTF-8 name of the topic the message is for."""
TARGET_PARTITION = "delay-partition"
"""Decimal ASCII: its partition there (chosen by the producer, as for any record)."""
HOP_AT = "hop-at"
"""ms since the epoch, decimal ASCII: when the record leaves the level it is in."""
CURSOR = "delay-cursor"
"""A mover's progress record in its own level (docs/format.md, "Delayed delivery"): the
value is JSON ``{"offset": X, "sequences": [[topic, partition, next sequence], ...]}``."""
INTERNAL_HEADERS = frozenset({TARGET_TOPIC, TARGET_PARTITION, HOP_AT})
"""Dropped when a message is delivered; DELIVER_AT stays for consumers to see."""

MOVER_PRODUCER_ID_BASE = 1 << 62
"""Movers produce as producer id ``MOVER_PRODUCER_ID_BASE + level`` (epoch 0). The
controller allocates ids from 0 upward in small blocks and never reaches this range;
partitions apply a sparse sequence rule to it (raftmq.partition.producer_state)."""
MOVER_PRODUCER_ID_END = MOVER_PRODUCER_ID_BASE + LEVELS


def is_mover(producer_id: int) -> bool:
    return MOVER_PRODUCER_ID_BASE <= producer_id < MOVER_PRODUCER_ID_END


class DelayHeaderError(ValueError):
    """A delayed record whose route headers are missing or malformed."""


def level_for(remaining_ms: int) -> int:
    """The level a record due in ``remaining_ms`` (> 0) goes to: the largest L with
    ``2**L * UNIT_MS <= remaining_ms`` (0 below one unit), capped at the top level."""
    assert remaining_ms > 0, remaining_ms
    units = remaining_ms // UNIT_MS
    return min(TOP_LEVEL, units.bit_length() - 1) if units else 0


def route(deliver_at_ms: int, now_ms: int) -> tuple[int, int] | None:
    """(level, hop_at) for a record due at ``deliver_at_ms``, or None when it is due now.
    The hop never passes the due time: below one unit the record waits in level 0 exactly
    until it is due, so nothing is released early."""
    remaining = deliver_at_ms - now_ms
    if remaining <= 0:
        return None
    level = level_for(remaining)
    if remaining < UNIT_MS:
        return 0, deliver_at_ms
    return level, now_ms + (UNIT_MS << level)


def route_headers(
    topic: str, partition: int, deliver_at_ms: int, hop_at_ms: int
) -> list[tuple[str, bytes | None]]:
    return [
        (DELIVER_AT, str(deliver_at_ms).encode()),
        (TARGET_TOPIC, topic.encode()),
        (TARGET_PARTITION, str(partition).encode()),
        (HOP_AT, str(hop_at_ms).encode()),
    ]


def _number(value: bytes | None, name: str) -> int:
    if value is None or not value.isdigit() or len(value) > 19:
        raise DelayHeaderError(f"header {name} must be a non-negative decimal number")
    return int(value)


def parse_route(headers: Sequence[tuple[str, bytes | None]]) -> tuple[str, int, int, int]:
    """(target topic, partition, deliver_at, hop_at) of a delayed record's headers; raises
    DelayHeaderError naming what is missing or malformed."""
    found: dict[str, bytes | None] = {}
    for name, value in headers:
        if name in (DELIVER_AT, TARGET_TOPIC, TARGET_PARTITION, HOP_AT):
            found[name] = value
    missing = [n for n in (DELIVER_AT, TARGET_TOPIC, TARGET_PARTITION, HOP_AT) if n not in found]
    if missing:
        raise DelayHeaderError(f"a delayed record lacks the header(s) {', '.join(missing)}")
    target = found[TARGET_TOPIC]
    if not target:
        raise DelayHeaderError(f"header {TARGET_TOPIC} must name a topic")
    try:
        topic = target.decode()
    except UnicodeDecodeError:
        raise DelayHeaderError(f"header {TARGET_TOPIC} is not UTF-8") from None
    return (
        topic,
        _number(found[TARGET_PARTITION], TARGET_PARTITION),
        _number(found[DELIVER_AT], DELIVER_AT),
        _number(found[HOP_AT], HOP_AT),
    )


def is_cursor(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    return bool(headers) and headers[0][0] == CURSOR
