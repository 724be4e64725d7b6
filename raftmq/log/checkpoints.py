"""The log's two checkpoint files beside its segments: where the log starts, and where each
term begins. Their names and layouts live here only, so the log, ``raftmq log inspect`` and
docs/format.md cannot drift apart; the framing (CRC, atomic replace) is atomic_file.py's.

Why checkpoints at all: the log start moves without rewriting a segment (retention,
snapshots), and the terms of closed segments would otherwise be rescanned on every open.
"""

from __future__ import annotations

import struct
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic

START_CHECKPOINT = "log-start.checkpoint"
TERMS_CHECKPOINT = "terms.checkpoint"
_START = struct.Struct(">qqq")  # start index, start offset, term of the entry before start
_TERM = struct.Struct(">qq")  # first index of a term, term


def read_start(directory: Path) -> tuple[int, int, int] | None:
    """(start index, start offset, term before the start), or None when the file is missing
    or damaged."""
    raw = read_atomic(directory / START_CHECKPOINT)
    if raw is None or len(raw) != _START.size:
        return None
    start_index, start_offset, prev_term = _START.unpack(raw)
    return start_index, start_offset, prev_term


def write_start(directory: Path, start_index: int, start_offset: int, prev_term: int) -> None:
    write_atomic(directory / START_CHECKPOINT, _START.pack(start_index, start_offset, prev_term))


def read_terms(directory: Path) -> list[tuple[int, int]] | None:
    """(first index of a term, term) pairs, ascending, or None when missing or damaged."""
    raw = read_atomic(directory / TERMS_CHECKPOINT)
    if raw is None or len(raw) % _TERM.size != 0:
        return None
    return [(i, t) for i, t in _TERM.iter_unpack(raw)]


def write_terms(directory: Path, terms: list[tuple[int, int]]) -> None:
    write_atomic(directory / TERMS_CHECKPOINT, b"".join(_TERM.pack(i, t) for i, t in terms))
