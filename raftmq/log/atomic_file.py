"""Small CRC-protected files (hard state, log-start and terms checkpoints, index files,
snapshot meta, the commit hint, the promised record): the one place that frames them, so
that every such file is torn-proof the same way and a reader gets the payload or ``None``.

Two ways to write, each with its framing (both on disk since the first release; docs/format.md
and docs/driver.md describe them):

- ``write_atomic``: ``payload | u32 CRC32C(payload)``, written to a temporary file, fsynced,
  renamed over the old one, directory fsynced. A reader sees the old file or the new one,
  never a mix, and the file's size is the frame's size, so no length is needed.
- ``overwrite_in_place``: ``u32 length | u32 CRC32C(payload) | payload``, written over the
  start of the file without truncating or fsyncing it (for a file rewritten often whose loss
  only costs time: truncate + fsync stalled the event loop). A shorter payload leaves the
  old tail behind, hence the length; a torn write fails the CRC.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from crc32c import crc32c

from raftmq.log.handles import open_fd

_TRAILER = struct.Struct(">I")  # CRC32C of the payload, after it
_HEAD = struct.Struct(">II")  # payload length, CRC32C of the payload, before it


def write_atomic(path: Path, payload: bytes) -> None:
    """Durably replace ``path``: on return the new payload survives power loss."""
    replace_durably(path, payload + _TRAILER.pack(crc32c(payload)))


def replace_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` as given (a temporary file, fsynced, renamed over it,
    then the directory fsynced): a crash leaves the old file or the new one, and on return
    the new one survives power loss. For files that frame their own checks; others use
    :func:`write_atomic`, which adds a CRC."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_atomic(path: Path) -> bytes | None:
    """The payload, or None when the file is missing or fails its CRC."""
    try:
        data = read_whole(path)
    except FileNotFoundError:
        return None
    if len(data) < _TRAILER.size:
        return None
    payload, (crc,) = data[: -_TRAILER.size], _TRAILER.unpack(data[-_TRAILER.size :])
    return payload if crc32c(payload) == crc else None


def overwrite_in_place(path: Path, payload: bytes) -> None:
    """Write ``payload`` over the start of ``path`` (created if missing), without fsync: after
    a crash the file may hold the old payload, the new one, or a torn mix that reads as None.
    Opened and closed each time, so a caller with many such files holds no descriptors."""
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = _HEAD.pack(len(payload), crc32c(payload)) + payload
        written = os.pwrite(fd, data, 0)
        assert written == len(data), "short pwrite of a small file"  # a regular file: all or error
    finally:
        os.close(fd)


def read_in_place(path: Path) -> bytes | None:
    """The payload ``overwrite_in_place`` last wrote, or None when the file is missing,
    unreadable, torn or corrupt (callers treat all of these as: no saved value)."""
    try:
        raw = read_whole(path)
    except OSError:
        return None
    if len(raw) < _HEAD.size:
        return None
    size, crc = _HEAD.unpack_from(raw)
    payload = raw[_HEAD.size : _HEAD.size + size]
    if len(payload) != size or crc32c(payload) != crc:
        return None
    return payload


def read_whole(path: Path) -> bytes:
    """The file's bytes, opened through :func:`~raftmq.log.handles.open_fd` (which makes room
    when the process is out of descriptors)."""
    fd = open_fd(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = open_fd(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
