"""In-place repair of a corrupt closed segment from a healthy replica's bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.errors import CorruptEntryError
from raftmq.format.records import Record, build_batch, iter_records
from raftmq.log.config import LogConfig
from raftmq.log.inspect import verify_folder
from raftmq.log.log import Log
from raftmq.log.repair import RepairRefusedError, find_damage, patch

CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512)


def write_log(folder: Path, entries: int = 200) -> None:
    with Log.open(folder, CONFIG) as log:
        for i in range(entries):
            batch = build_batch([Record(None, f"value-{i}".encode() * 10, 1_000 + i)])
            log.append(entry.stamp(batch, index=log.next_index, term=1, base_offset=i))
        log.flush()


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


@pytest.fixture
def replicas(tmp_path: Path) -> tuple[Path, Path]:
    """Two byte-identical replicas of one log, as Raft leaves them."""
    healthy, damaged = tmp_path / "healthy", tmp_path / "damaged"
    write_log(healthy)
    shutil.copytree(healthy, damaged)
    return healthy, damaged


@pytest.mark.parametrize("where", ["payload", "length field"])
def test_a_flipped_bit_is_replaced_by_the_peers_bytes(replicas, where):
    healthy, damaged = replicas
    segments = sorted(damaged.glob("*.log"))
    position = 500 if where == "payload" else 0  # byte 0: the first entry's length
    flip(segments[1], position, 0x01 if where == "payload" else 0x40)
    with Log.open(damaged, CONFIG) as log, Log.open(healthy, CONFIG) as peer:
        with pytest.raises(CorruptEntryError):
            log.read_entries(log.start_index, 1 << 20, log.last_index + 1)
        [damage] = find_damage(log)
        assert damage.segment == segments[1].stem
        data = peer.read_entries(damage.first_index, 1 << 30, damage.end_index)
        done = patch(log, damage, data)
        assert done.replaced_bytes == 1 and done.at == position
        assert not find_damage(log)
        got = log.read_entries(log.start_index, 1 << 30, log.last_index + 1)
        assert got == peer.read_entries(peer.start_index, 1 << 30, peer.last_index + 1)
        assert len(list(iter_records(got))) == 200
    for seg in segments:
        assert seg.read_bytes() == (healthy / seg.name).read_bytes()
    assert verify_folder(damaged).ok


def test_a_replacement_that_does_not_fit_is_refused_and_nothing_written(replicas):
    healthy, damaged = replicas
    seg = sorted(damaged.glob("*.log"))[1]
    flip(seg, 500)
    before = seg.read_bytes()
    with Log.open(damaged, CONFIG) as log, Log.open(healthy, CONFIG) as peer:
        [damage] = find_damage(log)
        wrong = peer.read_entries(damage.first_index + 1, 1 << 30, damage.end_index)
        with pytest.raises(RepairRefusedError, match="expected index"):
            patch(log, damage, wrong)
        short = peer.read_entries(damage.first_index, 1 << 30, damage.end_index - 1)
        with pytest.raises(RepairRefusedError, match="ends before"):
            patch(log, damage, short)
        bad = bytearray(peer.read_entries(damage.first_index, 1 << 30, damage.end_index))
        bad[30] ^= 0x01
        with pytest.raises(CorruptEntryError, match="replacement"):
            patch(log, damage, bytes(bad))
    assert seg.read_bytes() == before
