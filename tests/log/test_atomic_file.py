"""The framing of small CRC-protected files: files written by earlier releases (these exact
bytes) still read, and a torn or corrupt file reads as None, never as a wrong value."""

from __future__ import annotations

import pytest

from raftmq.log.atomic_file import overwrite_in_place, read_atomic, read_in_place, write_atomic
from raftmq.raft.hardstate import HardState
from raftmq.raft.host.group_storage import (
    HardStateCorruptError,
    load_hard_state,
    save_hard_state,
)

PAYLOAD = b"raftmq"
CRC = bytes.fromhex("607a221c")  # CRC32C(b"raftmq"), big-endian
ATOMIC_BYTES = PAYLOAD + CRC  # payload | u32 crc: checkpoints, index files, snapshot meta
IN_PLACE_BYTES = bytes.fromhex("00000006") + CRC + PAYLOAD  # u32 len | u32 crc | payload: hint


def test_layouts_are_unchanged(tmp_path):
    write_atomic(tmp_path / "a", PAYLOAD)
    overwrite_in_place(tmp_path / "h", PAYLOAD)
    assert (tmp_path / "a").read_bytes() == ATOMIC_BYTES
    assert (tmp_path / "h").read_bytes() == IN_PLACE_BYTES
    assert not (tmp_path / "a.tmp").exists()


def test_files_in_the_old_layouts_still_read(tmp_path):
    (tmp_path / "a").write_bytes(ATOMIC_BYTES)
    (tmp_path / "h").write_bytes(IN_PLACE_BYTES + b"stale tail of a longer hint")
    assert read_atomic(tmp_path / "a") == PAYLOAD
    assert read_in_place(tmp_path / "h") == PAYLOAD


def test_old_hard_state_bytes_still_load(tmp_path):
    path = tmp_path / "raft-hardstate"
    body = bytes.fromhex("5248533200000000000000070000000000000003000000000000000b01")
    path.write_bytes(body + bytes.fromhex("0e64675a"))
    assert load_hard_state(path) == HardState(7, 3, 11, rejoining=True)
    save_hard_state(path, HardState(7, 3, 11, rejoining=True))
    assert path.read_bytes() == body + bytes.fromhex("0e64675a")


def test_a_shorter_payload_overwrites_a_longer_one(tmp_path):
    path = tmp_path / "h"
    overwrite_in_place(path, b"x" * 100)
    overwrite_in_place(path, b"short")
    assert read_in_place(path) == b"short"


@pytest.mark.parametrize("cut", [0, 3, 7, 9])
def test_torn_files_read_as_none(tmp_path, cut):
    (tmp_path / "a").write_bytes(ATOMIC_BYTES[:cut])
    (tmp_path / "h").write_bytes(IN_PLACE_BYTES[:cut])
    assert read_atomic(tmp_path / "a") is None
    assert read_in_place(tmp_path / "h") is None


@pytest.mark.parametrize("at", range(len(PAYLOAD) + 4))
def test_a_flipped_bit_reads_as_none(tmp_path, at):
    atomic, in_place = bytearray(ATOMIC_BYTES), bytearray(IN_PLACE_BYTES)
    atomic[at] ^= 0x10
    in_place[at] ^= 0x10
    (tmp_path / "a").write_bytes(atomic)
    (tmp_path / "h").write_bytes(in_place)
    assert read_atomic(tmp_path / "a") is None
    assert read_in_place(tmp_path / "h") is None


def test_missing_files_read_as_none_but_a_torn_vote_is_refused(tmp_path):
    assert read_atomic(tmp_path / "nope") is None
    assert read_in_place(tmp_path / "nope") is None
    assert load_hard_state(tmp_path / "nope") == HardState()
    (tmp_path / "hs").write_bytes(b"")
    with pytest.raises(HardStateCorruptError):
        load_hard_state(tmp_path / "hs")
