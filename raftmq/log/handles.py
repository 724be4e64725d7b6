"""Open segment files, bounded per process: one LRU of descriptors shared by every Log.

Why: a broker hosts one log per partition replica, and each log kept its active segment
open for good (plus up to ``max_open_segments`` closed ones). With 1,000 replicas that is
over 1,000 descriptors before a single socket, and a process at a soft ``RLIMIT_NOFILE``
of 1,024 (a common default) failed with EMFILE. Here every segment descriptor, for reads
and writes alike, comes from one cache with a cap; the least recently used unpinned one is
closed to make room, and reopened on its next use. Nothing is lost by closing: write-behind
bytes stay in the segment's memory until a drain reopens the file, and Linux reports a
writeback error to the next ``fsync`` on any descriptor of the file (since 4.13), so an
fsync through a reopened descriptor covers what an evicted one wrote.

A descriptor is *pinned* while a system call uses it (``pin``/``unpin``, or ``using``):
only unpinned ones are evicted, so a thread never loses the descriptor it works on to
another log's open. All pins are short (one call, or one fsync in the flush pool), so the
cap can be passed only by the number of descriptors pinned at that moment.

The cap is derived from the limit: a broker raises its soft ``RLIMIT_NOFILE`` to the hard
limit at start (:func:`raise_nofile_limit`) and takes :func:`cap_for_limit` of it, leaving
the rest for sockets, gRPC, index and checkpoint files and the like.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raftmq.log.segment import Segment

MIN_CAP = 16
"""The smallest cap: below this a log could not even keep its own active segment open
while reading another."""
CAP_FRACTION = 0.75
"""Share of the open-file limit segment files may use."""
RESERVED_FDS = 64
"""Descriptors kept out of the cap on top of the remaining share: listening sockets, Raft
peers, the event loop, checkpoint and index files opened for a moment."""
MAX_CAP = 1 << 20
"""Where an unlimited (or huge) limit stops mattering."""
HANDLES_PER_REPLICA = 2
EMFILE_ROOM = 8
"""Idle segment descriptors closed to make room when an open fails with EMFILE. The limit
is shared with sockets the cap cannot see (a burst of client connections, TLS handshakes
through a hung link): a durable write must not fail for want of a descriptor while the
cache holds idle ones it can reopen later."""
"""Below this many per hosted log (its active segment and one read handle), a broker
warns at start that segment files will be reopened constantly."""


def cap_for_limit(limit: int) -> int:
    """Segment descriptors a process with open-file limit ``limit`` may hold."""
    if limit == resource.RLIM_INFINITY or limit <= 0:
        return MAX_CAP
    return max(MIN_CAP, min(MAX_CAP, int(limit * CAP_FRACTION) - RESERVED_FDS))


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (what an unprivileged process may do);
    returns (soft, hard) after the change. A refusal leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def _current_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class HandleCache:
    """The process's open segment descriptors, least recently used first."""

    def __init__(self, cap: int | None = None) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[Segment, None] = OrderedDict()
        self._cap = cap
        self.opens = 0  # files opened so far (reopens after eviction included)
        self.evictions = 0
        self.peak = 0  # most descriptors open at once

    @property
    def cap(self) -> int:
        if self._cap is None:
            self._cap = cap_for_limit(_current_limit())
        return self._cap

    def set_cap(self, cap: int) -> None:
        """Change the cap (a broker sets it from its raised limit before opening logs)."""
        if cap < 1:
            raise ValueError(f"the segment handle cap must be at least 1, got {cap}")
        with self._lock:
            self._cap = cap
            self._evict(0)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def pin(self, seg: Segment) -> int:
        """The segment's descriptor, opened if needed (read-write for a segment that may
        still be written, read-only for a sealed one), kept open until ``unpin``."""
        with self._lock:
            fd = seg.fd
            if fd is not None:
                self._open.move_to_end(seg)
                seg.pins += 1
                return fd
            self._evict(1)
            flags = os.O_RDWR if seg.writable else os.O_RDONLY
            fd = _open_with_room(lambda: os.open(seg.path, flags), self._shed)
            self._add(seg, fd)
            seg.pins += 1
            return fd

    def unpin(self, seg: Segment) -> None:
        with self._lock:
            assert seg.pins > 0, f"segment {seg.name} unpinned more often than pinned"
            seg.pins -= 1

    @contextmanager
    def using(self, seg: Segment) -> Iterator[int]:
        fd = self.pin(seg)
        try:
            yield fd
        finally:
            self.unpin(seg)

    def adopt(self, seg: Segment, fd: int) -> None:
        """Take charge of a descriptor the caller opened (a segment file just created)."""
        with self._lock:
            assert seg.fd is None
            self._evict(1)
            self._add(seg, fd)

    def close(self, seg: Segment) -> None:
        """Close the segment's descriptor now (its owner holds its log's lock and no flush
        is using it, so it cannot be pinned)."""
        with self._lock:
            fd = seg.fd
            if fd is None:
                return
            assert seg.pins == 0, f"closing segment {seg.name} while a call uses it"
            del self._open[seg]
            seg.fd = None
            os.close(fd)

    def shed(self, count: int) -> int:
        """Close up to ``count`` idle descriptors, least recently used first, to give their
        room to another open; how many it closed (0: none was idle)."""
        with self._lock:
            return self._shed(count)

    def _shed(self, count: int) -> int:
        victims = [seg for seg in self._open if not seg.pins][:count]
        for seg in victims:
            self._close_evicted(seg)
        return len(victims)

    def _add(self, seg: Segment, fd: int) -> None:
        seg.fd = fd
        self._open[seg] = None
        self.opens += 1
        self.peak = max(self.peak, len(self._open))

    def _evict(self, room: int) -> None:
        """Close least recently used unpinned descriptors until ``room`` more fit the cap."""
        target = self.cap - room
        if len(self._open) <= target:
            return
        victims = []
        for seg in self._open:
            if not seg.pins:  # one in use by a call right now stays: the next one goes
                victims.append(seg)
                if len(self._open) - len(victims) <= target:
                    break
        for seg in victims:
            self._close_evicted(seg)

    def _close_evicted(self, seg: Segment) -> None:
        fd = seg.fd
        del self._open[seg]
        seg.fd = None
        self.evictions += 1
        if fd is not None:
            os.close(fd)


HANDLES = HandleCache()
"""The one cache of this process."""


class DescriptorReserve:
    """A few descriptors (on /dev/null) a broker holds back for its persists. Closing idle
    segment descriptors is not always enough at a low limit: none may be idle, and the
    gRPC library's own threads take descriptors as they free (chaos seed 7453: a broker at
    a limit of 128 with 35 replicas failed persists even so, and its replicas were
    quarantined). Released one at a time to an open that failed with EMFILE, and filled
    again at a later open once there is room."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._fds: list[int] = []
        self._lock = threading.Lock()
        self.released = 0
        self.active = False
        """Filled once (a broker's): opens take back what they lent."""

    @property
    def held(self) -> int:
        return len(self._fds)

    def fill(self) -> None:
        """Hold ``count`` descriptors, or as many as the limit allows now."""
        self.active = True
        if len(self._fds) >= self.count:
            return
        with self._lock:
            while len(self._fds) < self.count:
                try:
                    self._fds.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    return

    def release(self) -> bool:
        """Close one held descriptor, for the caller's next open; False: none held."""
        with self._lock:
            if not self._fds:
                return False
            os.close(self._fds.pop())
            self.released += 1
            return True


RESERVE = DescriptorReserve(4)
"""The process's reserve; empty until a broker fills it at start (open_files_note)."""


def _open_with_room(open_: Callable[[], int], shed: Callable[[int], int]) -> int:
    """``open_()``; out of descriptors (EMFILE), first close up to :data:`EMFILE_ROOM` idle
    segment descriptors with ``shed``, then a reserved one, trying again after each."""
    for attempt in range(3):
        try:
            fd = open_()
            break
        except OSError as exc:
            if exc.errno != errno.EMFILE:
                raise
            room = shed(EMFILE_ROOM) if attempt == 0 else 0
            if not room and not RESERVE.release():
                raise
    else:
        fd = open_()
    if RESERVE.active and RESERVE.held < RESERVE.count:
        RESERVE.fill()  # room again: take back what was lent
    return fd


def open_fd(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` for the log's other files (index and checkpoint files, their temporary
    copies, directories to fsync): a process out of descriptors (EMFILE) first closes up
    to :data:`EMFILE_ROOM` idle segment descriptors, then one of its reserve
    (:data:`RESERVE`), trying again after each, so a persist fails only when neither is
    left."""
    return _open_with_room(lambda: os.open(path, flags, mode), HANDLES.shed)


__all__ = [
    "HANDLES",
    "HANDLES_PER_REPLICA",
    "RESERVE",
    "DescriptorReserve",
    "HandleCache",
    "cap_for_limit",
    "open_fd",
    "raise_nofile_limit",
]
