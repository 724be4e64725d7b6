"""A consumer's read with a tag filter (docs/tags.md): the entries that may hold a matching
record, whole and as stored, and how far the read looked.

Two ways, chosen by whether the expression is true on the empty tag set:

- false on it (``paid``, ``paid && eu``): only tagged entries can match, and the segment's
  tag index lists them all with a bloom of their tags. The read walks the index, reads
  the header and tag block of each entry the bloom lets through (a bloom false positive
  costs that small read), and reads whole only those whose block may match. Untagged
  entries and ruled-out ones are never read.
- true on it (``!debug``): untagged entries match, so the read goes on sequentially, as an
  unfiltered one does, and drops the tagged entries whose block rules them out.

Both stop at ``max_bytes`` of answer or at a bound on the work (index slots looked at,
bytes read), and say where they stopped in ``next_offset``: everything before it was
looked at, so a consumer moves on (and commits) past it even when nothing matched.
These are functions of the log they read, called with its lock held.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.format import entry
from raftmq.format.entry import HEADER_SIZE
from raftmq.format.errors import InvalidEntryError
from raftmq.format.tag_filter import TagFilter
from raftmq.format.tags import MAX_BLOCK_BYTES
from raftmq.log import reads, recovery
from raftmq.log.segment import Segment

if TYPE_CHECKING:
    from raftmq.log.log import Log

MAX_SCAN_SLOTS = 100_000
"""Tag index slots one filtered read looks at, at most (an indexed read's work bound)."""
MAX_SCAN_BYTES = 32 * 1024 * 1024
"""Bytes one filtered read reads from segment files, at most, past its first entry."""
_HEAD_BYTES = HEADER_SIZE + 256
"""What an indexed read reads first of a candidate: its header and (usually) its block."""
_WHOLE_READ_BYTES = 4096
"""A candidate at most this large is read whole at once: one read costs about the same as
a header read, and a match then needs no second one."""
_SEQUENTIAL_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FilteredRead:
    """Whole entries that may match; ``next_offset`` is where the read stopped looking
    (past every entry it looked at); ``read_bytes`` what it read from segment files."""

    data: bytes
    entries: int
    next_offset: int
    read_bytes: int


def read_filtered(
    log: Log, offset: int, max_bytes: int, upper_offset: int | None, flt: TagFilter
) -> FilteredRead:
    """``Log.read_filtered``: from the entry holding ``offset``, below ``upper_offset``."""
    upper = reads.offset_bounds(log, offset, max_bytes, upper_offset)
    if offset >= upper:
        return FilteredRead(b"", 0, offset, 0)
    if flt.matches_untagged:
        return _sequential(log, offset, max_bytes, upper, flt)
    return reads.with_checked_index(log, lambda: _indexed(log, offset, max_bytes, upper, flt))


def _sequential(log: Log, offset: int, max_bytes: int, upper: int, flt: TagFilter) -> FilteredRead:
    """Read on as an unfiltered read does, keeping untagged entries and tagged ones whose
    block may match."""
    pieces: list[bytes] = []
    total_bytes = entries = read_bytes = 0
    at = offset
    while at < upper and total_bytes < max_bytes and read_bytes < MAX_SCAN_BYTES:
        got = reads.read_from_offset(
            log, at, max(max_bytes - total_bytes, _SEQUENTIAL_CHUNK_BYTES), upper
        )
        if not got.entries:
            break
        read_bytes += len(got.data)
        view = memoryview(got.data)
        for position, f in entry.iter_fields(view, verify=False):
            size, attributes, base, count = f[0] + 4, f[4], f[7], f[8]
            if base + count <= at and count:
                continue  # before the offset asked for (the read starts at its entry)
            if f[3] == entry.EntryType.DATA and (
                not attributes & entry.TAGGED
                or flt.may_match_block(view, position + HEADER_SIZE, position + size)
            ):
                if entries and total_bytes + size > max_bytes:
                    return FilteredRead(b"".join(pieces), entries, base, read_bytes)
                pieces.append(bytes(view[position : position + size]))
                total_bytes += size
                entries += 1
        at = got.next_offset
    return FilteredRead(b"".join(pieces), entries, min(at, upper), read_bytes)


def _indexed(log: Log, offset: int, max_bytes: int, upper: int, flt: TagFilter) -> FilteredRead:
    """Walk the tag indexes from the segment holding ``offset``: only tagged entries can
    match a filter false on the empty set."""
    segments = log._segments
    pieces: list[bytes] = []
    total_bytes = entries = read_bytes = slots = 0
    pos = log._segment_at(offset, reads.BASE_OFFSET)
    while pos < len(segments):
        seg = segments[pos]
        if seg.base_offset >= upper:
            break
        if seg is not segments[-1]:
            log._cache_touch(seg)
        idx = log._index_of(seg)
        if not idx.tags_known:
            recovery.build_tag_index(log, seg)
        rel = idx.tag_offsets
        # The entry holding ``offset`` may start before it: begin one slot back.
        k = (
            max(0, bisect_left(rel, offset - seg.base_offset) - 1)
            if offset > seg.base_offset
            else 0
        )
        while k < len(rel):
            base = seg.base_offset + rel[k]
            if base >= upper:
                return FilteredRead(b"".join(pieces), entries, upper, read_bytes)
            if (
                slots >= MAX_SCAN_SLOTS
                or read_bytes >= MAX_SCAN_BYTES
                or (entries and total_bytes >= max_bytes)
            ):
                # Everything between the last slot looked at and this one is untagged or
                # was ruled out: the read may say it looked that far.
                return FilteredRead(b"".join(pieces), entries, max(base, offset), read_bytes)
            slots += 1
            position, size = idx.tag_positions[k], idx.tag_sizes[k]
            if flt.may_match_bloom(idx.tag_blooms[k]):
                got = _candidate(seg, position, size, base, offset, flt)
                read_bytes += got[1]
                data = got[0]
                if data is not None:
                    if entries and total_bytes + size > max_bytes:
                        return FilteredRead(b"".join(pieces), entries, base, read_bytes)
                    pieces.append(data)
                    total_bytes += size
                    entries += 1
            k += 1
        pos += 1
    # Every slot up to the log's end (or the bound) was looked at.
    end = segments[pos].base_offset if pos < len(segments) else log.next_offset
    return FilteredRead(b"".join(pieces), entries, min(max(end, offset), upper), read_bytes)


def _candidate(
    seg: Segment, position: int, size: int, base: int, offset: int, flt: TagFilter
) -> tuple[bytes | None, int]:
    """The entry at ``position`` when its block may match and it holds offsets at or past
    ``offset``, else None; with the bytes read to decide."""
    if seg.corrupt_at is not None and position >= seg.corrupt_at:
        raise reads.corrupt(seg, seg.corrupt_at, "found when its index was rebuilt")
    want = size if size <= _WHOLE_READ_BYTES else _HEAD_BYTES
    head = seg.pread(want, position)
    read_bytes = want
    try:
        f = entry.decode_header(head, 0)
    except InvalidEntryError as exc:
        raise reads.StaleIndexError(seg, f"its tag slot at byte {position}: {exc}") from None
    if f[0] + 4 != size or f[7] != base:
        raise reads.StaleIndexError(
            seg,
            f"its tag slot at byte {position} names an entry of {size} bytes at offset {base}, "
            f"but the entry there has {f[0] + 4} bytes at offset {f[7]}",
        )
    if base + f[8] <= offset:
        return None, read_bytes
    block_end = min(size, HEADER_SIZE + MAX_BLOCK_BYTES)
    if block_end > want and not _block_within(head, want):
        head = seg.pread(block_end, position)
        read_bytes += block_end
    if not flt.may_match_block(head, HEADER_SIZE, min(len(head), size)):
        return None, read_bytes
    if len(head) < size:
        head = seg.pread(size, position)
        read_bytes += size
    if position + size > seg.verified_upto and not entry.crc_matches(head, 0, size, f[1]):
        raise reads.corrupt(seg, position, "CRC mismatch")
    return head, read_bytes


def _block_within(head: bytes, end: int) -> bool:
    """Whether the tag block after the header ends within ``head[:end]``."""
    pos = HEADER_SIZE + 1
    if pos > end:
        return False
    for _ in range(head[HEADER_SIZE]):
        if pos >= end:
            return False
        pos += 1 + head[pos]
    return pos <= end
