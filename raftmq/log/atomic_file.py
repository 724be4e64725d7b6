"""Small files that must never be seen half-written: write a temporary, fsync, rename, fsync
the directory. Each carries a CRC so a reader can tell a valid file from garbage."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from crc32c import crc32c

_TRAILER = struct.Struct(">I")


def write_atomic(path: Path, payload: bytes) -> None:
    """Durably replace ``path`` with ``payload`` and its CRC trailer."""
    replace_file(path, payload + _TRAILER.pack(crc32c(payload)))


def replace_file(path: Path, data: bytes) -> None:
    """Durably replace ``path`` with ``data`` as it stands (for files that carry their own
    CRC, like the Raft hard state): on return it survives power loss, and a crash at any
    point leaves either the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _TRAILER.size:
        return None
    payload, (crc,) = data[: -_TRAILER.size], _TRAILER.unpack(data[-_TRAILER.size :])
    return payload if crc32c(payload) == crc else None


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
