"""A share group's settings (docs/share-groups.md, "Settings"): what the controller keeps
with the group and every partition leader applies to its share-partitions.

A top-level helper because both sides need it and neither may import the other: the
partition leaders enforce the settings (lock duration, delivery limit, in-flight bound,
where a new share-partition starts) and the controller keeps and validates them. One
definition of names, defaults and ranges for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

LOCK_DURATION_MS = "share.record.lock.duration.ms"
DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
AUTO_OFFSET_RESET = "share.auto.offset.reset"
DEAD_LETTER_TOPIC = "share.dead.letter.topic"
LOCK_PARTITION_LIMIT = "share.record.lock.partition.limit"

MIN_LOCK_DURATION_MS = 1_000
MAX_LOCK_DURATION_MS = 3_600_000
MAX_DELIVERY_COUNT_LIMIT = 10
MIN_LOCK_PARTITION_LIMIT = 100
MAX_LOCK_PARTITION_LIMIT = 10_000
MAX_LOCK_HOLD_MS = 12 * 3_600_000
"""A RENEW may keep a record acquired at most this long after its acquisition, and at
most 12 lock durations (whichever is less): past it LOCK_RENEWAL_LIMIT."""
MAX_LOCK_HOLD_DURATIONS = 12
AUTO_OFFSET_RESETS = ("latest", "earliest")


class ShareSettingError(ValueError):
    """A setting unknown or out of range; the message names it and its range."""


@dataclass(frozen=True, slots=True)
class ShareSettings:
    record_lock_duration_ms: int = 30_000
    """The visibility timeout: an acquired record not acknowledged by then is available
    again (its delivery count stays)."""
    delivery_count_limit: int = 5
    """A record delivered this many times and not accepted is archived (and dead-lettered
    when the group has a dead-letter topic), not delivered again."""
    auto_offset_reset: str = "latest"
    """Where a share-partition the group never consumed starts: the high watermark, or
    the log start."""
    dead_letter_topic: str = ""
    """Where archived records are written (with the dead-letter headers of
    raftmq.client.retry_headers); "" for none."""
    record_lock_partition_limit: int = 2_000
    """Records in flight (acquired or available between the start and end offsets) per
    share-partition, at most: acquisition stops there until some are done."""

    def max_lock_hold_ms(self) -> int:
        return min(MAX_LOCK_HOLD_MS, MAX_LOCK_HOLD_DURATIONS * self.record_lock_duration_ms)

    def as_dict(self) -> dict[str, str]:
        """Every setting by its name, as text (describe shows them all)."""
        return {
            LOCK_DURATION_MS: str(self.record_lock_duration_ms),
            DELIVERY_COUNT_LIMIT: str(self.delivery_count_limit),
            AUTO_OFFSET_RESET: self.auto_offset_reset,
            DEAD_LETTER_TOPIC: self.dead_letter_topic,
            LOCK_PARTITION_LIMIT: str(self.record_lock_partition_limit),
        }

    def altered(self, changes: Mapping[str, str]) -> ShareSettings:
        """These settings with ``changes`` (name: text; "" restores the default), checked.
        Raises ShareSettingError naming the first bad one."""
        default = ShareSettings()
        fields: dict[str, object] = {}
        for name, text in changes.items():
            if name not in _FIELDS:
                raise ShareSettingError(
                    f"unknown share group setting {name!r}; the settings are "
                    + ", ".join(sorted(_FIELDS))
                )
            field = _FIELDS[name]
            fields[field] = getattr(default, field) if text == "" else _parse(name, text)
        return dataclasses.replace(self, **fields)  # type: ignore[arg-type]


_FIELDS = {
    LOCK_DURATION_MS: "record_lock_duration_ms",
    DELIVERY_COUNT_LIMIT: "delivery_count_limit",
    AUTO_OFFSET_RESET: "auto_offset_reset",
    DEAD_LETTER_TOPIC: "dead_letter_topic",
    LOCK_PARTITION_LIMIT: "record_lock_partition_limit",
}
_RANGES = {
    LOCK_DURATION_MS: (MIN_LOCK_DURATION_MS, MAX_LOCK_DURATION_MS),
    DELIVERY_COUNT_LIMIT: (1, MAX_DELIVERY_COUNT_LIMIT),
    LOCK_PARTITION_LIMIT: (MIN_LOCK_PARTITION_LIMIT, MAX_LOCK_PARTITION_LIMIT),
}


def _parse(name: str, text: str) -> int | str:
    if name == AUTO_OFFSET_RESET:
        if text not in AUTO_OFFSET_RESETS:
            raise ShareSettingError(f"{name} is {text!r}; use latest or earliest")
        return text
    if name == DEAD_LETTER_TOPIC:
        # The topic name rules are the controller's (it checks the name against them).
        return text
    lo, hi = _RANGES[name]
    try:
        value = int(text)
    except ValueError:
        raise ShareSettingError(f"{name} is {text!r}, not a whole number") from None
    if not lo <= value <= hi:
        raise ShareSettingError(f"{name} is {value}; it must be between {lo} and {hi}")
    return value
