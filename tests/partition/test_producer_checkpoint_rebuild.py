"""Issue 20, the producer-state checkpoint: a flipped bit anywhere in it (header, body,
CRC trailer) never stops a replica from opening; the checkpoint is set aside with one
WARNING naming it, the state is rebuilt by replaying the log's batch headers, and it is
the same state the untouched checkpoint plus replay gives. Real files throughout: the
checkpoint written by ProducerTracking, the entries by a real Log."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.log.atomic_file import read_atomic
from raftmq.log.log import Log
from raftmq.partition.producer_tracking import CHECKPOINT_FILE, ProducerTracking

ENTRIES = 60
CHECKPOINTED = 40  # the checkpoint covers entries up to here; the rest is replayed


def _write_log(directory: Path) -> None:
    """Batches of three idempotent producers (one bumps its epoch) and plain entries."""
    sequences: dict[int, int] = {}
    with Log.open(directory) as log:
        for index in range(1, ENTRIES + 1):
            pid = index % 4 - 1  # -1: an entry of no producer
            epoch = 1 if pid == 2 and index > 30 else 0
            if pid == 2 and index in (31, 32, 33, 34):
                sequences[pid] = 0  # its first batch of the new epoch starts at 0
            seq = sequences.get(pid, 0)
            count = 1 + index % 3
            log.append(
                entry.encode(
                    bytes(40),
                    index=index,
                    term=1,
                    base_offset=log.next_offset,
                    record_count=count,
                    first_timestamp=1_000 + index,
                    max_timestamp=1_000 + index,
                    producer_id=pid if pid >= 0 else entry.NO_PRODUCER_ID,
                    producer_epoch=epoch if pid >= 0 else -1,
                    base_sequence=seq if pid >= 0 else entry.NO_SEQUENCE,
                )
            )
            if pid >= 0:
                sequences[pid] = seq + count


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs folder when there is one: many opens, each with fsyncs."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="raftmq-producers-", dir="/dev/shm") as d:
        yield Path(d)


@pytest.fixture
def written(scratch: Path) -> tuple[Path, list[list[int]]]:
    """A replica folder: the log, and a checkpoint written at CHECKPOINTED by the real
    writer; and the state a clean open reaches (checkpoint plus replay to the end)."""
    folder = scratch / "original"
    _write_log(folder)
    with Log.open(folder) as log:
        tracking = ProducerTracking(folder, "t/0")
        tracking.catch_up(log, CHECKPOINTED)
        tracking.checkpoint()  # no event loop here: written before it returns
        assert read_atomic(folder / CHECKPOINT_FILE) is not None
        clean = ProducerTracking(folder, "t/0")
        assert clean.applied_index == CHECKPOINTED
        clean.open_at(log, ENTRIES)
    return folder, clean.states.to_json()


def _replayed(folder: Path, tmp_path: Path) -> list[list[int]]:
    """The state replaying the whole log gives, with no checkpoint at all."""
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / CHECKPOINT_FILE).unlink()
    with Log.open(bare) as log:
        tracking = ProducerTracking(bare, "t/0")
        tracking.open_at(log, ENTRIES)
    return tracking.states.to_json()


def test_a_flipped_bit_in_the_checkpoint_rebuilds_the_same_state_with_a_warning(
    written: tuple[Path, list[list[int]]], scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, expected = written
    assert len(expected) == 3
    assert _replayed(folder, scratch) == expected
    size = (folder / CHECKPOINT_FILE).stat().st_size
    positions = sorted({0, 1, 7, 20, size // 3, size // 2, size - 6, size - 4, size - 1})
    for position in positions:
        case = scratch / f"case-{position}"
        shutil.copytree(folder, case)
        path = case / CHECKPOINT_FILE
        raw = bytearray(path.read_bytes())
        raw[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(raw))
        caplog.clear()
        with caplog.at_level(logging.WARNING), Log.open(case) as log:
            tracking = ProducerTracking(case, "t/0")  # never raises
            tracking.open_at(log, ENTRIES)
        assert tracking.states.to_json() == expected, position
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(said) == 1, said
        assert str(path) in said[0] and "rebuilt" in said[0]
        # A fresh checkpoint replaced it: the next open loads it, silently, same state.
        assert read_atomic(path) is not None
        caplog.clear()
        with caplog.at_level(logging.WARNING), Log.open(case) as log:
            again = ProducerTracking(case, "t/0")
            assert again.applied_index == ENTRIES
            again.open_at(log, ENTRIES)
        assert again.states.to_json() == expected
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
        shutil.rmtree(case)


def test_a_checkpoint_that_passes_its_crc_but_does_not_decode_is_rebuilt_too(
    written: tuple[Path, list[list[int]]], scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from raftmq.log.atomic_file import write_atomic

    folder, expected = written
    for what, payload in {
        "not json": b"\xff{",
        "not an object": b"[1, 2]",
        "a malformed row": b'{"index": 40, "term": 1, "producers": [[1, 0]]}',
        "deeply nested": b"[" * 100_000,
    }.items():
        case = scratch / f"bad-{len(payload)}-{what.replace(' ', '-')}"
        shutil.copytree(folder, case)
        write_atomic(case / CHECKPOINT_FILE, payload)
        caplog.clear()
        with caplog.at_level(logging.WARNING), Log.open(case) as log:
            tracking = ProducerTracking(case, "t/0")
            tracking.open_at(log, ENTRIES)
        assert tracking.states.to_json() == expected, what
        assert any("does not decode" in r.getMessage() for r in caplog.records), what
