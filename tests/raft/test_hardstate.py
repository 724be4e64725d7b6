"""The hard-state file: atomic replacement and refusal to guess on damage."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from raftmq.raft.hardstate import HardState
from raftmq.raft.host.group_storage import (
    HardStateCorruptError,
    load_hard_state,
    save_hard_state,
)


def test_missing_file_is_the_zero_state(tmp_path):
    assert load_hard_state(tmp_path / "hs") == HardState()


def test_save_then_load_and_replace(tmp_path):
    path = tmp_path / "hs"
    save_hard_state(path, HardState(3, 2, 17))
    assert load_hard_state(path) == HardState(3, 2, 17)
    save_hard_state(path, HardState(4, 0, 17))
    assert load_hard_state(path) == HardState(4, 0, 17)
    assert not (tmp_path / "hs.tmp").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_damaged_file_is_refused_not_guessed(tmp_path, damage):
    """Reading a torn vote as 'no vote' could let a node vote twice in one term."""
    path = tmp_path / "hs"
    save_hard_state(path, HardState(9, 1, 5))
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[12] ^= 0x01
    elif damage == "truncate":
        raw = raw[:20]
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    with pytest.raises(HardStateCorruptError):
        load_hard_state(path)


def test_rejoining_flag_round_trips_and_old_files_still_load(tmp_path):
    path = tmp_path / "hs"
    save_hard_state(path, HardState(2, 0, 4, rejoining=True))
    assert load_hard_state(path) == HardState(2, 0, 4, rejoining=True)
    body = struct.pack(">4sqqq", b"RHS1", 7, 3, 11)  # written before the flag existed
    path.write_bytes(body + struct.pack(">I", crc32c(body)))
    assert load_hard_state(path) == HardState(7, 3, 11, rejoining=False)
