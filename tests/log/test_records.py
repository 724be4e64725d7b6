import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.format import entry
from raftmq.format.errors import InvalidEntryError
from raftmq.format.records import Record, build_batch, decode_records, iter_records

records_st = st.lists(
    st.builds(
        Record,
        key=st.none() | st.binary(max_size=40),
        value=st.none() | st.binary(max_size=300),
        timestamp=st.integers(min_value=0, max_value=2**50),
        headers=st.lists(
            st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=4
        ).map(tuple),
    ),
    min_size=1,
    max_size=30,
)


@given(records_st, st.integers(min_value=0, max_value=2**40))
def test_records_round_trip_through_a_stamped_entry(records, base_offset):
    raw = entry.stamp(build_batch(records), index=1, term=1, base_offset=base_offset)
    back = list(iter_records(raw))
    assert [(r.key, r.value, r.timestamp, r.headers) for r in back] == [
        (r.key, r.value, r.timestamp, r.headers) for r in records
    ]
    assert [r.offset for r in back] == list(range(base_offset, base_offset + len(records)))
    h = entry.parse_header(raw)
    assert h.max_timestamp == max(r.timestamp for r in records)


def test_large_fields_and_memoryview_buffers_decode_alike():
    """Lengths of one, two and three varint bytes, from bytes and from a memoryview of a
    larger buffer (decode_records takes a fast path for the first)."""
    records = [
        Record(b"k", b"v" * 100, 5),
        Record(b"k" * 200, b"v" * 20_000, 6, (("h", b"x" * 300),)),
        Record(None, b"", 7),
    ]
    raw = entry.stamp(build_batch(records), index=1, term=1, base_offset=10)
    h = entry.parse_header(raw)
    framed = memoryview(b"junk" + raw)[4:]
    for buf in (raw, framed, bytearray(raw)):
        back = decode_records(buf, h)
        assert [(r.key, r.value, r.timestamp, r.headers, r.offset) for r in back] == [
            (r.key, r.value, r.timestamp, r.headers, 10 + i) for i, r in enumerate(records)
        ]


def test_a_payload_that_lies_about_its_record_count_is_refused():
    raw = build_batch([Record(b"k", b"v", 1), Record(b"k", b"w", 1)])
    h = entry.parse_header(raw)
    one = build_batch([Record(b"k", b"v", 1)])
    # Same header claims, payload of one record: rebuild with a wrong count.
    lying = entry.encode(bytes(entry.payload_of(one, entry.parse_header(one))), record_count=2)
    with pytest.raises(
        InvalidEntryError, match="record_count is 2 but the payload holds 1 records"
    ):
        decode_records(lying, entry.parse_header(lying))
    assert len(decode_records(raw, h)) == 2


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])


# --- check_records: the framing rules a broker and a reader share -----------------------------

from raftmq.format.records import _put_uvarint, _put_varint, check_records  # noqa: E402


def record_bytes(
    *, attributes: int = 0, ts_delta: int = 0, offset_delta: int = 0, tail: bytes = b"\x02v\x00"
) -> bytes:
    """One record with the given fields; ``tail`` is key, value and headers (null key, value
    b"v", no headers by default)."""
    body = bytearray([attributes])
    _put_varint(body, ts_delta)
    _put_uvarint(body, offset_delta)
    body += b"\x01" + tail  # null key
    out = bytearray()
    _put_uvarint(out, len(body))
    return bytes(out + body)


BAD_PAYLOADS = {
    "offset delta 1 on record 0": (record_bytes(offset_delta=1), "offset delta 1"),
    "first timestamp delta not 0": (record_bytes(ts_delta=3), "timestamp delta 3"),
    "record attributes": (record_bytes(attributes=1), "attributes 1"),
    # length 6: attributes, timestamp delta, offset delta, key length zigzag 5 (= -3), ...
    "negative key length": (b"\x06\x00\x00\x00\x05\x00\x00", "key length -3"),
    "bytes left in a record": (record_bytes(tail=b"\x02v\x00\x00"), "end 1 bytes before"),
    "value past the record": (record_bytes(tail=b"\x08v\x00"), "run past"),
    "header name not UTF-8": (record_bytes(tail=b"\x02v\x01\x01\xff\x01"), "not UTF-8"),
    "too many headers": (record_bytes(tail=b"\x02v\x82\x10"), "2050 headers"),
    "varint over 10 bytes": (b"\xff" * 11, "longer than 10 bytes"),
    "varint over 64 bits": (b"\xff" * 9 + b"\x7f", "does not fit 64 bits"),
    "record shorter than 6 bytes": (b"\x02\x00\x00", "at least 6"),
}


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_check_records_refuses_each_framing_lie(case):
    payload, words = BAD_PAYLOADS[case]
    with pytest.raises(InvalidEntryError, match=words):
        check_records(payload, 0, len(payload), 1, 0, 0)
    lying = entry.encode(payload, record_count=1)
    with pytest.raises(InvalidEntryError):  # the reader refuses what the broker refuses
        decode_records(lying, entry.parse_header(lying))


def test_max_timestamp_must_be_the_largest_record_timestamp():
    records = [Record(None, b"a", 10), Record(None, b"b", 5), Record(None, b"c", 30)]
    raw = build_batch(records)
    h = entry.parse_header(raw)
    assert (h.first_timestamp, h.max_timestamp) == (10, 30)
    payload = entry.payload_of(raw, h)
    check_records(payload, 0, len(payload), 3, 10, 30)
    with pytest.raises(InvalidEntryError, match="largest record timestamp is 30"):
        check_records(payload, 0, len(payload), 3, 10, 40)
    with pytest.raises(InvalidEntryError, match="timestamp -1"):
        check_records(payload, 0, len(payload), 3, 4, 24)  # record 1 at 4 - 5


@given(records_st, st.data())
def test_a_mutated_payload_decodes_whole_or_is_refused(records, data):
    """Whatever the bytes, the reader either returns record_count records or raises
    InvalidEntryError: never another exception, never a wrong count."""
    raw = bytearray(build_batch(records))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(entry.HEADER_SIZE, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    count = data.draw(st.sampled_from([len(records), len(records) + 1, max(1, len(records) - 1)]))
    lying = entry.encode(
        bytes(raw[entry.HEADER_SIZE :]),
        record_count=count,
        first_timestamp=records[0].timestamp,
        max_timestamp=max(r.timestamp for r in records),
    )
    try:
        got = decode_records(lying, entry.parse_header(lying))
    except InvalidEntryError:
        return
    assert len(got) == count
