"""The sparse offset index, time index and tag index of one segment.

Both hold one slot per ``index.interval.bytes`` of log, so a lookup is a binary search
followed by a scan of at most one interval. Slots are relative to the segment's base
offset and first Raft index and stored as u32, which is why a segment stays under 2 GiB.

In memory the slots stay relative too, as arrays of u32: then loading a file is a
byte swap and three slices in C, not a loop over tens of thousands of slots.

The tag index is not sparse: one slot per tagged DATA entry (relative base offset,
position, size and a 64-bit bloom of its tag block, docs/format.md "Index files"), so a
filtered fetch finds the entries that may match without reading any other.

The active segment's indexes live only in memory (it is rescanned on open anyway); a
segment's index files are written once, atomically and with a CRC, when it is closed. A
missing or damaged file is therefore never trusted: it is rebuilt from the segment, on
first use, with one WARNING naming the file and what was wrong with it
(``recovery.rebuild_index``).
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic

_OFFSET_SLOT = struct.Struct(">III")  # relative offset, relative Raft index, byte position
_TIME_SLOT = struct.Struct(">qI")  # max timestamp so far, relative offset
_TAG_SLOT = struct.Struct(">IIIQ")  # relative base offset, position, size, bloom
_SWAP = sys.byteorder == "little"  # the files are big-endian
assert array("I").itemsize == 4 and array("q").itemsize == 8 and array("Q").itemsize == 8


class SegmentIndex:
    """Offset and time slots of one segment, with the running state needed to extend them.

    ``offsets``, ``indexes`` and ``time_offsets`` are relative to the segment's base offset
    and first index; ``positions`` are byte positions; ``timestamps_ms`` are absolute.
    ``tag_*``: one slot per tagged entry (relative base offset, position, size, bloom)."""

    __slots__ = (
        "base_offset",
        "checked_slots",
        "first_index",
        "from_file",
        "indexes",
        "last_slot_position",
        "max_timestamp_ms",
        "offsets",
        "positions",
        "tag_blooms",
        "tag_offsets",
        "tag_positions",
        "tag_sizes",
        "tags_known",
        "time_offsets",
        "timestamps_ms",
    )

    def __init__(self, base_offset: int, first_index: int) -> None:
        self.base_offset = base_offset
        self.first_index = first_index
        self.offsets = array("I")
        self.indexes = array("I")
        self.positions = array("I")
        self.timestamps_ms = array("q")
        self.time_offsets = array("I")
        self.tag_offsets = array("I")
        self.tag_positions = array("I")
        self.tag_sizes = array("I")
        self.tag_blooms = array("Q")
        self.tags_known = True
        """False for a segment sealed before tag indexes existed (it has no .tagindex):
        a filtered read builds its tag slots first (``recovery.build_tag_index``)."""
        self.last_slot_position = -1
        self.max_timestamp_ms = -1
        # Loaded from files (not built by this process from the segment): a lookup checks
        # that the entry at the slot it starts from is the one the slot names, once per
        # slot (reads.check_slot), so a file that passed its CRC yet is wrong for this
        # segment cannot make a read skip or misplace records.
        self.from_file = False
        self.checked_slots = bytearray()  # one flag per slot, sized at load (1 byte each)

    def observe(
        self,
        position: int,
        index: int,
        base_offset: int,
        max_timestamp_ms: int,
        interval_bytes: int,
    ) -> None:
        """Account for one entry appended at ``position``; add slots when an interval passed."""
        if max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = max_timestamp_ms
        if self.last_slot_position >= 0 and position - self.last_slot_position < interval_bytes:
            return
        self.last_slot_position = position
        assert 0 <= base_offset - self.base_offset < 1 << 32, "relative offset past u32: roll"
        assert 0 <= index - self.first_index < 1 << 32, "relative index past u32: roll"
        self.offsets.append(base_offset - self.base_offset)
        self.indexes.append(index - self.first_index)
        self.positions.append(position)
        if not self.timestamps_ms or self.max_timestamp_ms > self.timestamps_ms[-1]:
            self.timestamps_ms.append(self.max_timestamp_ms)
            self.time_offsets.append(base_offset - self.base_offset)

    def observe_tagged(self, position: int, base_offset: int, size: int, bloom: int) -> None:
        """Account for a tagged DATA entry appended at ``position`` (after ``observe``)."""
        assert not self.tag_positions or position > self.tag_positions[-1]
        self.tag_offsets.append(base_offset - self.base_offset)
        self.tag_positions.append(position)
        self.tag_sizes.append(size)
        self.tag_blooms.append(bloom)

    def position_for_offset(self, offset: int) -> int:
        """Byte position of a slot at or before the entry holding ``offset``."""
        # Entries sharing a base offset are control entries followed by at most one data
        # entry, so the last slot at or below ``offset`` never lies past the entry holding it.
        slot = bisect_right(self.offsets, offset - self.base_offset) - 1
        return self.positions[slot] if slot >= 0 else 0

    def position_for_index(self, index: int) -> int:
        slot = bisect_right(self.indexes, index - self.first_index) - 1
        return self.positions[slot] if slot >= 0 else 0

    def position_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Where to start scanning for the first entry whose max timestamp is >= ``timestamp_ms``;
        None when no entry of this segment reaches it."""
        if self.max_timestamp_ms < timestamp_ms:
            return None
        t = bisect_left(self.timestamps_ms, timestamp_ms)
        if t == len(self.timestamps_ms):
            # No slot's running maximum reached it yet: the entry lies after the last slot.
            return self.positions[-1] if self.positions else 0
        slot = bisect_left(self.offsets, self.time_offsets[t]) - 1
        return self.positions[slot] if slot >= 0 else 0

    def slot_at(self, position: int) -> int | None:
        """Number of the slot at ``position``, None when no slot is there."""
        k = bisect_left(self.positions, position)
        return k if k < len(self.positions) and self.positions[k] == position else None

    def entry_at(self, position: int) -> tuple[int, int] | None:
        """(Raft index, base offset) of the entry at ``position`` when a slot marks one there."""
        k = bisect_left(self.positions, position)
        if k < len(self.positions) and self.positions[k] == position:
            return self.first_index + self.indexes[k], self.base_offset + self.offsets[k]
        return None

    def truncate_to_position(self, position: int) -> None:
        """Forget slots at or after ``position``; the caller rescans to restore the maxima."""
        keep = bisect_left(self.positions, position)
        del self.offsets[keep:]
        del self.indexes[keep:]
        del self.positions[keep:]
        keep = bisect_left(self.tag_positions, position)
        del self.tag_offsets[keep:]
        del self.tag_positions[keep:]
        del self.tag_sizes[keep:]
        del self.tag_blooms[keep:]

    def seal(self, last_base_offset: int) -> None:
        """Record the segment's final max timestamp so retention can read it from the file."""
        if self.max_timestamp_ms >= 0 and (
            not self.timestamps_ms or self.max_timestamp_ms > self.timestamps_ms[-1]
        ):
            self.timestamps_ms.append(self.max_timestamp_ms)
            self.time_offsets.append(last_base_offset - self.base_offset)

    # --- files -------------------------------------------------------------------------

    def write(self, offset_path: Path, time_path: Path, tag_path: Path) -> None:
        # The tag index first: the other two mark the segment sealed (docs/format.md).
        self.write_tags(tag_path)
        write_atomic(offset_path, _interleave_words(self.offsets, self.indexes, self.positions))
        # A big-endian i64 is two big-endian u32 words, high word first.
        stamps = array("I")
        stamps.frombytes(self.timestamps_ms.tobytes())
        low, high = (stamps[0::2], stamps[1::2]) if _SWAP else (stamps[1::2], stamps[0::2])
        write_atomic(time_path, _interleave_words(high, low, self.time_offsets))

    def write_tags(self, tag_path: Path) -> None:
        write_atomic(tag_path, self._tag_bytes())

    def _tag_bytes(self) -> bytes:
        return b"".join(
            _TAG_SLOT.pack(*slot)
            for slot in zip(
                self.tag_offsets, self.tag_positions, self.tag_sizes, self.tag_blooms, strict=True
            )
        )

    def _load_tags(self, tag_path: Path, size_bytes: int) -> str | None:
        """Read the tag index file into this index; why it cannot be trusted, or None. A
        missing one leaves the tags unknown (a segment sealed before tag indexes existed:
        every other read goes on without it, a filtered one builds it first)."""
        if not tag_path.exists():
            self.tags_known = False
            return None
        raw = _read_slots(tag_path, _TAG_SLOT.size)
        if isinstance(raw, str):
            return raw
        rows = list(_TAG_SLOT.iter_unpack(raw))
        end = -1
        last_offset = -1
        for rel, position, size, _ in rows:
            if position < end or position + size > size_bytes or rel < last_offset or not size:
                return (
                    f"{tag_path.name} has slots that do not fit its segment of {size_bytes} "
                    "bytes (overlapping, not ascending, or past its end)"
                )
            end, last_offset = position + size, rel
        self.tag_offsets = array("I", (r[0] for r in rows))
        self.tag_positions = array("I", (r[1] for r in rows))
        self.tag_sizes = array("I", (r[2] for r in rows))
        self.tag_blooms = array("Q", (r[3] for r in rows))
        return None

    @classmethod
    def load_checked(
        cls,
        offset_path: Path,
        time_path: Path,
        tag_path: Path,
        base_offset: int,
        first_index: int,
        size_bytes: int,
    ) -> SegmentIndex | str:
        """The index from its files, or why they cannot be trusted (a sentence naming the
        file, for the warning the rebuild logs).

        Two layers, both paid once per load and never per lookup: the CRC each file carries
        catches any flipped bit (CRC32C detects every 1- to 3-bit error in files this
        small), and the slot checks below catch a file that passes its CRC but does not
        describe this segment (written for another one, or by a bug): slots must start at
        the segment's first byte and entry, ascend, and stay inside the segment. A slot
        pointing past its entry would make a read skip records, which is why nothing less
        than all of this is trusted."""
        raw = _read_slots(offset_path, _OFFSET_SLOT.size)
        if isinstance(raw, str):
            return raw
        traw = _read_slots(time_path, _TIME_SLOT.size)
        if isinstance(traw, str):
            return traw
        offsets, indexes, positions = _split_words(raw)
        if positions and (
            positions[-1] >= size_bytes
            or (offsets[0], indexes[0], positions[0]) != (0, 0, 0)
            or not _ascending(offsets)
            or not _ascending(indexes, strictly=True)
            or not _ascending(positions, strictly=True)
        ):
            return (
                f"{offset_path.name} has slots that do not fit its segment of {size_bytes} "
                "bytes (not starting at its first entry, not ascending, or past its end)"
            )
        if size_bytes and not positions:
            return f"{offset_path.name} is empty but its segment holds {size_bytes} bytes"
        high, low, time_offsets = _split_words(traw)
        words = array("I", bytes(4 * 2 * len(low)))
        words[0::2], words[1::2] = (low, high) if _SWAP else (high, low)
        stamps = array("q")
        stamps.frombytes(words.tobytes())
        if (
            not _ascending(stamps, strictly=True)
            or not _ascending(time_offsets)
            or (time_offsets and time_offsets[0] != 0)
            or bool(stamps) != bool(positions)
        ):
            return (
                f"{time_path.name} has slots that do not fit its segment (timestamps or "
                "offsets not ascending, or no slot for a segment that has entries)"
            )
        idx = cls(base_offset, first_index)
        idx.offsets, idx.indexes, idx.positions = offsets, indexes, positions
        idx.timestamps_ms, idx.time_offsets = stamps, time_offsets
        idx.last_slot_position = positions[-1] if positions else -1
        idx.max_timestamp_ms = stamps[-1] if stamps else -1
        idx.from_file = True
        idx.checked_slots = bytearray(len(positions))
        problem = idx._load_tags(tag_path, size_bytes)
        return idx if problem is None else problem


def _read_slots(path: Path, slot_bytes: int) -> bytes | str:
    """The slots of an index file, or why it cannot be trusted (missing, damaged, torn)."""
    if not path.exists():
        return f"{path.name} is missing"
    raw = read_atomic(path)
    if raw is None:
        return f"{path.name} fails its CRC (damaged on disk)"
    if len(raw) % slot_bytes:
        return f"{path.name} holds a partial slot ({len(raw)} bytes)"
    return raw


def _interleave_words(a: array, b: array, c: array) -> bytes:
    """Three columns of u32 as big-endian rows (a, b, c)."""
    rows = array("I", bytes(4 * 3 * len(a)))
    rows[0::3], rows[1::3], rows[2::3] = a, b, c
    if _SWAP:
        rows.byteswap()
    return rows.tobytes()


def _split_words(raw: bytes) -> tuple[array, array, array]:
    """Big-endian rows of three u32 as three columns."""
    rows = array("I")
    rows.frombytes(raw)
    if _SWAP:
        rows.byteswap()
    return rows[0::3], rows[1::3], rows[2::3]


def _ascending(values: array, *, strictly: bool = False) -> bool:
    as_list = values.tolist()
    if as_list != sorted(as_list):
        return False
    return not strictly or len(set(as_list)) == len(as_list)
