"""The entry header is the contract between producers, Raft, the log and consumers: these
tests pin its layout to docs/format.md and check every refusal."""

import struct

import pytest

from raftmq.format import entry
from raftmq.format.entry import HEADER_SIZE, EntryType
from raftmq.format.errors import CorruptEntryError, InvalidEntryError


def test_header_layout_matches_docs():
    raw = entry.encode(
        b"xyz",
        index=7,
        term=3,
        base_offset=100,
        record_count=2,
        first_timestamp=11,
        max_timestamp=12,
        producer_id=5,
        producer_epoch=1,
        base_sequence=9,
    )
    assert HEADER_SIZE == 74 and len(raw) == 77
    length, crc, magic, etype = struct.unpack_from(">IIBB", raw, 0)
    assert (length, magic, etype) == (73, 1, 0)
    assert struct.unpack_from(">qqq", raw, 12) == (7, 3, 100)
    assert struct.unpack_from(">i", raw, 36) == (2,)
    assert struct.unpack_from(">qqqhii", raw, 40) == (11, 12, 5, 1, 9, 3)
    assert raw[74:] == b"xyz"
    from crc32c import crc32c

    assert crc == crc32c(raw[8:])


def test_stamp_changes_raft_fields_and_keeps_crc_valid():
    raw = entry.encode(b"payload", record_count=1)
    stamped = entry.stamp(raw, index=42, term=9, base_offset=1000)
    (h,) = list(entry.iter_headers(stamped))
    assert (h.index, h.term, h.base_offset) == (42, 9, 1000)
    assert stamped[74:] == raw[74:]


@pytest.mark.parametrize("where", [12, 20, 28, 40, 74])
def test_a_flipped_bit_anywhere_under_the_crc_is_caught(where):
    raw = bytearray(entry.encode(b"payload", index=1, term=1, record_count=1))
    raw[where] ^= 0x01
    with pytest.raises(CorruptEntryError):
        list(entry.iter_headers(bytes(raw)))


def test_refusals_name_the_problem():
    good = entry.encode(b"p", record_count=1)
    with pytest.raises(InvalidEntryError, match="truncated entry header"):
        entry.parse_header(good[:10])
    with pytest.raises(InvalidEntryError, match="needs"):
        list(entry.iter_headers(good[:-1]))
    bad_magic = bytearray(good)
    bad_magic[8] = 9
    with pytest.raises(InvalidEntryError, match="version 9"):
        entry.parse_header(bytes(bad_magic))
    with pytest.raises(InvalidEntryError, match="carries no records"):
        entry.encode(b"", type=EntryType.NOOP, record_count=1)
    with pytest.raises(InvalidEntryError, match="at least one record"):
        entry.encode(b"x", record_count=0)
    huge = bytearray(good)
    struct.pack_into(">I", huge, 0, entry.MAX_ENTRY_BYTES)
    with pytest.raises(InvalidEntryError, match="caps an entry at 67108864 bytes"):
        entry.parse_header(bytes(huge))
