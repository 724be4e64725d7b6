"""Durability markers (test-only, the broker's ``--durability-markers``): beside each
segment, ``<segment file>.durable`` holds the size the last fsync made durable, so the
chaos harness can cut the segment back to it after a SIGKILL and so simulate a power loss
that drops un-fsynced data.

In the log layer, not in devtools: a running broker installs the hook into its logs, and
the broker may not import the top floor. It writes files beside the log's own segments,
through the log's ``on_durable`` hook, so it is the log's concern.
"""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable

from raftmq.log.handles import open_fd

DURABLE_SUFFIX = ".durable"
_DURABLE = struct.Struct(">q")
_MARKERS_KEPT = 64
"""Marker descriptors kept open by the whole process (not per log): a broker with 1,000
logs would otherwise hold thousands, beside the segment cap (see handles.py)."""


class _MarkerFiles:
    """The durability markers' descriptors, least recently used first, shared by every log
    of the process and used from the fsync threads (hence the lock)."""

    def __init__(self, kept: int) -> None:
        self._lock = threading.Lock()
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._kept = kept

    def write(self, path: str, size_bytes: int) -> None:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = open_fd(path + DURABLE_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
                self._fds[path] = fd
                while len(self._fds) > self._kept:
                    os.close(self._fds.popitem(last=False)[1])
            else:
                self._fds.move_to_end(path)
            os.pwrite(fd, _DURABLE.pack(size_bytes), 0)


_MARKERS = _MarkerFiles(_MARKERS_KEPT)


def durability_marker_writer() -> Callable[[str, int], None]:
    """A ``Log.on_durable`` hook (test-only, ``--durability-markers``): writes each fsynced
    size into ``<segment file>.durable`` so the chaos harness can cut the segment back to
    it after a SIGKILL, simulating a power loss that drops un-fsynced data.

    No fsync: the marker only has to outlive the SIGKILL, so the page cache is enough.
    The descriptors are a bounded LRU for the whole process: the hook is called for each
    log's active segment, and for the one a roll just closed."""
    return _MARKERS.write
