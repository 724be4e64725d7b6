"""The message-feature checks (chaos/feature_checker.py) on handcrafted histories: each
test plants one anomaly in an otherwise clean history and asserts the check and kind
that report it."""

from __future__ import annotations

from chaos.checker import OK, check
from chaos.feature_checker import LATE_BOUND_MS, SETTLE_S
from chaos.feature_workload import delayed_value, matches, tags_of
from chaos.history import Op
from tests.chaos.test_checker import assert_only, clean, count, val

T0_MS = 1_700_000_000_000
"""Wall clock at recorder time 0 in these histories."""


def dsend(seq: int, at_s: float, delay_ms: int, status: str = "ok") -> Op:
    sent_ms = T0_MS + int(at_s * 1000)
    value = delayed_value("delayed-producer-0", seq % 3, seq, sent_ms + delay_ms)
    return Op(
        "delayed-send",
        "delayed-producer-0",
        seq % 3,
        value,
        None,
        status,
        at_s,
        at_s + 0.1,
        wall_ms=sent_ms,
    )


def dconsume(send: Op, offset: int, late_ms: int) -> Op:
    assert send.value is not None
    due_ms = int(send.value.rsplit("@", 1)[1])
    at_ms = due_ms + late_ms
    at_s = (at_ms - T0_MS) / 1000
    return Op(
        "delayed-consume",
        "delayed-consumer-0",
        send.partition,
        send.value,
        offset,
        "ok",
        at_s,
        at_s,
        wall_ms=at_ms,
    )


def delayed_history() -> tuple[list[Op], list[Op]]:
    """The clean history (its one fault ends at 90 s) plus delayed records due after the
    fault settled, each delivered 200 ms late."""
    sends = [dsend(seq, 100.0 + seq, 2_000) for seq in range(6)]
    consumes = [dconsume(s, seq // 3, 200) for seq, s in enumerate(sends)]
    return clean() + sends + consumes, sends


def test_a_clean_delayed_history_passes() -> None:
    ops, _ = delayed_history()
    result = check(ops, idempotent=True)
    assert_only(result)
    assert result.get("delayed").status == OK
    assert count(result, "delayed", "late_checked") == 6
    assert count(result, "delayed", "lateness_p50_ms") == 200


def test_an_early_a_lost_and_a_twice_delivered_record_are_caught() -> None:
    ops, sends = delayed_history()
    ops = [op for op in ops if not (op.kind == "delayed-consume" and op.value == sends[1].value)]
    ops += [dconsume(sends[2], 7, 200), dconsume(sends[3], 8, 0)]
    ops = [op for op in ops if not (op.kind == "delayed-consume" and op.value == sends[4].value)]
    ops.append(dconsume(sends[4], 1, -50))
    result = check(ops, idempotent=True)
    assert_only(result, "delayed")
    assert count(result, "delayed", "delayed-lost") == 1
    assert count(result, "delayed", "delayed-duplicate") == 2
    assert count(result, "delayed", "delayed-early") == 1


def test_two_offsets_are_no_violation_without_idempotence() -> None:
    ops, sends = delayed_history()
    ops.append(dconsume(sends[0], 9, 300))
    assert check(ops).valid


def test_lateness_counts_only_outside_fault_windows() -> None:
    ops, _ = delayed_history()
    slow = dsend(10, 50.0, 1_000)  # due during the clean history's fault (1 s to 90 s)
    ops += [slow, dconsume(slow, 5, 30_000)]
    assert check(ops, idempotent=True).valid
    late = dsend(11, 90.0 + SETTLE_S + 5, 1_000)
    ops += [late, dconsume(late, 6, LATE_BOUND_MS + 1)]
    result = check(ops, idempotent=True)
    assert_only(result, "delayed")
    assert count(result, "delayed", "delayed-late") == 1


def test_an_indeterminate_send_may_be_missing_and_a_phantom_is_caught() -> None:
    ops, _ = delayed_history()
    ops.append(dsend(20, 120.0, 1_000, status="info"))
    assert check(ops, idempotent=True).valid
    ghost = dsend(21, 120.0, 1_000)
    ops.append(dconsume(ghost, 11, 10))
    result = check(ops, idempotent=True)
    assert_only(result, "delayed")
    assert count(result, "delayed", "delayed-phantom") == 1


def tconsume(p: int, offset: int) -> Op:
    return Op("tag-consume", "tag-consumer-0", p, val(p, offset), offset, "ok", 120.0, 120.0)


def test_the_tag_functions_give_a_mix() -> None:
    assert {len(tags_of(s)) for s in range(64)} == {0, 1, 2, 3}
    assert 0 < sum(matches(s) for s in range(64)) < 64


def _renamed(op: Op) -> Op:
    if op.value is None or op.kind not in ("send", "read", "final"):
        return op
    p, seq = op.partition, int(op.value.rsplit(":", 1)[1])
    process = f"producer-{p}" if op.kind == "send" else op.process
    return Op(
        op.kind,
        process,
        p,
        f"producer-{p}:{p}:{seq}",
        op.offset,
        op.status,
        op.start,
        op.end,
        op.hw,
        op.replica,
        op.error,
    )


def tag_ops() -> list[Op]:
    ops = [_renamed(op) for op in clean()]
    for op in ops:
        if op.kind == "send" and op.status == "ok" and op.offset is not None:
            seq = int((op.value or "").rsplit(":", 1)[1])
            if matches(seq):
                ops.append(
                    Op(
                        "tag-consume",
                        "tag-consumer-0",
                        op.partition,
                        op.value,
                        op.offset,
                        "ok",
                        120.0,
                        120.0,
                    )
                )
    return ops


def test_a_filtered_consumer_that_got_every_match_passes() -> None:
    result = check(tag_ops())
    assert_only(result)
    assert count(result, "tag-filter", "matching_checked") > 0


def test_a_missed_match_and_a_delivered_mismatch_are_caught() -> None:
    ops = tag_ops()
    got = [op for op in ops if op.kind == "tag-consume"]
    ops.remove(got[0])
    ops.append(
        Op(
            "tag-consume",
            "tag-consumer-0",
            got[1].partition,
            got[1].value,
            got[1].offset,
            "ok",
            121.0,
            121.0,
        )
    )  # seen twice: fine
    miss = next(
        op
        for op in ops
        if op.kind == "send" and op.value and not matches(int(op.value.rsplit(":", 1)[1]))
    )
    ops.append(
        Op(
            "tag-consume",
            "tag-consumer-0",
            miss.partition,
            miss.value,
            miss.offset,
            "ok",
            122.0,
            122.0,
        )
    )
    ops += [
        Op("tag-position", "tag-consumer-0", p, None, 100, "ok", 130.0, 130.0)
        for p in {op.partition for op in got}
    ]
    result = check(ops)
    assert_only(result, "tag-filter")
    assert count(result, "tag-filter", "tag-missed") == 1
    assert count(result, "tag-filter", "tag-mismatch") == 1


def test_a_feature_consumer_that_broke_is_a_violation() -> None:
    ops = [
        *tag_ops(),
        Op(
            "feature-error",
            "tag-consumer-0",
            status="info",
            start=50.0,
            end=50.0,
            error="ClientError: boom",
        ),
    ]
    result = check(ops)
    assert_only(result, "feature-consumers")
