"""The retry headers (raftmq.client.retry_headers) and the attempt logic
(raftmq.client.retrying.RetryPolicy, next_info), without brokers: what a record's history
reads as, what is refused, and where each attempt sends a record."""

from __future__ import annotations

import pytest

from raftmq.client.consumer import ConsumerRecord
from raftmq.client.retrying import MAX_BACKOFF_MS, RetryPolicy, next_info
from raftmq.format import retry_headers as rh
from raftmq.format.retry_headers import RetryInfo

INFO = RetryInfo("orders", 2, 41, 3, 1_700_000_000_000, "ValueError: bad total")


def test_headers_round_trip_and_read_as_documented() -> None:
    headers = rh.encode(INFO)
    assert headers == [
        ("original-topic", b"orders"),
        ("original-partition", b"2"),
        ("original-offset", b"41"),
        ("attempts", b"3"),
        ("first-failure-at", b"1700000000000"),
        ("last-error", b"ValueError: bad total"),
    ]
    assert rh.decode(headers) == INFO
    assert [n for n, _ in headers] == list(rh.NAMES)


def test_a_record_without_history_and_strip_keeps_the_records_own_headers() -> None:
    assert rh.decode([("tag", b"paid"), ("source", None)]) is None
    own = [("tag", b"paid"), ("source", None)]
    mixed = [own[0], *rh.encode(INFO), ("deliver-at", b"1700000060000"), own[1]]
    assert rh.strip(mixed) == own  # the history, and the due time a delayed send sets
    # Sent on again: its own headers first, then exactly one history.
    again = rh.strip(mixed) + rh.encode(INFO)
    assert rh.decode(again) == INFO and [n for n, _ in again].count("attempts") == 1


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"attempts": b"0"}, "attempts header is '0'"),
        ({"attempts": b"-1"}, "attempts header is '-1'"),
        ({"original-offset": b"4x"}, "original-offset header is '4x'"),
        ({"original-partition": b"\xff"}, "not UTF-8"),
        ({"first-failure-at": None}, "first-failure-at header is null"),
        ({"original-topic": b""}, "original-topic header is empty"),
        ({"last-error": "drop"}, "lack last-error"),
    ],
)
def test_history_that_does_not_read_is_refused_naming_the_header(
    change: dict[str, bytes | str | None], says: str
) -> None:
    headers = dict(rh.encode(INFO))
    for name, value in change.items():
        if value == "drop":
            del headers[name]
        else:
            headers[name] = value if not isinstance(value, str) else value.encode()
    with pytest.raises(ValueError, match=says):
        rh.decode(list(headers.items()))


def test_the_due_time_is_delayed_deliverys_header() -> None:
    assert rh.due_ms([("deliver-at", b"1700000060000"), *rh.encode(INFO)]) == 1_700_000_060_000
    assert rh.due_ms(rh.encode(INFO)) is None
    with pytest.raises(ValueError, match="deliver-at header is 'soon'"):
        rh.due_ms([("deliver-at", b"soon")])


def test_error_text_is_type_and_message_cut_to_a_bound() -> None:
    assert rh.error_text(ValueError("bad total")) == "ValueError: bad total"
    assert rh.error_text(KeyError()) == "KeyError"
    long = rh.error_text(RuntimeError("x" * 5000))
    assert len(long) == rh.MAX_ERROR_CHARS and long.endswith("...")


def test_topic_names_are_per_topic_and_group_and_fit_a_topic_name() -> None:
    assert rh.retry_topic("orders", "billing") == "orders.billing.retry"
    assert rh.dead_letter_topic("orders", "billing") == "orders.billing.dlq"
    with pytest.raises(ValueError, match="over the 200 a topic name may have"):
        rh.retry_topic("t" * 150, "g" * 50)


def test_policy_attempts_and_backoffs() -> None:
    policy = RetryPolicy(max_attempts=4, backoff_ms=(1000, 10_000, 60_000))
    assert [policy.backoff_for(n) for n in (1, 2, 3, 4, 5)] == [1000, 10_000, 60_000, None, None]
    longer = RetryPolicy(max_attempts=6, backoff_ms=[500, 2000])  # the last wait repeats
    assert [longer.backoff_for(n) for n in range(1, 7)] == [500, 2000, 2000, 2000, 2000, None]
    assert longer.backoff_ms == (500, 2000)
    assert RetryPolicy(max_attempts=1).backoff_for(1) is None  # straight to the dead letters
    assert RetryPolicy() == RetryPolicy(4, (1000, 10_000, 60_000))


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_attempts": 0}, "at least 1"),
        ({"max_attempts": -3}, "at least 1"),
        ({"max_attempts": 2.5}, "at least 1"),
        ({"max_attempts": True}, "at least 1"),
        ({"backoff_ms": []}, "backoff_ms is empty"),
        ({"backoff_ms": "1000"}, "is a list of waits"),
        ({"backoff_ms": 1000}, "is a list of waits"),
        ({"backoff_ms": [1000, -1]}, r"backoff_ms\[1\] is -1"),
        ({"backoff_ms": [1.5]}, r"backoff_ms\[0\] is 1.5"),
        ({"backoff_ms": [MAX_BACKOFF_MS + 1]}, "40 days"),
        ({"backoff_ms": [10_000, 1000]}, r"backoff_ms\[1\] \(1000 ms\) is shorter"),
    ],
)
def test_bad_policies_are_refused_with_a_sentence(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RetryPolicy(**kwargs)


def record(topic: str, headers: tuple[tuple[str, bytes | None], ...] = ()) -> ConsumerRecord:
    return ConsumerRecord(topic, 1, 7, b"k", b"v", 1, headers)


def test_next_info_counts_attempts_from_the_original() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_ms=(1000, 5000))
    first, due = next_info(record("orders"), None, "E: one", 10_000, policy)
    assert (first, due) == (RetryInfo("orders", 1, 7, 1, 10_000, "E: one"), 11_000)
    # The retry topic's copy fails again: the origin and the first failure stay.
    copy = record("orders.g.retry", tuple(rh.encode(first)))
    second, due = next_info(copy, rh.decode(copy.headers), "E: two", 12_000, policy)
    assert (second, due) == (RetryInfo("orders", 1, 7, 2, 10_000, "E: two"), 17_000)
    third, due = next_info(copy, second, "E: three", 18_000, policy)
    assert (third, due) == (RetryInfo("orders", 1, 7, 3, 10_000, "E: three"), None)  # dead
