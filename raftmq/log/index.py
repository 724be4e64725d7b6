"""The sparse offset index and time index of one segment.

Both hold one slot per ``index.interval.bytes`` of log, so a lookup is a binary search
followed by a scan of at most one interval. Slots are relative to the segment's base
offset and first Raft index and stored as u32, which is why a segment stays under 2 GiB.

The active segment's indexes live only in memory (it is rescanned on open anyway); a
segment's index files are written once, atomically and with a CRC, when it is closed. A
missing or damaged file is therefore never trusted: it is rebuilt from the segment.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic

_OFFSET_SLOT = struct.Struct(">III")  # relative offset, relative Raft index, byte position
_TIME_SLOT = struct.Struct(">qI")  # max timestamp so far, relative offset


class SegmentIndex:
    """Offset and time slots of one segment, with the running state needed to extend them."""

    __slots__ = (
        "base_offset",
        "first_index",
        "indexes",
        "last_slot_position",
        "max_timestamp",
        "offsets",
        "positions",
        "time_offsets",
        "time_stamps",
    )

    def __init__(self, base_offset: int, first_index: int) -> None:
        self.base_offset = base_offset
        self.first_index = first_index
        self.offsets = array("q")
        self.indexes = array("q")
        self.positions = array("q")
        self.time_stamps = array("q")
        self.time_offsets = array("q")
        self.last_slot_position = -1
        self.max_timestamp = -1

    def observe(
        self, position: int, index: int, base_offset: int, max_timestamp: int, interval: int
    ) -> None:
        """Account for one entry appended at ``position``; add slots when an interval passed."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
        if self.last_slot_position >= 0 and position - self.last_slot_position < interval:
            return
        self.last_slot_position = position
        self.offsets.append(base_offset)
        self.indexes.append(index)
        self.positions.append(position)
        if not self.time_stamps or self.max_timestamp > self.time_stamps[-1]:
            self.time_stamps.append(self.max_timestamp)
            self.time_offsets.append(base_offset)

    def position_for_offset(self, offset: int) -> int:
        """Byte position of a slot at or before the entry holding ``offset``."""
        # Entries sharing a base offset are control entries followed by at most one data
        # entry, so the last slot at or below ``offset`` never lies past the entry holding it.
        slot = bisect_right(self.offsets, offset) - 1
        return self.positions[slot] if slot >= 0 else 0

    def position_for_index(self, index: int) -> int:
        slot = bisect_right(self.indexes, index) - 1
        return self.positions[slot] if slot >= 0 else 0

    def position_for_timestamp(self, timestamp: int) -> int | None:
        """Where to start scanning for the first entry whose max timestamp is >= ``timestamp``;
        None when no entry of this segment reaches it."""
        if self.max_timestamp < timestamp:
            return None
        t = bisect_left(self.time_stamps, timestamp)
        if t == len(self.time_stamps):
            # No slot's running maximum reached it yet: the entry lies after the last slot.
            return self.positions[-1] if self.positions else 0
        slot = bisect_left(self.offsets, self.time_offsets[t]) - 1
        return self.positions[slot] if slot >= 0 else 0

    def truncate_to_position(self, position: int) -> None:
        """Forget slots at or after ``position``; the caller rescans to restore the maxima."""
        keep = bisect_left(self.positions, position)
        del self.offsets[keep:]
        del self.indexes[keep:]
        del self.positions[keep:]

    def seal(self, last_base_offset: int) -> None:
        """Record the segment's final max timestamp so retention can read it from the file."""
        if self.max_timestamp >= 0 and (
            not self.time_stamps or self.max_timestamp > self.time_stamps[-1]
        ):
            self.time_stamps.append(self.max_timestamp)
            self.time_offsets.append(last_base_offset)

    # --- files -------------------------------------------------------------------------

    def write(self, offset_path: Path, time_path: Path) -> None:
        buf = bytearray()
        for o, i, p in zip(self.offsets, self.indexes, self.positions, strict=True):
            buf += _OFFSET_SLOT.pack(o - self.base_offset, i - self.first_index, p)
        write_atomic(offset_path, bytes(buf))
        tbuf = bytearray()
        for ts, o in zip(self.time_stamps, self.time_offsets, strict=True):
            tbuf += _TIME_SLOT.pack(ts, o - self.base_offset)
        write_atomic(time_path, bytes(tbuf))

    @classmethod
    def load(
        cls, offset_path: Path, time_path: Path, base_offset: int, first_index: int, size: int
    ) -> SegmentIndex | None:
        """The index from its files, or None when either is missing, damaged or inconsistent
        with a segment of ``size`` bytes (the caller then rebuilds it)."""
        raw = read_atomic(offset_path)
        traw = read_atomic(time_path)
        if raw is None or traw is None:
            return None
        if len(raw) % _OFFSET_SLOT.size or len(traw) % _TIME_SLOT.size:
            return None
        idx = cls(base_offset, first_index)
        prev = (-1, -1, -1)
        for ro, ri, p in _OFFSET_SLOT.iter_unpack(raw):
            if ro < prev[0] or ri <= prev[1] or p <= prev[2] or p >= size:
                return None
            prev = (ro, ri, p)
            idx.offsets.append(base_offset + ro)
            idx.indexes.append(first_index + ri)
            idx.positions.append(p)
        for ts, ro in _TIME_SLOT.iter_unpack(traw):
            if idx.time_stamps and ts <= idx.time_stamps[-1]:
                return None
            idx.time_stamps.append(ts)
            idx.time_offsets.append(base_offset + ro)
        if size and not idx.positions:
            return None
        idx.last_slot_position = idx.positions[-1] if idx.positions else -1
        idx.max_timestamp = idx.time_stamps[-1] if idx.time_stamps else -1
        return idx
