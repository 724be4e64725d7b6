"""In-place repair of a corrupt entry in a closed segment, from a healthy replica's copy.

Replicated entries are byte-identical on every replica: the leader stamps index, term,
offset and CRC once and followers store the bytes they receive. So when an entry of a
closed segment fails its CRC (a flipped bit), the same index range read from a peer is
exactly what the damaged bytes should be. This module finds the damage (the first bad
entry of a segment, through to the segment's end, since nothing after an entry whose
framing may be wrong can be trusted), checks a replacement against everything the damaged
replica still knows (CRCs, the index range from the segment names, offsets, the size on
disk), and writes only the bytes that differ at the same positions, then fsyncs.

A replacement of another size (a flipped length field changes where this replica thinks
entries end) cannot be patched in place: :class:`RepairRefusedError` says so, and the
replica must instead be cut back and caught up by Raft.

It works on a :class:`~raftmq.log.log.Log`'s segments under the log's lock; it is the
log's companion, kept apart so the log's read and write paths stay as they are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from crc32c import crc32c

from raftmq.format import entry
from raftmq.format.entry import EntryHeader
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.log.errors import LogError
from raftmq.log.handles import open_fd
from raftmq.log.log import Log
from raftmq.log.segment import Segment

_CHUNK_BYTES = 1 << 20


class RepairRefusedError(LogError):
    """The replacement does not fit the damaged range; nothing was written."""


@dataclass(frozen=True, slots=True)
class Damage:
    """The damaged tail of one closed segment: entries ``[first_index, end_index)`` at
    bytes ``[position, position + size)``, the first of them at message offset
    ``base_offset``."""

    segment: str
    position: int
    size: int
    first_index: int
    end_index: int
    base_offset: int
    end_offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Patch:
    """What a repair replaced: ``replaced_bytes`` bytes from byte ``at`` of ``segment``
    (0 when the damaged bytes already matched, e.g. a transient read error)."""

    segment: str
    first_index: int
    end_index: int
    at: int
    replaced_bytes: int


def closed_segments(log: Log) -> list[tuple[Segment, Segment]]:
    """Each sealed segment (closed, with index files) with the one after it, as fresh
    handles with their own file descriptors: scanning them takes no lock of the log and
    shares no state with its readers (sealed segments are never written)."""
    segs = [Segment(log.directory, base, first, size) for _, first, base, size in log.segments()]
    return [(seg, segs[i + 1]) for i, seg in enumerate(segs[:-1]) if seg.has_index_files()]


def find_damage(log: Log) -> list[Damage]:
    """Every sealed segment whose entries fail their CRC or framing (reads each once: for
    a repair or a scrub, not for the hot path)."""
    return [d for seg, after in closed_segments(log) if (d := damage_in(seg, after)) is not None]


def damage_in(seg: Segment, after: Segment) -> Damage | None:
    """Scan one sealed segment (a handle from :func:`closed_segments`) with CRCs."""
    last: list[EntryHeader] = []

    def keep(_: int, h: EntryHeader) -> str | None:
        last[:] = [h]
        return None

    try:
        result = seg.scan(verify=True, on_entry=keep)
    finally:
        seg.close_fd()
    if result.error is None and result.valid_end == seg.size:
        return None
    first = last[0].index + 1 if last else seg.first_index
    offset = last[0].next_offset if last else seg.base_offset
    return Damage(
        seg.name,
        result.valid_end,
        seg.size - result.valid_end,
        first,
        after.first_index,
        offset,
        after.base_offset,
        result.error or "segment ends early",
    )


def patch(log: Log, damage: Damage, data: bytes) -> Patch:
    """Replace the damaged range with ``data`` (a peer's entries ``[first_index,
    end_index)`` as stored) after checking it fits exactly; fsync before returning.

    Raises CorruptEntryError if ``data`` itself fails a CRC (the peer's copy is bad too)
    and RepairRefusedError if it is not exactly the damaged range.
    """
    try:
        headers = list(entry.iter_headers(data, verify=True))
    except (InvalidEntryError, CorruptEntryError) as exc:
        raise CorruptEntryError(f"the replacement for {damage.segment} is bad: {exc}") from exc
    expect_index, expect_offset = damage.first_index, damage.base_offset
    for h in headers:
        if (h.index, h.base_offset) != (expect_index, expect_offset):
            raise RepairRefusedError(
                f"replacement entry has index {h.index} offset {h.base_offset}, expected "
                f"index {expect_index} offset {expect_offset}"
            )
        expect_index, expect_offset = h.index + 1, h.next_offset
    if (expect_index, expect_offset) != (damage.end_index, damage.end_offset):
        raise RepairRefusedError(
            f"replacement ends before index {expect_index} offset {expect_offset}, the "
            f"damaged range before index {damage.end_index} offset {damage.end_offset}"
        )
    if len(data) != damage.size:
        raise RepairRefusedError(
            f"replacement of entries {damage.first_index}..{damage.end_index - 1} has "
            f"{len(data)} bytes where segment {damage.segment} holds {damage.size}: a "
            "damaged length field; the replica must be cut back and caught up instead"
        )
    with log._lock:
        seg = next((s for s in log._segments[:-1] if s.name == damage.segment), None)
        if seg is None or seg.size != damage.position + damage.size:
            raise RepairRefusedError(f"segment {damage.segment} changed since it was checked")
        local = seg.pread(damage.size, damage.position)
        lo = next((i for i in range(len(data)) if data[i] != local[i]), len(data))
        hi = next((i for i in range(len(data), lo, -1) if data[i - 1] != local[i - 1]), lo)
        if hi > lo:
            fd = open_fd(seg.path, os.O_WRONLY)
            try:
                view = memoryview(data)[lo:hi]
                at = damage.position + lo
                while view:
                    n = os.pwrite(fd, view, at)
                    view, at = view[n:], at + n
                os.fsync(fd)
            finally:
                os.close(fd)
        seg.close_fd()  # reads reopen the file and see the new bytes
        seg.verified_upto = min(seg.verified_upto, damage.position)
        if seg.corrupt_at is not None:
            # Its index stopped at the damage: rebuild it on the next read.
            seg.corrupt_at = None
            seg.index = None
            seg.remove_index_files()
        check = seg.scan(verify=True, on_entry=lambda _p, _h: None, start=damage.position)
        seg.close_fd()
        assert check.error is None and check.valid_end == seg.size, check
    return Patch(
        damage.segment, damage.first_index, damage.end_index, damage.position + lo, hi - lo
    )


def stored_crc(log: Log, lo: int, hi: int) -> int:
    """CRC32C of the stored bytes of entries [lo, hi), as every replica should hold them
    (the replica audit compares it across replicas). Reads check entry CRCs too."""
    crc, index = 0, lo
    while index < hi:
        got = log.read_by_index(index, _CHUNK_BYTES, hi)
        crc = crc32c(got.data, crc)
        index = got.next_index
    return crc


def whole_segment(log: Log, lo: int, hi: int) -> Damage | None:
    """The sealed segment holding exactly entries [lo, hi), as a range to replace: for a
    copy whose CRCs all check out yet differs from the other replicas' (which Raft should
    never allow; the audit finds it). None when no segment has those bounds here."""
    for seg, after in closed_segments(log):
        if (seg.first_index, after.first_index) == (lo, hi):
            return Damage(
                seg.name, 0, seg.size, lo, hi, seg.base_offset, after.base_offset, "differs"
            )
    return None
