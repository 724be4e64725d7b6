"""The delay movers' pure steps (raftmq.broker.delay_steps): a released record's next
step follows from its headers alone (so a successor repeats it), is never a delivery
before deliver-at, and drops the route headers on delivery; the cursor round-trips."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftmq.broker.delay_steps import Cursor, next_step
from raftmq.format import delay
from raftmq.format.records import Record


def _record(deliver_at: int, hop_at: int, offset: int = 7) -> Record:
    headers = (("user", b"1"), *delay.route_headers("t", 2, deliver_at, hop_at))
    return Record(b"k", b"v", 1_000, headers, offset)


@given(hop_at=st.integers(0, 1 << 44), wait=st.integers(0, delay.MAX_DELIVERY_DELAY_MS))
def test_a_record_is_delivered_only_once_due_else_it_hops_lower_or_level(
    hop_at: int, wait: int
) -> None:
    move = next_step(_record(hop_at + wait, hop_at))
    assert move is not None and move == next_step(_record(hop_at + wait, hop_at))
    if wait == 0:
        assert move.destination == ("t", 2)
        assert move.record.headers == (("user", b"1"), (delay.DELIVER_AT, str(hop_at).encode()))
        assert (move.record.key, move.record.value, move.record.timestamp) == (b"k", b"v", 1_000)
    else:
        topic, level = move.destination
        assert topic == delay.DELAY_TOPIC
        assert level == delay.level_for(wait)
        _, _, due, new_hop = delay.parse_route(move.record.headers)
        assert due == hop_at + wait and hop_at < new_hop <= due
    assert move.source_offset == 7


def test_a_record_without_a_route_has_no_step() -> None:
    assert next_step(Record(None, b"x", 0, (), 3)) is None


def test_the_cursor_round_trips() -> None:
    cursor = Cursor(42, {("a", 0): 5, (delay.DELAY_TOPIC, 3): 9})
    assert Cursor.decode(cursor.encode()) == cursor
