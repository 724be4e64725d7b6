"""One segment: an append-only file of whole entries, named by its base offset and first
Raft index, with its sparse indexes beside it.

Two numbers are in the name because control entries take no message offsets: two segments
can share a base offset, never a first Raft index. Kafka names by offset alone; we keep its
zero-padded style so ``ls`` sorts segments in log order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raftmq.format import entry, tag_filter, tags
from raftmq.format.entry import HEADER_SIZE, EntryHeader
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.log import preallocate
from raftmq.log.atomic_file import fsync_dir
from raftmq.log.handles import HANDLES, open_fd
from raftmq.log.index import SegmentIndex

SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# Appends kept back by write-behind before a drain, whatever their bytes: under IOV_MAX.
MAX_PENDING_WRITES = 256
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TAG_INDEX_SUFFIX = ".tagindex"


def segment_name(base_offset: int, first_index: int) -> str:
    return f"{base_offset:020d}-{first_index:020d}"


def parse_segment_name(stem: str) -> tuple[int, int] | None:
    parts = stem.split("-")
    if len(parts) != 2 or not all(len(p) == 20 and p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def first_unsealed(segments: list[Segment]) -> int:
    """Position of the first segment without a durable, sealed past: the last one (active)
    and, before it, the run of closed ones that have no index files. Index files are
    written only after their segment's fsync, so a roll not yet followed by a flush (or a
    crash in between) leaves such a run at the tail; an index missing further back (a
    sealed segment follows it) was lost some other way and is only rebuilt."""
    pos = len(segments) - 1
    while pos > 0 and not segments[pos - 1].has_index_files():
        pos -= 1
    return pos


@dataclass(slots=True)
class ScanResult:
    """How far a scan got: ``valid_end`` is the byte after the last good entry."""

    valid_end: int
    entries: int
    last: EntryHeader | None
    error: str | None  # why the scan stopped early, None when it reached the end


class Segment:
    __slots__ = (
        "accounted_bytes",
        "allocated_bytes",
        "base_offset",
        "corrupt_at",
        "directory",
        "fd",
        "first_index",
        "index",
        "pacer",
        "pending",
        "pins",
        "size",
        "ticket_bytes",
        "verified_upto",
        "writable",
        "written",
    )

    def __init__(self, directory: Path, base_offset: int, first_index: int, size: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.first_index = first_index
        self.size = size
        # The descriptor belongs to the process's handle cache (handles.py): it may be
        # closed whenever no call pins it, and is reopened on the next use. ``writable``
        # is the segment's role, not the descriptor's: True while the file may still be
        # written (active, or closed but not sealed yet), so it is opened read-write.
        self.fd: int | None = None
        self.pins = 0
        self.writable = False
        self.index: SegmentIndex | None = None
        # Bytes below this position were CRC-checked by this process (appended here, or
        # scanned); reads verify only beyond it, so a hot log is not checksummed twice.
        self.verified_upto = 0
        self.corrupt_at: int | None = None
        # Reserving disk ahead of the end (see preallocate.py): the log's pacer (None:
        # never), how far this process has reserved, the budget ticket held for it, and
        # how much of the file the pacer has been told about.
        self.pacer: preallocate.Pacer | None = None
        self.allocated_bytes = size
        self.ticket_bytes = 0
        self.accounted_bytes = size
        # Write-behind (see ``write``): appended bytes not yet handed to the kernel, and the
        # file's end; ``size`` counts both.
        self.pending: list[bytes] = []
        self.written = size

    @property
    def name(self) -> str:
        return segment_name(self.base_offset, self.first_index)

    @property
    def path(self) -> Path:
        return self.directory / (self.name + LOG_SUFFIX)

    @property
    def index_path(self) -> Path:
        return self.directory / (self.name + INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        return self.directory / (self.name + TIME_INDEX_SUFFIX)

    @property
    def tag_index_path(self) -> Path:
        return self.directory / (self.name + TAG_INDEX_SUFFIX)

    def write_index(self) -> None:
        """Write the index files (the tag index first: the other two mark it sealed)."""
        assert self.index is not None
        self.index.write(self.index_path, self.time_index_path, self.tag_index_path)

    def has_index_files(self) -> bool:
        return self.index_path.exists() and self.time_index_path.exists()

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        first_index: int,
        *,
        pacer: preallocate.Pacer | None = None,
        durable: bool = True,
    ) -> Segment:
        """A new empty segment file; with ``durable``, its name is made durable at once
        (fsync of the file and of the directory), so entries a flush later makes durable in
        it are not lost with the name."""
        seg = cls(directory, base_offset, first_index, 0)
        seg.pacer = pacer
        fd = open_fd(seg.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            if durable:
                os.fsync(fd)
                fsync_dir(directory)
        except BaseException:
            os.close(fd)
            raise
        seg.writable = True
        HANDLES.adopt(seg, fd)
        seg.index = SegmentIndex(base_offset, first_index)
        return seg

    def set_writable(self, writable: bool) -> None:
        """Change the segment's role (sealed: read-only; active again after a cut: written).
        The caller holds the log's lock with no flush running, so nothing pins the old
        descriptor; the next use opens the file in the new mode."""
        if writable != self.writable:
            if self.fd is not None:
                self.drain()
                HANDLES.close(self)
            self.writable = writable

    def fsync(self) -> None:
        with HANDLES.using(self) as fd:
            os.fsync(fd)

    def close_fd(self) -> None:
        if self.pending:
            self.drain()  # appended bytes are never dropped by closing
        HANDLES.close(self)

    def pread(self, length: int, position: int) -> bytes:
        if position + length > self.written:
            self.drain()
        fd = HANDLES.pin(self)
        try:
            data = os.pread(fd, length, position)
        finally:
            HANDLES.unpin(self)
        if len(data) != length:
            raise CorruptEntryError(
                f"segment {self.name} is shorter than expected: wanted {length} bytes at "
                f"{position}, got {len(data)}",
                position=position,
                segment=self.name,
            )
        return data

    def write(self, buf: bytes, write_behind_bytes: int) -> None:
        """Append ``buf``: kept in memory until ``write_behind_bytes`` wait (0: write now),
        then all of them go to the kernel with one ``pwritev``.

        Why: a write system call costs about as much for 64 KiB as for 16 KiB here, so small
        appends (a 16 KiB batch, a follower's one-entry round) pay mostly for the call. The
        bytes are the caller's own immutable objects, not copies. Every path that needs them
        in the file (a read reaching them, fsync, roll, truncate, close) calls ``drain`` first.
        """
        assert self.writable, "append to a sealed segment"
        end = self.size + len(buf)
        if end > self.allocated_bytes:
            self._reserve(end)
        self.pending.append(buf)
        self.size = end
        if end - self.written >= write_behind_bytes or len(self.pending) >= MAX_PENDING_WRITES:
            self.drain()

    def drain(self) -> None:
        """Write what ``write`` kept back. On an error the bytes stay pending and a retry
        writes them again at the same position, so a failed drain never leaves a gap."""
        pending = self.pending
        if not pending:
            return
        assert self.writable, "pending bytes on a read-only segment"
        position = self.written
        fd = HANDLES.pin(self)
        try:
            if len(pending) == 1:
                n = os.pwrite(fd, pending[0], position)
            else:
                n = os.pwritev(fd, pending, position)
            total = self.size - position
            if n < total:  # short write (a full disk, a signal): finish it or raise trying
                view = memoryview(b"".join(pending))[n:]
                while view:
                    written = os.pwrite(fd, view, position + n)
                    n += written
                    view = view[written:]
        finally:
            HANDLES.unpin(self)
        pending.clear()
        self.written = self.size

    def _reserve(self, end: int) -> None:
        """An append reaches past the reservation: ask the log's pacer for the next one
        (sized by the log's recent writes) and reserve it from here."""
        pacer = self.pacer
        if pacer is None:
            self.allocated_bytes = 1 << 62  # never again
            return
        self._give_back()  # the old reservation is used up
        want_bytes = pacer.want(end - self.accounted_bytes)
        self.accounted_bytes = end
        grant_bytes = pacer.budget.take(want_bytes) if want_bytes else 0
        if not grant_bytes:
            self.allocated_bytes = end  # nothing reserved: decide again at the next append
            return
        with HANDLES.using(self) as fd:
            ok = preallocate.reserve(
                fd, self.allocated_bytes, end + grant_bytes - self.allocated_bytes
            )
        if ok:
            self.allocated_bytes, self.ticket_bytes = end + grant_bytes, grant_bytes
        else:
            pacer.budget.give(grant_bytes)
            self.pacer, self.allocated_bytes = None, 1 << 62  # unsupported here: stop trying

    def _give_back(self) -> None:
        if self.ticket_bytes:
            assert self.pacer is not None
            self.pacer.budget.give(self.ticket_bytes)
            self.ticket_bytes = 0

    def release_reserved(self) -> None:
        """Give back disk reserved past the end: called when the segment is sealed (and on
        close and open), and harmless on a file that has no reservation."""
        if self.writable:
            self.drain()  # the file must end where the segment does
            with HANDLES.using(self) as fd:
                preallocate.release_beyond(fd, self.size)
        self._give_back()
        self.allocated_bytes = self.accounted_bytes = self.size

    def truncate(self, position: int) -> None:
        self.drain()
        self.set_writable(True)
        with HANDLES.using(self) as fd:
            os.ftruncate(fd, position)  # frees whatever was reserved past it, too
            os.fsync(fd)
        self._give_back()
        self.size = self.written = position
        self.allocated_bytes = self.accounted_bytes = position
        self.verified_upto = min(self.verified_upto, position)

    def remove_files(self) -> None:
        self.pending.clear()  # the file goes: nothing of it needs writing
        HANDLES.close(self)
        self._give_back()
        for path in (self.path, self.index_path, self.time_index_path, self.tag_index_path):
            path.unlink(missing_ok=True)
        fsync_dir(self.directory)

    def remove_index_files(self) -> None:
        for path in (self.index_path, self.time_index_path, self.tag_index_path):
            path.unlink(missing_ok=True)

    def scan(
        self,
        *,
        verify: bool,
        on_entry: Callable[[int, EntryHeader], str | None],
        start: int = 0,
    ) -> ScanResult:
        """Walk the entries from ``start`` in bounded chunks, stopping at the first entry that
        is torn, fails its CRC, or that ``on_entry`` refuses (it returns a reason)."""
        self.drain()
        fd = HANDLES.pin(self)
        try:
            return self._scan(fd, verify, on_entry, start)
        finally:
            HANDLES.unpin(self)

    def _scan(
        self,
        fd: int,
        verify: bool,
        on_entry: Callable[[int, EntryHeader], str | None],
        start: int,
    ) -> ScanResult:
        size = os.fstat(fd).st_size
        position, count, last = start, 0, None
        want_bytes = SCAN_CHUNK_BYTES
        while position < size:
            chunk = os.pread(fd, min(want_bytes, size - position), position)
            want_bytes = SCAN_CHUNK_BYTES
            view = memoryview(chunk)
            p = 0
            while p < len(chunk):
                if len(chunk) - p < HEADER_SIZE and position + p + HEADER_SIZE <= size:
                    break  # header straddles the chunk: re-read from here
                try:
                    header = entry.parse_header(view, p)
                except InvalidEntryError as exc:
                    return ScanResult(position + p, count, last, str(exc))
                if p + header.size > len(chunk):
                    if position + p + header.size > size:
                        return ScanResult(
                            position + p,
                            count,
                            last,
                            f"torn entry at byte {position + p}: needs {header.size} bytes, "
                            f"{size - position - p} present",
                        )
                    want_bytes = max(SCAN_CHUNK_BYTES, header.size)
                    break
                if verify and not entry.crc_ok(view, header):
                    return ScanResult(
                        position + p, count, last, f"CRC mismatch at byte {position + p}"
                    )
                reason = on_entry(position + p, header)
                if reason is not None:
                    return ScanResult(position + p, count, last, reason)
                count += 1
                last = header
                p += header.size
            if p == 0 and want_bytes == SCAN_CHUNK_BYTES:
                break  # nothing parseable and nothing to wait for (cannot happen; guards a loop)
            position += p
        return ScanResult(position, count, last, None)

    def load_index(self) -> str | None:
        """Load the index files; None when loaded, else why they must be rebuilt."""
        found = SegmentIndex.load_checked(
            self.index_path,
            self.time_index_path,
            self.tag_index_path,
            self.base_offset,
            self.first_index,
            self.size,
        )
        if isinstance(found, str):
            return found
        self.index = found
        return None

    def tag_bloom_at(self, position: int, size: int) -> int:
        """The bloom of the tag block of the tagged entry of ``size`` bytes at ``position``
        (for indexing an entry found by a scan): reads its header and block only."""
        want = min(size, HEADER_SIZE + 256)
        head = self.pread(want, position)
        bloom = tag_filter.bloom_of_block(head, HEADER_SIZE, want)
        if bloom is None:  # a long block: read all of it
            end = min(size, HEADER_SIZE + tags.MAX_BLOCK_BYTES)
            bloom = tag_filter.bloom_of_block(self.pread(end, position), HEADER_SIZE, end)
        return tag_filter.ALL_BITS if bloom is None else bloom

    def release(self) -> None:
        """Drop what a closed segment holds in memory; it reloads lazily."""
        self.close_fd()
        self.index = None
