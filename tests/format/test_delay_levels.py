"""The delay wheel's arithmetic (raftmq.format.delay): which level a wait goes to, that a
record never leaves a level after its due time, and the route headers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.format import delay


@pytest.mark.parametrize(
    ("remaining_ms", "level"),
    [
        (1, 0),
        (99, 0),
        (100, 0),
        (199, 0),
        (200, 1),
        (399, 1),
        (400, 2),
        (1_000, 3),
        (60_000, 9),
        (delay.DEFAULT_MAX_DELAY_MS, 25),
        (delay.MAX_DELIVERY_DELAY_MS, 25),
    ],
)
def test_the_level_is_the_largest_power_of_two_units_within_the_wait(
    remaining_ms: int, level: int
) -> None:
    assert delay.level_for(remaining_ms) == level


def test_forty_days_fit_the_levels() -> None:
    assert delay.UNIT_MS << delay.TOP_LEVEL <= delay.DEFAULT_MAX_DELAY_MS
    assert delay.UNIT_MS << delay.LEVELS > delay.DEFAULT_MAX_DELAY_MS


@given(now=st.integers(0, 1 << 45), wait=st.integers(-10_000, delay.MAX_DELIVERY_DELAY_MS))
def test_every_hop_ends_at_or_before_the_due_time_and_the_chain_ends(now: int, wait: int) -> None:
    due = now + wait
    at, hops = now, 0
    while (step := delay.route(due, at)) is not None:
        level, hop_at = step
        assert at < hop_at <= due
        assert hop_at - at <= delay.UNIT_MS << level
        at, hops = hop_at, hops + 1
        assert hops <= 2 * delay.LEVELS + (due - now) // (delay.UNIT_MS << delay.TOP_LEVEL)
    assert at == max(now, due) or wait <= 0


def test_route_headers_round_trip_and_malformed_ones_are_named() -> None:
    headers = delay.route_headers("orders", 2, 5_000, 4_000)
    assert delay.parse_route(headers) == ("orders", 2, 5_000, 4_000)
    with pytest.raises(delay.DelayHeaderError, match="hop-at"):
        delay.parse_route(headers[:3])
    bad = [(n, b"-1" if n == delay.DELIVER_AT else v) for n, v in headers]
    with pytest.raises(delay.DelayHeaderError, match="deliver-at"):
        delay.parse_route(bad)
