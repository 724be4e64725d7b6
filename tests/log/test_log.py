"""Focused unit tests of :class:`raftmq.log.log.Log`: recovery, corruption, index rebuilds,
group commit, flush policies, retention, file handles, time lookups, crash-safe truncation.

The property test (``test_log_properties.py``) explores sequences; these pin down the
behaviours whose exact numbers matter (counts in the recovery report, fsyncs per commit,
open descriptors), including regressions for bugs this suite found.
"""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import raftmq.log.log as log_module
from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.errors import CorruptEntryError
from raftmq.log import checkpoints
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import LogError, NotContiguousError
from raftmq.log.log import READ_SLACK_BYTES, Log
from raftmq.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    Segment,
    segment_name,
)

BIG = 1 << 30


class FakeClock:
    """Injected ``clock_ms``: the tests decide when time passes."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def data_entry(index: int, payload: bytes | int = 100, *, term: int = 1, ts: int = 0) -> bytes:
    """A one-record DATA entry at ``index`` (offset ``index - 1``, as when no control
    entries precede it)."""
    body = payload if isinstance(payload, bytes) else bytes([index % 251]) * payload
    return entry.encode(
        body,
        index=index,
        term=term,
        base_offset=index - 1,
        record_count=1,
        first_timestamp=ts,
        max_timestamp=ts,
    )


def fill(log: Log, count: int, size: int = 100, *, ts: int = 0) -> list[bytes]:
    """Append ``count`` one-record entries after the log's end; return their bytes."""
    out = []
    for _ in range(count):
        e = data_entry(log.next_index, size, ts=ts)
        log.append(e)
        out.append(e)
    return out


def abandon(log: Log) -> None:
    """Simulate the process dying: drop the descriptors without flush or checkpoints."""
    for seg in log._segments:
        seg.close_fd()
    log._closed = True


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*" + LOG_SUFFIX))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


INTERVAL = LogConfig(flush_policy=FlushPolicy.INTERVAL)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs folder (``/dev/shm``) for tests about logic, not the disk: creating dozens of
    segments costs ~10 fsyncs each, seconds on a shared disk. Falls back to ``tmp_path``."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="raftmq-logtest-", dir="/dev/shm") as d:
        yield Path(d)


# --- torn tails --------------------------------------------------------------------------


def test_torn_tail_is_cut_and_counted(tmp_path: Path) -> None:
    log = Log.open(tmp_path, INTERVAL)
    entries = fill(log, 10, 200)
    log.flush()
    fill(log, 3, 200)
    abandon(log)
    path = segment_files(tmp_path)[-1]
    size = path.stat().st_size
    os.truncate(path, size - 50)  # the last entry loses its last 50 bytes

    log = Log.open(tmp_path, INTERVAL)
    rec = log.recovery
    assert rec.truncated_bytes == len(entries[0]) - 50
    assert rec.truncated_entries == 1
    assert rec.truncation_reason is not None and "torn" in rec.truncation_reason
    assert log.next_index == 13 and log.durable_index == 12
    assert path.stat().st_size == size - len(entries[0])
    log.close()


def test_corrupt_entry_in_active_tail_drops_it_and_everything_after(tmp_path: Path) -> None:
    log = Log.open(tmp_path, INTERVAL)
    entries = fill(log, 10, 300)
    abandon(log)
    path = segment_files(tmp_path)[-1]
    at = sum(len(e) for e in entries[:6]) + 100  # a payload byte of the 7th entry
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))

    log = Log.open(tmp_path, INTERVAL)
    assert log.recovery.truncated_entries == 4
    assert log.recovery.truncated_bytes == sum(len(e) for e in entries[6:])
    assert "CRC" in (log.recovery.truncation_reason or "")
    assert log.read_by_index(1, BIG).data == b"".join(entries[:6])
    log.close()


ROLLING = LogConfig(flush_policy=FlushPolicy.INTERVAL, segment_bytes=2048)


def test_a_roll_leaves_the_old_segment_unsealed_until_the_next_flush(tmp_path: Path) -> None:
    """The appender never waits for a closed segment's fsync; the flush does it, then seals."""
    log = Log.open(tmp_path, ROLLING)
    fill(log, 8, 300)  # 374 bytes each: five fit in 2,048, so one roll after entry 5
    first = segment_files(tmp_path)[0]
    assert len(segment_files(tmp_path)) == 2
    assert log.durable_index == 0
    assert not first.with_suffix(INDEX_SUFFIX).exists()
    assert log.read_by_index(1, BIG).entries == 8  # readable while unsealed

    log.flush()
    assert first.with_suffix(INDEX_SUFFIX).exists()
    assert first.with_suffix(TIME_INDEX_SUFFIX).exists()
    assert log.durable_index == 8
    log.close()
    reopened = Log.open(tmp_path, ROLLING)
    assert reopened.recovery.clean
    reopened.close()


def test_power_loss_in_an_unsealed_segment_drops_the_segments_after_it(tmp_path: Path) -> None:
    log = Log.open(tmp_path, ROLLING)
    entries = fill(log, 3, 300)
    log.flush()  # entries 1-3 durable
    entries += fill(log, 5, 300)  # roll after entry 5: entries 6-8 in the second segment
    abandon(log)
    old, new = segment_files(tmp_path)
    durable_end = sum(len(e) for e in entries[:3])
    os.truncate(old, durable_end + 100)  # the power cut kept the new file but not old's end

    log = Log.open(tmp_path, ROLLING)
    rec = log.recovery
    assert rec.truncated_bytes == 100 and rec.truncated_entries == 1
    assert new.name in rec.removed_files and not new.exists()
    assert log.next_index == 4 and log.durable_index == 3
    assert log.read_by_index(1, BIG).data == b"".join(entries[:3])
    assert old.with_suffix(INDEX_SUFFIX).exists() is False  # it is the active segment again
    log.append(data_entry(4, 300))  # and the log goes on from there
    log.close()


def test_an_unsealed_segment_cut_at_an_entry_boundary_is_a_gap(tmp_path: Path) -> None:
    log = Log.open(tmp_path, ROLLING)
    entries = fill(log, 8, 300)
    abandon(log)
    old, new = segment_files(tmp_path)
    os.truncate(old, sum(len(e) for e in entries[:4]))  # whole entries, but entry 5 is gone

    log = Log.open(tmp_path, ROLLING)
    rec = log.recovery
    assert rec.truncated_bytes == 0
    assert "does not follow" in (rec.truncation_reason or "")
    assert new.name in rec.removed_files
    assert log.next_index == 5
    log.close()


def test_unsealed_segments_that_survived_whole_are_sealed_on_open(tmp_path: Path) -> None:
    log = Log.open(tmp_path, ROLLING)
    entries = fill(log, 20, 300)
    abandon(log)  # a process crash: the page cache kept every byte
    closed = segment_files(tmp_path)[:-1]
    assert len(closed) >= 2 and not any(p.with_suffix(INDEX_SUFFIX).exists() for p in closed)

    log = Log.open(tmp_path, ROLLING)
    assert log.recovery.truncation_reason is None and log.recovery.removed_files == []
    assert all(p.with_suffix(INDEX_SUFFIX).exists() for p in closed)
    assert log.read_by_index(1, BIG).data == b"".join(entries)
    log.close()


def test_retention_waits_for_a_flush_that_is_sealing(tmp_path: Path) -> None:
    """Sealing runs outside the lock; deleting the segment under it would fail the flush."""
    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, segment_bytes=2048, retention_bytes=0)
    log = Log.open(tmp_path, config)
    fill(log, 8, 300)  # a roll after entry 5: the first segment waits to be sealed
    entered, release = threading.Event(), threading.Event()

    def hold(path: str, size: int) -> None:
        entered.set()
        release.wait(5)

    log.on_durable = hold
    flusher = threading.Thread(target=log.flush)
    flusher.start()
    assert entered.wait(5)
    deleted: list[int] = []
    retention = threading.Thread(target=lambda: deleted.append(log.apply_retention()))
    retention.start()
    time.sleep(0.2)
    assert not deleted, "retention deleted a segment that a flush was sealing"
    release.set()
    flusher.join(5)
    retention.join(5)
    assert deleted == [1] and log.start_index == 6
    log.close()


def test_clean_reopen_reports_nothing(scratch: Path) -> None:
    with Log.open(scratch, LogConfig(segment_bytes=2048)) as log:
        fill(log, 30, 200)
    with Log.open(scratch, LogConfig(segment_bytes=2048)) as log:
        assert log.recovery.clean
        assert log.recovery.segments == len(segment_files(scratch)) > 1
        assert log.next_index == 31


def test_a_directory_named_like_a_segment_is_refused_with_its_path(scratch: Path) -> None:
    """A foreign directory where a segment would go: opening says which path and what to
    do, instead of an assertion (or an EEXIST at the next roll)."""
    with Log.open(scratch, LogConfig(segment_bytes=2048)) as log:
        fill(log, 30, 200)
        last = segment_files(scratch)[-1]
    base_offset, first_index = (int(part) for part in last.stem.split("-"))
    intruder = scratch / (segment_name(base_offset + 5, first_index + 3) + LOG_SUFFIX)
    intruder.mkdir()
    with pytest.raises(LogError, match="not a regular file; move it out"):
        Log.open(scratch, LogConfig(segment_bytes=2048))
    intruder.rmdir()
    clash = scratch / (segment_name(base_offset + 1, first_index) + LOG_SUFFIX)
    clash.write_bytes(b"")
    with pytest.raises(LogError, match="overlap"):
        Log.open(scratch, LogConfig(segment_bytes=2048))


# --- corruption in closed segments -------------------------------------------------------


def _multi_segment_log(directory: Path, count: int = 30, size: int = 200) -> list[bytes]:
    config = LogConfig(segment_bytes=2048, index_interval_bytes=1)
    with Log.open(directory, config) as log:
        return fill(log, count, size)


def test_corrupt_byte_in_closed_segment_is_detected_on_read_and_not_served(
    scratch: Path,
) -> None:
    entries = _multi_segment_log(scratch)
    first = segment_files(scratch)[0]
    victim = 3  # the 4th entry of the first (closed) segment
    position = sum(len(e) for e in entries[:victim])
    with open(first, "r+b") as f:
        f.seek(position + entry.HEADER_SIZE + 10)
        f.write(b"\x00" if entries[victim][entry.HEADER_SIZE + 10] else b"\x01")

    config = LogConfig(segment_bytes=2048, index_interval_bytes=1)
    log = Log.open(scratch, config)
    assert log.recovery.clean  # closed segments are not rescanned on open
    ok = log.read_by_index(1, sum(len(e) for e in entries[:victim]))
    assert ok.data == b"".join(entries[:victim])
    for read in (
        lambda: log.read_by_index(1, BIG),
        lambda: log.read_by_index(victim + 1, 1),
        lambda: log.read(0, BIG),
        lambda: log.read(0, BIG),  # a failed read must not mark the bytes verified
    ):
        with pytest.raises(CorruptEntryError) as info:
            read()
        assert info.value.segment == first.stem
        assert info.value.position == position
        assert first.stem in str(info.value) and str(position) in str(info.value)
    # Entries after the damaged one are still served from the next segment.
    later = log.read_by_index(log.segments()[1][1], BIG)
    assert later.entries > 0
    log.close()


# --- index files -------------------------------------------------------------------------


def test_missing_and_damaged_index_files_are_rebuilt(scratch: Path) -> None:
    config = LogConfig(segment_bytes=2048, index_interval_bytes=300)
    with Log.open(scratch, config) as log:
        for i in range(1, 41):
            log.append(data_entry(i, 200, ts=1000 + 10 * i))
    segs = segment_files(scratch)
    assert len(segs) >= 4
    originals = {p: p.read_bytes() for s in segs[:-1] for p in (s.with_suffix(INDEX_SUFFIX),)} | {
        p: p.read_bytes() for s in segs[:-1] for p in (s.with_suffix(TIME_INDEX_SUFFIX),)
    }
    segs[0].with_suffix(INDEX_SUFFIX).unlink()  # missing
    segs[1].with_suffix(TIME_INDEX_SUFFIX).unlink()  # missing
    damaged = segs[2].with_suffix(INDEX_SUFFIX)
    raw = bytearray(damaged.read_bytes())
    raw[0] ^= 0x40
    damaged.write_bytes(bytes(raw))  # damaged: fails its CRC when loaded

    log = Log.open(scratch, config)
    assert segs[0].stem in log.recovery.rebuilt_indexes
    assert segs[1].stem in log.recovery.rebuilt_indexes
    everything = log.read_by_index(1, BIG)
    assert everything.entries == 40
    for i in range(1, 41):  # lookups through every (rebuilt) index
        assert entry.parse_header(log.read_by_index(i, 1).data).index == i
        assert entry.parse_header(log.read(i - 1, 1).data).base_offset == i - 1
        assert log.offset_for_timestamp(1000 + 10 * i) == i - 1
    assert segs[2].stem in log.recovery.rebuilt_indexes  # lazily, on first use
    log.close()
    for path, data in originals.items():
        assert path.read_bytes() == data, f"{path.name} rebuilt differently"


# --- group commit and flush policies -----------------------------------------------------


class FsyncCounter:
    """Wraps os.fdatasync to count the calls the log makes.

    ``min_seconds`` makes each call take at least that long, like a real disk's flush: how
    many callers one fsync serves depends on how long it takes, and a tmpfs or an idle SSD
    would otherwise make the count depend on the machine rather than on the log."""

    def __init__(self, min_seconds: float = 0.0) -> None:
        self.calls = 0
        self._real = os.fdatasync
        self._lock = threading.Lock()
        self._min = min_seconds

    def __call__(self, fd: int) -> None:
        with self._lock:
            self.calls += 1
        start = time.monotonic()
        self._real(fd)
        left = self._min - (time.monotonic() - start)
        if left > 0:
            time.sleep(left)


def _append_racing(log: Log, payload: int) -> None:
    """Append one entry at whatever the end is when we get there (retrying when another
    thread got there first). Validation precedes any write, so a lost race writes nothing."""
    while True:
        with log._lock:
            index, offset = log.next_index, log.next_offset
        e = entry.encode(b"p" * payload, index=index, term=1, base_offset=offset, record_count=1)
        try:
            log.append(e)
            return
        except NotContiguousError:
            continue


@pytest.mark.parametrize("mode", ["append-every-batch", "append-then-flush"])
def test_group_commit_serves_1000_callers_with_few_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    policy = FlushPolicy.EVERY_BATCH if mode == "append-every-batch" else FlushPolicy.INTERVAL
    log = Log.open(tmp_path, LogConfig(flush_policy=policy))
    # 20 ms per simulated fsync (a slow disk): on a loaded machine 1000 racing appends
    # spread over 300 ms or more (CI once saw 58 fsyncs of 5 ms), and each fsync should
    # gather every append that arrived while the previous one ran.
    counter = FsyncCounter(min_seconds=0.02)
    monkeypatch.setattr(log_module.os, "fdatasync", counter)
    callers = 1000
    barrier = threading.Barrier(callers)
    appended = threading.Barrier(callers)
    errors: list[BaseException] = []
    order = threading.Lock()

    def caller() -> None:
        try:
            barrier.wait()
            if policy is FlushPolicy.INTERVAL:
                # append returns without an fsync here, so a test lock may order the appends;
                # then every caller asks for durability at once.
                with order:
                    log.append(data_entry(log.next_index, 64))
                appended.wait()
                log.flush()
            else:
                _append_racing(log, 64)
            # Either way the caller's entry is durable when it gets here.
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert log.next_index == callers + 1
    assert log.durable_index == callers
    print(f"group commit ({mode}): {counter.calls} fdatasyncs served {callers} callers")
    # Without group commit every caller would fsync (1000). How many share one depends on
    # how fast 1000 threads get the GIL to append: on a busy 2-core machine about 20.
    assert counter.calls <= callers // 10, f"{counter.calls} fsyncs for {callers} callers"
    log.close()


def test_interval_policy_flushes_only_when_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_interval_ms=1000)
    log = Log.open(tmp_path, config, clock_ms=clock)
    counter = FsyncCounter()
    monkeypatch.setattr(log_module.os, "fdatasync", counter)
    fill(log, 5)
    assert log.durable_index == 0 and counter.calls == 0
    clock.now += 999
    assert log.flush_if_due() is False
    clock.now += 1
    assert log.flush_if_due() is True
    assert log.durable_index == 5 and counter.calls == 1
    clock.now += 5000
    assert log.flush_if_due() is False  # nothing new to flush
    fill(log, 1)
    assert log.flush_if_due() is True and counter.calls == 2
    fill(log, 1)
    log.flush()  # on demand, regardless of the interval
    assert log.durable_index == 7 and counter.calls == 3
    log.close()


# --- retention ---------------------------------------------------------------------------


def test_retention_keeps_the_active_segment_and_respects_max_index(scratch: Path) -> None:
    clock = FakeClock(10_000_000)
    config = LogConfig(segment_bytes=2048, retention_ms=1000, retention_bytes=0)
    log = Log.open(scratch, config, clock_ms=clock)
    fill(log, 40, 200, ts=clock.now)
    segs = log.segments()
    assert len(segs) >= 5
    clock.now += 10_000
    # max_index inside the third segment: the first two may go, the third may not.
    third_first = segs[2][1]
    assert log.apply_retention(max_index=third_first + 1) == 2
    assert log.start_index == third_first and log.start_offset == segs[2][2]
    assert log.term_at(third_first - 1) == 1
    assert log.apply_retention() == len(segs) - 3
    assert [s[0] for s in log.segments()] == [segs[-1][0]]  # the active one stays
    assert log.read_by_index(log.start_index, BIG).entries == 41 - segs[-1][1]
    assert log.apply_retention() == 0
    log.close()


def test_retention_by_time_only_deletes_old_segments(scratch: Path) -> None:
    clock = FakeClock(10_000_000)
    config = LogConfig(segment_bytes=2048, retention_ms=5_000)
    log = Log.open(scratch, config, clock_ms=clock)
    fill(log, 20, 200, ts=clock.now)
    old_segments = len(log.segments()) - 1
    clock.now += 3_000
    fill(log, 20, 200, ts=clock.now)
    clock.now += 3_000  # the first batch is 6 s old, the second 3 s
    deleted = log.apply_retention()
    assert deleted == old_segments
    assert log.start_index <= 21
    log.close()


# --- file handles ------------------------------------------------------------------------


def test_closed_segments_hold_a_bounded_number_of_descriptors(scratch: Path) -> None:
    config = LogConfig(
        segment_bytes=1024,
        max_open_segments=3,
        index_interval_bytes=100,
        flush_policy=FlushPolicy.INTERVAL,
    )
    with Log.open(scratch, config) as log:
        fill(log, 60, 600)
    log = Log.open(scratch, config)
    assert len(log.segments()) == 60
    baseline = open_fds()
    for i in range(1, log.next_index):
        log.read_by_index(i, 1)
        log.read(i - 1, 1)
    log.offset_for_timestamp(0)
    assert open_fds() - baseline <= config.max_open_segments + 2
    log.close()


def test_reads_spanning_many_segments_keep_descriptors_bounded(scratch: Path) -> None:
    config = LogConfig(segment_bytes=1024, max_open_segments=3, flush_policy=FlushPolicy.INTERVAL)
    with Log.open(scratch, config) as log:
        fill(log, 60, 600)
    log = Log.open(scratch, config)
    baseline = open_fds()
    try:
        log.read_by_index(1, BIG)  # one read across every segment
        assert open_fds() - baseline <= config.max_open_segments + 2
    finally:
        log.close()


# --- time index --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_offset_for_timestamp_matches_a_brute_force_scan(scratch: Path, seed: int) -> None:
    rng = random.Random(seed)
    config = LogConfig(
        segment_bytes=rng.choice([1024, 4096, 1 << 20]),
        index_interval_bytes=rng.choice([1, 200, 4096]),
        flush_policy=FlushPolicy.INTERVAL,
    )
    log = Log.open(scratch, config)
    offset = 0
    for index in range(1, 120):
        ts = rng.randrange(0, 10_000)  # not monotonic: producers' clocks disagree
        if rng.random() < 0.2:
            e = entry.encode(
                b"c",
                type=EntryType.NOOP,
                index=index,
                term=1,
                base_offset=offset,
                first_timestamp=ts,
                max_timestamp=ts,
            )
        else:
            n = rng.randint(1, 4)
            e = entry.encode(
                b"d" * rng.randrange(10, 300),
                index=index,
                term=1,
                base_offset=offset,
                record_count=n,
                first_timestamp=ts - 5,
                max_timestamp=ts,
            )
            offset += n
        log.append(e)

    def check(log: Log) -> None:
        headers = [h for _, _, h in log.iter_headers()]
        for target in list(range(-1, 10_050, 37)) + [h.max_timestamp for h in headers]:
            want = next(
                (
                    h.base_offset
                    for h in headers
                    if h.type == EntryType.DATA and h.max_timestamp >= target
                ),
                None,
            )
            assert log.offset_for_timestamp(target) == want, target

    check(log)  # the active segment's in-memory index, the closed ones' written files
    log.close()
    log = Log.open(scratch, config)
    check(log)  # every index loaded from files / rebuilt by the rescan
    log.close()


# --- crash-safe prefix truncation --------------------------------------------------------


def test_checkpoint_written_but_segments_not_deleted_is_finished_on_open(scratch: Path) -> None:
    entries = _multi_segment_log(scratch)
    config = LogConfig(segment_bytes=2048, index_interval_bytes=1)
    with Log.open(scratch, config) as log:
        segs = log.segments()
    target_first, target_base = segs[2][1], segs[2][2]
    start = target_first + 1  # inside the third segment
    # What truncate_prefix writes first, before deleting anything:
    checkpoints.write_start(scratch, start, start - 1, 1)
    log = Log.open(scratch, config)
    assert sorted(log.recovery.removed_files) == sorted(s[0] + LOG_SUFFIX for s in segs[:2])
    assert log.start_index == start and log.start_offset == start - 1
    assert log.term_at(start - 1) == 1
    assert log.read_by_index(start, BIG).data == b"".join(entries[start - 1 :])
    assert log.segments()[0][1] == target_first
    assert target_base == target_first - 1
    log.close()


def test_prefix_truncation_interrupted_midway_recovers(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = _multi_segment_log(scratch)
    config = LogConfig(segment_bytes=2048, index_interval_bytes=1)
    log = Log.open(scratch, config)
    segs = log.segments()
    start = segs[3][1] + 1
    real = Segment.remove_files
    calls = {"n": 0}

    def dies_on_second(self: Segment) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("simulated crash between unlinks")
        real(self)

    monkeypatch.setattr(Segment, "remove_files", dies_on_second)
    with pytest.raises(OSError, match="simulated crash"):
        log.truncate_prefix(start)
    monkeypatch.setattr(Segment, "remove_files", real)
    abandon(log)
    assert len(segment_files(scratch)) == len(segs) - 1  # one deleted, two left behind

    log = Log.open(scratch, config)
    assert len(log.recovery.removed_files) == 2
    assert log.start_index == start
    assert log.read_by_index(start, BIG).data == b"".join(entries[start - 1 :])
    assert log.segments()[0][1] == segs[3][1]
    log.close()


def test_snapshot_install_interrupted_midway_restarts_empty_at_the_snapshot(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _multi_segment_log(scratch)
    config = LogConfig(segment_bytes=2048, index_interval_bytes=1)
    log = Log.open(scratch, config)
    end_offset = log.next_offset
    real = Segment.remove_files
    calls = {"n": 0}

    def dies_on_third(self: Segment) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("simulated crash between unlinks")
        real(self)

    monkeypatch.setattr(Segment, "remove_files", dies_on_third)
    with pytest.raises(OSError, match="simulated crash"):
        log.truncate_prefix(100, offset=end_offset + 500, prev_term=7)
    monkeypatch.setattr(Segment, "remove_files", real)
    abandon(log)

    log = Log.open(scratch, config)
    assert (log.start_index, log.start_offset, log.next_index) == (100, end_offset + 500, 100)
    assert log.term_at(99) == 7 and log.last_term == 7
    assert [s[1] for s in log.segments()] == [100]
    assert log.recovery.removed_files
    log.append(entry.encode(b"x", index=100, term=7, base_offset=end_offset + 500, record_count=1))
    log.close()


# --- regressions and known bugs ----------------------------------------------------------


def test_read_stopping_at_a_segment_boundary(tmp_path: Path) -> None:
    """Regression (fixed in 41b1f09): a read whose limit (hi, upper_offset or max_bytes) ends
    exactly where a segment starts raised CorruptEntryError("no whole entry ...")."""
    with Log.open(tmp_path, LogConfig(segment_bytes=1024)) as log:
        entries = fill(log, 3, 600)  # one entry per segment
        assert len(log.segments()) == 3
        assert log.read_by_index(1, BIG, hi=2).data == entries[0]
        assert log.read(0, BIG, upper_offset=1).data == entries[0]
        assert log.read_by_index(1, 700).data == entries[0]
        assert log.read(0, 700).data == entries[0]


def test_read_followed_by_an_entry_larger_than_the_chunk(tmp_path: Path) -> None:
    """Regression (fixed in 41b1f09): a small entry followed by one larger than
    ``max_bytes + READ_SLACK_BYTES`` in the same segment raised CorruptEntryError."""
    with Log.open(tmp_path, INTERVAL) as log:
        small = data_entry(1, 100)
        large = data_entry(2, READ_SLACK_BYTES * 3)
        log.append(small + large)
        assert log.read(0, 1000).data == small
        assert log.read_by_index(1, 1000).data == small
        assert log.read_by_index(1, BIG).data == small + large


def test_truncate_suffix_into_a_closed_segment_after_reopen(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1024)
    with Log.open(tmp_path, config) as log:
        fill(log, 4, 400)  # two entries per segment: segments start at 1 and 3
        assert [s[1] for s in log.segments()] == [1, 3]
    with Log.open(tmp_path, config) as log:  # closed segments' indexes load lazily
        log.truncate_suffix(2)
        assert log.next_index == 2


def test_offset_for_timestamp_ignores_entries_below_the_start(scratch: Path) -> None:
    with Log.open(scratch, INTERVAL) as log:
        for index, ts in ((1, 9000), (2, 10), (3, 20)):
            log.append(data_entry(index, 10, ts=ts))
        log.truncate_prefix(2)  # entry 1 (ts 9000) stays on disk, below the start
        assert log.start_offset == 1
        assert log.offset_for_timestamp(15) == 2
        assert log.offset_for_timestamp(5000) is None  # no retained entry is that recent


def test_truncate_suffix_at_the_first_index_of_the_last_segment_after_reopen(
    scratch: Path,
) -> None:
    """Found by the long property run: cutting exactly at a segment boundary (the cut is the
    end of the segment that becomes the last one) after a reopen."""
    config = LogConfig(segment_bytes=1024, flush_policy=FlushPolicy.INTERVAL)
    with Log.open(scratch, config) as log:
        log.append(data_entry(1, 0) + data_entry(2, 0))
    with Log.open(scratch, config) as log:
        log.append(data_entry(3, 1000))  # does not fit: rolls, segments start at 1 and 3
        assert [s[1] for s in log.segments()] == [1, 3]
        log.truncate_suffix(3)
        assert log.next_index == 3 and log.next_offset == 2
        assert [s[1] for s in log.segments()] == [1]
        log.append(data_entry(3, 10))
    with Log.open(scratch, config) as log:
        assert log.recovery.clean and log.next_index == 4


# --- write-behind ------------------------------------------------------------------------


def test_small_appends_wait_in_memory_and_reach_the_file_together(scratch: Path) -> None:
    """Under INTERVAL, appends below write_behind_bytes are not written one by one: the file
    grows when enough wait, or when a read, flush or close needs them there."""
    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, write_behind_bytes=1000)
    log = Log.open(scratch, config)
    path = segment_files(scratch)[0]
    first = fill(log, 3, 200)  # 274 bytes each: 822 wait
    assert path.stat().st_size == 0
    assert log.read_by_index(1, BIG).data == b"".join(first)  # a read drains them
    assert path.stat().st_size == 822
    fill(log, 3, 200)
    assert path.stat().st_size == 822
    fill(log, 1, 200)  # 4 x 274 = 1,096 waiting >= 1,000: one pwritev
    assert path.stat().st_size == 7 * 274
    fill(log, 2, 200)
    log.flush()  # a flush writes before its fsync
    assert path.stat().st_size == 9 * 274
    assert log.durable_index == 9
    fill(log, 1, 200)
    log.close()  # and so does a close
    assert path.stat().st_size == 10 * 274
    reopened = Log.open(scratch, config)
    assert reopened.recovery.clean and reopened.next_index == 11
    reopened.close()


def test_write_behind_never_reorders_with_truncation_or_roll(scratch: Path) -> None:
    """A suffix cut and a roll both see the waiting bytes in the file first."""
    config = LogConfig(
        flush_policy=FlushPolicy.INTERVAL, segment_bytes=2048, write_behind_bytes=1 << 20
    )
    log = Log.open(scratch, config)
    kept = fill(log, 4, 200)
    fill(log, 2, 200)
    log.truncate_suffix(5)  # entries 5 and 6 go; 1-4 stay, written
    assert log.next_index == 5
    assert segment_files(scratch)[0].stat().st_size == 4 * 274
    more = fill(log, 6, 200)  # rolls after 7 entries of 274 bytes
    assert len(segment_files(scratch)) == 2
    assert segment_files(scratch)[0].stat().st_size == 7 * 274
    assert log.read_by_index(1, BIG).data == b"".join(kept + more)
    log.close()


def test_a_failed_write_keeps_the_bytes_for_the_next_try(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An EIO or ENOSPC while draining raises to the caller that needed the bytes; they stay
    pending at the same position, so a later flush writes them without a gap."""
    import raftmq.log.segment as segment_module

    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, write_behind_bytes=1 << 20)
    log = Log.open(scratch, config)
    written = fill(log, 3, 200)
    real = os.pwritev

    def failing(fd: int, buffers: list[bytes], position: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(segment_module.os, "pwritev", failing)
    with pytest.raises(OSError, match="No space"):
        log.flush()
    assert log.durable_index == 0
    monkeypatch.setattr(segment_module.os, "pwritev", real)
    log.flush()
    assert log.durable_index == 3
    assert log.read_by_index(1, BIG).data == b"".join(written)
    log.close()


def test_append_checks_crcs_unless_its_caller_did_at_a_trust_boundary(tmp_path: Path) -> None:
    """The Raft host's appends were CRC-checked once, at the client or the peer edge, and
    say so; anyone else's append is checked here. Framing and contiguity always are."""
    good = data_entry(1)
    bad = bytearray(good)
    bad[-1] ^= 0x01  # a payload bit: the header still frames
    with Log.open(tmp_path / "a", INTERVAL) as log:
        with pytest.raises(CorruptEntryError):
            log.append(bytes(bad))
        assert log.last_index == 0
    with Log.open(tmp_path / "b", INTERVAL) as log:
        log.append(bytes(bad), crc_checked=True)  # trusted: stored as given
        assert log.last_index == 1
        with pytest.raises(NotContiguousError):
            log.append(data_entry(5), crc_checked=True)


# --- settings altered while open ---------------------------------------------------------


def test_reconfigure_takes_new_limits_retention_and_write_behind_live(scratch: Path) -> None:
    """A topic's altered config reaches an open log: the next append is checked against
    the new size limit, the next retention pass uses the new retention, and bytes kept
    back under a larger write-behind reach the file when it shrinks. Nothing reopens."""
    clock = FakeClock(10_000_000)
    config = LogConfig(
        flush_policy=FlushPolicy.INTERVAL,
        segment_bytes=2048,
        max_message_bytes=512,
        write_behind_bytes=1 << 20,
    )
    log = Log.open(scratch, config, clock_ms=clock)
    fill(log, 20, 200, ts=clock.now)
    with pytest.raises(LogError):
        log.append(data_entry(log.next_index, 1000, ts=clock.now))
    clock.now += 60_000
    assert log.apply_retention() == 0  # 14 days by default
    log.reconfigure(dataclasses.replace(config, max_message_bytes=4096, retention_ms=1000))
    big = data_entry(log.next_index, 1000, ts=clock.now)
    log.append(big)
    assert log.read_by_index(21, BIG).data == big
    assert log.apply_retention() > 0
    assert log.start_index > 1
    fill(log, 2, 100, ts=clock.now)
    active = segment_files(scratch)[-1]
    waiting = active.stat().st_size
    log.reconfigure(dataclasses.replace(log.config, write_behind_bytes=0))
    assert active.stat().st_size > waiting  # drained at once
    log.close()
