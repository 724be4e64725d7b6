"""docs/format.md's test vectors against our encoder and decoder, so the document a client in
another language is written from cannot drift from the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from crc32c import crc32c

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.records import (
    Record,
    _Cursor,
    _get_varint,
    _put_varint,
    build_batch,
    decode_records,
    iter_records,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def block(tag: str) -> str:
    """The fenced block whose info string is ``tag`` (e.g. ``hex entry-produced``)."""
    match = re.search(rf"^```{re.escape(tag)}\n(.*?)^```", DOC.read_text(), re.M | re.S)
    assert match, f"docs/format.md has no ```{tag} block"
    return match.group(1)


def hex_block(tag: str) -> bytes:
    return bytes.fromhex(block(tag))


def documented_records() -> list[Record]:
    def raw(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    return [
        Record(
            raw(r["key"]),
            raw(r["value"]),
            r["timestamp"],
            tuple((name, raw(value)) for name, value in r["headers"]),
            r["offset"],
        )
        for r in json.loads(block("json records"))
    ]


def test_crc32c_vector() -> None:
    text, value = block("text crc32c").strip().split(" -> ")
    assert crc32c(text.encode("ascii")) == int(value, 16) == 0xE3069283


def test_produced_entry_is_what_build_batch_makes() -> None:
    records = documented_records()
    produced = hex_block("hex entry-produced")
    # The encoder makes the documented bytes from the documented records.
    assert build_batch([Record(r.key, r.value, r.timestamp, r.headers) for r in records]) == (
        produced
    )
    h = entry.parse_header(produced)
    assert (h.type, h.index, h.term, h.base_offset, h.record_count) == (EntryType.DATA, 0, 0, 0, 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    assert entry.crc_ok(produced, h)
    assert h.size == len(produced) == 117


def test_stored_entry_decodes_to_the_documented_records() -> None:
    produced, stored = hex_block("hex entry-produced"), hex_block("hex entry-stored")
    assert entry.stamp(produced, index=1, term=1, base_offset=0) == stored
    h = entry.parse_header(stored)
    assert (h.index, h.term, h.base_offset) == (1, 1, 0)
    assert decode_records(stored, h) == documented_records()
    assert list(iter_records(stored)) == documented_records()


def test_zigzag_varint_table() -> None:
    doc = DOC.read_text()
    rows = re.findall(r"^\| (-?\d+) \| `([0-9a-f ]+)` \|$", doc, re.M)
    assert len(rows) >= 7, "the zigzag examples table is missing"
    for value, hex_bytes in rows:
        out = bytearray()
        _put_varint(out, int(value))
        assert out.hex(" ") == hex_bytes, value
        raw = bytes.fromhex(hex_bytes)
        cursor = _Cursor(memoryview(raw), 0, len(raw))
        assert _get_varint(cursor) == int(value) and cursor.pos == len(raw)


def test_tagged_entry_is_what_build_batch_makes_and_its_block_is_the_union() -> None:
    from raftmq.format.records import check_payload
    from raftmq.format.tags import entry_tags, records_region

    tagged = hex_block("hex entry-tagged")
    records = [
        Record(b"o-1", b"10", 1_700_000_000_000, (("tag", b"paid"), ("tag", b"eu"))),
        Record(b"o-2", b"20", 1_700_000_000_000, (("tag", b"paid"),)),
    ]
    assert build_batch(records) == tagged
    h = entry.parse_header(tagged)
    assert (h.attributes, h.payload_length, h.size) == (entry.TAGGED, 58, 132)
    assert entry_tags(tagged, h) == ["eu", "paid"]
    assert bytes(records_region(tagged, h))[:1] == b"\x1b"  # record 0's length
    check_payload(
        h.attributes, tagged, entry.HEADER_SIZE, h.size, 2, h.first_timestamp, h.max_timestamp
    )
    assert [r.value for r in decode_records(tagged, h)] == [b"10", b"20"]
