"""Per-log settings, with Kafka's names and defaults where Kafka has one."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from raftmq.format.entry import MAX_ENTRY_BYTES

MIB = 1024 * 1024
DAY_MS = 24 * 60 * 60 * 1000


class FlushPolicy(StrEnum):
    """When appended bytes are made durable.

    EVERY_BATCH: ``append`` returns only after an fsync covers the batch (group-committed with
    concurrent appenders); the default, because acks=all promises durability.
    INTERVAL: ``append`` returns after the write; ``flush_if_due`` (called by the owner's timer)
    fsyncs at most every ``flush_interval_ms``; ``flush`` still works on demand.
    """

    EVERY_BATCH = "every-batch"
    INTERVAL = "interval"


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 128 * MIB  # segment.bytes
    segment_ms: int = 7 * DAY_MS  # segment.ms
    retention_ms: int = 14 * DAY_MS  # retention.ms; -1 keeps forever
    retention_bytes: int = -1  # retention.bytes; -1 is unlimited
    max_message_bytes: int = 1 * MIB  # max.message.bytes: one entry, header included
    # message.timestamp.after.max.ms: how far past the broker's clock a produced entry's
    # max_timestamp may lie (a clock far ahead would make time lookups answer wrong offsets)
    message_timestamp_after_max_ms: int = 60 * 60 * 1000
    index_interval_bytes: int = 4096  # index.interval.bytes: density of the sparse indexes
    flush_policy: FlushPolicy = FlushPolicy.EVERY_BATCH
    flush_interval_ms: int = 1000
    max_open_segments: int = 256  # file handles + loaded indexes kept for closed segments
    preallocate_bytes: int = 16 * MIB  # disk reserved ahead of the active segment; 0 is off
    # Appends smaller than this wait in memory (references, not copies) and reach the file
    # together with one pwritev: before any read of them, flush, roll, truncate or close, or
    # when this many bytes wait. 0 writes each append at once. A process crash loses what
    # waits, as a power cut loses what is not fsynced: only flushed entries are durable.
    write_behind_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        # Relative offsets and positions are stored as u32, so a segment stays under 2 GiB.
        _check_range("segment_bytes", self.segment_bytes, 1024, (1 << 31) - 1)
        _check_range("segment_ms", self.segment_ms, 1, 1 << 62)
        if self.retention_ms != -1:
            _check_range("retention_ms", self.retention_ms, 1, 1 << 62)
        if self.retention_bytes != -1:
            _check_range("retention_bytes", self.retention_bytes, 0, 1 << 62)
        _check_range("max_message_bytes", self.max_message_bytes, 128, MAX_ENTRY_BYTES)
        _check_range(
            "message_timestamp_after_max_ms", self.message_timestamp_after_max_ms, 0, 1 << 62
        )
        _check_range("index_interval_bytes", self.index_interval_bytes, 1, 1 << 30)
        _check_range("flush_interval_ms", self.flush_interval_ms, 1, 1 << 40)
        _check_range("max_open_segments", self.max_open_segments, 2, 1 << 20)
        _check_range("preallocate_bytes", self.preallocate_bytes, 0, 1 << 31)
        _check_range("write_behind_bytes", self.write_behind_bytes, 0, 64 * MIB)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
