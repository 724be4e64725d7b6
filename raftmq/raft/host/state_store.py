"""The durable state of every Raft group whose directory sits in one folder, in one file:
``<folder>/raft-state.wal``, an append-only log of CRC-framed records (group, kind, body),
made durable with one fsync per ready-loop round for all groups that changed in it.

Why one file: with a set of small files per group (hard state, promise record, snapshot
meta, commit hint), each written with temp file + fsync + rename + directory fsync, a new
replica cost about 14 fsyncs and 10,000 of them took minutes. Here a group's state is a
few records in a file every group of the folder shares (one write-ahead log per store, as
multi-Raft stores do), and a round's term and vote changes share one fsync.

What it holds per group (keyed by the name of the group's directory): the hard state
(``HARD``), the snapshot meta (``META``), the commit hint (``HINT``, never fsynced on its
own), the promise record (``PROMISED``: the replica once voted or acknowledged; a hard state
with a term implies it) and, when a replica is deleted, a ``TOMBSTONE`` that drops all of
them, so a later replica of the same name starts new. The store lives *beside* the group
directories, not in them, so a group directory lost with the store intact still knows what
it promised (docs/raft.md, "Rejoining after disk loss").

The file is rewritten (a snapshot of the live records, temp file + fsync + rename +
directory fsync) when it grows past ``COMPACT_FACTOR`` times what the last rewrite wrote.

Reading it back (docs/driver.md, "What happens to each file when a group opens"):

- a torn tail (a record cut short by a crash: fewer bytes than its head, a head whose frame
  runs past the end, or a head cut short and followed only by zeros) is what an unsynced
  append leaves; nothing was promised on it, and it is cut off;
- any other record that fails its CRC is *damage* (bit rot), and the store does not guess
  whose it was: it skips to the next whole record and marks itself damaged from there. Every
  group that has no hard state written after the damage is then *suspect*, and opens as
  one whose hard state cannot be read (it rejoins: ``group_storage._hard_state_or_rejoin``).
  A ``DAMAGED`` record keeps that across rewrites until each such group wrote a hard state
  again. A single bit flip can neither make a whole record look torn (the length is in the
  CRC-checked head) nor a torn one look whole.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import struct
import threading
from collections.abc import Iterable
from pathlib import Path

from crc32c import crc32c

from raftmq.log.atomic_file import fsync_dir, replace_durably
from raftmq.log.handles import open_fd

log = logging.getLogger(__name__)

STORE_FILE = "raft-state.wal"
COMPACT_MIN_BYTES = 1 << 20
"""The file is never rewritten below this size."""
COMPACT_FACTOR = 4
"""...and otherwise once it holds this many times what the last rewrite wrote."""
_MAGIC = b"RS"
_HEAD = struct.Struct(">2sIII")  # magic, body length, CRC32C of the body, CRC32C of the rest
_BODY = struct.Struct(">BH")  # kind, length of the group's name (then the name, the payload)
MAX_BODY_BYTES = 1 << 24


class Kind(enum.IntEnum):
    HARD = 1
    META = 2
    HINT = 3
    PROMISED = 4
    TOMBSTONE = 5
    DAMAGED = 6  # not of a group: the name is empty


class StateStoreError(Exception):
    """The store could not be written or made durable. Its state on disk is then unknown,
    so the host stops (crash-only) rather than let any group acknowledge on it."""


@dataclasses.dataclass(frozen=True, slots=True)
class GroupState:
    """What the store holds for one group (encoded bodies; group_storage decodes them)."""

    hard: bytes | None = None
    meta: bytes | None = None
    hint: bytes | None = None
    promised: bool = False
    """A PROMISED record, or a hard state with a term (the caller decodes that)."""
    suspect: bool = False
    """The store found damage, and this group wrote no hard state since: whatever it holds
    for the group may be older than what the group promised."""

    @property
    def empty(self) -> bool:
        return self.hard is None and self.meta is None and self.hint is None and not self.promised


def _frame(kind: Kind, name: str, payload: bytes) -> bytes:
    raw_name = name.encode()
    body = _BODY.pack(kind, len(raw_name)) + raw_name + payload
    head = _MAGIC + struct.pack(">II", len(body), crc32c(body))
    return head + struct.pack(">I", crc32c(head)) + body


def _parse(data: bytes, pos: int) -> tuple[Kind, str, bytes, int] | None:
    """The record at ``pos`` (kind, name, payload, end), or None when it is not whole."""
    if len(data) - pos < _HEAD.size:
        return None
    magic, length, body_crc, head_crc = _HEAD.unpack_from(data, pos)
    if magic != _MAGIC or crc32c(data[pos : pos + _HEAD.size - 4]) != head_crc:
        return None
    start, end = pos + _HEAD.size, pos + _HEAD.size + length
    if end > len(data) or length < _BODY.size or crc32c(data[start:end]) != body_crc:
        return None
    kind, name_len = _BODY.unpack_from(data, start)
    name_end = start + _BODY.size + name_len
    if name_end > end or kind not in Kind._value2member_map_:
        return None
    return Kind(kind), data[start + _BODY.size : name_end].decode(), data[name_end:end], end


def _torn_at(data: bytes, pos: int) -> bool:
    """Whether what starts at ``pos`` (not a whole record) is a torn tail rather than damage."""
    rest = len(data) - pos
    if rest < _HEAD.size:
        return True
    magic, length, _, head_crc = _HEAD.unpack_from(data, pos)
    if magic == _MAGIC and crc32c(data[pos : pos + _HEAD.size - 4]) == head_crc:
        return pos + _HEAD.size + length > len(data)  # a whole head, its body cut short
    return len(data[pos:].rstrip(b"\0")) < _HEAD.size  # a head cut short, zeros after it


class StateStore:
    """One folder's ``raft-state.wal``: thread-safe. Writers call :meth:`put` (memory
    only) and then :meth:`sync` (group commit: one fsync covers every record put before it,
    whichever thread put it). Open it with :func:`acquire`, so that every user in the
    process shares one instance."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / STORE_FILE
        self._lock = threading.Lock()  # the records in memory, the pending list
        self._io = threading.Lock()  # the file: one writer at a time
        self._groups: dict[str, dict[Kind, bytes]] = {}
        self._promised: set[str] = set()
        self.damaged: str | None = None
        """Why the store was found damaged (None if it never was)."""
        self._cleared: set[str] = set()  # groups with a hard state written after the damage
        self._pending: list[bytes] = []
        self._pending_dirs: set[Path] = set()
        self._seq = 0  # records put so far
        self._synced_seq = 0
        self._size_bytes = 0
        self._compacted_bytes = 0
        self.fsyncs = 0
        self.dir_fsyncs = 0
        """New group directories made durable (one each, before its first promise)."""
        self.users = 0  # see acquire/release
        self._fd: int | None = None
        """Kept open while the store is: a sync must not need a descriptor (a process at
        its open-file limit would otherwise fail every group at once)."""
        folder.mkdir(parents=True, exist_ok=True)
        self._load()

    # --- reading --------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        pos, rewrite = 0, False
        while pos < len(data):
            record = _parse(data, pos)
            if record is not None:
                kind, name, payload, pos = record
                self._apply(kind, name, payload)
                continue
            rewrite = True
            if _torn_at(data, pos):
                log.warning(
                    "%s: a torn record at byte %d (an unsynced append cut by a crash) is cut off",
                    self.path,
                    pos,
                )
                break
            nxt = self._next_whole(data, pos + 1)
            self._damage(f"a damaged record at byte {pos} of {self.path} (bytes {pos}..{nxt})")
            pos = nxt
        self._size_bytes = len(data)
        self._exists = self.path.exists()
        if rewrite:
            self._rewrite()
        self._compacted_bytes = self._size_bytes

    @staticmethod
    def _next_whole(data: bytes, pos: int) -> int:
        while (pos := data.find(_MAGIC, pos)) >= 0:
            if _parse(data, pos) is not None:
                return pos
            pos += 1
        return len(data)

    def _damage(self, why: str) -> None:
        log.error(
            "%s; every group with no hard state written after it opens as one whose hard "
            "state cannot be read (it rejoins)",
            why,
        )
        self.damaged = why
        self._cleared = set()

    def _apply(self, kind: Kind, name: str, payload: bytes) -> None:
        """One record, in memory (caller holds the lock, or is loading)."""
        if kind is Kind.DAMAGED:
            self.damaged = self.damaged or payload.decode(errors="replace")
            self._cleared = set()
        elif kind is Kind.TOMBSTONE:
            self._groups.pop(name, None)
            self._promised.discard(name)
            self._cleared.discard(name)
        elif kind is Kind.PROMISED:
            self._promised.add(name)
        else:
            self._groups.setdefault(name, {})[kind] = payload
            if kind is Kind.HARD and self.damaged is not None:
                self._cleared.add(name)

    def group(self, name: str) -> GroupState:
        with self._lock:
            records = self._groups.get(name, {})
            return GroupState(
                hard=records.get(Kind.HARD),
                meta=records.get(Kind.META),
                hint=records.get(Kind.HINT),
                promised=name in self._promised,
                suspect=self.damaged is not None and name not in self._cleared,
            )

    # --- writing --------------------------------------------------------------------------

    def put(self, name: str, kind: Kind, payload: bytes = b"") -> None:
        """Record ``payload`` as ``name``'s latest of ``kind`` (in memory until written)."""
        assert kind is not Kind.DAMAGED
        with self._lock:
            self._apply(kind, name, payload)
            self._pending.append(_frame(kind, name, payload))
            self._seq += 1

    def forget(self, name: str) -> None:
        """Drop every record of ``name`` (its replica is deleted)."""
        self.put(name, Kind.TOMBSTONE)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def sync(self, new_dirs: Iterable[Path] = ()) -> None:
        """Make every record put so far durable (one fsync shared by all callers whose
        records it covers). ``new_dirs`` are group directories created in this folder whose
        entries must be durable first: a record promising for a group must never outlive
        its directory's existence after a power loss (docs/raft.md)."""
        with self._lock:
            target = self._seq
            self._pending_dirs.update(new_dirs)
        with self._io:
            if self._synced_seq >= target and not self._pending_dirs:
                return
            try:
                self._write_pending()
            except OSError as exc:
                raise StateStoreError(f"{self.path}: {exc}") from exc

    def _write_pending(self) -> None:
        with self._lock:
            frames, self._pending = self._pending, []
            dirs, self._pending_dirs = self._pending_dirs, set()
            seq = self._seq
            grow = sum(map(len, frames))
            snapshot = (
                self._snapshot()
                if self._size_bytes + grow
                > max(COMPACT_MIN_BYTES, COMPACT_FACTOR * self._compacted_bytes)
                else None
            )
        for directory in sorted(dirs):
            fsync_dir(directory)
            self.dir_fsyncs += 1
        if dirs:
            fsync_dir(self.folder)
            self.fsyncs += 1
        if snapshot is not None:
            try:
                self._replace(snapshot)
                self._synced_seq = seq
                return
            except OSError as exc:  # the old file is whole: append instead, rewrite later
                log.warning("%s: rewriting it failed (%s); appending to it", self.path, exc)
        if self._fd is None:
            self._fd = open_fd(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(b"".join(frames))
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)
        self.fsyncs += 1
        self._size_bytes += grow
        if not self._exists:  # the file's own name must be durable too, once
            fsync_dir(self.folder)
            self.fsyncs += 1
            self._exists = True
        self._synced_seq = seq

    def _snapshot(self) -> bytes:
        """The live records, as a fresh file holds them (caller holds the lock): those of
        suspect groups before the DAMAGED record, the others after it."""
        before: list[bytes] = []
        after: list[bytes] = []
        for name in sorted(self._groups.keys() | self._promised):
            out = after if self.damaged is None or name in self._cleared else before
            if name in self._promised:
                out.append(_frame(Kind.PROMISED, name, b""))
            for kind, payload in sorted(self._groups.get(name, {}).items()):
                out.append(_frame(kind, name, payload))
        marker = [] if self.damaged is None else [_frame(Kind.DAMAGED, "", self.damaged.encode())]
        return b"".join(before + marker + after)

    def _rewrite(self) -> None:
        with self._lock:
            snapshot = self._snapshot()
        self._replace(snapshot)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Make what it holds durable and give its descriptor back."""
        try:
            self.sync()
        finally:
            with self._io:
                self._close_fd()

    def _replace(self, data: bytes) -> None:
        replace_durably(self.path, data)
        self.fsyncs += 2
        self._exists = True
        self._close_fd()
        self._size_bytes = self._compacted_bytes = len(data)


_registry: dict[Path, StateStore] = {}
_registry_lock = threading.Lock()


def acquire(folder: Path) -> StateStore:
    """The store of ``folder``, opened (and read) by its first user in this process and
    shared by the others; give it back with :func:`release`."""
    key = Path(os.path.abspath(folder))
    with _registry_lock:
        store = _registry.get(key)
        if store is None:
            store = _registry[key] = StateStore(key)
        store.users += 1
        return store


def release(store: StateStore) -> None:
    """One user is done: the last one makes what it holds durable and closes it."""
    with _registry_lock:
        store.users -= 1
        if store.users > 0:
            return
        _registry.pop(store.folder, None)
    store.close()
