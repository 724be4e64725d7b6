"""The read paths of a :class:`~raftmq.log.log.Log`: whole entries by message offset (the
consumer's fetch) or by Raft index (replication), and the lookup by timestamp.

A read finds its segment by bisection and its place in it by the sparse index, then hands
out the bytes as stored: only framing is decoded, and CRCs are checked only past what this
process already verified (the disk-read trust boundary). These are functions of the log
they read, called with its lock held (see log.py for why the log's code is split into
modules of functions rather than classes).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from raftmq.format import entry
from raftmq.format.entry import EntryHeader, EntryType
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.log.errors import OutOfRangeError
from raftmq.log.segment import Segment

if TYPE_CHECKING:
    from raftmq.log.log import Log

READ_SLACK_BYTES = 64 * 1024  # extra bytes read past max_bytes to find the next header cheaply
_NO_BOUND = 1 << 62  # a stop bound no index or offset reaches
FIRST_INDEX = attrgetter("first_index")  # bisect keys over the segment list
BASE_OFFSET = attrgetter("base_offset")
_T = TypeVar("_T")


class StaleIndexError(Exception):
    """A closed segment's index, loaded from its files, names an entry at a slot that is
    not the one there: the files passed their CRC but are not this segment's (a bug, or
    a file put back from elsewhere). The caller rebuilds the index and looks up again."""

    def __init__(self, seg: Segment, reason: str) -> None:
        super().__init__(reason)
        self.seg = seg
        self.reason = reason


def check_slot(seg: Segment, position: int) -> None:
    """Before a lookup starts at ``position`` (a slot of ``seg``'s index), make sure the
    entry there is the one the slot names, when the index came from files and this slot
    was not checked yet: one header read per slot per load, so the hot path (the active
    segment, slots already checked) pays a bisection. Raises StaleIndexError."""
    idx = seg.index
    if idx is None or not idx.from_file or position == 0:
        return
    slot = idx.slot_at(position)
    if slot is not None and idx.checked_slots[slot]:
        return
    claimed = idx.entry_at(position)
    found: tuple[int, int] | None = None
    if position + entry.HEADER_SIZE <= seg.size:
        try:
            _, _, index, base, _ = entry.frame_at(seg.pread(entry.HEADER_SIZE, position), 0)
            found = (index, base)
        except InvalidEntryError:
            pass
    if claimed is None or found != claimed:
        raise StaleIndexError(
            seg,
            f"its slot at byte {position} names (index, offset) {claimed} but the entry "
            f"there is {found if found is not None else 'not an entry start'}",
        )
    assert slot is not None
    idx.checked_slots[slot] = 1


def with_checked_index(log: Log, lookup: Callable[[], _T]) -> _T:
    """Run ``lookup``; if it finds a stale index, rebuild that index and run it again (the
    rebuilt index is this process's own, so the second run cannot find one stale)."""
    try:
        return lookup()
    except StaleIndexError as exc:
        log._rebuild_index(exc.seg, exc.reason)
    return lookup()


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole entries as stored. ``next_offset``/``next_index`` say where the next read starts."""

    data: bytes
    entries: int
    first_index: int
    next_index: int
    next_offset: int


def read_from_offset(log: Log, offset: int, max_bytes: int, upper_offset: int | None) -> ReadResult:
    """``Log.read``: from the entry holding ``offset``, below ``upper_offset``."""
    upper = offset_bounds(log, offset, max_bytes, upper_offset)
    if offset >= upper:
        return ReadResult(b"", 0, log.next_index, log.next_index, offset)
    pos = log._segment_at(offset, BASE_OFFSET)
    start_index = log.start_index
    return with_checked_index(
        log,
        lambda: _collect(
            log,
            pos,
            lambda seg: log._index_of(seg).position_for_offset(offset),
            lambda i, base, n: base + n <= offset or i < start_index,
            max_bytes,
            stop_index=_NO_BOUND,
            stop_offset=upper,
        ),
    )


def offset_bounds(log: Log, offset: int, max_bytes: int, upper_offset: int | None) -> int:
    """Check a read by offset's arguments (OutOfRangeError names the log's range); the
    offset it must stop before."""
    check_max_bytes(max_bytes)
    if not log.start_offset <= offset <= log.next_offset:
        raise OutOfRangeError(
            f"offset {offset} is out of range: the log holds offsets "
            f"{log.start_offset} to {log.next_offset - 1} (next is {log.next_offset})",
            start=log.start_offset,
            end=log.next_offset,
        )
    return log.next_offset if upper_offset is None else min(upper_offset, log.next_offset)


def read_from_index(log: Log, lo: int, max_bytes: int, hi: int | None) -> ReadResult:
    """``Log.read_by_index``: entries with Raft index in [lo, hi)."""
    check_max_bytes(max_bytes)
    if not log.start_index <= lo <= log.next_index:
        raise OutOfRangeError(
            f"index {lo} is out of range: the log holds indexes "
            f"{log.start_index} to {log.next_index - 1}",
            start=log.start_index,
            end=log.next_index,
        )
    upper = log.next_index if hi is None else min(hi, log.next_index)
    if lo >= upper:
        return ReadResult(b"", 0, lo, lo, log.next_offset)
    pos = log._segment_at(lo, FIRST_INDEX)
    return with_checked_index(
        log,
        lambda: _collect(
            log,
            pos,
            lambda seg: log._index_of(seg).position_for_index(lo),
            lambda i, base, n: i < lo,
            max_bytes,
            stop_index=upper,
            stop_offset=_NO_BOUND,
        ),
    )


def _collect(
    log: Log,
    pos: int,
    start_position: Callable[[Segment], int],
    skip: Callable[[int, int, int], bool],
    max_bytes: int,
    *,
    stop_index: int,
    stop_offset: int,
) -> ReadResult:
    """Whole entries from segment ``pos`` on. ``skip`` sees each entry's (index, base
    offset, record count) until the first one wanted (``_seek`` places the reads there,
    and what follows it is wanted too); the read stops before an entry with index
    ``stop_index`` or holding offsets at or past ``stop_offset``. Only framing is
    decoded, and CRCs are checked only past what this process already verified. The
    bounds are numbers, not callables, because the inner loop runs once per entry."""
    segments = log._segments
    pieces: list[bytes] = []
    total_bytes = entries = 0
    first_index = next_index = next_offset = -1
    frame_at = entry.frame_at
    done = False
    first_segment = True
    while pos < len(segments) and not done:
        seg = segments[pos]
        if seg is not segments[-1]:
            log._cache_touch(seg)  # bound open descriptors on reads across segments
        position = start_position(seg) if first_segment else 0
        check_slot(seg, position)
        if not entries:
            # The index knows the entry at its slot: when that one is wanted (as for a
            # consumer reading on from the last read's end), no seek read is needed.
            # Counting it as a data entry is a guess; if it is a control entry to
            # skip, the walk below skips it.
            at = _entry_after(log, pos, seg, position) if position < seg.size else None
            if at is None or skip(at[0], at[1], 1):
                position = _seek(log, seg, position, skip)
        first_segment = False
        while position < seg.size and not done:
            if seg.corrupt_at is not None and position >= seg.corrupt_at:
                raise corrupt(seg, seg.corrupt_at, "found when its index was rebuilt")
            want_bytes = _read_size(log, seg, position, max_bytes - total_bytes, have=entries)
            if not want_bytes:
                done = True  # what is left of max_bytes cannot hold another entry
                break
            chunk = seg.pread(want_bytes, position)
            size_bytes, _, index, base, count = _frame(seg, chunk, 0, position)
            after = _entry_after(log, pos, seg, position + want_bytes)
            if (
                after is not None
                and want_bytes <= max_bytes - total_bytes  # not the slack read for a first entry
                and after[0] <= stop_index
                and after[1] < stop_offset
                and (entries or not skip(index, base, count))
            ):
                # Whole entries, none near a bound: the index says where they end, so
                # the bytes go out without the bounded walk below; those this process
                # has not checked yet get a lean CRC walk first.
                verified = seg.verified_upto
                if verified < position + want_bytes:
                    bad = entry.first_bad_entry(chunk, max(0, verified - position))
                    if bad is not None:
                        raise corrupt(seg, position + bad[0], bad[1])
                    if verified >= position:
                        seg.verified_upto = position + want_bytes
                if first_index < 0:
                    first_index = index
                entries += after[0] - index
                total_bytes += want_bytes
                next_index, next_offset = after
                pieces.append(chunk)
                position += want_bytes
                if total_bytes >= max_bytes:
                    done = True
                continue
            if size_bytes > len(chunk):
                # The first entry is larger than the read: decide on it from its header,
                # then read it whole if it is wanted.
                if position + size_bytes > seg.size:
                    raise corrupt(seg, position, "entry runs past the segment end")
                if skip(index, base, count):
                    position += size_bytes
                    continue
                if (
                    index >= stop_index
                    or base + count > stop_offset
                    or (count == 0 and base >= stop_offset)
                    or (entries and total_bytes + size_bytes > max_bytes)
                ):
                    done = True
                    break
                chunk = seg.pread(size_bytes, position)
            p = 0
            begin = None
            end = len(chunk)
            verified = seg.verified_upto - position
            header_bytes = entry.HEADER_SIZE
            try:
                while end - p >= header_bytes:
                    size_bytes, crc, index, base, count = frame_at(chunk, p)
                    if p + size_bytes > end:
                        break  # continues past this read: the next read starts here
                    if begin is None and not entries and skip(index, base, count):
                        p += size_bytes
                        continue
                    if (
                        index >= stop_index
                        or base + count > stop_offset
                        or (count == 0 and base >= stop_offset)
                        or (entries and total_bytes + size_bytes > max_bytes)
                    ):
                        done = True
                        break
                    # Trust boundary: the disk read. Bytes not yet checked by this
                    # process are CRC-checked before they are served.
                    if p >= verified and not entry.crc_matches(chunk, p, size_bytes, crc):
                        raise corrupt(seg, position + p, "CRC mismatch")
                    if begin is None:
                        begin = p
                        if first_index < 0:
                            first_index = index
                    entries += 1
                    total_bytes += size_bytes
                    next_index, next_offset = index + 1, base + count
                    p += size_bytes
            except InvalidEntryError as exc:
                raise corrupt(seg, position + p, str(exc)) from None
            if begin is not None:
                pieces.append(chunk if (begin, p) == (0, end) else chunk[begin:p])
            if position <= seg.verified_upto < position + p:
                seg.verified_upto = position + p  # checked now: later reads skip it
            assert p > 0 or done, "a read must advance or finish"
            position += p
            if total_bytes >= max_bytes:
                done = True
        pos += 1
    if not entries:
        return ReadResult(b"", 0, log.next_index, log.next_index, log.next_offset)
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return ReadResult(data, entries, first_index, next_index, next_offset)


def _seek(log: Log, seg: Segment, position: int, skip: Callable[[int, int, int], bool]) -> int:
    """From an index slot, the position of the first entry ``skip`` does not refuse (at
    most about one index interval further), found with small reads so the bulk read
    that follows can start exactly there and be returned without a copy."""
    window_bytes = log.config.index_interval_bytes + entry.HEADER_SIZE
    while position < seg.size:
        if seg.corrupt_at is not None and position >= seg.corrupt_at:
            raise corrupt(seg, seg.corrupt_at, "found when its index was rebuilt")
        chunk = seg.pread(min(window_bytes, seg.size - position), position)
        p = 0
        while len(chunk) - p >= entry.HEADER_SIZE:
            size_bytes, _, index, base, count = _frame(seg, chunk, p, position)
            if not skip(index, base, count):
                return position + p
            p += size_bytes
        if p == 0:
            raise corrupt(seg, position, "no whole entry where one must start")
        position += p
    return position


def _entry_after(log: Log, pos: int, seg: Segment, end: int) -> tuple[int, int] | None:
    """(Raft index, base offset) of the entry that starts at byte ``end`` of segment
    ``pos``, when the index or the segment's end says so without reading; else None."""
    if end == seg.size:
        if pos + 1 < len(log._segments):
            following = log._segments[pos + 1]
            return following.first_index, following.base_offset
        return log.next_index, log.next_offset
    if seg.index is None:
        return None
    found = seg.index.entry_at(end)
    if found is not None:
        # Trusted to say where whole entries end and what follows: a slot from a file is
        # checked against the disk first (once), or a read could end mid-entry.
        check_slot(seg, end)
    return found


def _read_size(log: Log, seg: Segment, position: int, budget_bytes: int, *, have: int) -> int:
    """Bytes to read from ``position``: up to the last index slot (an entry boundary)
    within ``budget_bytes`` when there is one, so the read holds only whole entries. When
    none fits, a read that already has entries reads exactly the rest of its budget
    (less than one index interval: whatever whole entries fit are taken, as max_bytes
    promises), or stops (0) when not even a header fits. A read with nothing yet reads
    ``budget_bytes`` plus slack: it must return at least one entry."""
    rest_bytes = seg.size - position
    if budget_bytes >= rest_bytes:
        return rest_bytes
    index = log._index_of(seg)
    positions = index.positions
    k = bisect_right(positions, position + budget_bytes)
    boundary = positions[k - 1] if k else 0
    if boundary > position:
        return boundary - position
    if have:
        if budget_bytes < entry.HEADER_SIZE:
            return 0
        if (
            0 < k < len(positions)
            and boundary == position
            and index.indexes[k] == index.indexes[k - 1] + 1
        ):
            # The index has slots at both ends of the entry here, and it is larger than
            # the budget: nothing more fits, and reading the budget would be wasted.
            return 0
        return min(rest_bytes, budget_bytes)
    return min(rest_bytes, max(budget_bytes, 0) + READ_SLACK_BYTES)


def _frame(seg: Segment, buf: bytes, p: int, base: int) -> tuple[int, int, int, int, int]:
    try:
        return entry.frame_at(buf, p)
    except InvalidEntryError as exc:
        raise corrupt(seg, base + p, str(exc)) from None


def corrupt(seg: Segment, position: int, why: str) -> CorruptEntryError:
    """The error a read (or a header walk) raises for a bad entry on disk."""
    return CorruptEntryError(
        f"corrupt entry in segment {seg.name} at byte {position}: {why}; "
        "it is not served. Run 'raftmq log verify' on this folder",
        position=position,
        segment=seg.name,
    )


def check_max_bytes(max_bytes: int) -> None:
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")


def offset_for_timestamp(log: Log, timestamp_ms: int) -> int | None:
    """``Log.offset_for_timestamp``: the first retained DATA entry at or after
    ``timestamp_ms``, found through each segment's time index."""
    found: list[int] = []
    start_index = log.start_index

    def match(_: int, h: EntryHeader) -> str | None:
        if h.index < start_index:
            return None  # below the start: deleted as far as readers know
        if h.type == EntryType.DATA and h.max_timestamp >= timestamp_ms:
            found.append(h.base_offset)
            return "found"
        return None

    def position_in(seg: Segment) -> int | None:
        position = log._index_of(seg).position_for_timestamp(timestamp_ms)
        if position is not None:
            check_slot(seg, position)
        return position

    for seg in log._segments:
        if seg.size == 0:
            continue
        position = with_checked_index(log, partial(position_in, seg))
        if position is None:
            continue
        seg.scan(verify=False, on_entry=match, start=position)
        if found:
            return found[0]
    return None
