"""The log's two checkpoint files beside its segments: where the log starts, and where each
term begins. Their names and layouts live here only, so the log, ``raftmq log inspect`` and
docs/format.md cannot drift apart; the framing (CRC, atomic replace) is atomic_file.py's.

Why checkpoints at all: the log start moves without rewriting a segment (retention,
snapshots), and the terms of closed segments would otherwise be rescanned on every open.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic

# What opening a log does when one of them is unusable (recovery.py): the log start is
# rebuilt from the first segment on disk (``recovery._rebuild_start`` says why that is the
# safe side) and the terms from the closed segments' headers; each says so in one WARNING
# (the sentences below name the file and what is wrong) and the file is written again.

START_CHECKPOINT = "log-start.checkpoint"
TERMS_CHECKPOINT = "terms.checkpoint"
_START = struct.Struct(">qqq")  # start index, start offset, term of the entry before start
_TERM = struct.Struct(">qq")  # first index of a term, term


def read_start(directory: Path) -> tuple[int, int, int] | None:
    """(start index, start offset, term before the start), or None when the file is missing
    or damaged."""
    raw = _read(directory / START_CHECKPOINT)
    if raw is None or len(raw) != _START.size:
        return None
    start_index, start_offset, prev_term = _START.unpack(raw)
    return start_index, start_offset, prev_term


def write_start(directory: Path, start_index: int, start_offset: int, prev_term: int) -> None:
    write_atomic(directory / START_CHECKPOINT, _START.pack(start_index, start_offset, prev_term))


def read_terms(directory: Path) -> list[tuple[int, int]] | None:
    """(first index of a term, term) pairs, ascending, or None when missing or damaged."""
    raw = _read(directory / TERMS_CHECKPOINT)
    if raw is None or len(raw) % _TERM.size != 0:
        return None
    return [(i, t) for i, t in _TERM.iter_unpack(raw)]


def boundary_at(terms: list[tuple[int, int]], index: int) -> int:
    """Position in ``terms`` of the boundary in force at ``index``: the last one at or
    below it, -1 when there is none."""
    return bisect_right(terms, (index, _NO_TERM_BOUND)) - 1


_NO_TERM_BOUND = 1 << 62  # sorts after every term in a (first index, term) bisect key


def write_terms(directory: Path, terms: list[tuple[int, int]]) -> None:
    write_atomic(directory / TERMS_CHECKPOINT, b"".join(_TERM.pack(i, t) for i, t in terms))


def _read(path: Path) -> bytes | None:
    """The payload, or None when it cannot be had: an unreadable file (EIO, a directory in
    its place) is as unusable as a damaged one, and both are rebuilt, not a reason to fail
    opening the log again and again."""
    try:
        return read_atomic(path)
    except OSError:
        return None


def start_problem(directory: Path) -> str:
    """Why :func:`read_start` found no start, as a sentence for the WARNING."""
    return _problem(directory / START_CHECKPOINT)


def terms_problem(directory: Path) -> str:
    """Why :func:`read_terms` found no terms, as a sentence for the WARNING."""
    return _problem(directory / TERMS_CHECKPOINT)


def _problem(path: Path) -> str:
    try:
        raw = read_atomic(path)
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror})"
    if not path.exists():
        return f"{path.name} is missing"
    if raw is None:
        return f"{path.name} is damaged (it fails its CRC)"
    return f"{path.name} has a payload of {len(raw)} bytes, not a whole record (damaged)"
