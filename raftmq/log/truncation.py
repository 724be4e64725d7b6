"""Cutting a :class:`~raftmq.log.log.Log` at either end: the suffix (Raft conflict
resolution), the prefix (snapshots) and retention (whole old segments by age or size).

Each waits for a running flush first, since a flush may be sealing the segments it would
drop, and keeps the crash order the recovery relies on: a suffix goes newest segment first,
and the log-start checkpoint is written before any segment below the start is deleted.
These are functions of the log they cut, called with its lock held (see log.py for why the
log's code is split into modules of functions rather than classes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftmq.format import entry
from raftmq.format.entry import EntryHeader
from raftmq.log import checkpoints, reads, recovery, writes
from raftmq.log.errors import OutOfRangeError
from raftmq.log.segment import Segment

if TYPE_CHECKING:
    from raftmq.log.log import Log


def truncate_suffix(log: Log, index: int) -> None:
    """``Log.truncate_suffix``: remove every entry with Raft index >= ``index``."""
    log._check_open()
    writes.wait_no_flush(log)
    if index >= log.next_index:
        return
    if index < log.start_index:
        raise OutOfRangeError(
            f"cannot truncate to index {index}: below the log start {log.start_index}",
            start=log.start_index,
            end=log.next_index,
        )
    segments = log._segments
    # Find the cut first, while the target segment is still a closed one whose index
    # can be loaded: nothing is deleted before every position is known.
    k = log._segment_at(index, reads.FIRST_INDEX)
    if k > 0 and segments[k].first_index == index:
        target = segments[k - 1]  # the cut is a segment boundary: keep it whole
        cut = target.size
    else:
        target = segments[k]
        cut = _position_of_index(log, target, index)
    while len(segments) > 1 and segments[-1].first_index >= index:
        log._drop_segment(len(segments) - 1)
    seg = segments[-1]
    assert seg is target, "the cut lies in the last remaining segment"
    log._open_cache.pop(seg.first_index, None)
    if seg in log._unsealed:
        log._unsealed.remove(seg)  # it is the active segment again
    seg.truncate(cut)
    seg.remove_index_files()
    del log._terms[checkpoints.boundary_at(log._terms, index - 1) + 1 :]
    recovery.recover_tail(log, len(segments) - 1)  # rescan the segment now active again
    assert log.next_index == max(index, log.start_index), (log.next_index, index)
    log.durable_index = min(log.durable_index, log.next_index - 1)
    log._write_terms()


def _position_of_index(log: Log, seg: Segment, index: int) -> int:
    if index <= seg.first_index:
        return 0

    def slot() -> int:
        position = log._index_of(seg).position_for_index(index)
        reads.check_slot(seg, position)
        return position

    start = reads.with_checked_index(log, slot)
    found: list[int] = []

    def at(position: int, h: EntryHeader) -> str | None:
        if h.index >= index:
            found.append(position)
            return "found"
        return None

    result = seg.scan(verify=False, on_entry=at, start=start)
    return found[0] if found else result.valid_end


def truncate_prefix(log: Log, index: int, offset: int | None, prev_term: int | None) -> None:
    """``Log.truncate_prefix``: move the start to ``index`` within the log, or restart the
    log empty there when ``index`` lies past its end (a snapshot install)."""
    log._check_open()
    writes.wait_no_flush(log)
    if index == log.start_index and prev_term is not None and prev_term != log._prev_term:
        # A snapshot (committed state) that ends right before our start and knows the term
        # there better than we do: our log-start checkpoint was rebuilt without it
        # (``recovery._rebuild_start`` takes 0 rather than guess). Take the snapshot's, or
        # the leader's appends after it never match and it resends the same snapshot.
        log._set_start(index, log.start_offset, prev_term)
        return
    if index <= log.start_index:
        return
    if index <= log.next_index:
        start_offset = _offset_at_index(log, index)
        term_before = log.term_at(index - 1)
        log._set_start(index, start_offset, term_before)
        while len(log._segments) > 1 and log._segments[1].first_index <= index:
            log._drop_segment(0)
        log._drop_terms_below_start()
        log._write_terms()
        return
    if offset is None or prev_term is None:
        raise ValueError(
            f"truncating past the end (index {index} > {log.next_index}) needs the "
            "offset and term of the snapshot"
        )
    # No offset check against the old log: a follower whose tail diverged from the
    # leader's history may hold more records than the snapshot, and all of it goes.
    # The old terms are forgotten on disk first: a crash before the new start is written
    # leaves the old log beside an empty checkpoint, which the next open finds wrong and
    # rebuilds from the segments; the other order would leave the old log's terms beside
    # the new log, where nothing could tell that they are stale.
    log._terms.clear()
    log._write_terms()
    log._set_start(index, offset, prev_term)
    log._restart_empty()
    log.durable_index = index - 1


def _offset_at_index(log: Log, index: int) -> int:
    if index == log.next_index:
        return log.next_offset
    result = reads.read_from_index(log, index, 1, None)
    return entry.parse_header(result.data).base_offset


def apply_retention(log: Log, max_index: int | None) -> int:
    """``Log.apply_retention``: delete the oldest closed segments while they are past
    ``retention_ms`` or ``retention_bytes``, never one holding index >= ``max_index``."""
    log._check_open()
    writes.wait_no_flush(log)  # a flush may be sealing the segments we would delete
    config = log.config
    segments = log._segments
    now_ms = log._clock_ms()
    deleted = 0
    total_bytes = sum(s.size for s in segments)
    while len(segments) > 1:
        oldest, nxt = segments[0], segments[1]
        if max_index is not None and nxt.first_index - 1 >= max_index:
            break
        by_size = (
            config.retention_bytes >= 0 and total_bytes - oldest.size >= config.retention_bytes
        )
        by_time = (
            config.retention_ms >= 0
            and log._index_of(oldest).max_timestamp_ms < now_ms - config.retention_ms
        )
        if not (by_size or by_time):
            break
        log._set_start(nxt.first_index, nxt.base_offset, log.term_at(nxt.first_index - 1))
        total_bytes -= oldest.size
        log._drop_segment(0)
        deleted += 1
    if deleted:
        log._drop_terms_below_start()
        log._write_terms()
    return deleted
