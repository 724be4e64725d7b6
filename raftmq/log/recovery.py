"""Opening a log directory: find the segments, finish an interrupted prefix truncation,
rebuild lost indexes and the terms, rescan the unsealed tail with CRCs and cut it at the
first torn or corrupt entry. Also the rescan a suffix truncation ends with, and the index
rebuild a read falls back to when a closed segment's index files are gone.

These are functions of the :class:`~raftmq.log.log.Log` they repair (see log.py for why the
log's code is split into modules of functions rather than classes); callers hold its lock.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftmq.format import entry
from raftmq.format.entry import EntryHeader
from raftmq.log import checkpoints, writes
from raftmq.log.errors import LogError
from raftmq.log.index import SegmentIndex
from raftmq.log.segment import (
    LOG_SUFFIX,
    Segment,
    first_unsealed,
    parse_segment_name,
    segment_name,
)

if TYPE_CHECKING:
    from raftmq.log.log import Log

logger = logging.getLogger(__name__)

_MAX_COUNTED_FRAMES = 1_000_000  # a dropped tail's entries are counted up to this many


@dataclass(slots=True)
class RecoveryReport:
    """What opening the log found and repaired; printed by ``raftmq log`` and logged by brokers."""

    segments: int = 0
    truncated_bytes: int = 0
    truncated_entries: int = 0
    truncation_reason: str | None = None
    rebuilt_indexes: list[str] = field(default_factory=list)
    removed_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.truncated_bytes or self.rebuilt_indexes or self.removed_files)


def recover(log: Log) -> None:
    """Bring a freshly constructed ``log`` to the state its directory holds, repairing the
    tail; what was found goes to ``log.recovery``."""
    report = log.recovery
    for tmp in log.directory.glob("*.tmp"):
        tmp.unlink()
        report.removed_files.append(tmp.name)
    found: list[tuple[int, int]] = []
    for path in log.directory.iterdir():
        if path.suffix != LOG_SUFFIX:
            continue
        parsed = parse_segment_name(path.stem)
        if parsed is None:
            report.notes.append(f"ignored unknown file {path.name}")
            continue
        if not path.is_file():
            # Not ours to delete, and a write would fail on it later (EEXIST): refuse now,
            # with the path, rather than trip an assertion or fail at some later append.
            raise LogError(
                f"{path} is named like a log segment but is not a regular file; move it out "
                "of the log directory"
            )
        found.append(parsed)
    found.sort(key=lambda pair: pair[1])
    for (prev_offset, prev_index), (offset, index) in itertools.pairwise(found):
        if index == prev_index or offset < prev_offset:
            raise LogError(
                f"segments {segment_name(prev_offset, prev_index)} and "
                f"{segment_name(offset, index)} in {log.directory} overlap; one of them is "
                "not this log's (restore the directory, or delete the replica to refetch it)"
            )

    start = checkpoints.read_start(log.directory)
    start_problem = None
    if start is not None:
        log.start_index, log.start_offset, log._prev_term = start
    elif found and (found[0] != (0, 1) or (log.directory / checkpoints.START_CHECKPOINT).exists()):
        start_problem = checkpoints.start_problem(log.directory)
        log.start_offset, log.start_index = found[0]
    # Otherwise the log never moved its start: no checkpoint is written until it does
    # (a new log costs no fsync for it), and the first segment says where it is.

    # A crash during prefix truncation can leave segments wholly below the start.
    while len(found) > 1 and found[1][1] <= log.start_index:
        _remove_orphan(log, found.pop(0))
    for base_offset, first_index in found:
        seg = Segment(log.directory, base_offset, first_index, 0)
        seg.size = seg.written = seg.path.stat().st_size
        log._push_segment(seg)
    report.segments = len(log._segments)

    _load_terms(log)
    if start_problem is not None:
        _rebuild_start(log, start_problem)
    if not log._segments:
        # A new log. Its first segment is not made durable here (two fsyncs per new
        # replica): a crash before anything is written loses nothing, and the driver
        # makes the directory durable before the replica first promises (RaftHost).
        log._restart_empty(durable=False)
    else:
        first = first_unsealed(log._segments)  # recovery rescans from here, with CRCs
        _check_closed_indexes(log, first)
        recover_tail(log, first)
    if log.next_index <= log.start_index and log._segments[-1].first_index < log.start_index:
        # Every entry is below the start (a snapshot was installed past the end): restart.
        report.removed_files += [seg.name + LOG_SUFFIX for seg in log._segments]
        log._restart_empty()
    # What a crashed process wrote may still be only in the page cache: make it durable
    # before calling it durable, or this node could vote or ack on data a power loss
    # would erase. One fsync of the active segment (closed ones are sealed: durable).
    # What a crashed process had reserved past its end is given back here.
    active = log._segments[-1]
    active.set_writable(True)
    if found:
        active.fsync()
    active.release_reserved()
    log.durable_index = log.next_index - 1
    log._drop_terms_below_start()
    log._write_terms()


def _remove_orphan(log: Log, pair: tuple[int, int]) -> None:
    seg = Segment(log.directory, pair[0], pair[1], 0)
    seg.remove_files()
    log.recovery.removed_files.append(seg.name + LOG_SUFFIX)


def _rebuild_start(log: Log, problem: str) -> None:
    """The log-start checkpoint is missing or damaged: start at the first segment on disk,
    say so, and write the checkpoint again.

    Why the first segment's first entry, the lowest start the disk allows: the true start
    lies in that segment or at its end (a cut first writes the checkpoint, then deletes
    the segments wholly below it), so starting there hides nothing that was retained: no
    consumer finds an offset it committed to gone. What it may bring back is what was
    below the true start in that segment, or a whole segment a crash kept between the
    checkpoint and the unlink: entries retention or a state machine's snapshot had let go
    of. Those are committed entries, unchanged (a cut never rewrites a byte), and no
    request promised they were gone (raftmq has no DeleteRecords): retention deletes
    whole segments anyway, so for a partition the first segment's start is exact but for
    that crash, and a group with snapshots cuts its log after the snapshot again on open
    (``cut_to_snapshot``). A start higher than the disk's, guessed, could instead hide
    records that were never deleted; that is the one mistake this must not make.

    The term before the start comes from the terms checkpoint when it knows it (a term
    began at or below the entry before the start); otherwise it is 0, the lowest, never a
    guess upward: with an empty log that term is the log's last term, and claiming a
    higher one could win this replica a vote its log does not deserve. A term too low
    costs only liveness (the leader's first append there does not match and it sends its
    start point, which sets the term: ``truncation.truncate_prefix``)."""
    below = [term for first, term in log._terms if first < log.start_index]
    prev_term = below[-1] if below else 0
    known = bool(below) or log.start_index == 1  # nothing precedes index 1: its term is 0
    log._prev_term = prev_term
    log._write_start()
    log.recovery.notes.append(f"{problem}: rebuilt from the first segment")
    logger.warning(
        "log %s: %s; rebuilt it from the segments on disk: the log now starts at the first "
        "segment's first entry (index %d, offset %d, term before it %s). %s",
        log.directory,
        problem,
        log.start_index,
        log.start_offset,
        prev_term if known else "unknown: 0 until the leader's start point says",
        "Nothing was ever cut from this log: the start is exact"
        if log.start_index == 1
        else "Entries a cut had dropped from that segment may be readable again; none "
        "that were kept are hidden",
    )


def _check_closed_indexes(log: Log, upto: int) -> None:
    for seg in log._segments[:upto]:
        if not seg.has_index_files():
            rebuild_index(log, seg, "its index files are missing")


def rebuild_index(log: Log, seg: Segment, reason: str) -> None:
    """Rebuild a closed segment's index from its entries (headers only; reads verify CRCs),
    write its files again and log one WARNING naming them and ``reason`` (what was wrong).

    Called at open for a sealed segment whose files are gone, and on first use for one
    whose files fail to load (``SegmentIndex.load_checked`` says why): loading is lazy so
    that opening a log of thousands of segments reads none of their indexes."""
    idx = SegmentIndex(seg.base_offset, seg.first_index)
    interval_bytes = log.config.index_interval_bytes

    def observe(position: int, h: EntryHeader) -> str | None:
        idx.observe(position, h.index, h.base_offset, h.max_timestamp, interval_bytes)
        if h.attributes & entry.TAGGED:
            idx.observe_tagged(position, h.base_offset, h.size, seg.tag_bloom_at(position, h.size))
        return None

    result = seg.scan(verify=False, on_entry=observe)
    if result.error is not None:
        seg.corrupt_at = result.valid_end
        log.recovery.notes.append(
            f"segment {seg.name}: {result.error}; reads past byte {result.valid_end} fail"
        )
    if result.last is not None:
        idx.seal(result.last.base_offset)
    seg.index = idx
    seg.write_index()
    log.recovery.rebuilt_indexes.append(seg.name)
    logger.warning(
        "log %s: index of segment %s not used: %s; rebuilt %s, %s and %s from the segment "
        "(%d entries scanned)",
        log.directory,
        seg.name,
        reason,
        seg.index_path.name,
        seg.time_index_path.name,
        seg.tag_index_path.name,
        result.entries,
    )


def build_tag_index(log: Log, seg: Segment) -> None:
    """Fill in the tag slots of a sealed segment whose index has none (sealed before tag
    indexes existed) from its entries' headers and tag blocks, and write its .tagindex.
    An upgrade step, done once per segment by the first filtered read that needs it, so
    unfiltered reads of old segments never pay for it."""
    idx = seg.index
    assert idx is not None and not idx.tags_known

    def observe(position: int, h: EntryHeader) -> str | None:
        if h.attributes & entry.TAGGED:
            idx.observe_tagged(position, h.base_offset, h.size, seg.tag_bloom_at(position, h.size))
        return None

    result = seg.scan(verify=False, on_entry=observe)
    idx.tags_known = True
    if result.error is None:
        idx.write_tags(seg.tag_index_path)
    logger.info(
        "log %s: built %s for segment %s, sealed before tag indexes existed (%d tagged entries)",
        log.directory,
        seg.tag_index_path.name,
        seg.name,
        len(idx.tag_offsets),
    )


def recover_tail(log: Log, first: int) -> None:
    """Scan the segments from ``first`` on with CRCs and contiguity checks, rebuild their
    indexes, cut at the first torn or corrupt entry and delete every segment after the cut
    (or after a gap between segments: a power loss can keep a new segment's file and lose
    the end of an unsynced older one). Closed segments that pass are sealed."""
    segments = log._segments
    log._terms = [t for t in log._terms if t[0] < segments[first].first_index]
    seg = segments[first]
    log.next_index, log.next_offset = seg.first_index, seg.base_offset
    pos = first
    born_ms = 0
    while True:
        seg = segments[pos]
        clean, born_ms = _rescan(log, seg)
        last = pos == len(segments) - 1
        if last:
            break
        after = segments[pos + 1]
        if clean and (after.first_index, after.base_offset) == (log.next_index, log.next_offset):
            pos += 1
            continue
        if clean:
            log.recovery.truncation_reason = (
                f"segment {after.name} does not follow segment {seg.name}, which ends "
                f"before index {log.next_index}: its unsynced end was lost"
            )
        while len(segments) - 1 > pos:
            dropped = segments[-1]
            log.recovery.removed_files.append(dropped.name + LOG_SUFFIX)
            log._drop_segment(len(segments) - 1)
        break
    to_seal = [seg for seg in segments[first:-1] if seg not in log._unsealed]
    if to_seal:
        log._write_terms()  # before the index files that make them sealed (writes.seal)
    for seg in to_seal:
        writes.seal(log, seg)
        seg.set_writable(False)
    active = segments[-1]
    active.pacer = log._pacer
    # Age rolls count from the first entry's time when it is plausible; a producer's old
    # timestamps must not make every append after a restart roll a segment.
    now_ms = log._clock_ms()
    log._active_born_ms = born_ms if active.size and 0 < born_ms <= now_ms else now_ms


def _rescan(log: Log, seg: Segment) -> tuple[bool, int]:
    """Scan one tail segment from ``next_index``/``next_offset``, rebuilding its index and
    the terms; cut a bad tail. (False when it was cut, the first entry's timestamp in ms)."""
    seg.set_writable(True)
    idx = SegmentIndex(seg.base_offset, seg.first_index)
    interval_bytes = log.config.index_interval_bytes
    terms = log._terms
    expect = [log.next_index, log.next_offset, terms[-1][1] if terms else 0]
    born_ms = [0]

    def observe(position: int, h: EntryHeader) -> str | None:
        index, offset, term = expect
        if h.index != index or h.base_offset != offset:
            return (
                f"entry at byte {position} has index {h.index} offset {h.base_offset}, "
                f"expected index {index} offset {offset}"
            )
        if h.term < term:
            return f"entry at byte {position} has term {h.term} below {term}"
        if not terms or h.term != terms[-1][1]:
            terms.append((h.index, h.term))
        if position == 0:
            born_ms[0] = h.max_timestamp
        idx.observe(position, h.index, h.base_offset, h.max_timestamp, interval_bytes)
        if h.attributes & entry.TAGGED:
            idx.observe_tagged(position, h.base_offset, h.size, seg.tag_bloom_at(position, h.size))
        expect[:] = [h.index + 1, h.next_offset, h.term]
        return None

    result = seg.scan(verify=True, on_entry=observe)
    if result.error is not None:
        dropped_bytes = seg.size - result.valid_end
        log.recovery.truncated_bytes += dropped_bytes
        log.recovery.truncated_entries += _count_frames(seg, result.valid_end)
        log.recovery.truncation_reason = f"segment {seg.name}: {result.error}"
        seg.truncate(result.valid_end)
    seg.verified_upto = seg.size
    seg.index = idx
    seg.remove_index_files()
    log.next_index, log.next_offset = expect[0], expect[1]
    return result.error is None, born_ms[0]


def _count_frames(seg: Segment, position: int) -> int:
    """How many entries a dropped tail held, counted by their length fields (at least 1)."""
    count = 0
    while position + 4 <= seg.size and count < _MAX_COUNTED_FRAMES:
        size_bytes = entry.entry_size_at(seg.pread(4, position), 0)
        count += 1
        if size_bytes < entry.HEADER_SIZE:
            break
        position += size_bytes
    return max(count, 1)


def _load_terms(log: Log) -> None:
    """The terms of the sealed segments, from the checkpoint when it describes them, else
    rebuilt from their entry headers (the unsealed tail is rescanned by recover_tail)."""
    terms = checkpoints.read_terms(log.directory)
    if terms is not None:
        problem = _stale_terms_problem(log, terms)
        if problem is None:
            log._terms = terms
            log._terms_saved = list(terms)
            return
    # Missing is normal for a new log (one segment, nothing closed yet); damaged never is.
    elif len(log._segments) > 1 or (log.directory / checkpoints.TERMS_CHECKPOINT).exists():
        problem = checkpoints.terms_problem(log.directory)
    else:
        log._terms = []
        log._terms_saved = []  # none on disk reads as none: nothing to write yet
        return
    log._terms = []
    log.recovery.notes.append(f"{problem}: rebuilt from the segments")
    logger.warning(
        "log %s: %s; rebuilt it from the segments' entry headers (it is written again "
        "when this open completes)",
        log.directory,
        problem,
    )
    for seg in log._segments[: first_unsealed(log._segments)]:

        def observe(_: int, h: EntryHeader) -> str | None:
            if not log._terms or h.term != log._terms[-1][1]:
                log._terms.append((h.index, h.term))
            return None

        seg.scan(verify=False, on_entry=observe)
        seg.close_fd()


def _stale_terms_problem(log: Log, terms: list[tuple[int, int]]) -> str | None:
    """Why a terms checkpoint that passed its CRC still cannot be the sealed segments'
    terms, as a sentence for the WARNING, or None when it agrees with them.

    Recovery takes the terms of sealed segments from the checkpoint alone, so one written
    before a segment was sealed (a crash between the two, before the writes were ordered)
    or kept from a log a snapshot replaced would answer wrong terms or none at all. What
    is checked is cheap and catches every such staleness seen: a boundary at or below the
    first entry kept, and the terms of the first sealed segment's first entry and of the
    last sealed entry (a checkpoint that missed a term began later than it says)."""
    name = checkpoints.TERMS_CHECKPOINT
    for (i0, t0), (i1, t1) in itertools.pairwise(terms):
        if not (i0 < i1 and t0 < t1):
            return f"{name} lists term {t1} from index {i1} after term {t0} from index {i0}"
    segments = log._segments
    first = first_unsealed(segments) if segments else 0
    if first == 0:
        return None  # nothing sealed: every entry is rescanned
    lowest = max(log.start_index, segments[0].first_index)
    if not terms or terms[0][0] > lowest:
        return f"{name} has no term boundary at or below index {lowest}, the first kept"
    probes = []
    if segments[0].first_index >= log.start_index:
        probes.append(_first_header(segments[0]))
    last_sealed = segments[first - 1]
    if last_sealed.size:
        log._index_of(last_sealed)  # loaded (or rebuilt) for its last slot
        probes.append(writes.last_header(last_sealed))
    for h in probes:
        if h is None:
            continue
        pos = checkpoints.boundary_at(terms, h.index)
        said = terms[pos][1] if pos >= 0 else None
        if said != h.term:
            return (
                f"{name} says term {said} at index {h.index}, whose entry has term "
                f"{h.term} (it is older than the segments)"
            )
    return None


def _first_header(seg: Segment) -> EntryHeader | None:
    found: list[EntryHeader] = []

    def first(_: int, h: EntryHeader) -> str | None:
        found.append(h)
        return "found"

    seg.scan(verify=False, on_entry=first)
    seg.close_fd()
    return found[0] if found else None
