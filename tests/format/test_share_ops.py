"""SHARE_STATE payloads (docs/format.md, "Share-state entries"): every operation round-trips,
the entry is a control entry readers skip, and malformed payloads are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.format import entry, share_ops
from raftmq.format.errors import InvalidEntryError
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.format.share_ops import AckType, Op, ShareOp

OPS = [
    ShareOp(Op.INIT, "g", 7, 1_000, start=42),
    ShareOp(Op.ACQUIRE, "g", 7, 1_000, member_id="m1", deadline_ms=31_000, ranges=((0, 4), (9, 9))),
    ShareOp(
        Op.ACK,
        "grp",
        7,
        2_000,
        delivery_count_limit=3,
        dead_letter=True,
        lock_duration_ms=5_000,
        max_lock_hold_ms=60_000,
        member_id="m\u00e9",
        acks=((0, 1, AckType.ACCEPT), (2, 2, AckType.RENEW), (3, 4, AckType.REJECT)),
    ),
    ShareOp(Op.RELEASE_MEMBER, "g", 7, 3_000, member_id="m1"),
    ShareOp(Op.RESET, "g", 7, 3_000, start=0),
    ShareOp(Op.DELETE, "g", 7, 3_000),
    ShareOp(Op.DEAD_LETTERED, "g", 7, 3_000, ranges=((3, 4),)),
]


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.op.name)
def test_every_operation_round_trips(op: ShareOp) -> None:
    assert share_ops.decode(share_ops.encode(op)) == op


@given(
    st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 1000)), max_size=50),
    st.integers(0, 1 << 50),
)
def test_ranges_round_trip(spans: list[tuple[int, int]], now_ms: int) -> None:
    ranges = tuple((a, a + n) for a, n in spans)
    op = ShareOp(Op.ACQUIRE, "g", 1, now_ms, member_id="m", deadline_ms=now_ms + 1, ranges=ranges)
    assert share_ops.decode(share_ops.encode(op)) == op


def test_the_entry_is_a_control_entry_readers_skip() -> None:
    data = build_batch([Record(None, b"v", 1)]) + share_ops.encode_entry(OPS[1])
    headers = list(entry.iter_headers(data))
    assert [h.type for h in headers] == [entry.EntryType.DATA, entry.EntryType.SHARE_STATE]
    share = headers[1]
    assert share.record_count == 0 and share.producer_id == entry.NO_PRODUCER_ID
    assert share_ops.decode(entry.payload_of(data, share)) == OPS[1]
    assert decode_records(data, share) == []  # a records reader sees none in it


@pytest.mark.parametrize(
    "payload, why",
    [
        (b"", "ends early"),
        (bytes([9]) + share_ops.encode(OPS[0])[1:], "version 9"),
        (share_ops.encode(OPS[0])[:1] + bytes([77]) + share_ops.encode(OPS[0])[2:], "operation 77"),
        (share_ops.encode(OPS[0]) + b"x", "follow"),
        (share_ops.encode(OPS[1])[:-3], "ends early"),
    ],
)
def test_malformed_payloads_are_refused(payload: bytes, why: str) -> None:
    with pytest.raises(InvalidEntryError, match=why):
        share_ops.decode(payload)


def test_bounds_are_enforced_when_encoding() -> None:
    with pytest.raises(InvalidEntryError, match="at most"):
        share_ops.encode(ShareOp(Op.DEAD_LETTERED, "g", 1, 1, ranges=((1, 1),) * 10_001))
    with pytest.raises(InvalidEntryError, match="ids"):
        share_ops.encode(ShareOp(Op.DELETE, "g" * 256, 1, 1))
    with pytest.raises(InvalidEntryError, match="not a range"):
        share_ops.decode(share_ops.encode(ShareOp(Op.DEAD_LETTERED, "g", 1, 1, ranges=((5, 4),))))
