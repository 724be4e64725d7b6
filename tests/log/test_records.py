import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.log import entry
from raftmq.log.errors import InvalidEntryError
from raftmq.log.records import Record, build_batch, decode_records, iter_records

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


def test_a_payload_that_lies_about_its_record_count_is_refused():
    raw = build_batch([Record(b"k", b"v", 1), Record(b"k", b"w", 1)])
    h = entry.parse_header(raw)
    one = build_batch([Record(b"k", b"v", 1)])
    # Same header claims, payload of one record: rebuild with a wrong count.
    lying = entry.encode(bytes(entry.payload_of(one, entry.parse_header(one))), record_count=2)
    with pytest.raises(InvalidEntryError, match="declares 2 records"):
        decode_records(lying, entry.parse_header(lying))
    assert len(decode_records(raw, h)) == 2


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])
