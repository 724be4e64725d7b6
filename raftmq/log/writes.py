"""The write path of a :class:`~raftmq.log.log.Log`: validate and append entries, roll to a
new segment, and make what was appended durable (group-committed fsyncs, then sealing the
segments a roll closed).

Rolling and sealing live together because they are two halves of one rule: a roll never
fsyncs (the appender would stall behind a segment's dirty pages), so the segment it closes
waits in ``_unsealed`` until the next flush fsyncs it and writes its index files.

These are functions of the log they write (see log.py for why the log's code is split into
modules of functions rather than classes).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from raftmq.format import entry, tag_filter, tags
from raftmq.format.entry import EntryHeader
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.log import checkpoints
from raftmq.log.config import FlushPolicy
from raftmq.log.errors import EntryTooLargeError, NotContiguousError
from raftmq.log.handles import HANDLES
from raftmq.log.index import SegmentIndex
from raftmq.log.segment import Segment

if TYPE_CHECKING:
    from raftmq.log.log import Log


class AppendInfo(NamedTuple):
    """What one append added. A named tuple: one is made per append on the write path."""

    first_index: int
    last_index: int
    base_offset: int
    next_offset: int
    entries: int


_TAGGED = entry.TAGGED
_U32_SPAN = 1 << 32  # index slots hold offsets and indexes relative to the segment as u32

_Validated = tuple[int, int, int, int, int, int, int]
"""One checked entry of an append: (position in the append, index, term, base offset, max
timestamp in ms, next offset, size in bytes when it is tagged else 0)."""


def _fitting(seg: Segment, headers: list[_Validated], start: int) -> int:
    """The end of the run of ``headers`` from ``start`` whose offsets and indexes fit
    ``seg``'s u32 relative slots (every offset an entry covers, not just its base)."""
    k = start
    while k < len(headers) and _fits(seg, headers[k]):
        k += 1
    return k


def _fits(seg: Segment, h: _Validated) -> bool:
    """Whether entry ``h`` (every offset it covers, not just its base) fits ``seg``'s slots."""
    return h[5] - seg.base_offset <= _U32_SPAN and h[1] - seg.first_index < _U32_SPAN


# --- append ---------------------------------------------------------------------------------


def append(log: Log, data: bytes, crc_checked: bool) -> AppendInfo:
    """``Log.append``: everything is checked before a byte is written, then the entries go
    to the active segment (rolling first when it is full or old, or when their offsets
    would not fit its u32 slots), and under EVERY_BATCH a flush covers them."""
    config = log.config
    with log._lock:
        if log._closed:
            log._check_open()
        headers = _validate(log, data, crc_checked=crc_checked)
        final_next = log._validated_next
        first_index = log.next_index
        first_offset = log.next_offset
        seg = log._segments[-1]
        now_ms = log._clock_ms()
        if seg.size and (
            seg.size + len(data) > config.segment_bytes
            or now_ms - log._active_born_ms >= config.segment_ms
        ):
            seg = _roll(log)
        if _fits(seg, headers[-1]):
            # The usual case, in one test (offsets and indexes only grow): the whole
            # append goes to one segment.
            if seg.size == 0:
                log._active_born_ms = now_ms
            _write_entries(log, seg, data, headers, 0, len(headers))
        else:
            _write_split(log, seg, data, headers, now_ms)
        assert (log.next_index, log.next_offset) == final_next
        info = AppendInfo(
            first_index, log.next_index - 1, first_offset, log.next_offset, len(headers)
        )
    if config.flush_policy is FlushPolicy.EVERY_BATCH:
        flush(log)
    return info


def _write_split(
    log: Log, seg: Segment, data: bytes, headers: list[_Validated], now_ms: int
) -> None:
    """Write an append whose later entries would overflow ``seg``'s u32 relative slots:
    as many as fit, then a roll, and so on."""
    start = 0
    while start < len(headers):
        stop = _fitting(seg, headers, start)
        if stop == start:
            # Its offsets or indexes would not fit the segment's u32 relative slots:
            # roll instead of overflowing (a fresh segment always fits one entry).
            assert seg.size, "an entry does not fit even an empty segment"
            seg = _roll(log)
            continue
        if seg.size == 0:
            log._active_born_ms = now_ms
        end = headers[stop][0] if stop < len(headers) else len(data)
        _write_entries(log, seg, data[headers[start][0] : end], headers, start, stop)
        start = stop


def _write_entries(
    log: Log, seg: Segment, chunk: bytes, headers: list[_Validated], start: int, stop: int
) -> None:
    """Write ``chunk``, the entries ``headers[start:stop]``, to the active segment and
    index them."""
    base = seg.size
    size_bytes = len(chunk)
    assert base + size_bytes < (1 << 32), "segment would overflow u32 positions"
    seg.write(chunk, log.config.write_behind_bytes)
    index = seg.index
    assert index is not None
    interval_bytes = log.config.index_interval_bytes
    terms = log._terms
    shift = base - headers[start][0]  # chunk positions are relative to the append
    observe = index.observe
    last_term = terms[-1][1] if terms else None
    first = headers[start][0]
    for position, e_index, e_term, e_offset, max_ts_ms, _, tagged_bytes in (
        headers if start == 0 and stop == len(headers) else headers[start:stop]
    ):
        observe(shift + position, e_index, e_offset, max_ts_ms, interval_bytes)
        if tagged_bytes:
            _index_tags(index, chunk, position - first, shift + position, e_offset, tagged_bytes)
        if e_term != last_term:
            terms.append((e_index, e_term))
            last_term = e_term
    seg.verified_upto = base + size_bytes
    last = headers[stop - 1]
    # The invariant append keeps by rolling: relative offsets and indexes fit u32.
    assert last[5] - seg.base_offset <= _U32_SPAN and last[1] - seg.first_index < _U32_SPAN
    log.next_index, log.next_offset = last[1] + 1, last[5]


def _index_tags(
    index: SegmentIndex, chunk: bytes, at: int, position: int, base_offset: int, size: int
) -> None:
    """Add the tag index slot of the tagged entry at ``chunk[at:]`` (now at ``position`` of
    the segment): its block follows the header, in bytes the append holds already."""
    end = at + min(size, entry.HEADER_SIZE + tags.MAX_BLOCK_BYTES)
    bloom = tag_filter.bloom_of_block(chunk, at + entry.HEADER_SIZE, end)
    index.observe_tagged(
        position, base_offset, size, tag_filter.ALL_BITS if bloom is None else bloom
    )


def _validate(log: Log, data: bytes, *, crc_checked: bool = False) -> list[_Validated]:
    """Check every entry of an append; (position, index, term, base offset, max
    timestamp, next offset, size when tagged) of each. Plain tuples: this runs once per entry on the
    write path.

    Framing, size and contiguity always; the CRC unless the caller checked it at its
    trust boundary (``crc_checked``): the Raft host's appends were checked once, at the
    client edge (raftmq/partition/batch_check.py) or at the peer edge (the Raft core's
    check of a leader's append). The disk-read boundary is the log's own CRC check of
    what it reads back."""
    if not data:
        raise InvalidEntryError("nothing to append: the buffer holds no entry")
    index, offset = log.next_index, log.next_offset
    term = log._terms[-1][1] if log._terms else log._prev_term
    limit_bytes = log.config.max_message_bytes
    out = []
    position = 0
    end = len(data)
    view = memoryview(data)
    decode = entry.decode_header
    while position < end:
        (length, crc, _, _, attributes, e_index, e_term, e_offset, count, _, max_ts_ms,
         _, _, _, _) = decode(view, position)  # fmt: skip
        size_bytes = length + 4
        if size_bytes > limit_bytes:
            raise EntryTooLargeError(
                f"entry at byte {position} is {size_bytes} bytes; "
                f"max.message.bytes is {limit_bytes}"
            )
        if position + size_bytes > end:
            raise InvalidEntryError(
                f"entry at byte {position} needs {size_bytes} bytes, {end - position} given"
            )
        if not crc_checked and not entry.crc_matches(view, position, size_bytes, crc):
            raise CorruptEntryError(
                f"CRC mismatch in entry at byte {position} of the append (index {e_index})",
                position=position,
            )
        if e_index != index:
            raise NotContiguousError(
                f"entry at byte {position} has index {e_index}; the log expects {index}"
            )
        if e_offset != offset:
            raise NotContiguousError(
                f"entry at byte {position} has base offset {e_offset}; the log expects {offset}"
            )
        if e_term < term:
            raise InvalidEntryError(
                f"entry at byte {position} has term {e_term}, below the log's term {term}"
            )
        index, offset, term = e_index + 1, e_offset + count, e_term
        tagged_bytes = size_bytes if attributes & _TAGGED else 0
        out.append((position, e_index, e_term, e_offset, max_ts_ms, offset, tagged_bytes))
        position += size_bytes
    log._validated_next = (index, offset)
    return out


def _roll(log: Log) -> Segment:
    """Start a new active segment; the old one waits in ``_unsealed`` for the next flush.

    Why not fsync here: under the INTERVAL policy the old segment can hold 128 MiB of
    dirty pages, and the appender (a Raft round) would stall for the whole fsync. A
    segment becomes closed-and-sealed only once it is durable (fsync, then index files),
    so recovery can trust index files and rescans whatever has none.
    """
    old = log._segments[-1]
    assert old.index is not None
    old.drain()  # seal fsyncs it outside the lock: its bytes must be in the file
    log._unsealed.append(old)
    seg = Segment.create(log.directory, log.next_offset, log.next_index, pacer=log._pacer)
    log._push_segment(seg)
    return seg


# --- durability -----------------------------------------------------------------------------


def seal(log: Log, seg: Segment) -> None:
    """Make a closed segment durable, then write its index files: their presence is what
    tells recovery the segment needs no rescan. Runs outside the lock, under _flushing (or
    during recovery, before anyone else sees the log).

    The caller has written a terms checkpoint covering ``seg`` first: recovery takes the
    terms of sealed segments from that checkpoint alone, so index files beside a
    checkpoint that predates the segment's terms would lose them on the next open."""
    assert seg.index is not None, f"unsealed segment {seg.name} lost its index"
    seg.fsync()
    if log.on_durable is not None:
        log.on_durable(str(seg.path), seg.size)  # a sealed segment is wholly durable
    seg.index.seal(last_header(seg).base_offset)
    seg.write_index()
    seg.release_reserved()


def last_header(seg: Segment) -> EntryHeader:
    """The header of a closed segment's last entry, found from its index's last slot."""
    assert seg.index is not None and seg.size > 0
    found: list[EntryHeader] = []
    start = seg.index.positions[-1] if seg.index.positions else 0

    def keep(_: int, h: EntryHeader) -> str | None:
        found[:] = [h]
        return None

    seg.scan(verify=False, on_entry=keep, start=start)
    return found[0]


def flush(log: Log) -> None:
    """``Log.flush``: one flusher at a time fsyncs outside the lock (sealing the segments
    rolls closed first, so the log stays a durable prefix); callers that arrive meanwhile
    wait and join the next round if that one did not cover them."""
    with log._lock:
        target = log.next_index - 1
        while log.durable_index < target or log._unsealed:
            if log._flushing:
                log._flush_done.wait()
                continue
            log._check_open()
            active = log._segments[-1]
            active.drain()  # may raise (EIO, ENOSPC): the bytes stay pending for a retry
            # Pinned: no other log's open may close it while the fdatasync runs.
            fd = HANDLES.pin(active)
            log._flushing = True
            pending = list(log._unsealed)
            covered = log.next_index - 1
            # What this fdatasync covers, captured with ``covered``: appends made while
            # the disk works may or may not be on it.
            durable_size = active.size
            # The terms checkpoint goes first: a sealed segment is never rescanned, so its
            # terms must be on disk before its index files say it is sealed.
            terms = list(log._terms) if pending and log._terms != log._terms_saved else None
            log._lock.release()
            try:
                if terms is not None:
                    checkpoints.write_terms(log.directory, terms)
                    log._terms_saved = terms
                for seg in pending:  # older segments first: the log stays a prefix
                    seal(log, seg)
                os.fdatasync(fd)
                if log.on_durable is not None:
                    log.on_durable(str(active.path), durable_size)
            finally:
                HANDLES.unpin(active)
                log._lock.acquire()
                log._flushing = False
                log._flush_done.notify_all()
            if pending:
                # Every change that drops segments waits for the flush to finish, so
                # all of them are still here; only now may the cache close their fds.
                for seg in pending:
                    log._unsealed.remove(seg)
                    seg.set_writable(False)
                    log._cache_touch(seg)
            log.durable_index = max(log.durable_index, min(covered, log.next_index - 1))
            log._last_flush_ms = log._clock_ms()


def flush_if_due(log: Log) -> bool:
    """``Log.flush_if_due``: flush when ``flush_interval_ms`` passed since the last one."""
    with log._lock:
        due = (
            log.durable_index < log.next_index - 1
            and log._clock_ms() - log._last_flush_ms >= log.config.flush_interval_ms
        )
    if due:
        flush(log)
    return due


def wait_no_flush(log: Log) -> None:
    """Wait (holding the lock, which the wait releases) until no flush is running: every
    change that drops or cuts segments calls this first, as a flush may be sealing them."""
    while log._flushing:
        log._flush_done.wait()
