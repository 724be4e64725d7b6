"""``Log.on_durable``: the test-only hook through which the chaos harness learns how much of
each segment an fsync covered, so it can simulate a power loss by cutting every file back
to that size. The hook is only useful if its sizes are exact: too small and the simulation
destroys data the log legitimately acknowledged, too large and it hides real losses.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from raftmq.format import entry
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.log import Log
from raftmq.log.segment import LOG_SUFFIX


def _entry(index: int, size: int = 100) -> bytes:
    return entry.encode(
        bytes([index % 251]) * size, index=index, term=1, base_offset=index - 1, record_count=1
    )


class Recorder:
    """Collects hook calls; checks per path that sizes never shrink (thread-safe)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.last: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, path: str, size: int) -> None:
        with self._lock:
            assert size >= self.last.get(path, 0), (path, size, self.last)
            self.last[path] = size
            self.calls.append((path, size))


def _open(directory: Path, **kw: int) -> Log:
    return Log.open(directory, LogConfig(flush_policy=FlushPolicy.INTERVAL, **kw))


def test_reported_size_is_the_file_size_after_flush_and_only_grows(tmp_path: Path) -> None:
    log = _open(tmp_path)
    hook = Recorder()
    log.on_durable = hook
    appended = 0
    for i in range(1, 41):
        data = _entry(i, 50 + i)
        log.append(data)
        appended += len(data)
        if i % 7 == 0:
            log.flush()
            path, size = hook.calls[-1]
            assert Path(path).name.endswith(LOG_SUFFIX)
            assert size == appended == os.path.getsize(path)
    log.flush()  # 36..40 unsynced: one more report
    calls = len(hook.calls)
    log.flush()  # nothing new: no fsync, no report
    assert len(hook.calls) == calls
    log.append(_entry(41))
    log.flush()
    assert len(hook.calls) == calls + 1
    assert hook.calls[-1][1] == os.path.getsize(hook.calls[-1][0])
    log.close()


def test_a_roll_reports_the_closed_segment_whole(tmp_path: Path) -> None:
    log = _open(tmp_path, segment_bytes=1024)
    hook = Recorder()
    log.on_durable = hook
    for i in range(1, 30):
        log.append(_entry(i))
    log.flush()
    segments = log.segments()
    assert len(segments) > 2
    for name, _first, _base, size in segments:
        assert hook.last[str(tmp_path / (name + LOG_SUFFIX))] == size
    log.close()


def test_reports_cover_every_entry_appended_before_a_concurrent_flush(tmp_path: Path) -> None:
    """Appends go on while the fsync runs outside the lock: every reported size must end on
    an entry boundary and, once ``flush()`` returns, cover what was appended before it."""
    log = _open(tmp_path)
    hook = Recorder()
    log.on_durable = hook
    stop = threading.Event()
    ends: list[int] = []  # file size after each append, i.e. every entry boundary
    lock = threading.Lock()

    def appender() -> None:
        i = 1
        while not stop.is_set() and i < 3000:
            with lock:
                log.append(_entry(i, 30))
                ends.append(log.segments()[-1][3])
            i += 1

    thread = threading.Thread(target=appender)
    thread.start()
    try:
        for _ in range(50):
            with lock:
                before = log.segments()[-1][3]
            log.flush()
            assert hook.last[hook.calls[-1][0]] >= before
    finally:
        stop.set()
        thread.join()
    boundaries = set(ends)
    assert all(size in boundaries for _path, size in hook.calls)
    log.close()


def _lose_unsynced(log_dir: Path, hook: Recorder) -> int:
    """Cut every segment back to its last reported size, as a power loss would."""
    dropped = 0
    for path, size in hook.last.items():
        actual = os.path.getsize(path)
        if actual > size:
            os.truncate(path, size)
            dropped += actual - size
    return dropped


def test_cutting_to_the_reported_size_keeps_every_flushed_entry(tmp_path: Path) -> None:
    log = _open(tmp_path)
    hook = Recorder()
    log.on_durable = hook
    for i in range(1, 21):
        log.append(_entry(i))
    log.flush()
    flushed = log.last_index
    for i in range(21, 31):
        log.append(_entry(i))
    # A SIGKILL: the process dies without closing (close would flush).
    for seg in log._segments:
        seg.close_fd()
    log._closed = True
    assert _lose_unsynced(tmp_path, hook) == 10 * len(_entry(21))
    reopened = _open(tmp_path)
    assert reopened.next_index == flushed + 1
    assert reopened.recovery.clean
    assert entry.parse_header(reopened.read_by_index(flushed, 1).data).index == flushed
    reopened.close()


def test_a_torn_write_past_the_reported_size_is_all_recovery_drops(tmp_path: Path) -> None:
    """A power loss may keep part of an unsynced write: recovery cuts only that torn tail."""
    log = _open(tmp_path, segment_bytes=2048)
    hook = Recorder()
    log.on_durable = hook
    for i in range(1, 40):
        log.append(_entry(i))
    log.flush()
    flushed = log.last_index
    log.append(_entry(40))
    log.append(_entry(41))
    for seg in log._segments:
        seg.close_fd()
    log._closed = True
    path, size = hook.calls[-1]
    os.truncate(path, size + len(_entry(40)) // 2)
    _lose_unsynced(tmp_path, Recorder())  # nothing else to cut: other segments are closed
    reopened = _open(tmp_path)
    assert reopened.next_index == flushed + 1
    assert reopened.recovery.truncated_bytes == len(_entry(40)) // 2
    assert reopened.recovery.truncated_entries == 1
    reopened.close()
