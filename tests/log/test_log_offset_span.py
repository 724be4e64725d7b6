"""A segment's index slots hold offsets and Raft indexes relative to the segment as u32. An
append whose offsets would not fit rolls the segment instead of overflowing: the broker's
checks bound one entry's record_count by its payload, but a segment can still gather more
than 2^32 offsets, and before this an OverflowError stopped every replica's Raft driver."""

from __future__ import annotations

from pathlib import Path

from raftmq.format import entry
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.log import Log

HUGE = (1 << 31) - 1  # the largest record_count the header's i32 holds
CONFIG = LogConfig(flush_policy=FlushPolicy.INTERVAL, preallocate_bytes=0)


def huge_entry(index: int, base_offset: int, *, count: int = HUGE) -> bytes:
    """A DATA entry claiming ``count`` records (the log never decodes the payload)."""
    return entry.encode(
        b"x" * 50,
        index=index,
        term=1,
        base_offset=base_offset,
        record_count=count,
        first_timestamp=index,
        max_timestamp=index,
    )


def check_spans(log: Log) -> None:
    segments = log.segments()
    ends = [(first, base) for _, first, base, _ in segments[1:]] + [
        (log.next_index, log.next_offset)
    ]
    for (name, first, base, _), (next_first, next_base) in zip(segments, ends, strict=True):
        assert next_base - base <= 1 << 32, f"segment {name} spans {next_base - base} offsets"
        assert next_first - first < 1 << 32, name


def test_entries_that_overflow_relative_offsets_roll_the_segment(tmp_path: Path) -> None:
    log = Log.open(tmp_path, CONFIG)
    offset = 0
    for index in range(1, 6):
        log.append(huge_entry(index, offset))
        offset += HUGE
    assert log.next_offset == 5 * HUGE
    assert len(log.segments()) >= 3, log.segments()
    check_spans(log)
    # Every entry is found again by any offset it covers, before and after a reopen.
    for _ in range(2):
        for index in range(1, 6):
            base = (index - 1) * HUGE
            for probe in (base, base + HUGE - 1):
                got = entry.parse_header(log.read(probe, 1).data)
                assert (got.index, got.base_offset) == (index, base)
        log.flush()
        log.close()
        log = Log.open(tmp_path, CONFIG)
        check_spans(log)
    log.close()


def test_one_append_spanning_more_than_a_segment_can_hold_is_split(tmp_path: Path) -> None:
    log = Log.open(tmp_path, CONFIG)
    log.append(huge_entry(1, 0, count=1))
    batch = b"".join(huge_entry(i, 1 + (i - 2) * HUGE) for i in range(2, 6))
    info = log.append(batch)
    assert (info.first_index, info.last_index, info.entries) == (2, 5, 4)
    assert info.next_offset == 1 + 4 * HUGE
    check_spans(log)
    assert len(log.segments()) >= 2
    got = [entry.parse_header(log.read_by_index(i, 1).data).index for i in range(1, 6)]
    assert got == [1, 2, 3, 4, 5]
    log.close()
