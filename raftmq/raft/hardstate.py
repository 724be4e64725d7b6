"""The durable triple (term, vote, commit) and a crash-safe file for it.

Raft's safety rests on term and vote surviving crashes: a node that forgets its vote can
vote twice in one term and elect two leaders. The file is replaced atomically (write a
temporary file, fsync it, rename over the old one, fsync the directory) so a crash leaves
either the old or the new state, never a torn mix; a CRC catches a torn or rotted file.
Both are :mod:`raftmq.log.atomic_file`'s ``write_atomic`` framing (``body | u32 CRC32C``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic

_MAGIC_V1 = b"RHS1"  # term, vote, commit (read only: files written before rejoining existed)
_MAGIC = b"RHS2"  # term, vote, commit, flags
_BODY_V1 = struct.Struct(">4sqqq")
_BODY = struct.Struct(">4sqqqB")
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
    """The body: the file holds it framed by ``write_atomic`` (CRC after it)."""
    flags = _FLAG_REJOINING if hs.rejoining else 0
    return _BODY.pack(_MAGIC, hs.term, hs.vote, hs.commit, flags)


def decode(body: bytes) -> HardState:
    """A body whose CRC already checked out (``read_atomic``): RHS2, or RHS1 from before the
    rejoining flag existed."""
    layout = _BODY if len(body) == _BODY.size else _BODY_V1
    if len(body) != layout.size:
        raise HardStateCorruptError(f"hard state body has {len(body)} bytes, expected {_BODY.size}")
    magic, term, vote, commit, *flags = layout.unpack(body)
    if magic != (_MAGIC if layout is _BODY else _MAGIC_V1):
        raise HardStateCorruptError(f"hard state magic {magic!r} unknown")
    rejoining = bool(flags and flags[0] & _FLAG_REJOINING)
    return HardState(term, vote, commit, rejoining)


def save(path: str | os.PathLike[str], hs: HardState) -> None:
    """Durably replace the hard state; on return it survives power loss."""
    write_atomic(Path(path), encode(hs))


def load(path: str | os.PathLike[str]) -> HardState:
    """The saved state, or the zero state for a node that never saved one."""
    path = Path(path)
    body = read_atomic(path)
    if body is None:
        if not path.exists():
            return HardState()
        raise HardStateCorruptError(f"hard state file {path} is torn or corrupt (CRC mismatch)")
    return decode(body)
