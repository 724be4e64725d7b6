"""The checker's consumer-groups check (and the consumed records in checks 3-5) on
handcrafted histories of the real clients' workload (chaos/client_workload.py): each test
plants one anomaly and asserts the exact check and kind that report it."""

from __future__ import annotations

import pytest

from chaos.checker import OK, check
from chaos.history import Op
from tests.chaos.test_checker import PARTITIONS, N, assert_only, clean, count, val


def consume(p: int, offset: int, who: str = "consumer-0", t: float = 120.0) -> Op:
    return Op("consume", who, p, val(p, offset), offset, "ok", t, t)


def commit(p: int, offset: int, t: float, who: str = "consumer-0", status: str = "ok") -> Op:
    return Op("commit", who, p, None, offset, status, t, t + 0.2)


def committed(p: int, offset: int) -> Op:
    return Op("committed", "final-group", p, None, offset, "ok", 190.0, 190.5)


def group_history() -> list[Op]:
    """The clean history plus a group that consumed and committed everything, in two
    members' hands (partition 0 moved from consumer-0 to consumer-1 halfway)."""
    ops = clean()
    ops += [consume(0, i, "consumer-0" if i < 3 else "consumer-1", 120.0 + i) for i in range(N)]
    ops += [consume(1, i, "consumer-1", 120.0 + i) for i in range(N)]
    ops += [
        commit(0, 3, 130.0),
        commit(0, 5, 140.0, "consumer-1"),
        commit(1, 5, 141.0, "consumer-1"),
    ]
    ops += [committed(p, N) for p in PARTITIONS]
    return ops


def test_a_clean_group_history_passes() -> None:
    result = check(group_history())
    assert_only(result)
    assert result.get("consumer-groups").status == OK
    assert count(result, "consumer-groups", "commits_acked") == 3


def test_a_fixed_consumer_that_skips_or_goes_back_is_caught() -> None:
    ops = clean() + [consume(0, o, t=120.0 + k) for k, o in enumerate((0, 1, 3, 4, 2))]
    result = check(ops)
    assert_only(result, "consumer-groups")
    assert count(result, "consumer-groups", "consumer-skip") == 1
    assert count(result, "consumer-groups", "consumer-backwards") == 1


def test_a_commit_that_goes_back_after_a_newer_one_is_caught() -> None:
    ops = [*group_history(), commit(0, 2, 150.0, "consumer-0")]  # a zombie, old progress
    result = check(ops)
    assert_only(result, "consumer-groups")
    assert count(result, "consumer-groups", "commit-went-back-client") == 1
    assert count(result, "consumer-groups", "commit-went-back-coordinator") == 0
    example = result.get("consumer-groups").examples[0]
    assert example["side"] == "client" and example["later"]["process"] == "consumer-0"
    assert example["explanation"].startswith("client side: member consumer-0 committed")


def test_overlapping_commits_are_not_ordered() -> None:
    # Started before the commit of 5 was acknowledged (140.2): no order between them.
    ops = [*group_history(), commit(0, 4, 140.1, "consumer-0", status="ok")]
    assert check(ops).valid


def test_a_lost_commit_and_one_past_the_log_end_are_caught() -> None:
    ops = [op for op in group_history() if op.kind != "committed"]
    ops += [committed(0, 3), committed(1, N)]
    result = check(ops)
    assert_only(result, "consumer-groups")
    assert count(result, "consumer-groups", "commit-went-back-coordinator") == 1
    assert count(result, "consumer-groups", "commit-went-back-client") == 0
    example = result.get("consumer-groups").examples[0]
    assert example["side"] == "coordinator" and example["answered"] == 3
    assert example["acknowledged"] == 5
    assert example["explanation"].startswith("coordinator side: consumer-1's commit of offset 5")

    ops = [*group_history(), commit(1, N + 4, 150.0, "consumer-1")]
    result = check(ops)
    assert count(result, "consumer-groups", "commit-past-end") == 1


def test_a_commit_past_an_unconsumed_record_is_caught() -> None:
    history = group_history()
    skipped = next(op for op in history if op.kind == "consume" and op.partition == 1)
    result = check([op for op in history if op is not skipped])
    assert_only(result, "consumer-groups")
    assert count(result, "consumer-groups", "unconsumed-below-commit") == 1


def test_commits_never_read_back_are_a_violation() -> None:
    ops = [op for op in group_history() if op.kind != "committed"]
    ops.append(Op("committed", "final-group", status="fail", error="no controller"))
    result = check(ops)
    assert_only(result, "consumer-groups")
    assert count(result, "consumer-groups", "committed-unread") == 1


def test_a_consumer_that_broke_is_a_violation() -> None:
    ops = [*clean(), Op("consumer-error", "consumer-1", status="info", error="boom")]
    result = check(ops)
    assert_only(result, "consumer-groups")


@pytest.mark.parametrize(
    ("planted", "check_name", "kind"),
    [
        (Op("consume", "consumer-0", 0, "never:0:0", 1, "ok", 120, 120), "phantoms", "never-sent"),
        (
            Op("consume", "consumer-0", 0, val(0, 2), 1, "ok", 120, 120),
            "one-value-per-offset",
            "conflict",
        ),
        (Op("consume", "consumer-0", 0, val(0, 1), 9, "ok", 120, 120), "phantoms", "dirty-read"),
    ],
)
def test_consumed_records_are_held_to_the_read_checks(
    planted: Op, check_name: str, kind: str
) -> None:
    result = check([*clean(), planted])
    assert count(result, check_name, kind) == 1


def test_redelivery_at_the_same_offset_is_no_duplicate_but_two_offsets_are() -> None:
    again = [consume(0, 1, "consumer-1", 150.0)]
    assert check(group_history() + again, idempotent=True).valid
    twice = Op("final", "final-r1", 0, val(0, 1), N, "ok", 200.0, 200.1, N + 1, 1)
    result = check([*clean(), twice], idempotent=True)
    assert count(result, "duplicates", "duplicate") == 1


def test_records_retention_deleted_before_a_consumer_got_there_are_not_unconsumed() -> None:
    # The healthy replicas start at 2 (retention); a failed one still "starts" at 0. The
    # group never consumed offsets 0-1 of partition 0 (deleted before it got there).
    ops = [op for op in group_history() if not (op.kind == "consume" and op.partition == 0)]
    ops += [consume(0, i, "consumer-1", 125.0 + i) for i in range(2, N)]
    ops += [
        Op("range", f"final-r{r}", 0, None, 2 if r != 3 else 0, "ok", 200, 200, hw=N, replica=r)
        for r in (1, 2, 3)
    ]
    ops = [op for op in ops if not (op.kind == "status" and op.partition == 0 and op.replica == 3)]
    ops.append(Op("status", "status-3", 0, "REPLICA_FAILED", 210, 210, replica=3, error="CRC"))
    result = check(ops)
    assert count(result, "consumer-groups", "unconsumed-below-commit") == 0
    # Without retention the same gap is a violation: the group committed past them.
    ops = [op for op in ops if op.kind != "range"]
    result = check(ops)
    assert count(result, "consumer-groups", "unconsumed-below-commit") == 2


def test_a_coordinator_that_forgets_a_partition_goes_back_on_the_coordinator_side() -> None:
    # After the run the coordinator answers no committed offset (-1) for partition 1.
    ops = [op for op in group_history() if not (op.kind == "committed" and op.partition == 1)]
    result = check(ops)
    assert count(result, "consumer-groups", "commit-went-back-coordinator") == 1
    example = result.get("consumer-groups").examples[0]
    assert example["side"] == "coordinator" and example["partition"] == 1
    assert "answered no committed offset" in example["explanation"]
    assert_only(result, "consumer-groups")


def test_consumers_that_read_nothing_in_the_whole_run_are_a_violation() -> None:
    """Seed 7411's consumers never reached the cluster (TLS) and every check passed with
    nothing to check."""
    ops = [op for op in clean() if op.kind != "read"]
    result = check(ops)
    assert_only(result, "consumer-groups")
    assert count(result, "consumer-groups", "nothing-read") == 1
