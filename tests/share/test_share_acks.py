"""The share consumer's bookkeeping without brokers: acknowledgements coalesced into the
ranges a leader judges all-or-nothing (only consecutive offsets of one type), and which
records of a ShareFetch answer are delivered (only those inside the acquired ranges,
with their delivery counts; control entries skipped; acquired offsets the entries lack
reported to be given back)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.api.v1 import share_pb2 as spb
from raftmq.client import AcknowledgeType, ConsumerRecord
from raftmq.client.share_acks import AckRange, acquired_records, coalesce, offsets_of
from raftmq.client.share_consumer import ShareConsumerConfig
from raftmq.format import entry
from raftmq.format.records import Record, build_batch

A, RL, RJ, RN = (
    AcknowledgeType.ACCEPT,
    AcknowledgeType.RELEASE,
    AcknowledgeType.REJECT,
    AcknowledgeType.RENEW,
)


def test_consecutive_offsets_of_one_type_make_one_range() -> None:
    pending = {5: A, 6: A, 7: A, 9: A, 10: RL, 11: RL, 12: A}
    assert coalesce(pending) == [
        AckRange(5, 7, A),
        AckRange(9, 9, A),
        AckRange(10, 11, RL),
        AckRange(12, 12, A),
    ]
    assert coalesce({}) == []


@given(st.dictionaries(st.integers(0, 200), st.sampled_from(list(AcknowledgeType))))
def test_ranges_cover_exactly_what_was_acknowledged(pending: dict[int, AcknowledgeType]) -> None:
    ranges = coalesce(pending)
    covered = {o: r.type for r in ranges for o in range(r.first_offset, r.last_offset + 1)}
    assert covered == pending
    assert sorted(offsets_of(ranges)) == sorted(pending)
    for a, b in itertools.pairwise(ranges):
        assert a.last_offset < b.first_offset  # ordered, disjoint
        assert a.last_offset + 1 < b.first_offset or a.type is not b.type  # fewest


def test_only_renew_leaves_a_record_held() -> None:
    assert [t.settles for t in (A, RL, RJ, RN)] == [True, True, True, False]
    assert {t.value for t in AcknowledgeType} == {1, 2, 3, 4}  # share.proto's numbers


def _stamped(records: list[Record], base_offset: int) -> bytes:
    return entry.stamp(build_batch(records), index=1, term=1, base_offset=base_offset)


def _records(first: int, n: int) -> list[Record]:
    return [Record(f"k{first + i}".encode(), f"v{first + i}".encode(), 1000 + i) for i in range(n)]


def _acquired(*ranges: tuple[int, int, int]) -> list[spb.AcquiredRecords]:
    return [
        spb.AcquiredRecords(first_offset=f, last_offset=z, delivery_count=c) for f, z, c in ranges
    ]


def test_only_records_inside_acquired_ranges_are_delivered_with_their_counts() -> None:
    entries = _stamped(_records(10, 5), 10) + _stamped(_records(15, 5), 15)
    marker = entry.stamp(
        entry.encode_marker(commit=True, producer_id=7, producer_epoch=0, timestamp_ms=1),
        index=2,
        term=1,
        base_offset=20,
    )
    got, missing = acquired_records(entries + marker, _acquired((12, 13, 1), (16, 19, 3)))
    assert [(a.record.offset, a.delivery_count) for a in got] == [
        (12, 1),
        (13, 1),
        (16, 3),
        (17, 3),
        (18, 3),
        (19, 3),
    ]
    assert got[0].record.value == b"v12" and got[0].record.key == b"k12"
    assert missing == []


def test_acquired_offsets_the_entries_lack_are_reported() -> None:
    got, missing = acquired_records(_stamped(_records(0, 3), 0), _acquired((1, 4, 2)))
    assert [a.record.offset for a in got] == [1, 2]
    assert missing == [3, 4]
    assert acquired_records(b"", []) == ([], [])


def test_settings_are_checked_at_construction() -> None:
    ok = ShareConsumerConfig(("h:1",), "g")
    assert ok.acknowledgement_mode == "implicit" and ok.client_id.startswith("share-consumer-")
    for bad, words in [
        ({"group_id": ""}, "group_id"),
        ({"acknowledgement_mode": "auto"}, "acknowledgement_mode"),
        ({"max_poll_records": 0}, "max_poll_records"),
        ({"session_timeout_ms": 10}, "session_timeout_ms"),
        ({"max_concurrent_fetches": 0}, "max_concurrent_fetches"),
    ]:
        settings = {"group_id": "g", **bad}
        with pytest.raises(ValueError, match=words):
            ShareConsumerConfig(("h:1",), **settings)  # type: ignore[arg-type]


def test_a_plain_record_has_no_delivery_count() -> None:
    r = ConsumerRecord("t", 0, 1, None, b"v", 0, ())
    assert r.delivery_count is None
