"""The durable triple (term, vote, commit) and a crash-safe file for it.

Raft's safety rests on term and vote surviving crashes: a node that forgets its vote can
vote twice in one term and elect two leaders. The file is replaced atomically (write a
temporary file, fsync it, rename over the old one, fsync the directory) so a crash leaves
either the old or the new state, never a torn mix; a CRC catches a torn or rotted file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from crc32c import crc32c

_MAGIC_V1 = b"RHS1"  # term, vote, commit (read only: files written before rejoining existed)
_MAGIC = b"RHS2"  # term, vote, commit, flags
_BODY_V1 = struct.Struct(">4sqqq")
_BODY = struct.Struct(">4sqqqB")
_CRC = struct.Struct(">I")
_FLAG_REJOINING = 0x01


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0
    vote: int = 0
    commit: int = 0
    rejoining: bool = False
    """This replica may have lost entries or votes it once acknowledged (its disk was
    wiped or truncated) and has not caught up yet: it must not vote (docs/raft.md,
    "Rejoining after disk loss"). Durable so that a crash mid-rejoin cannot forget it."""


class HardStateCorruptError(Exception):
    """The hard-state file exists but is not a complete record: refuse to guess a vote."""


def encode(hs: HardState) -> bytes:
    flags = _FLAG_REJOINING if hs.rejoining else 0
    body = _BODY.pack(_MAGIC, hs.term, hs.vote, hs.commit, flags)
    return body + _CRC.pack(crc32c(body))


def decode(buf: bytes) -> HardState:
    layout = _BODY if len(buf) == _BODY.size + _CRC.size else _BODY_V1
    if len(buf) != layout.size + _CRC.size:
        raise HardStateCorruptError(
            f"hard state file has {len(buf)} bytes, expected {_BODY.size + _CRC.size}"
        )
    body = buf[: layout.size]
    (crc,) = _CRC.unpack_from(buf, layout.size)
    if crc32c(body) != crc:
        raise HardStateCorruptError("hard state CRC mismatch")
    magic, term, vote, commit, *flags = layout.unpack(body)
    if magic != (_MAGIC if layout is _BODY else _MAGIC_V1):
        raise HardStateCorruptError(f"hard state magic {magic!r} unknown")
    rejoining = bool(flags and flags[0] & _FLAG_REJOINING)
    return HardState(term, vote, commit, rejoining)


def save(path: str | os.PathLike[str], hs: HardState) -> None:
    """Durably replace the hard state; on return it survives power loss."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = encode(hs)
        written = os.write(fd, data)
        assert written == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load(path: str | os.PathLike[str]) -> HardState:
    """The saved state, or the zero state for a node that never saved one."""
    try:
        with open(path, "rb") as f:
            return decode(f.read())
    except FileNotFoundError:
        return HardState()
