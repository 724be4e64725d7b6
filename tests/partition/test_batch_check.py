"""Unit tests of the client-edge checks (raftmq.partition.batch_check): each lie a
producer's header can tell is refused with a sentence naming the entry, field, value and
limit; honest batches pass."""

from __future__ import annotations

import pytest

from raftmq.format import entry
from raftmq.format.records import Record, build_batch, encode_records
from raftmq.partition.batch_check import MAX_ENTRIES_PER_PRODUCE, check_produce
from raftmq.partition.errors import BatchTooLargeError, CorruptBatchError, InvalidBatchError

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
RECORDS = [Record(b"k", b"v1", NOW_MS, (("h", b"x"),)), Record(None, b"v2", NOW_MS + 5)]
PAYLOAD = encode_records(RECORDS, base_timestamp=NOW_MS)


def lie(**fields: object) -> bytes:
    """An entry with a valid CRC over the two honest records, with header ``fields`` changed."""
    honest: dict[str, object] = {
        "record_count": 2,
        "first_timestamp": NOW_MS,
        "max_timestamp": NOW_MS + 5,
    }
    payload = fields.pop("payload", PAYLOAD)
    return entry.encode(payload, **{**honest, **fields})  # type: ignore[arg-type]


def check(entries: bytes) -> int:
    return check_produce(entries, max_entry_bytes=1 << 20, max_future_ms=HOUR_MS, now_ms=NOW_MS)


def test_honest_batches_pass() -> None:
    assert check(lie()) == 1
    assert check(build_batch(RECORDS) * 3) == 3
    assert check(lie(producer_id=5, producer_epoch=0, base_sequence=7)) == 1
    assert check(lie(first_timestamp=NOW_MS, max_timestamp=NOW_MS + 5)) == 1


LIES: dict[str, tuple[dict[str, object], tuple[str, ...]]] = {
    "count-too-high": ({"record_count": 3}, ("record_count is 3", "holds 2 records")),
    "count-too-low": ({"record_count": 1}, ("record_count is 1", "more records")),
    "count-near-2^31": ({"record_count": (1 << 31) - 2}, ("record_count is 2147483646",)),
    "max-far-future": (
        {"max_timestamp": NOW_MS + 10 * 365 * 24 * HOUR_MS},
        ("max_timestamp", "ahead of the broker's clock", "3600000 ms"),
    ),
    "max-below-first": ({"max_timestamp": NOW_MS - 1}, ("below first_timestamp",)),
    "max-not-the-max": ({"max_timestamp": NOW_MS + 4}, ("largest record timestamp is",)),
    "negative-first": ({"first_timestamp": -1, "max_timestamp": 4}, ("first_timestamp is -1",)),
    "gzip-bit-uncompressed": ({"attributes": 1}, ("not valid gzip data",)),
    "zstd-bit-uncompressed": ({"attributes": 4}, ("not a zstd frame",)),
    "lz4-bit-uncompressed": ({"attributes": 3}, ("not valid lz4 data",)),
    "snappy-bit": ({"attributes": 2}, ("snappy (codec 2) is not supported", "zstd (4)")),
    "codec-7": ({"attributes": 7}, ("codec 7 is not defined",)),
    "log-append-bit": ({"attributes": 8}, ("log-append-time", "broker")),
    "index": ({"index": 3}, ("index is 3", "broker assigns offsets")),
    "term": ({"term": 1}, ("term is 1",)),
    "base-offset": ({"base_offset": 42}, ("base_offset is 42", "base_offset 0")),
    "producer-without-epoch": ({"producer_id": 5}, ("producer_id 5", "producer_epoch -1")),
    "epoch-without-producer": ({"producer_epoch": 3}, ("producer_epoch 3",)),
    "sequence-overflows": (
        {"producer_id": 1, "producer_epoch": 0, "base_sequence": (1 << 31) - 1},
        ("must fit 32 bits",),
    ),
    "trailing-bytes": ({"payload": PAYLOAD + b"\x00"}, ("record 2",)),
    "cut-payload": ({"payload": PAYLOAD[:-1]}, ("record 1",)),
}


@pytest.mark.parametrize("case", list(LIES))
def test_each_header_lie_is_refused_with_a_sentence(case: str) -> None:
    fields, words = LIES[case]
    with pytest.raises(InvalidBatchError) as info:
        check(build_batch(RECORDS) + lie(**dict(fields)))
    message = str(info.value)
    assert message.startswith("entry 1 (byte "), message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    for jargon in ("proposal", "Raft"):
        assert jargon not in message


def test_sizes_crc_and_entry_count_keep_their_codes() -> None:
    with pytest.raises(BatchTooLargeError, match=r"max\.message\.bytes is 80"):
        check_produce(lie(), max_entry_bytes=80, max_future_ms=HOUR_MS, now_ms=NOW_MS)
    bad = bytearray(lie())
    bad[-1] ^= 1
    with pytest.raises(CorruptBatchError, match="CRC32C"):
        check(bytes(bad))
    with pytest.raises(InvalidBatchError, match=f"more than {MAX_ENTRIES_PER_PRODUCE} entries"):
        check(lie() * (MAX_ENTRIES_PER_PRODUCE + 1))
    with pytest.raises(InvalidBatchError, match="no entries"):
        check(b"")
