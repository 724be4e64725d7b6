"""Disk space reserved ahead of the active segment's end, without changing its size.

Why: an append that extends a file makes the file system allocate blocks for it (ext4's
delayed allocation reserves them on every write), which is a good part of what a write
costs. Reserving the next few MiB at once with ``fallocate(FALLOC_FL_KEEP_SIZE)`` moves
that work out of the per-append path; Redpanda does the same for its segments. The file's
size still ends at the last byte written, so recovery, which trusts the size and checks
the tail by CRC, is unchanged. Sealing a segment gives the unused reservation back.

How much: enough for about the next eight seconds at the log's recent rate of writes
(:class:`Pacer`), up to
``LogConfig.preallocate_bytes``, and never more than a per-process budget shared by every
log (:class:`ReserveBudget`). A fixed 16 MiB ahead of every active segment cost a broker
with 3,000 partition replicas about 47 GB of disk for 13 MB of data; a log that writes
little now reserves nothing, a busy one still gets the whole step.

Python's ``os`` module has only ``posix_fallocate``, which grows the size, so the Linux
call goes through ctypes. Where it is missing or the file system refuses (tmpfs on old
kernels, some network file systems), reserving is simply skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Callable

_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE


def _load_fallocate() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()


def _call(fd: int, mode: int, position: int, length_bytes: int) -> bool:
    """True when the call succeeded. Any failure (no support, a full disk) is left for the
    write itself to meet: a reservation only saves work, and a step-sized one may fail on a
    nearly full disk where the append itself still fits."""
    return _fallocate is not None and _fallocate(fd, mode, position, length_bytes) == 0


def reserve(fd: int, position: int, length_bytes: int) -> bool:
    """Allocate ``length_bytes`` from byte ``position`` without changing the file's size."""
    return _call(fd, _KEEP_SIZE, position, length_bytes)


def release_beyond(fd: int, size_bytes: int) -> None:
    """Free whatever was reserved past ``size_bytes``, which must be the file's size: a no-op if
    nothing was.

    By truncating to the same size, not by punching a hole: ext4 returns success for a
    hole punched at or past the end of the file and frees nothing (seen on Linux 6.18), so
    every sealed segment kept its last reservation; a truncation frees all blocks past the
    end, preallocated ones included."""
    assert os.fstat(fd).st_size == size_bytes, "releasing a reservation must not move the end"
    os.ftruncate(fd, size_bytes)


MIB = 1024 * 1024
DEFAULT_BUDGET_BYTES = 128 * MIB
"""What all logs of one process may hold reserved ahead of their ends at once."""
RATE_WINDOW_MS = 1000
"""Length of the windows a log's recent writes are counted in."""
AHEAD_WINDOWS = 8
"""A reservation covers this many windows of the log's recent writes. Why eight: a log that
starts writing fast reaches the whole step after three or four reservations; with two it
took six for the first 4 MiB, and each extra one showed in ``log_bench``'s fsync-per-batch
phase (0.65-0.75x of a plain file instead of 0.85-0.95x)."""
MIN_GRANT_BYTES = 64 * 1024
"""Smaller reservations are not worth their system call: the log then reserves nothing."""
BLOCK_BYTES = 4096


class ReserveBudget:
    """The disk all logs of a process may reserve ahead of their active segments' ends.

    Each segment holds a ticket for what it was granted past its end at its last
    reservation; what it still has reserved is at most that, so the sum of tickets bounds
    the process's unused reservations. Tickets come back when the reservation is used up
    (the next one replaces it), on seal, close, truncation and removal."""

    def __init__(self, total_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self._lock = threading.Lock()
        self.total_bytes = total_bytes
        self.used_bytes = 0

    def take(self, want_bytes: int) -> int:
        """Up to ``want_bytes`` (whole blocks), or 0 when not even the minimum grant is left."""
        with self._lock:
            grant_bytes = (
                min(want_bytes, self.total_bytes - self.used_bytes) // BLOCK_BYTES * BLOCK_BYTES
            )
            if grant_bytes < MIN_GRANT_BYTES:
                return 0
            self.used_bytes += grant_bytes
            return grant_bytes

    def give(self, n_bytes: int) -> None:
        with self._lock:
            self.used_bytes -= n_bytes
            assert self.used_bytes >= 0, "a reservation ticket was given back twice"

    def set_total(self, total_bytes: int) -> None:
        """Change the budget (a broker's setting); grants beyond it end as they are used."""
        with self._lock:
            self.total_bytes = total_bytes


BUDGET = ReserveBudget()
"""The one budget of this process."""


class Pacer:
    """How far ahead of one log's active segment to reserve: ``AHEAD_WINDOWS`` times the
    bytes it wrote in the current or the previous window (the larger), in powers of two,
    at most ``max_bytes``, and only what the budget grants.

    Fed only when an append passes the end of the reservation, so a log with a large
    reservation pays nothing per append, and one with none pays a clock read."""

    __slots__ = ("budget", "clock_ms", "current_bytes", "max_bytes", "previous_bytes", "window")

    def __init__(self, max_bytes: int, clock_ms: Callable[[], int], budget: ReserveBudget) -> None:
        assert max_bytes > 0
        self.max_bytes = max_bytes
        self.clock_ms = clock_ms
        self.budget = budget
        self.window = -1
        self.current_bytes = 0
        self.previous_bytes = 0

    def want(self, written_bytes: int) -> int:
        """Note ``written_bytes`` more; the reservation the log should hold now."""
        window = self.clock_ms() // RATE_WINDOW_MS
        if window != self.window:
            self.previous_bytes = self.current_bytes if window == self.window + 1 else 0
            self.current_bytes = 0
            self.window = window
        self.current_bytes += written_bytes
        recent_bytes = AHEAD_WINDOWS * max(self.current_bytes, self.previous_bytes)
        if recent_bytes < MIN_GRANT_BYTES:
            return 0
        return min(self.max_bytes, 1 << (recent_bytes - 1).bit_length())


__all__ = [
    "BUDGET",
    "DEFAULT_BUDGET_BYTES",
    "Pacer",
    "ReserveBudget",
    "release_beyond",
    "reserve",
]
