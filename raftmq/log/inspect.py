"""Read-only inspection of a partition folder, for people and for ``raftmq log``.

Opening a :class:`~raftmq.log.log.Log` repairs (it cuts torn tails); an operator looking at a
folder, maybe one a broker is using, must change nothing. So this module reads the files
itself, with the same entry and index codecs, and reports instead of repairing.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from raftmq.format.entry import HEADER_SIZE, TAGGED, EntryHeader, EntryType
from raftmq.format.errors import InvalidEntryError
from raftmq.format.records import check_payload
from raftmq.log.atomic_file import read_atomic
from raftmq.log.checkpoints import START_CHECKPOINT, TERMS_CHECKPOINT, read_start
from raftmq.log.segment import LOG_SUFFIX, Segment, first_unsealed, parse_segment_name

MAX_RECORD_PROBLEMS = 10
"""Entries with undecodable records named per segment; past it only their number is given."""

_OFFSET_SLOT = struct.Struct(">III")
_TIME_SLOT = struct.Struct(">qI")
_TAG_SLOT = struct.Struct(">IIIQ")


@dataclass(slots=True)
class SegmentReport:
    name: str
    base_offset: int
    first_index: int
    size: int
    entries: int = 0
    records: int = 0
    last_index: int = -1
    next_offset: int = -1
    first_term: int = -1
    last_term: int = -1
    max_timestamp: int = -1
    index_slots: int | None = None  # None: no index files (active or not yet sealed)
    problems: list[str] = field(default_factory=list)
    complete: bool = True
    """False when the scan stopped at a bad entry: what lies after it is unknown, so
    nothing is judged against it (one flipped bit is one problem, not three)."""


@dataclass(slots=True)
class FolderReport:
    directory: Path
    start_index: int | None
    start_offset: int | None
    prev_term: int | None
    segments: list[SegmentReport]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and not any(s.problems for s in self.segments)


def segment_files(directory: Path) -> list[Segment]:
    """The folder's segments in log order, each with its size (no file is opened)."""
    found = []
    for path in directory.glob("*" + LOG_SUFFIX):
        parsed = parse_segment_name(path.stem)
        if parsed is not None:
            seg = Segment(directory, parsed[0], parsed[1], path.stat().st_size)
            found.append(seg)
    found.sort(key=lambda s: s.first_index)
    return found


def iter_entries(directory: Path, *, verify: bool = True) -> Iterator[tuple[str, int, EntryHeader]]:
    """(segment, position, header) of every entry, oldest first; stops at the first bad one."""
    found: list[tuple[int, EntryHeader]] = []

    def keep(position: int, h: EntryHeader) -> None:
        found.append((position, h))

    for seg in segment_files(directory):
        found.clear()
        try:
            result = seg.scan(verify=verify, on_entry=keep)
        finally:
            seg.close_fd()
        for position, h in found:
            yield seg.name, position, h
        if result.error is not None:
            return


def verify_folder(directory: Path) -> FolderReport:
    """Check every CRC, the continuity of indexes, offsets and terms, every index file, and
    that every DATA entry's records decode."""
    problems: list[str] = []
    segments = segment_files(directory)
    # A log that never moved its start has no start checkpoint, and one that never closed
    # a segment may have no terms checkpoint (recovery.py reads both so).
    untouched = not segments or (segments[0].base_offset, segments[0].first_index) == (0, 1)
    start = read_start(directory)
    if start is None and untouched and not (directory / START_CHECKPOINT).exists():
        start = (1, 0, 0)
    if start is None:
        problems.append(f"{START_CHECKPOINT} is missing or damaged")
    terms_path = directory / TERMS_CHECKPOINT
    if read_atomic(terms_path) is None and (terms_path.exists() or len(segments) > 1):
        problems.append(f"{TERMS_CHECKPOINT} is missing or damaged")
    reports = []
    expect: tuple[int, int, int] | None = None  # next index, next offset, last term
    # Closed segments at the tail without index files were rolled but not yet sealed (the
    # flush after a roll fsyncs them, then writes their index): normal for a running log.
    sealed_below = first_unsealed(segments)
    for i, seg in enumerate(segments):
        report = _verify_segment(seg, expect, closed=i < sealed_below)
        reports.append(report)
        if not report.complete:
            expect = None  # where it ends is unknown: the next segment's name is the guide
        elif report.entries:
            expect = (report.last_index + 1, report.next_offset, report.last_term)
        elif expect is None:
            expect = (seg.first_index, seg.base_offset, 0)
    if not segments:
        problems.append("no segment files")
    return FolderReport(
        directory,
        start[0] if start else None,
        start[1] if start else None,
        start[2] if start else None,
        reports,
        problems,
    )


def _verify_segment(
    seg: Segment, expect: tuple[int, int, int] | None, *, closed: bool
) -> SegmentReport:
    report = SegmentReport(seg.name, seg.base_offset, seg.first_index, seg.size)
    if expect is not None and (seg.first_index, seg.base_offset) != expect[:2]:
        report.problems.append(
            f"starts at index {seg.first_index} offset {seg.base_offset}, but the previous "
            f"segment ends before index {expect[0]} offset {expect[1]}"
        )
    positions = array("q")
    data_entries: list[EntryHeader] = []
    tag_slots: list[tuple[int, int, int, int]] = []  # what the tag index must hold
    state = [seg.first_index, seg.base_offset, expect[2] if expect else 0]

    def check(position: int, h: EntryHeader) -> str | None:
        if h.index != state[0] or h.base_offset != state[1]:
            return (
                f"entry at byte {position} has index {h.index} offset {h.base_offset}, "
                f"expected index {state[0]} offset {state[1]}"
            )
        if h.term < state[2]:
            return f"entry at byte {position} has term {h.term}, below {state[2]}"
        if report.entries == 0:
            report.first_term = h.term
        positions.append(position)
        if h.type == EntryType.DATA:
            data_entries.append(h)
            if h.attributes & TAGGED:
                bloom = seg.tag_bloom_at(position, h.size)
                tag_slots.append((h.base_offset - seg.base_offset, position, h.size, bloom))
        report.entries += 1
        report.records += h.record_count
        report.max_timestamp = max(report.max_timestamp, h.max_timestamp)
        state[:] = [h.index + 1, h.next_offset, h.term]
        return None

    try:
        result = seg.scan(verify=True, on_entry=check)
    finally:
        seg.close_fd()
    report.last_index, report.next_offset, report.last_term = state
    report.last_index -= 1
    if result.error is not None:
        report.problems.append(f"{result.error} (segment {seg.name}, byte {result.valid_end})")
        report.complete = False
    _verify_records(seg, report, data_entries)
    if closed:
        _verify_index_files(seg, report, positions, result.valid_end)
        _verify_tag_index(seg, report, tag_slots)
    return report


def _verify_records(seg: Segment, report: SegmentReport, data_entries: list[EntryHeader]) -> None:
    """Check the records of every DATA entry whose CRC checked out: a CRC proves the bytes are
    what was written, not that a consumer can read them (an entry written before the broker
    checked records, or by another writer, may not decode)."""
    bad = 0
    with open(seg.path, "rb") as f:
        fd = f.fileno()
        for h in data_entries:
            payload = os.pread(fd, h.payload_length, h.position + HEADER_SIZE)
            try:
                check_payload(
                    h.attributes,
                    payload,
                    0,
                    len(payload),
                    h.record_count,
                    h.first_timestamp,
                    h.max_timestamp,
                    # Tag headers of an untagged entry predate tag blocks: readable as they are.
                    check_tags=bool(h.attributes & TAGGED),
                )
            except InvalidEntryError as exc:
                bad += 1
                if bad <= MAX_RECORD_PROBLEMS:
                    report.problems.append(
                        f"entry at byte {h.position} (index {h.index}) has records that cannot "
                        f"be decoded: {exc} (segment {seg.name}, byte {h.position})"
                    )
    if bad > MAX_RECORD_PROBLEMS:
        report.problems.append(
            f"{bad - MAX_RECORD_PROBLEMS} more entries with undecodable records in {seg.name}"
        )


def _verify_index_files(
    seg: Segment, report: SegmentReport, positions: array, valid_end: int
) -> None:
    """Check the index files against the entries found. Past a bad entry (``valid_end``
    below the segment's size) no boundary is known: slots there are not judged."""
    raw = read_atomic(seg.index_path)
    traw = read_atomic(seg.time_index_path)
    if raw is None or traw is None:
        report.problems.append("index files missing or damaged (the log rebuilds them on open)")
        return
    report.index_slots = len(raw) // _OFFSET_SLOT.size
    for n, (_ro, _ri, p) in enumerate(_OFFSET_SLOT.iter_unpack(raw)):
        if not report.complete and p >= valid_end:
            break
        k = bisect_left(positions, p)
        if k == len(positions) or positions[k] != p:
            report.problems.append(f"index slot {n} points at byte {p}, not an entry boundary")
            return
    stamps = [ts for ts, _ in _TIME_SLOT.iter_unpack(traw)]
    if not report.complete:
        return  # the max timestamp of the unreadable part is unknown
    if stamps != sorted(set(stamps)):
        report.problems.append("time index timestamps are not strictly increasing")
    elif stamps and stamps[-1] != report.max_timestamp:
        report.problems.append(
            f"time index ends at {stamps[-1]}, the segment's max timestamp is "
            f"{report.max_timestamp}"
        )


def _verify_tag_index(
    seg: Segment, report: SegmentReport, tag_slots: list[tuple[int, int, int, int]]
) -> None:
    """The tag index must hold one slot per tagged entry, as the entries say. A missing
    file is no problem (a segment sealed before tags existed has none: the log builds it
    on first use); one that disagrees is."""
    if not seg.tag_index_path.exists() or not report.complete:
        return
    raw = read_atomic(seg.tag_index_path)
    if raw is None or len(raw) % _TAG_SLOT.size:
        report.problems.append(f"{seg.tag_index_path.name} is damaged (the log rebuilds it)")
    elif list(_TAG_SLOT.iter_unpack(raw)) != tag_slots:
        report.problems.append(
            f"{seg.tag_index_path.name} does not list the segment's {len(tag_slots)} tagged "
            "entries as they are; delete it and the log rebuilds it"
        )


def describe(h: EntryHeader) -> dict[str, int | str]:
    return {
        "index": h.index,
        "term": h.term,
        "type": h.type.name,
        "offset": h.base_offset,
        "records": h.record_count,
        "bytes": h.size,
        "max_timestamp": h.max_timestamp,
        "producer": h.producer_id,
        "crc": f"{h.crc:08x}",
    }


__all__ = ["FolderReport", "SegmentReport", "describe", "iter_entries", "verify_folder"]
