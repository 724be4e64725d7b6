"""The share consumer's bookkeeping without brokers: acknowledgements coalesced into the
ranges a leader judges all-or-nothing (only consecutive offsets of one type), and which
records of a ShareFetch answer are delivered (only those inside the acquired ranges,
with their delivery counts; control entries skipped; acquired offsets the entries lack
reported to be given back)."""

from __future__ import annotations

import itertools

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import share_pb2 as spb
from raftmq.client import AcknowledgeType, ClientError, ConsumerRecord
from raftmq.client.share_acks import AckRange, Pending, acquired_records, coalesce, offsets_of
from raftmq.client.share_consumer import ShareConsumerConfig, _maybe_done, _unknown_if
from raftmq.format import entry
from raftmq.format.records import Record, build_batch

A, RL, RJ, RN = (
    AcknowledgeType.ACCEPT,
    AcknowledgeType.RELEASE,
    AcknowledgeType.REJECT,
    AcknowledgeType.RENEW,
)


def test_consecutive_offsets_of_one_type_and_delivery_make_one_range() -> None:
    one = {o: Pending(A, 1) for o in (5, 6, 7, 9, 12)}
    pending = {**one, 10: Pending(RL, 1), 11: Pending(RL, 1), 13: Pending(A, 2)}
    assert coalesce(pending) == [
        AckRange(5, 7, A, 1),
        AckRange(9, 9, A, 1),
        AckRange(10, 11, RL, 1),
        AckRange(12, 12, A, 1),
        AckRange(13, 13, A, 2),  # another delivery: a range of its own
    ]
    assert coalesce({}) == []
    assert coalesce({3: Pending(RN, 4)})[0].batch().delivery_count == 4


@given(
    st.dictionaries(
        st.integers(0, 200),
        st.builds(Pending, st.sampled_from(list(AcknowledgeType)), st.integers(1, 3)),
    )
)
def test_ranges_cover_exactly_what_was_acknowledged(pending: dict[int, Pending]) -> None:
    ranges = coalesce(pending)
    covered = {
        o: Pending(r.type, r.delivery_count)
        for r in ranges
        for o in range(r.first_offset, r.last_offset + 1)
    }
    assert covered == pending
    assert sorted(offsets_of(ranges)) == sorted(pending)
    for a, b in itertools.pairwise(ranges):
        assert a.last_offset < b.first_offset  # ordered, disjoint
        same = (a.type, a.delivery_count) == (b.type, b.delivery_count)
        assert a.last_offset + 1 < b.first_offset or not same  # fewest


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
    assert missing == [(3, 2), (4, 2)]
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


def test_an_acknowledgement_whose_try_got_no_answer_is_of_unknown_outcome() -> None:
    """A try that got no answer (the leader died, perhaps after committing) makes a later
    refusal of the same acknowledgement OUTCOME_UNKNOWN; a refusal after refusals (no
    leader did anything) stays what it is."""
    lost = ClientError(
        "connection reset", pb.ERROR_CODE_UNSPECIFIED, grpc.StatusCode.UNAVAILABLE, {}
    )
    moved = ClientError(
        "not the leader", pb.ERROR_CODE_NOT_LEADER, grpc.StatusCode.FAILED_PRECONDITION, {}
    )
    settled = ClientError("not held", pb.ERROR_CODE_INVALID_RECORD_STATE, None, {})
    assert _maybe_done([lost, moved]) and not _maybe_done([moved, moved])
    unknown = _unknown_if(_maybe_done([lost]), settled)
    assert unknown.code == pb.ERROR_CODE_OUTCOME_UNKNOWN and "not held" in str(unknown)
    assert _unknown_if(_maybe_done([moved]), settled) is settled
