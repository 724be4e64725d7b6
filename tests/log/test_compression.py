"""Compressed batches (raftmq.format.compression): what a producer compresses the broker
checks and a consumer decodes to the same records, and a payload that lies about what it
holds, is cut short, carries extra bytes or inflates too far is refused with a sentence."""

from __future__ import annotations

import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.format import compression, entry
from raftmq.format.compression import Codec
from raftmq.format.errors import InvalidEntryError
from raftmq.format.records import (
    Record,
    build_batch,
    check_compressed_records,
    decode_records,
    encode_records,
)
from raftmq.partition.batch_check import check_produce
from raftmq.partition.errors import InvalidBatchError

NOW_MS = 1_700_000_000_000
CODECS = [Codec.GZIP, Codec.LZ4, Codec.ZSTD]


def check(entries: bytes) -> int:
    return check_produce(entries, max_entry_bytes=1 << 26, max_future_ms=3_600_000, now_ms=NOW_MS)


def records(n: int, value_bytes: int = 100) -> list[Record]:
    return [
        Record(f"k{i}".encode(), bytes([i % 251]) * value_bytes, NOW_MS + i % 7, (("tag", b"a"),))
        for i in range(n)
    ]


def entry_with(payload: bytes, codec: Codec, recs: list[Record]) -> bytes:
    stamps = [r.timestamp for r in recs]
    return entry.encode(
        payload,
        record_count=len(recs),
        first_timestamp=stamps[0],
        max_timestamp=max(stamps),
        attributes=int(codec),
    )


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_a_compressed_batch_passes_and_decodes_to_its_records(codec: Codec) -> None:
    recs = records(500)
    batch = build_batch(recs, compression_codec=codec)
    assert len(batch) < len(build_batch(recs)) // 4  # it did compress
    assert check(batch) == 1
    header = entry.parse_header(batch)
    assert header.attributes & entry.CODEC_MASK == codec
    decoded = decode_records(batch, header)
    assert [(r.key, r.value, r.timestamp, r.headers) for r in decoded] == [
        (r.key, r.value, r.timestamp, r.headers) for r in recs
    ]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_records_split_across_chunks_are_checked_whole(
    codec: Codec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks far smaller than a record: every record spans several, and a length prefix
    is cut at a chunk's end; the windowed walk must still see each record whole."""
    monkeypatch.setattr(compression, "CHUNK_BYTES", 7)
    recs = [*records(40, value_bytes=300), Record(None, b"x" * 70_000, NOW_MS)]
    assert check(build_batch(recs, compression_codec=codec)) == 1


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_framing_lies_inside_the_compressed_payload_are_refused(codec: Codec) -> None:
    recs = records(3)
    payload = compression.compress(codec, encode_records(recs, base_timestamp=NOW_MS))
    liar = entry.encode(
        payload,
        record_count=4,
        first_timestamp=NOW_MS,
        max_timestamp=NOW_MS + 2,
        attributes=int(codec),
    )
    with pytest.raises(InvalidBatchError, match="record_count is 4 but the payload holds 3"):
        check(liar)
    one_more = encode_records(recs, base_timestamp=NOW_MS) + b"\x00"
    with pytest.raises(InvalidBatchError, match="record 3"):
        check(entry_with(compression.compress(codec, one_more), codec, recs))


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_a_cut_or_padded_frame_is_refused(codec: Codec) -> None:
    recs = records(200)
    payload = compression.compress(codec, encode_records(recs, base_timestamp=NOW_MS))
    with pytest.raises(InvalidBatchError, match=r"cut short|not valid|not a zstd"):
        check(entry_with(payload[:-5], codec, recs))
    with pytest.raises(InvalidBatchError, match=r"after its frame|more than the"):
        check(entry_with(payload + payload, codec, recs))


def test_a_zstd_frame_without_its_content_size_is_refused() -> None:
    recs = records(3)
    raw = encode_records(recs, base_timestamp=NOW_MS)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    with pytest.raises(InvalidBatchError, match="does not declare its content size"):
        check(entry_with(frame, Codec.ZSTD, recs))


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_a_payload_inflating_past_the_limit_is_refused(codec: Codec) -> None:
    """A small request must not make the broker (or a consumer) hold a huge payload."""
    value = bytes(compression.MAX_UNCOMPRESSED_PAYLOAD_BYTES)  # framed, it is just past
    zeros = encode_records([Record(None, value, NOW_MS)], base_timestamp=NOW_MS)
    if codec == Codec.GZIP:
        c = zlib.compressobj(1, zlib.DEFLATED, 31)
        bomb = c.compress(zeros) + c.flush()
    elif codec == Codec.LZ4:
        bomb = lz4.frame.compress(zeros)
    else:
        bomb = zstandard.ZstdCompressor().compress(zeros)
    assert len(bomb) < 1 << 20
    with pytest.raises(InvalidEntryError, match=r"past (the )?67108864"):
        check_compressed_records(codec, bomb, 1, NOW_MS, NOW_MS)


def test_snappy_and_unknown_codecs_are_named() -> None:
    assert "snappy" in (compression.unsupported_reason(2) or "")
    assert "not defined" in (compression.unsupported_reason(6) or "")
    assert compression.codec_named("zstd") == Codec.ZSTD
    assert compression.codec_named(None) == Codec.NONE
    with pytest.raises(ValueError, match="'snappy' is not supported; use 'gzip', 'lz4', 'zstd'"):
        compression.codec_named("snappy")


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from(CODECS),
    values=st.lists(st.binary(max_size=3000) | st.none(), min_size=1, max_size=40),
    chunk=st.integers(min_value=1, max_value=4096),
)
def test_any_batch_round_trips_whatever_the_chunk_size(
    codec: Codec, values: list[bytes | None], chunk: int
) -> None:
    recs = [Record(None, v, NOW_MS + i) for i, v in enumerate(values)]
    batch = build_batch(recs, compression_codec=codec)
    old = compression.CHUNK_BYTES
    compression.CHUNK_BYTES = chunk
    try:
        assert check(batch) == 1
    finally:
        compression.CHUNK_BYTES = old
    decoded = decode_records(batch, entry.parse_header(batch))
    assert [r.value for r in decoded] == values
