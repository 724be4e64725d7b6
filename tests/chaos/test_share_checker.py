"""The share group checks (chaos/share_checker.py) on handcrafted histories: a clean one
passes, and each test plants one anomaly and asserts the check and kind that report it."""

from __future__ import annotations

from chaos.checker import check
from chaos.history import Op, send_value
from chaos.share_workload import DELIVERY_LIMIT, LOCK_DURATION_MS_VALUE, POISON_EVERY, is_poison
from tests.chaos.test_checker import assert_only, clean, count

T0_MS = 1_700_000_000_000
LOCK = LOCK_DURATION_MS_VALUE


def value(seq: int) -> str:
    return send_value("share-producer-0", 0, seq)


def sent(seq: int, offset: int) -> Op:
    return Op("share-send", "share-producer-0", 0, value(seq), offset, "ok", 1.0, 1.1)


def recv(member: str, seq: int, offset: int, n: int, at_ms: int) -> Op:
    return Op(
        "share-receive",
        member,
        0,
        value(seq),
        offset,
        "ok",
        2.0,
        2.0,
        wall_ms=T0_MS + at_ms,
        count=n,
        deadline_ms=T0_MS + at_ms + LOCK,
    )


def ack(member: str, offset: int, kind: str, at_ms: int, status: str = "ok") -> Op:
    return Op(
        "share-ack",
        member,
        0,
        kind,
        offset,
        status,
        3.0,
        3.0,
        wall_ms=T0_MS + at_ms + 5,
        start_ms=T0_MS + at_ms,
        last_offset=offset,
    )


def dlq(seq: int, offset: int, attempts: int) -> Op:
    return Op(
        "share-dlq", "share-dlq-reader", 0, value(seq), offset, "ok", 9.0, 9.0, count=attempts
    )


def happy() -> list[Op]:
    """Record 1 accepted at once; record 2 released by m1 and accepted by m2; record 3
    left by a crashed member, its lock expired, accepted by m2; a poison record released
    until the limit and dead-lettered."""
    poison = POISON_EVERY
    assert is_poison(value(poison))
    ops = [sent(1, 0), sent(2, 1), sent(3, 2), sent(poison, 3)]
    ops += [recv("m1", 1, 0, 1, 0), ack("m1", 0, "ACCEPT", 10)]
    ops += [recv("m1", 2, 1, 1, 0), ack("m1", 1, "RELEASE", 10)]
    ops += [recv("m2", 2, 1, 2, 20), ack("m2", 1, "ACCEPT", 30)]
    ops += [recv("m3", 3, 2, 1, 0), Op("share-crash", "m3", wall_ms=T0_MS + 50)]
    ops += [recv("m2", 3, 2, 2, LOCK + 10), ack("m2", 2, "ACCEPT", LOCK + 20)]
    for n in range(1, DELIVERY_LIMIT + 1):
        at = 100 * n
        ops += [recv(f"m{n}", poison, 3, n, at), ack(f"m{n}", 3, "RELEASE", at + 10)]
    ops.append(dlq(poison, 3, DELIVERY_LIMIT))
    return ops


def test_a_clean_share_history_passes() -> None:
    result = check(clean() + happy())
    assert_only(result)
    summary = result.summary["share_group"]
    assert summary["accepted"] == 3 and summary["dead_lettered"] == 1


def test_a_record_never_settled_is_lost() -> None:
    ops = [*happy(), sent(5, 4), recv("m1", 5, 4, 1, 0)]
    result = check(clean() + ops)
    assert_only(result, "share-settled")
    assert count(result, "share-settled", "share-lost") == 1


def test_a_poison_record_missing_from_the_dead_letters_is_lost() -> None:
    ops = [op for op in happy() if op.kind != "share-dlq"]
    result = check(clean() + ops)
    assert_only(result, "share-settled")


def test_a_delivery_inside_another_members_lock_is_a_double_acquisition() -> None:
    ops = [*happy(), sent(6, 5), recv("m1", 6, 5, 1, 0), recv("m2", 6, 5, 2, LOCK - 100)]
    ops.append(ack("m2", 5, "ACCEPT", LOCK))
    result = check(clean() + ops)
    assert_only(result, "share-exclusive")
    assert count(result, "share-exclusive", "share-double-acquired") == 1


def test_two_members_with_the_same_delivery_count_is_a_double_acquisition() -> None:
    ops = [*happy(), sent(6, 5), recv("m1", 6, 5, 1, 0), recv("m2", 6, 5, 1, LOCK + 5)]
    ops.append(ack("m2", 5, "ACCEPT", LOCK + 10))
    result = check(clean() + ops)
    assert_only(result, "share-exclusive")


def test_a_delivery_count_that_goes_back_or_past_the_limit_is_reported() -> None:
    ops = [*happy(), sent(6, 5), recv("m1", 6, 5, 2, 0), recv("m2", 6, 5, 1, LOCK + 5)]
    ops.append(ack("m2", 5, "ACCEPT", LOCK + 10))
    result = check(clean() + ops)
    assert "share-delivery-counts" in {c.name for c in result.checks if not c.ok}
    assert count(result, "share-delivery-counts", "share-count-back") == 1
    over = [*happy(), sent(7, 6), recv("m1", 7, 6, DELIVERY_LIMIT + 1, 0)]
    over.append(ack("m1", 6, "ACCEPT", 10))
    result = check(clean() + over)
    assert_only(result, "share-delivery-counts")
    assert count(result, "share-delivery-counts", "share-over-limit") == 1


def test_a_delivery_after_a_committed_accept_is_an_accept_lost() -> None:
    ops = [*happy(), recv("m4", 1, 0, 2, LOCK + 500)]
    result = check(clean() + ops)
    assert "share-accepts-kept" in {c.name for c in result.checks if not c.ok}
    assert count(result, "share-accepts-kept", "share-accept-lost") == 1


def test_dead_letters_only_after_the_limit_or_a_reject() -> None:
    early = [*happy(), sent(8, 7), recv("m1", 8, 7, 1, 0), dlq(8, 7, 1)]
    result = check(clean() + early)
    assert_only(result, "share-accepts-kept")
    assert count(result, "share-accepts-kept", "share-dead-lettered-early") == 1
    rejected = [*happy(), sent(8, 7), recv("m1", 8, 7, 1, 0), ack("m1", 7, "REJECT", 10)]
    rejected.append(dlq(8, 7, 1))
    assert_only(check(clean() + rejected))
    unknown = [*happy(), sent(8, 7), recv("m1", 8, 7, 1, 0), ack("m1", 7, "REJECT", 10, "info")]
    unknown.append(dlq(8, 7, 1))  # the REJECT was done before its leader failed
    assert_only(check(clean() + unknown))


def test_a_member_that_raised_is_reported() -> None:
    ops = [*happy(), Op("share-error", "m1", status="info", start=5.0, end=5.0, error="boom")]
    assert_only(check(clean() + ops), "share-members")


def test_an_accept_of_unknown_outcome_settles_a_record_nothing_delivered_again() -> None:
    """The leader failed after committing the ACCEPT and before answering; the retry was
    refused (the record was no longer held): OUTCOME_UNKNOWN, so ``info``."""
    settled = [*happy(), sent(9, 8), recv("m1", 9, 8, 1, 0), ack("m1", 8, "ACCEPT", 10, "info")]
    assert_only(check(clean() + settled))
    again = [*settled, recv("m2", 9, 8, 2, LOCK + 10)]
    result = check(clean() + again)
    assert_only(result, "share-settled")
    assert count(result, "share-settled", "share-lost") == 1
