"""The terms checkpoint after crashes: whatever instant a process dies at, the reopened log
knows the term of every entry it holds.

Found by a chaos run (seed 7101): a follower installed a snapshot (the log restarted empty
and wrote an empty terms checkpoint), appended past a roll, and was killed while the
flush that sealed the old segment was rewriting the checkpoint (``terms.checkpoint.tmp``
left behind). The sealed segment's index files said "no rescan needed", the checkpoint on
disk still said "no terms", so the reopened log had no term boundary below the new
segment and ``term_at`` failed its assertion on every reopen.

Crash images are taken with the log's ``on_durable`` observer: it runs in the flush right
after the fsyncs and before the flush's bookkeeping, which is exactly where a SIGKILL
leaves a sealed segment beside whatever checkpoint was durable then."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.log import checkpoints
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.log import Log
from raftmq.log.segment import INDEX_SUFFIX

CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=300, flush_policy=FlushPolicy.INTERVAL)
SNAPSHOT_INDEX = 1079  # the snapshot covers 1..1079; the log restarts at 1080


def _entry(index: int, offset: int, term: int) -> bytes:
    return entry.encode(
        bytes([index % 251]) * 180,
        index=index,
        term=term,
        base_offset=offset,
        record_count=1,
        first_timestamp=1_000 + index,
        max_timestamp=1_000 + index,
    )


def _append(log: Log, count: int, term: int) -> None:
    for _ in range(count):
        log.append(_entry(log.next_index, log.next_offset, term))


def _terms_of(directory: Path) -> list[int]:
    """The term of every entry of the log in ``directory``, opened afresh."""
    with Log.open(directory, CONFIG) as log:
        return [log.term_at(i) for i in range(log.start_index - 1, log.next_index)]


def _crash_image_at_next_flush(log: Log, image: Path) -> None:
    """Flush ``log`` and copy its directory at the instant the flush's fsyncs are done,
    before anything else the flush does: what a SIGKILL at that instant leaves."""
    active = str(log._segments[-1].path)
    taken: list[bool] = []

    def copy(path: str, size: int) -> None:
        # The active segment's fdatasync is reported last, after every seal.
        if path == active and not taken:
            shutil.copytree(log.directory, image)
            taken.append(True)

    log.on_durable = copy
    log.flush()
    log.on_durable = None
    assert taken, "the flush never reported its active segment durable"


def _past_an_installed_snapshot(log: Log) -> None:
    _append(log, 5, term=1)
    log.flush()
    log.truncate_prefix(SNAPSHOT_INDEX + 1, offset=1078, prev_term=3)  # checkpoint: none
    _append(log, 14, term=4)  # more than a segment: the first one is rolled closed


def _where_terms_began(log: Log) -> None:
    _append(log, 3, term=1)
    log.flush()  # the checkpoint now says: term 1 from index 1
    _append(log, 4, term=2)
    _append(log, 8, term=3)  # a roll: terms 2 and 3 begin in the closed segment


@pytest.mark.parametrize("write", [_past_an_installed_snapshot, _where_terms_began])
def test_a_crash_after_sealing_a_segment_keeps_its_terms(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, write: Callable[[Log], None]
) -> None:
    """The crash image reopens with every term, and the checkpoint was already right: the
    write order, not the open-time check, kept the terms."""
    with Log.open(tmp_path / "live", CONFIG) as log:
        write(log)
        assert len(log.segments()) == 2
        _crash_image_at_next_flush(log, tmp_path / "crashed")
        expected = [log.term_at(i) for i in range(log.start_index - 1, log.next_index)]
    assert any((tmp_path / "crashed").glob("*" + INDEX_SUFFIX)), "no segment was sealed"
    with caplog.at_level(logging.WARNING, logger="raftmq.log"):
        assert _terms_of(tmp_path / "crashed") == expected
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _stale_copy(tmp_path: Path, stale_terms: bytes) -> Path:
    """A cleanly closed log of two sealed segments and an active one, whose terms
    checkpoint is then replaced by ``stale_terms`` with a torn rewrite left beside it:
    the state a crash left before this was fixed."""
    directory = tmp_path / "stale"
    with Log.open(directory, CONFIG) as log:
        log.truncate_prefix(SNAPSHOT_INDEX + 1, offset=1078, prev_term=3)
        _append(log, 10, term=4)
        _append(log, 10, term=5)
        log.flush()
        assert len(log.segments()) == 3
    (directory / checkpoints.TERMS_CHECKPOINT).write_bytes(stale_terms)
    (directory / (checkpoints.TERMS_CHECKPOINT + ".tmp")).write_bytes(b"torn")
    return directory


def _checkpoint_bytes(terms: list[tuple[int, int]], scratch: Path) -> bytes:
    scratch.mkdir()
    checkpoints.write_terms(scratch, terms)
    return (scratch / checkpoints.TERMS_CHECKPOINT).read_bytes()


@pytest.mark.parametrize(
    "stale",
    [
        [],  # written when the snapshot restarted the log empty
        [(SNAPSHOT_INDEX + 1, 4)],  # written before term 5 began in a now sealed segment
        [(7, 2)],  # the log before the snapshot: a boundary below the start, wrong term
    ],
)
def test_a_stale_terms_checkpoint_is_rebuilt_from_the_segments_on_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stale: list[tuple[int, int]]
) -> None:
    directory = _stale_copy(tmp_path, _checkpoint_bytes(stale, tmp_path / "scratch"))
    expected = [3] + [4] * 10 + [5] * 10  # the term before the start, then every entry
    with caplog.at_level(logging.WARNING, logger="raftmq.log"):
        assert _terms_of(directory) == expected
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and checkpoints.TERMS_CHECKPOINT in said[0], said
    assert "rebuilt" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="raftmq.log"):
        assert _terms_of(directory) == expected
    assert not [r for r in caplog.records if r.levelno == logging.WARNING], "not rewritten"
