"""The index files' byte layout (docs/format.md), checked against struct-packed rows rather
than against the code that writes them, and the lookups a loaded index answers."""

from __future__ import annotations

import struct
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic
from raftmq.log.index import SegmentIndex

BASE_OFFSET, FIRST_INDEX = 1_000, 500


def built() -> SegmentIndex:
    idx = SegmentIndex(BASE_OFFSET, FIRST_INDEX)
    stamps = [-1, -1, 5, 5, 1_700_000_000_000, 1_700_000_000_003, 1_700_000_000_003]
    for k, ts in enumerate(stamps):
        idx.observe(k * 100, FIRST_INDEX + 2 * k, BASE_OFFSET + 10 * k, ts, interval_bytes=100)
    idx.seal(BASE_OFFSET + 70)
    return idx


def test_index_files_hold_big_endian_relative_rows(tmp_path: Path) -> None:
    idx = built()
    idx.write(tmp_path / "s.index", tmp_path / "s.timeindex", tmp_path / "s.tagindex")
    rows = b"".join(struct.pack(">III", 10 * k, 2 * k, 100 * k) for k in range(7))
    assert read_atomic(tmp_path / "s.index") == rows
    times = [(-1, 0), (5, 20), (1_700_000_000_000, 40), (1_700_000_000_003, 50)]
    assert read_atomic(tmp_path / "s.timeindex") == b"".join(
        struct.pack(">qI", ts, off) for ts, off in times
    )


def load(folder: Path, base_offset: int, first_index: int, size_bytes: int) -> SegmentIndex | None:
    """The index from the three files in ``folder`` (an empty tag index when it has none),
    or None when load_checked refuses them."""
    if not (folder / "s.tagindex").exists():
        write_atomic(folder / "s.tagindex", b"")
    found = SegmentIndex.load_checked(
        folder / "s.index",
        folder / "s.timeindex",
        folder / "s.tagindex",
        base_offset,
        first_index,
        size_bytes,
    )
    return found if isinstance(found, SegmentIndex) else None


def test_a_loaded_index_answers_like_the_one_that_wrote_it(tmp_path: Path) -> None:
    idx = built()
    idx.write(tmp_path / "s.index", tmp_path / "s.timeindex", tmp_path / "s.tagindex")
    got = load(tmp_path, BASE_OFFSET, FIRST_INDEX, 700)
    assert isinstance(got, SegmentIndex)
    for offset in range(BASE_OFFSET - 5, BASE_OFFSET + 80):
        assert got.position_for_offset(offset) == idx.position_for_offset(offset)
    for index in range(FIRST_INDEX - 3, FIRST_INDEX + 16):
        assert got.position_for_index(index) == idx.position_for_index(index)
    for ts in (-5, -1, 0, 5, 6, 1_700_000_000_000, 1_700_000_000_003, 1_700_000_000_004):
        assert got.position_for_timestamp(ts) == idx.position_for_timestamp(ts)
    assert got.entry_at(300) == (FIRST_INDEX + 6, BASE_OFFSET + 30)
    assert got.entry_at(301) is None
    assert got.max_timestamp_ms == 1_700_000_000_003 and got.last_slot_position == 600


def test_index_files_that_contradict_themselves_or_the_segment_are_refused(
    tmp_path: Path,
) -> None:
    good = b"".join(struct.pack(">III", 10 * k, 2 * k, 100 * k) for k in range(3))
    times = struct.pack(">qI", 5, 0)
    cases = {
        "offsets going back": struct.pack(">III", 10, 0, 0) + struct.pack(">III", 5, 1, 100),
        "a repeated index": struct.pack(">III", 0, 1, 0) + struct.pack(">III", 10, 1, 100),
        "a slot past the segment": good + struct.pack(">III", 30, 6, 700),
        "a torn row": good[:-2],
    }
    for what, rows in cases.items():
        write_atomic(tmp_path / "s.index", rows)
        write_atomic(tmp_path / "s.timeindex", times)
        assert load(tmp_path, 0, 1, 700) is None, what
    write_atomic(tmp_path / "s.index", good)
    write_atomic(tmp_path / "s.timeindex", struct.pack(">qI", 5, 0) + struct.pack(">qI", 5, 10))
    assert load(tmp_path, 0, 1, 700) is None
