"""Issue 20, the log's derived files: a flipped bit anywhere in a sealed segment's index
files, in the log-start checkpoint or in the terms checkpoint is found when the log opens
(or on the index's first use), the file is rebuilt from the segments with one WARNING
naming it, and the log answers exactly as it did before the flip.

Each case starts from a copy of one log written by the real writer, flips one bit (in
the header rows, the body, the last row and the CRC trailer), reopens and compares every
lookup with the answers of the untouched copy."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.log import checkpoints
from raftmq.log.config import LogConfig
from raftmq.log.log import Log
from raftmq.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX

BIG = 1 << 30
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=300)
ENTRIES = 40


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs folder when there is one: dozens of opens, each with fsyncs."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="raftmq-derived-", dir="/dev/shm") as d:
        yield Path(d)


def _entry(index: int, offset: int, *, control: bool = False) -> bytes:
    if control:
        return entry.encode(b"", type=EntryType.NOOP, index=index, term=2, base_offset=offset)
    ts = 1_000 + 10 * index
    return entry.encode(
        bytes([index % 251]) * 180,
        index=index,
        term=1 if index < 20 else 2,
        base_offset=offset,
        record_count=1,
        first_timestamp=ts,
        max_timestamp=ts,
    )


def _write_log(directory: Path) -> None:
    """A log of several sealed segments and an active one, with a term change and a
    control entry (two entries sharing a base offset), closed cleanly."""
    with Log.open(directory, CONFIG) as log:
        for index in range(1, ENTRIES + 1):
            log.append(_entry(index, log.next_offset, control=index == 20))


def _answers(directory: Path) -> dict[str, object]:
    """Every lookup the indexes serve, and the log's bounds."""
    with Log.open(directory, CONFIG) as log:
        return {
            "all": log.read_by_index(log.start_index, BIG).data,
            "by_index": [log.read_by_index(i, 1).data for i in range(log.start_index, ENTRIES)],
            "by_offset": [
                log.read(o, 1).data[: entry.HEADER_SIZE]
                for o in range(log.start_offset, log.next_offset)
            ],
            "by_time": [log.offset_for_timestamp(1_000 + 10 * i) for i in range(0, ENTRIES + 2)],
            "start": (log.start_index, log.start_offset, log.term_at(log.start_index - 1)),
            "terms": [log.term_at(i) for i in range(log.start_index, log.next_index)],
            "end": (log.next_index, log.next_offset),
        }


def _flip(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 1 << (position % 8)
    path.write_bytes(bytes(raw))


def _positions(size: int) -> list[int]:
    """Header, body, last row and the CRC trailer of a file of ``size`` bytes."""
    wanted = {0, 1, 5, 11, size // 2, size - 9, size - 5, size - 4, size - 1}
    return sorted(p for p in wanted if 0 <= p < size)


@pytest.fixture
def pristine(scratch: Path) -> tuple[Path, dict[str, object]]:
    original = scratch / "original"
    _write_log(original)
    shutil.copytree(original, scratch / "reference")
    return original, _answers(scratch / "reference")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("suffix", [INDEX_SUFFIX, TIME_INDEX_SUFFIX])
def test_a_flipped_bit_in_a_sealed_index_file_is_rebuilt_and_lookups_agree(
    pristine: tuple[Path, dict[str, object]],
    scratch: Path,
    caplog: pytest.LogCaptureFixture,
    suffix: str,
) -> None:
    original, answers = pristine
    segments = sorted(original.glob("*" + LOG_SUFFIX))
    assert len(segments) >= 4
    for victim in (segments[0], segments[len(segments) // 2]):
        target = victim.with_suffix(suffix)
        good = target.read_bytes()
        for position in _positions(len(good)):
            case = scratch / f"case-{victim.stem}-{suffix[1:]}-{position}"
            shutil.copytree(original, case)
            _flip(case / target.name, position)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="raftmq.log"):
                got = _answers(case)
            assert got == answers, f"{target.name} byte {position}"
            said = [w for w in _warnings(caplog) if victim.stem in w]
            assert len(said) == 1, (position, _warnings(caplog))
            assert target.name in said[0] and "rebuilt" in said[0]
            # Written again as the writer wrote it: the next open trusts it silently.
            assert (case / target.name).read_bytes() == good
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="raftmq.log"):
                assert _answers(case) == answers
            assert _warnings(caplog) == []
            shutil.rmtree(case)


def test_an_index_file_with_a_valid_crc_but_wrong_slots_is_rebuilt(
    pristine: tuple[Path, dict[str, object]], scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a flip (the CRC catches those) but a file that passes its CRC and describes
    another segment: slots not starting at byte 0, or pointing past the segment's end."""
    from raftmq.log.atomic_file import read_atomic, write_atomic

    original, answers = pristine
    victim = sorted(original.glob("*" + INDEX_SUFFIX))[1]
    rows = read_atomic(victim)
    assert rows is not None and len(rows) >= 24
    wrong = {
        # The second slot claims one offset less and one index less than its entry
        # has: still ascending, in range, CRC-valid; a read starting there would skip.
        "shifted": rows[:12]
        + (int.from_bytes(rows[12:16], "big") - 1).to_bytes(4, "big")
        + (int.from_bytes(rows[16:20], "big") - 1).to_bytes(4, "big")
        + rows[20:],
        "past the end": rows[:-4] + (1 << 30).to_bytes(4, "big"),
        # The last slot's position moved 8 bytes into its entry: a read ending there
        # would hand out part of an entry.
        "mid-entry": rows[:-4] + (int.from_bytes(rows[-4:], "big") + 8).to_bytes(4, "big"),
        "first slot not at 0": rows[:8] + (7).to_bytes(4, "big") + rows[12:],
    }
    for what, payload in wrong.items():
        case = scratch / f"wrong-{what.replace(' ', '-')}"
        shutil.copytree(original, case)
        write_atomic(case / victim.name, payload)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="raftmq.log"):
            assert _answers(case) == answers, what
        said = [w for w in _warnings(caplog) if victim.name in w and "rebuilt" in w]
        assert len(said) == 1, (what, _warnings(caplog))
        if what in ("shifted", "mid-entry"):
            assert "slot at byte" in said[0]  # caught by the lookup, not by the load


@pytest.mark.parametrize("name", [checkpoints.START_CHECKPOINT, checkpoints.TERMS_CHECKPOINT])
def test_a_flipped_bit_in_a_log_checkpoint_is_rebuilt_with_a_warning(
    pristine: tuple[Path, dict[str, object]],
    scratch: Path,
    caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    original, answers = pristine
    if not (original / name).exists():  # a log that never moved its start has none
        checkpoints.write_start(original, 1, 0, 0)
    size = (original / name).stat().st_size
    for position in _positions(size):
        case = scratch / f"case-{name}-{position}"
        shutil.copytree(original, case)
        _flip(case / name, position)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="raftmq.log"):
            got = _answers(case)
        # Nothing was cut from this log, so the start rebuilt from the first segment is
        # the true one, term before it included (0: the log began at index 1).
        assert got == answers, f"{name} byte {position}"
        said = [w for w in _warnings(caplog) if name in w]
        assert len(said) == 1 and "rebuilt" in said[0], _warnings(caplog)
        assert "damaged" in said[0]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="raftmq.log"):
            assert _answers(case) == answers
        assert _warnings(caplog) == [], "the checkpoint was not written again"
        shutil.rmtree(case)


def test_a_rebuilt_log_start_after_retention_hides_nothing_kept(
    scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After retention deleted whole segments the first segment on disk is where the log
    starts; the term before it comes from the terms checkpoint, which kept the boundary."""
    directory = scratch / "retained"
    config = LogConfig(segment_bytes=2048, index_interval_bytes=300, retention_bytes=4096)
    with Log.open(directory, config) as log:
        for index in range(1, ENTRIES + 1):
            log.append(_entry(index, log.next_offset, control=index == 20))
        log.flush()
        assert log.apply_retention() > 0
        before = (log.start_index, log.start_offset, log.term_at(log.start_index - 1))
        kept = log.read_by_index(log.start_index, BIG).data
    _flip(directory / checkpoints.START_CHECKPOINT, 3)
    with caplog.at_level(logging.WARNING, logger="raftmq.log"), Log.open(directory, config) as log:
        assert (log.start_index, log.start_offset, log.term_at(log.start_index - 1)) == before
        assert log.read_by_index(log.start_index, BIG).data == kept
    assert any(checkpoints.START_CHECKPOINT in w for w in _warnings(caplog))


def test_a_rebuilt_log_start_after_a_cut_inside_a_segment_is_at_or_below_it(
    scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A snapshot cut inside the first segment: the rebuilt start is that segment's first
    entry (never above the true start: no kept record is hidden), the entries below the
    cut that are still in the file read back unchanged, and a later snapshot at the true
    start sets the start there again, with its term."""
    directory = scratch / "cut"
    with Log.open(directory, CONFIG) as log:
        for index in range(1, ENTRIES + 1):
            log.append(_entry(index, log.next_offset, control=index == 20))
        log.flush()
        cut = log.segments()[3][1] + 2  # inside the fourth segment
        log.truncate_prefix(cut)
        first = log.segments()[0]
        assert first[1] < cut  # the cut lies inside the first segment left
        true_start = (log.start_index, log.start_offset, log.term_at(cut - 1))
        kept = {i: log.read_by_index(i, 1).data for i in range(cut, ENTRIES + 1)}
    _flip(directory / checkpoints.START_CHECKPOINT, 20)
    with caplog.at_level(logging.WARNING, logger="raftmq.log"), Log.open(directory, CONFIG) as log:
        assert (log.start_index, log.start_offset) == (first[1], first[2])
        assert log.start_index <= true_start[0]
        for i, data in kept.items():
            assert log.read_by_index(i, 1).data == data
        # The snapshot a group cuts to on open (or a leader sends) restores the exact start.
        log.truncate_prefix(cut, offset=true_start[1], prev_term=true_start[2])
        assert (log.start_index, log.start_offset, log.term_at(cut - 1)) == true_start
    assert any("log now starts at the first segment" in w for w in _warnings(caplog))
    with Log.open(directory, CONFIG) as log:
        assert (log.start_index, log.start_offset, log.term_at(cut - 1)) == true_start


def test_a_rebuilt_start_of_an_empty_log_claims_term_0_until_a_snapshot_says(
    scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a snapshot install the log is one empty segment and no term is on disk but in
    the checkpoint: rebuilt, the term before the start is 0 (never a higher guess: it is
    the log's last term, which votes compare), and the leader's snapshot at that same
    point sets it again."""
    directory = scratch / "installed"
    with Log.open(directory, CONFIG) as log:
        for index in range(1, 6):
            log.append(_entry(index, log.next_offset))
        log.truncate_prefix(100, offset=500, prev_term=7)
    _flip(directory / checkpoints.START_CHECKPOINT, 9)
    with caplog.at_level(logging.WARNING, logger="raftmq.log"), Log.open(directory, CONFIG) as log:
        assert (log.start_index, log.start_offset, log.last_index) == (100, 500, 99)
        assert log.last_term == 0
        log.truncate_prefix(100, offset=500, prev_term=7)
        assert log.last_term == 7
    assert any("unknown" in w and checkpoints.START_CHECKPOINT in w for w in _warnings(caplog))
    with Log.open(directory, CONFIG) as log:
        assert (log.start_index, log.start_offset, log.last_term) == (100, 500, 7)


def test_an_emptied_log_start_checkpoint_does_not_stop_the_open(
    pristine: tuple[Path, dict[str, object]], scratch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    original, answers = pristine
    case = scratch / "unreadable"
    shutil.copytree(original, case)
    (case / checkpoints.START_CHECKPOINT).write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="raftmq.log"):
        assert _answers(case) == answers
    assert any(checkpoints.START_CHECKPOINT in w for w in _warnings(caplog))
