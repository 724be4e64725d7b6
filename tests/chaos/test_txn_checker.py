"""The transactional checks (chaos/txn_checker.py) on handcrafted histories.

Each test starts from a clean pipeline history (the main checker's clean history as the
input topic, a worker's transactions turning it into outputs, a direct producer's
transactions, one read_committed and one read_uncommitted reader, a final read), plants
one anomaly, and asserts the exact check and kind that must report it, so no check is
one that can never fail."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from chaos.checker import NOT_APPLICABLE, OK, VIOLATED, CheckResult, check
from chaos.history import Op, txn_value
from tests.chaos.test_checker import assert_only, clean, count

TXN_CHECKS = (
    "txn-aborted-read",
    "txn-uncommitted-read",
    "txn-torn",
    "txn-lost",
    "txn-exactly-once",
    "txn-offsets",
    "txn-positions",
    "txn-polls",
)
WORKER = "txn-worker-0"
DIRECT = "txn-producer-0"
RC = "read_committed-0"
RU = "read_uncommitted-0"


@dataclass
class T:
    """A transaction to build: its writes (output partition, input or None), in order."""

    txn: str
    status: str
    writes: list[tuple[int, tuple[int, int] | None]]
    asked_at: float
    offsets: dict[int, int] = field(default_factory=dict)

    @property
    def process(self) -> str:
        return self.txn.split("#")[0]


def pipeline(skip_input: tuple[int, int] | None = None) -> list[T]:
    """The worker's three transactions over inputs 0..4 of partitions 0 and 1 (the
    second aborted and redone by the third), then the direct producer's three (one
    aborted on purpose, one of unknown outcome that the final read shows committed)."""
    redo = [(0, (0, 2)), (0, (0, 3)), (0, (0, 4)), *((1, (1, o)) for o in range(1, 5))]
    redo = [w for w in redo if w[1] != skip_input]
    return [
        T(f"{WORKER}#1", "ok", [(0, (0, 0)), (0, (0, 1)), (1, (1, 0))], 20.0, {0: 2, 1: 1}),
        T(f"{WORKER}#2", "fail", [(0, (0, 2)), (1, (1, 1))], 30.0, {0: 3, 1: 2}),
        T(f"{WORKER}#3", "ok", redo, 40.0, {0: 5, 1: 5}),
        T(f"{DIRECT}#1", "ok", [(0, None)], 50.0),
        T(f"{DIRECT}#2", "fail", [(1, None)], 55.0),
        T(f"{DIRECT}#3", "info", [(0, None), (1, None)], 60.0),
    ]


def build(txns: list[T], committed: dict[int, int] | None = None) -> list[Op]:
    """The main topic's clean history plus ``txns`` written in order (offsets assigned
    per output partition), read by both readers at t=100, finally read at t=200."""
    ops = clean()
    next_offset = {0: 0, 1: 0}
    writes: list[tuple[T, Op]] = []
    for t in txns:
        for index, (p, src) in enumerate(t.writes):
            value = txn_value(t.txn, index, src)
            op = Op("txn-write", t.process, p, value, next_offset[p], "ok", t.asked_at - 1, 0)
            next_offset[p] += 1
            writes.append((t, replace(op, end=t.asked_at - 0.5)))
    ops += [w for _, w in writes]
    ops += _worker_ops(txns)
    for t in txns:
        ops += [
            Op("txn-offsets", t.process, p, t.txn, o, "ok", t.asked_at - 0.5, t.asked_at - 0.4)
            for p, o in sorted(t.offsets.items())
        ]
        ops.append(
            Op(
                "txn",
                t.process,
                value=t.txn,
                status=t.status,
                start=t.asked_at,
                end=t.asked_at + 1,
                error=None if t.status == "ok" else "test",
            )
        )
    visible = [w for t, w in writes if t.status != "fail"]
    for p in (0, 1):
        mine = sorted((w for _, w in writes if w.partition == p), key=lambda w: w.offset or 0)
        ops += [_read(RU, w, 100.0) for w in mine]
        ops += [_read(RC, w, 100.0) for w in mine if w in visible]
    ops += [replace(_read("final-read_committed", w, 200.0), kind="txn-final") for w in visible]
    for p in (0, 1):
        ops.append(
            Op(
                "txn-range",
                "final-read_committed",
                p,
                str(next_offset[p]),
                0,
                "ok",
                200,
                200,
                hw=next_offset[p],
            )
        )
    for p, o in sorted((committed or {0: 5, 1: 5}).items()):
        ops.append(Op("txn-committed", "final-group", p, None, o, "ok", 190.0, 190.5))
    return ops


def _worker_ops(txns: list[T]) -> list[Op]:
    """The worker's program: assigned both partitions, it consumes each transaction's
    inputs before it, and after an aborted one seeks back to the committed offsets."""
    ops = [Op("txn-assign", WORKER, p, "assign", start=5.0, end=5.0) for p in (0, 1)]
    committed = {0: 0, 1: 0}
    for t in txns:
        if t.process != WORKER:
            continue
        for _, src in t.writes:
            assert src is not None
            ops.append(
                Op(
                    "txn-consume",
                    WORKER,
                    src[0],
                    f"in-{src}",
                    src[1],
                    "ok",
                    t.asked_at - 2,
                    t.asked_at - 2,
                )
            )
        if t.status == "ok":
            committed.update(t.offsets)
        else:
            ops += [
                Op("txn-seek", WORKER, p, "committed", o, "ok", t.asked_at + 2, t.asked_at + 2)
                for p, o in sorted(committed.items())
            ]
    return ops


def _read(reader: str, w: Op, t: float) -> Op:
    return Op(
        "txn-read",
        reader,
        w.partition,
        w.value,
        w.offset,
        "ok",
        t + (w.offset or 0),
        t + (w.offset or 0) + 0.1,
    )


def the(ops: list[Op], kind: str, value: str, process: str | None = None) -> Op:
    """The one op of ``kind`` with ``value`` (and ``process``)."""
    found = [
        o
        for o in ops
        if o.kind == kind and o.value == value and (process is None or o.process == process)
    ]
    assert len(found) == 1, found
    return found[0]


def swap(ops: list[Op], old: Op, new: Op | None) -> list[Op]:
    i = ops.index(old)
    return ops[:i] + ([new] if new is not None else []) + ops[i + 1 :]


def kinds(result: CheckResult, name: str) -> dict[str, float]:
    return {k: v for k, v in result.get(name).counts.items() if v}


# --------------------------------------------------------------------------- clean


def test_a_clean_transactional_history_passes_every_check() -> None:
    result = check(build(pipeline()))
    assert_only(result)
    assert [c.name for c in result.checks][-len(TXN_CHECKS) :] == list(TXN_CHECKS)
    assert all(result.get(name).status == OK for name in TXN_CHECKS)
    assert result.summary["transactions"] == {
        "committed": 3,
        "aborted": 2,
        "unknown": 1,
        "unknown_resolved_committed": 1,
        "unresolved": 0,
        "writes": 16,
        "reads": 29,
        "finals": 13,
        "errors": 0,
        "malformed_ops": 0,
    }
    assert count(result, "txn-lost", "committed_writes") == 11
    assert count(result, "txn-exactly-once", "inputs_below_commit") == 10
    assert count(result, "txn-torn", "writes_read_past") > 0


def test_a_history_without_transactions_has_no_transactional_reports() -> None:
    result = check(clean())
    assert not any(c.name.startswith("txn") for c in result.checks)
    assert "transactions" not in result.summary


# --------------------------------------------------------------------------- 1. G1a


@pytest.mark.parametrize("where", ["live", "final"])
def test_a_read_committed_read_of_an_aborted_write_is_g1a(where: str) -> None:
    ops = build(pipeline())
    aborted = the(ops, "txn-write", txn_value(f"{DIRECT}#2", 0))
    seen = _read(RC, aborted, 100.0)
    if where == "live":  # in its place among the reader's reads of partition 1
        later = [i for i, o in enumerate(ops) if o.process == RC and o.partition == 1]
        ops.insert(later[-1], seen)
    else:
        ops.append(replace(seen, kind="txn-final", process="final"))
    result = check(ops)
    assert_only(result, "txn-aborted-read")
    assert kinds(result, "txn-aborted-read")["aborted-read"] == 1
    assert "aborted" in result.get("txn-aborted-read").examples[0]["explanation"]


# --------------------------------------------------------------------------- 2. uncommitted


def test_a_read_committed_read_before_the_commit_was_asked_for_is_caught() -> None:
    ops = build(pipeline())
    early = the(ops, "txn-read", txn_value(f"{WORKER}#1", 0, (0, 0)), RC)
    ops = swap(ops, early, replace(early, start=10.0, end=10.1))
    result = check(ops)
    assert_only(result, "txn-uncommitted-read")
    assert kinds(result, "txn-uncommitted-read")["read-before-commit"] == 1


def test_an_unknown_transaction_partly_visible_in_the_final_read_is_caught() -> None:
    ops = build(pipeline())
    half = the(ops, "txn-final", txn_value(f"{DIRECT}#3", 1))
    result = check(swap(ops, half, None))
    assert_only(result, "txn-uncommitted-read")
    assert kinds(result, "txn-uncommitted-read")["unknown-partly-visible"] == 1


def test_an_unknown_transaction_read_live_then_missing_from_the_final_read_is_caught() -> None:
    ops = build(pipeline())
    for v in (txn_value(f"{DIRECT}#3", 0), txn_value(f"{DIRECT}#3", 1)):
        ops = swap(ops, the(ops, "txn-final", v), None)
    result = check(ops)
    assert_only(result, "txn-uncommitted-read")
    assert kinds(result, "txn-uncommitted-read")["unknown-seen-then-gone"] == 2


def test_an_unknown_transaction_wholly_invisible_resolves_as_aborted() -> None:
    ops = build(pipeline())
    for v in (txn_value(f"{DIRECT}#3", 0), txn_value(f"{DIRECT}#3", 1)):
        ops = swap(ops, the(ops, "txn-final", v), None)
        ops = swap(ops, the(ops, "txn-read", v, RC), None)
    result = check(ops)
    assert_only(result)
    assert count(result, "txn-uncommitted-read", "resolved_aborted") == 1


# --------------------------------------------------------------------------- 3. torn


def test_a_reader_that_returns_part_of_a_committed_transaction_is_torn() -> None:
    ops = build(pipeline())
    part = the(ops, "txn-read", txn_value(f"{WORKER}#3", 4, (1, 2)), RC)
    result = check(swap(ops, part, None))
    assert_only(result, "txn-torn")
    assert kinds(result, "txn-torn")["torn"] == 1


def test_a_reader_that_skips_a_whole_committed_transaction_is_caught() -> None:
    ops = build(pipeline())
    whole = the(ops, "txn-read", txn_value(f"{DIRECT}#1", 0), RC)
    result = check(swap(ops, whole, None))
    assert_only(result, "txn-torn")
    assert kinds(result, "txn-torn")["skipped-committed"] == 1


# --------------------------------------------------------------------------- 4. lost


def test_a_committed_write_missing_from_the_final_read_is_lost() -> None:
    ops = build(pipeline())
    gone = the(ops, "txn-final", txn_value(f"{WORKER}#3", 1, (0, 3)))
    result = check(swap(ops, gone, None))
    assert_only(result, "txn-lost")
    assert kinds(result, "txn-lost")["lost"] == 1


def test_a_final_read_stuck_below_committed_writes_reports_them_unread() -> None:
    ops = build(pipeline())
    rng = next(o for o in ops if o.kind == "txn-range" and o.partition == 0)
    ops = [
        o for o in ops if not (o.kind == "txn-final" and o.partition == 0 and (o.offset or 0) >= 5)
    ]
    ops = swap(ops, rng, replace(rng, value="5", error="LSO stuck"))
    result = check(ops)
    assert kinds(result, "txn-lost") == {
        "committed_txns": 3,
        "committed_writes": 11,
        "final_reads": 10,
        "unread": 2,
    }
    assert "LSO stuck" in result.get("txn-lost").examples[0]["explanation"]


def test_writes_below_the_final_log_start_were_deleted_not_lost() -> None:
    ops = build(pipeline())
    rng = next(o for o in ops if o.kind == "txn-range" and o.partition == 0)
    ops = [
        o
        for o in ops
        if not (o.kind in ("txn-final", "txn-read") and o.partition == 0 and (o.offset or 0) < 4)
    ]
    result = check(swap(ops, rng, replace(rng, offset=4)))
    assert_only(result)
    assert count(result, "txn-lost", "deleted_by_retention") == 3


# --------------------------------------------------------------------------- 5. exactly once


def test_two_committed_outputs_for_one_input_are_a_duplicate() -> None:
    txns = [*pipeline(), T("txn-worker-1#1", "ok", [(1, (0, 4))], 70.0, {0: 5})]
    result = check(build(txns))
    assert_only(result, "txn-exactly-once")
    assert kinds(result, "txn-exactly-once")["duplicate"] == 1


def test_an_input_below_the_committed_offset_without_an_output_is_missing() -> None:
    result = check(build(pipeline(skip_input=(0, 3))))
    assert_only(result, "txn-exactly-once")
    assert kinds(result, "txn-exactly-once")["missing"] == 1


# --------------------------------------------------------------------------- 6. offsets


def test_a_transaction_carrying_a_position_its_outputs_do_not_match_is_caught() -> None:
    ops = build(pipeline())
    carried = next(
        o for o in ops if o.kind == "txn-offsets" and o.value == f"{WORKER}#3" and o.partition == 1
    )
    result = check(swap(ops, carried, replace(carried, offset=4)))
    assert_only(result, "txn-offsets")
    assert kinds(result, "txn-offsets")["txn-offset-mismatch"] == 1


def test_a_final_committed_offset_past_the_outputs_is_caught() -> None:
    result = check(build(pipeline(), committed={0: 6, 1: 5}))
    assert_only(result, "txn-offsets")
    assert kinds(result, "txn-offsets")["commit-past-outputs"] == 1


def test_a_final_committed_offset_behind_an_output_is_caught_on_both_sides() -> None:
    """Behind the last output: the input would be processed again (offsets), and behind
    what a transaction acknowledged committing (positions: the group lost it)."""
    result = check(build(pipeline(), committed={0: 4, 1: 5}))
    assert_only(result, "txn-offsets", "txn-positions")
    assert kinds(result, "txn-offsets")["commit-behind-output"] == 1
    assert kinds(result, "txn-positions")["committed-went-back"] == 1


# --------------------------------------------------------------------------- 7. positions


def test_a_worker_consuming_backwards_within_a_tenure_is_caught() -> None:
    ops = build(pipeline())
    last = max(i for i, o in enumerate(ops) if o.kind == "txn-consume")
    again = replace(ops[last], offset=1, value="in-(1, 1)")
    result = check([*ops[: last + 1], again, *ops[last + 1 :]])
    assert_only(result, "txn-positions")
    assert kinds(result, "txn-positions")["position-backwards"] == 1


def test_going_back_after_a_seek_or_a_new_assignment_is_allowed() -> None:
    ops = build(pipeline())
    last = max(i for i, o in enumerate(ops) if o.kind == "txn-consume")
    again = [
        Op("txn-assign", WORKER, 1, "revoke", start=45, end=45),
        Op("txn-assign", WORKER, 1, "assign", start=46, end=46),
        replace(ops[last], offset=4, start=47, end=47),
    ]
    result = check(ops[: last + 1] + again + ops[last + 1 :])
    assert result.get("txn-positions").status == OK


def test_a_committed_offset_read_behind_an_acknowledged_commit_went_back() -> None:
    ops = build(pipeline())
    seek = next(o for o in ops if o.kind == "txn-seek" and o.partition == 0)
    result = check(swap(ops, seek, replace(seek, offset=1)))
    assert_only(result, "txn-positions")
    assert kinds(result, "txn-positions")["committed-went-back"] == 1


# --------------------------------------------------------------------------- 8. polls


def test_a_reader_going_back_is_a_nonmonotonic_poll() -> None:
    ops = build(pipeline())
    first = the(ops, "txn-read", txn_value(f"{WORKER}#1", 0, (0, 0)), RU)
    result = check([*ops, replace(first, start=300, end=300)])
    assert_only(result, "txn-polls")
    assert kinds(result, "txn-polls")["nonmonotonic"] == 1


def test_a_reader_restarted_by_a_seek_may_read_again() -> None:
    ops = build(pipeline())
    first = the(ops, "txn-read", txn_value(f"{WORKER}#1", 0, (0, 0)), RU)
    restart = Op("txn-seek", RU, 0, "restart", 0, "ok", 299, 299)
    result = check([*ops, restart, replace(first, start=300, end=300)])
    assert result.get("txn-polls").status == OK


def test_a_read_uncommitted_reader_that_skips_an_offset_is_caught() -> None:
    ops = build(pipeline())
    aborted = the(ops, "txn-read", txn_value(f"{WORKER}#2", 0, (0, 2)), RU)
    result = check(swap(ops, aborted, None))
    assert_only(result, "txn-polls")
    assert kinds(result, "txn-polls")["skip"] == 1


def test_a_value_nobody_wrote_or_read_at_another_offset_is_caught() -> None:
    ops = build(pipeline())
    aborted = the(ops, "txn-read", txn_value(f"{WORKER}#2", 1, (1, 1)), RU)
    moved = replace(aborted, value=txn_value(f"{WORKER}#3", 3, (1, 1)))
    phantom = Op("txn-read", RC, 1, "txn-worker-9#1/0", 99, "ok", 400, 400)
    result = check([*swap(ops, aborted, moved), phantom])
    assert_only(result, "txn-polls")
    assert kinds(result, "txn-polls")["offset-mismatch"] == 1
    assert kinds(result, "txn-polls")["phantom"] == 1


# --------------------------------------------------------------------------- applicability


def test_transactional_checks_without_readers_or_a_pipeline_are_not_applicable() -> None:
    ops = [
        *clean(),
        Op("txn-write", DIRECT, 0, txn_value(f"{DIRECT}#1", 0), 0, "ok", 1, 2),
        Op("txn", DIRECT, value=f"{DIRECT}#1", status="fail", start=3, end=4),
    ]
    result = check(ops)
    assert result.valid
    statuses = {name: result.get(name).status for name in TXN_CHECKS}
    assert statuses["txn-aborted-read"] == OK
    assert statuses["txn-torn"] == NOT_APPLICABLE
    assert statuses["txn-exactly-once"] == NOT_APPLICABLE
    assert VIOLATED not in statuses.values()
