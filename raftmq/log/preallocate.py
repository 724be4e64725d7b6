"""Disk space reserved ahead of the active segment's end, without changing its size.

Why: an append that extends a file makes the file system allocate blocks for it (ext4's
delayed allocation reserves them on every write), which is a good part of what a write
costs. Reserving the next few MiB at once with ``fallocate(FALLOC_FL_KEEP_SIZE)`` moves
that work out of the per-append path; Redpanda does the same for its segments. The file's
size still ends at the last byte written, so recovery, which trusts the size and checks
the tail by CRC, is unchanged. Sealing a segment gives the unused reservation back.

Python's ``os`` module has only ``posix_fallocate``, which grows the size, so the Linux
call goes through ctypes. Where it is missing or the file system refuses (tmpfs on old
kernels, some network file systems), reserving is simply skipped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE
_PUNCH_HOLE = 0x02  # FALLOC_FL_PUNCH_HOLE (must be combined with KEEP_SIZE)
_FREE_TO = 1 << 40  # how far past the end a release reaches: any reservation we made


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


def _call(fd: int, mode: int, offset: int, length: int) -> bool:
    """True when the call succeeded. Any failure (no support, a full disk) is left for the
    write itself to meet: a reservation only saves work, and a step-sized one may fail on a
    nearly full disk where the append itself still fits."""
    return _fallocate is not None and _fallocate(fd, mode, offset, length) == 0


def reserve(fd: int, offset: int, length: int) -> bool:
    """Allocate ``length`` bytes from ``offset`` without changing the file's size."""
    return _call(fd, _KEEP_SIZE, offset, length)


def release_beyond(fd: int, size: int) -> None:
    """Free whatever was reserved past ``size`` (the file's end); a no-op if nothing was."""
    _call(fd, _KEEP_SIZE | _PUNCH_HOLE, size, _FREE_TO)


__all__ = ["release_beyond", "reserve"]
