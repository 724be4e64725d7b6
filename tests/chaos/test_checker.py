"""The chaos checker on handcrafted histories.

Each test starts from a clean history (two partitions, three replicas, one producer and
one live reader per partition), plants one kind of anomaly, and asserts the exact check
and violation kind that must report it, so removing that check (or that branch of it)
fails the test. Where the anomaly should trip nothing else, the test says so too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from chaos import history
from chaos.checker import (
    MAX_EXAMPLES,
    NOT_APPLICABLE,
    OK,
    VIOLATED,
    CheckResult,
    check,
    check_file,
    format_lines,
    format_table,
)
from chaos.history import Op, send_value

N = 5  # records per partition in the clean history
PARTITIONS = (0, 1)
REPLICAS = (1, 2, 3)
ALL_CHECKS = (
    "lost",
    "replicas",
    "one-value-per-offset",
    "duplicates",
    "phantoms",
    "order",
    "consumer-groups",
    "recovery",
    "leaderless",
    "health",
    "replication",
)


def producer(p: int) -> str:
    return f"prod{p}"


def val(p: int, seq: int) -> str:
    return send_value(producer(p), p, seq)


def send(p: int, seq: int, offset: int | None, status: str = "ok", t: float = 0.0) -> Op:
    return Op("send", producer(p), p, val(p, seq), offset, status, start=t, end=t + 0.5)


def read(p: int, offset: int, value: str, hw: int, t: float = 100.0, reader: str = "") -> Op:
    return Op("read", reader or f"reader{p}", p, value, offset, "ok", t, t + 0.1, hw=hw)


def final(p: int, offset: int, value: str, hw: int, replica: int) -> Op:
    return Op("final", f"final-r{replica}", p, value, offset, "ok", 200.0, 200.1, hw, replica)


def digest(p: int, offset: int, replica: int, value: str | None = None) -> Op:
    return Op("digest", "checker", p, value or f"sha-{p}-{offset}", offset, replica=replica)


def recovery(seconds: str = "2.5", status: str = "ok") -> Op:
    return Op("recovery", "nemesis", value=seconds, status=status, start=150.0, end=152.5)


def leader(p: int, leaders: str, t: float) -> Op:
    return Op("leader", "monitor", p, leaders, start=t, end=t)


def status(broker: int, p: int, value: str, reason: str | None = None) -> Op:
    return Op(
        "status", f"status-{broker}", p, value, start=210, end=210, replica=broker, error=reason
    )


def clean(n: int = N, partitions: tuple[int, ...] = PARTITIONS) -> list[Op]:
    """A history that keeps every promise: acks, in-order reads, identical finals, a
    leader all along, every broker serving and every replica sound at the end."""
    ops = [Op("fault", "nemesis", value="partition {1} from {2,3}", status="start", start=1)]
    ops += [leader(p, "1", 0.5) for p in partitions]
    for p in partitions:
        ops += [send(p, i, i, t=10.0 * i + p) for i in range(n)]
        ops += [read(p, i, val(p, i), hw=i + 1, t=10.0 * i + p + 1) for i in range(n)]
    ops.append(Op("fault", "nemesis", value="heal", status="end", start=90))
    ops.append(recovery())
    for p in partitions:
        for r in REPLICAS:
            ops += [final(p, i, val(p, i), n, r) for i in range(n)]
            ops.append(digest(p, n, r))
    for r in REPLICAS:
        ops.append(status(r, -1, "SERVING"))
        ops += [status(r, p, "REPLICA_OK") for p in partitions]
    return ops


def without(ops: list[Op], *drop: Op) -> list[Op]:
    gone = set(drop)
    assert all(op in ops for op in gone), "the test meant to drop an op that is not there"
    return [op for op in ops if op not in gone]


def statuses(result: CheckResult) -> dict[str, str]:
    return {c.name: c.status for c in result.checks}


def assert_only(result: CheckResult, *violated: str) -> None:
    """Exactly the named checks are violated; the rest are ok (or not applicable)."""
    bad = {name for name, status in statuses(result).items() if status == VIOLATED}
    assert bad == set(violated), result.to_dict()
    assert result.valid is (not violated)


def count(result: CheckResult, check_name: str, kind: str) -> float:
    return result.get(check_name).counts[kind]


# --------------------------------------------------------------------------- clean


def test_clean_history_passes_every_check() -> None:
    result = check(clean())
    assert_only(result)
    assert [c.name for c in result.checks] == list(ALL_CHECKS)
    assert statuses(result)["consumer-groups"] == NOT_APPLICABLE
    assert statuses(result)["replication"] == NOT_APPLICABLE  # no broker died for good
    assert all(
        c.status == OK for c in result.checks if c.name not in ("consumer-groups", "replication")
    ), result.to_dict()
    assert result.summary == {
        "sends_attempted": 10,
        "sends_acked": 10,
        "sends_failed": 0,
        "sends_indeterminate": 0,
        "reads": 10,
        "finals": 30,
        "digests": 6,
        "faults_started": 1,
        "faults_ended": 1,
        "recoveries": 1,
        "partitions": 2,
        "malformed_ops": 0,
        "unknown_kinds": {},
        "metrics": {"samples": 0},
    }
    assert count(result, "lost", "acked") == 10
    assert count(result, "replicas", "replica_record_pairs") == 30
    assert count(result, "order", "reader_steps") == 8
    assert all(not c.examples for c in result.checks)


def test_result_is_json_serialisable_and_printable() -> None:
    ops = clean()
    ops.append(send(0, 9, 0))  # a second ack at offset 0: conflict, lost, reorder
    result = check(ops)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["valid"] is False
    assert {c["name"] for c in data["checks"]} == set(ALL_CHECKS)
    for c in data["checks"]:
        assert set(c) == {"name", "description", "status", "counts", "examples", "note"}
        assert c["status"] in (OK, VIOLATED, NOT_APPLICABLE)
        for example in c["examples"]:
            assert example["explanation"]
    lines = format_lines(result)
    assert lines[0] == "chaos check: INVALID"
    assert any("one-value-per-offset" in line and VIOLATED in line for line in lines)
    console = Console(width=200, record=True)
    console.print(format_table(result))
    text = console.export_text()
    assert "INVALID" in text and "lost" in text and "recovery" in text


def test_check_file_reads_a_history_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history.write(path, clean())
    assert check_file(path).valid
    history.write(path, [*clean(), read(0, N, "ghost", hw=N + 1)])
    assert not check_file(path).valid


# --------------------------------------------------------------------------- 1. lost


def test_lost_write_is_reported() -> None:
    # Acknowledged at offset 5, but no replica's final read goes past offset 4.
    ops = [*clean(), send(0, N, N, t=60.0)]
    result = check(ops)
    assert count(result, "lost", "lost") == 1
    example = result.get("lost").examples[0]
    assert example["partition"] == 0 and example["offset"] == N
    assert example["value"] == val(0, N) and example["process"] == producer(0)
    assert example["status"] == "ok"
    assert example["finals_at_offset"] == {
        str(r): {"value": None, "hw": N, "state": "ok"} for r in REPLICAS
    }
    assert "no final read holds it anywhere" in example["explanation"]
    assert "replica 3 ok" in example["explanation"]
    # Held by no replica, it is lost, and not counted again as under-replicated.
    assert_only(result, "lost")


def test_ack_found_only_at_another_offset_is_lost() -> None:
    # The ack said offset 3, the log holds the record at 4 (and something else at 3).
    ops = without(clean(), *[final(0, 3, val(0, 3), N, r) for r in REPLICAS])
    ops += [final(0, 3, "intruder", N, r) for r in REPLICAS]
    result = check(ops)
    assert count(result, "lost", "lost") == 1
    example = result.get("lost").examples[0]
    assert example["offset"] == 3
    assert example["finals_at_offset"]["1"]["value"] == "intruder"
    assert count(result, "one-value-per-offset", "conflict") == 1


def test_lost_partition_without_any_final_read() -> None:
    ops = [op for op in clean() if not (op.partition == 1 and op.kind in ("final", "digest"))]
    result = check(ops)
    assert count(result, "lost", "lost") == N
    assert count(result, "replicas", "partition-without-replicas") == 1
    assert count(result, "phantoms", "dirty-read") == N  # the reader saw them: now lost


def test_examples_are_capped_but_counts_are_not() -> None:
    ops = [*clean(), *[send(0, N + i, N + i, t=60.0 + i) for i in range(50)]]
    result = check(ops)
    lost = result.get("lost")
    assert lost.counts["lost"] == 50
    assert len(lost.examples) == MAX_EXAMPLES
    assert result.get("replicas").counts["under-replicated"] == 0


def test_ack_without_offset_is_malformed_not_silently_skipped() -> None:
    result = check([*clean(), send(0, N, None, t=60.0)])
    assert count(result, "lost", "acked-without-offset") == 1
    assert result.summary["malformed_ops"] == 1
    assert_only(result, "lost")


# --------------------------------------------------------------------------- 2. replicas


def test_replica_missing_a_record() -> None:
    ops = without(clean(), final(0, 2, val(0, 2), N, 3))
    result = check(ops)
    # Its final hw (5) is past offset 2: it claims a record it does not hold.
    assert count(result, "replicas", "missing-below-hw") == 1
    assert count(result, "replicas", "under-replicated") == 0
    example = result.get("replicas").examples[0]
    assert (example["partition"], example["offset"], example["replica"]) == (0, 2, 3)
    assert example["value"] == val(0, 2) and example["state"] == "ok"
    assert "nothing at that offset" in example["explanation"]
    assert_only(result, "replicas")  # replicas 1 and 2 still hold it: not lost


def test_replica_whose_hw_is_below_an_acked_offset() -> None:
    # Replica 3 of partition 0 is stuck at hw 3: acked offsets 3 and 4 are missing there.
    ops = without(clean(), final(0, 3, val(0, 3), N, 3), final(0, 4, val(0, 4), N, 3))
    result = check(_with_replica_hw(ops, partition=0, replica=3, hw=3))
    # Two records, one replica short: one example names the replica, its state, the range.
    assert count(result, "replicas", "under-replicated") == 2
    assert count(result, "replicas", "under-replicated-replicas") == 1
    (example,) = result.get("replicas").examples
    assert (example["first_offset"], example["last_offset"]) == (3, 4)
    assert example["replica"] == 3 and example["replica_hw"] == 3
    assert example["held_by"] == [1, 2] and example["state"] == "ok"
    assert "final high watermark is 3" in example["explanation"]
    assert "not lost" in example["explanation"]
    assert_only(result, "replicas")


def test_record_at_or_above_a_replicas_hw_counts_as_missing() -> None:
    # Replica 3 reports hw 4 while its log shows offset 4: offset 4 is not committed there.
    result = check(_with_replica_hw(clean(), partition=0, replica=3, hw=4))
    assert count(result, "replicas", "under-replicated") == 1
    assert result.get("replicas").examples[0]["offset"] == 4
    assert count(result, "phantoms", "at-or-above-hw") == 1  # the final read itself


def _with_replica_hw(ops: list[Op], *, partition: int, replica: int, hw: int) -> list[Op]:
    return [
        final(op.partition, op.offset or 0, op.value or "", hw, replica)
        if op.kind == "final" and op.partition == partition and op.replica == replica
        else op
        for op in ops
    ]


def test_replica_known_only_by_its_digest_holds_nothing() -> None:
    result = check([*clean(), digest(0, N, 4)])
    assert count(result, "replicas", "under-replicated") == N
    assert "only a digest" in result.get("replicas").examples[0]["explanation"]
    assert_only(result, "replicas")


def test_digest_mismatch() -> None:
    ops = without(clean(), digest(1, N, 2))
    ops.append(digest(1, N, 2, value="sha-other"))
    result = check(ops)
    assert count(result, "replicas", "digest-mismatch") == 1
    example = result.get("replicas").examples[0]
    assert example["partition"] == 1 and example["offset"] == N
    assert example["values"] == {f"sha-1-{N}": [1, 3], "sha-other": [2]}
    assert count(result, "replicas", "under-replicated") == 0
    assert count(result, "replicas", "missing-below-hw") == 0
    assert_only(result, "replicas")


# --------------------------------------------------------------------------- 3. one value


def test_two_values_at_one_offset_among_replicas() -> None:
    # Two indeterminate sends each landed at offset 5 of partition 0, on different
    # replicas: nothing acked is lost, nothing read is unknown, but the logs diverged.
    ops = [*clean(), send(0, N, None, "info", t=60.0), send(0, N + 1, None, "info", t=61.0)]
    ops = _with_replica_hw(ops, partition=0, replica=1, hw=N + 1)
    ops = _with_replica_hw(ops, partition=0, replica=2, hw=N + 1)
    ops = _with_replica_hw(ops, partition=0, replica=3, hw=N + 1)
    ops += [final(0, N, val(0, N), N + 1, r) for r in (1, 2)]
    ops.append(final(0, N, val(0, N + 1), N + 1, 3))
    result = check(ops)
    assert count(result, "one-value-per-offset", "conflict") == 1
    example = result.get("one-value-per-offset").examples[0]
    assert (example["partition"], example["offset"]) == (0, N)
    values = example["values"]
    assert set(values) == {val(0, N), val(0, N + 1)}
    assert values[val(0, N)]["count"] == 2
    assert values[val(0, N + 1)]["seen_by"] == ["replica 3 (final, reader final-r3)"]
    assert values[val(0, N)]["send_status"] == "info"
    assert_only(result, "one-value-per-offset")


def test_ack_and_read_disagree_on_an_offset() -> None:
    # A second acknowledged send claims offset 2, already holding another record.
    result = check([*clean(), send(0, 7, 2, t=60.0)])
    assert count(result, "one-value-per-offset", "conflict") == 1
    values = result.get("one-value-per-offset").examples[0]["values"]
    assert values[val(0, 7)]["seen_by"] == [f"producer {producer(0)} (ack)"]
    assert "reader reader0" in values[val(0, 2)]["seen_by"]


# --------------------------------------------------------------------------- 4. duplicates


def _duplicated() -> list[Op]:
    """The producer's retry wrote record 4 again at offset 5 (first ack lost in flight)."""
    ops = clean()
    for r in REPLICAS:
        ops = _with_replica_hw(ops, partition=0, replica=r, hw=N + 1)
    ops += [final(0, N, val(0, N - 1), N + 1, r) for r in REPLICAS]
    ops.append(read(0, N, val(0, N - 1), hw=N + 1, t=60.0))
    return ops


def test_duplicate_is_counted_but_ok_without_idempotence() -> None:
    result = check(_duplicated())
    dup = result.get("duplicates")
    assert dup.status == OK
    assert dup.counts["duplicate"] == 1 and dup.counts["extra_copies"] == 1
    assert dup.examples[0]["value"] == val(0, N - 1)
    assert dup.examples[0]["offsets"] == [N - 1, N]
    assert dup.examples[0]["acked_offset"] == N - 1
    assert "allowed without idempotence" in dup.note
    assert_only(result)


def test_duplicate_is_a_violation_with_idempotence() -> None:
    result = check(_duplicated(), idempotent=True)
    assert result.get("duplicates").status == VIOLATED
    assert count(result, "duplicates", "duplicate") == 1
    assert_only(result, "duplicates")


# --------------------------------------------------------------------------- 5. phantoms


def _extend_partition0(value: str, *, read_it: bool = True, hw: int = N + 1) -> list[Op]:
    """Every replica (and the reader, if ``read_it``) holds ``value`` at offset N."""
    ops = clean()
    for r in REPLICAS:
        ops = _with_replica_hw(ops, partition=0, replica=r, hw=hw)
    ops += [final(0, N, value, hw, r) for r in REPLICAS]
    if read_it:
        ops.append(read(0, N, value, hw=hw, t=60.0))
    return ops


def test_phantom_read_of_a_value_never_sent() -> None:
    result = check(_extend_partition0("ghost"))
    assert count(result, "phantoms", "never-sent") == 4  # the live read and 3 finals
    example = result.get("phantoms").examples[0]
    assert example["value"] == "ghost" and example["status"] == "never sent"
    assert count(result, "phantoms", "dirty-read") == 0
    assert_only(result, "phantoms")


def test_read_of_a_definitely_failed_write() -> None:
    ops = [*_extend_partition0(val(0, N)), send(0, N, None, "fail", t=60.0)]
    result = check(ops)
    assert count(result, "phantoms", "failed-send-read") == 4
    assert count(result, "phantoms", "never-sent") == 0
    assert result.get("phantoms").examples[0]["status"] == "fail"
    assert_only(result, "phantoms")


def test_a_value_retried_after_a_definite_failure_may_be_read() -> None:
    # Logged twice: refused once, then acknowledged on retry. The value was written,
    # whichever of the two ops the history lists last.
    refused, acked = send(0, N, None, "fail", t=60.0), send(0, N, N, t=61)
    for attempts in ([refused, acked], [acked, refused]):
        result = check([*_extend_partition0(val(0, N)), *attempts])
        assert count(result, "phantoms", "failed-send-read") == 0
        assert_only(result)


def test_read_at_or_above_the_answers_high_watermark() -> None:
    ops = without(clean(), read(1, 3, val(1, 3), hw=4, t=10.0 * 3 + 1 + 1))
    ops.append(read(1, 3, val(1, 3), hw=3, t=10.0 * 3 + 1 + 1))
    result = check(ops)
    assert count(result, "phantoms", "at-or-above-hw") == 1
    example = result.get("phantoms").examples[0]
    assert (example["partition"], example["offset"], example["hw"]) == (1, 3, 3)
    assert_only(result, "phantoms")


def test_final_read_above_its_replicas_hw() -> None:
    ops = [*clean(), send(1, N, None, "info", t=60.0), final(1, N, val(1, N), N, 2)]
    result = check(ops)
    assert count(result, "phantoms", "at-or-above-hw") == 1
    assert result.get("phantoms").examples[0]["replica"] == 2


def test_dirty_read_of_a_record_later_lost() -> None:
    # An indeterminate send was read live (below that answer's hw) but no replica kept it.
    ops = [*clean(), send(0, N, None, "info", t=60.0), read(0, N, val(0, N), hw=N + 1, t=61.0)]
    result = check(ops)
    assert count(result, "phantoms", "dirty-read") == 1
    example = result.get("phantoms").examples[0]
    assert example["value"] == val(0, N) and example["process"] == "reader0"
    assert example["finals_at_offset"]["1"] == {"value": None, "hw": N, "state": "ok"}
    assert_only(result, "phantoms")


# --------------------------------------------------------------------------- 6. order


def test_producer_reorder() -> None:
    # Send 3 then send 4 (in that order) were acked at offsets 4 and 3.
    ops = without(clean(), send(0, 3, 3, t=30.0), send(0, 4, 4, t=40.0))
    ops += [send(0, 3, 4, t=30.0), send(0, 4, 3, t=40.0)]
    swap = {val(0, 3): val(0, 4), val(0, 4): val(0, 3)}
    ops = [
        Op(
            op.kind,
            op.process,
            op.partition,
            swap.get(op.value or "", op.value),
            op.offset,
            op.status,
            op.start,
            op.end,
            op.hw,
            op.replica,
        )
        if op.kind in ("read", "final") and op.partition == 0
        else op
        for op in ops
    ]
    result = check(ops)
    assert count(result, "order", "producer-reorder") == 1
    example = result.get("order").examples[0]
    assert example["earlier"] == {"value": val(0, 3), "offset": 4, "start": 30.0}
    assert example["later"] == {"value": val(0, 4), "offset": 3, "start": 40.0}
    assert_only(result, "order")


def test_producer_order_uses_start_time_not_history_order() -> None:
    # The history lists the acks out of order, but by start time they increase.
    ops = clean()
    sends = [op for op in ops if op.kind == "send"]
    ops = [*reversed(sends), *(op for op in ops if op.kind != "send")]
    assert_only(check(ops))


def test_reader_skip() -> None:
    ops = without(clean(), read(0, 2, val(0, 2), hw=3, t=21.0))
    result = check(ops)
    assert count(result, "order", "reader-skip") == 1
    example = result.get("order").examples[0]
    assert (example["previous"]["offset"], example["next"]["offset"]) == (1, 3)
    assert "skipped 1 record" in example["explanation"]
    assert_only(result, "order")


def test_reader_going_backwards() -> None:
    # After offset 4 the reader was shown offset 2 again.
    result = check([*clean(), read(0, 2, val(0, 2), hw=N, t=60.0)])
    assert count(result, "order", "reader-backwards") == 1
    assert count(result, "order", "reader-skip") == 0
    assert "went back" in result.get("order").examples[0]["explanation"]
    assert_only(result, "order")


# --------------------------------------------------------------------------- 8. recovery


def _with_recovery(*recoveries: Op) -> list[Op]:
    return [*(op for op in clean() if op.kind != "recovery"), *recoveries]


def test_slow_recovery() -> None:
    result = check(_with_recovery(recovery("45.5")))
    assert count(result, "recovery", "slow") == 1
    assert result.get("recovery").examples[0]["seconds"] == 45.5
    assert_only(result, "recovery")
    assert check(_with_recovery(recovery("45.5")), recovery_limit_s=60).valid


def test_failed_recovery() -> None:
    result = check(_with_recovery(recovery("30", status="fail")))
    assert count(result, "recovery", "failed") == 1
    assert_only(result, "recovery")


def test_missing_recovery() -> None:
    result = check(_with_recovery())
    assert count(result, "recovery", "missing") == 1
    assert_only(result, "recovery")


def test_recovery_duration_may_be_a_number() -> None:
    ops = _with_recovery(Op("recovery", "nemesis", value=3.0))  # type: ignore[arg-type]
    assert check(ops).valid


# --------------------------------------------------------------------------- indeterminate


def test_indeterminate_send_present_is_fine() -> None:
    ops = [*_extend_partition0(val(0, N)), send(0, N, None, "info", t=60.0)]
    result = check(ops)
    assert_only(result)
    assert result.summary["sends_indeterminate"] == 1


def test_indeterminate_send_absent_is_fine() -> None:
    result = check([*clean(), send(0, N, None, "info", t=60.0), send(1, N, None, "info")])
    assert_only(result)
    assert result.summary["sends_indeterminate"] == 2


def test_indeterminate_send_present_twice_breaks_idempotence() -> None:
    ops = [*_duplicated(), send(0, N + 3, None, "info", t=70.0)]
    assert check(ops).valid
    assert not check(ops, idempotent=True).valid


# --------------------------------------------------------------------------- scale


def test_large_clean_history_is_checked_quickly() -> None:
    partitions = tuple(range(8))
    ops = clean(n=4000, partitions=partitions)  # ~200k ops
    began = time.perf_counter()
    result = check(ops)
    elapsed = time.perf_counter() - began
    assert_only(result)
    assert result.summary["finals"] == 4000 * 8 * 3
    assert elapsed < 20, f"{len(ops)} ops took {elapsed:.1f} s"


@pytest.mark.parametrize("name", ALL_CHECKS)
def test_every_check_reports_name_description_and_counts(name: str) -> None:
    report = check(clean()).get(name)
    assert report.description
    assert report.counts


# --------------------------------------------------------------------------- retention


def ranged(ops: list[Op], starts: dict[tuple[int, int], int], hw: int = N) -> list[Op]:
    """Retention moved some replicas' log starts: ``starts`` maps (partition, replica) to
    the new start; those replicas' finals below it are gone, and every (partition,
    replica) gets its ``range`` op (start 0 where not named)."""
    kept = [
        op
        for op in ops
        if not (
            op.kind == "final" and (op.offset or 0) < starts.get((op.partition, op.replica or 0), 0)
        )
    ]
    kept += [
        Op("range", f"final-r{r}", p, None, starts.get((p, r), 0), hw=hw, replica=r)
        for p in PARTITIONS
        for r in REPLICAS
    ]
    return kept


def reset(p: int, frm: int, to: int, t: float, reader: str = "") -> Op:
    return Op("reset", reader or f"reader{p}", p, str(to), frm, "ok", t, t)


def test_range_ops_at_start_zero_change_nothing() -> None:
    result = check(ranged(clean(), {}))
    assert_only(result)
    assert count(result, "lost", "deleted-by-retention") == 0
    assert result.summary["unknown_kinds"] == {}


def test_records_below_every_replicas_start_are_deleted_not_lost() -> None:
    result = check(ranged(clean(), {(0, 1): 3, (0, 2): 2, (0, 3): 4}))
    assert_only(result)
    # Offsets 0 and 1 are below all three starts (the smallest is 2).
    assert count(result, "lost", "deleted-by-retention") == 2
    # Below each replica's own start nothing is expected: 3 + 2 + 4 pairs skipped.
    assert count(result, "replicas", "below-replica-start") == 9
    assert count(result, "replicas", "replica_record_pairs") == 3 * 2 * N - 9


def test_a_record_below_one_replicas_start_must_be_on_another() -> None:
    # Replicas 1 and 2 deleted offsets 0-2; replica 3 still starts at 0 but lacks offset 1.
    ops = ranged(clean(), {(0, 1): 3, (0, 2): 3})
    result = check(without(ops, final(0, 1, val(0, 1), N, 3)))
    assert count(result, "lost", "lost") == 1
    assert result.get("lost").examples[0]["offset"] == 1
    assert count(result, "lost", "deleted-by-retention") == 0
    assert count(result, "replicas", "under-replicated") == 0  # lost, not counted twice
    # The live reader saw offset 1 and no replica holds it any more: a dirty read too.
    assert count(result, "phantoms", "dirty-read") == 1
    assert_only(result, "lost", "phantoms")


def test_a_replica_missing_a_record_at_or_above_its_own_start() -> None:
    ops = ranged(clean(), {(0, 1): 2, (0, 2): 2, (0, 3): 2})
    result = check(without(ops, final(0, 3, val(0, 3), N, 2)))
    assert count(result, "replicas", "missing-below-hw") == 1
    example = result.get("replicas").examples[0]
    assert (example["offset"], example["replica"]) == (3, 2)
    assert_only(result, "replicas")  # replicas 1 and 3 still hold it: not lost


def test_a_record_missing_everywhere_at_the_common_start_is_lost() -> None:
    # The starts are all 2: offset 2 is the first record every replica must still hold.
    ops = ranged(clean(), {(1, r): 2 for r in REPLICAS})
    result = check(without(ops, *[final(1, 2, val(1, 2), N, r) for r in REPLICAS]))
    assert count(result, "lost", "lost") == 1
    assert count(result, "lost", "deleted-by-retention") == 2
    assert_only(result, "lost", "phantoms")


def test_a_replica_without_a_range_op_starts_at_zero() -> None:
    # Replica 3 has no range op: it is held to everything, so offset 0 is not deleted.
    ops = ranged(clean(), {(0, 1): 2, (0, 2): 2, (0, 3): 2})
    ops = [op for op in ops if not (op.kind == "range" and op.partition == 0 and op.replica == 3)]
    result = check(ops)
    assert count(result, "lost", "deleted-by-retention") == 0
    assert count(result, "lost", "lost") == 2
    assert_only(result, "lost", "phantoms")


def test_live_read_below_every_start_is_not_a_dirty_read() -> None:
    # An indeterminate send was read live at offset 0 of a fresh partition 2 whose
    # replicas all start at 1: retention deleted it, nothing says it was lost.
    ops = [*ranged(clean(), {}), send(2, 0, None, "info", t=5.0)]
    ops.append(read(2, 0, val(2, 0), hw=1, t=6.0))
    ops += [Op("range", f"final-r{r}", 2, None, 1, hw=1, replica=r) for r in REPLICAS]
    ops += [digest(2, 1, r) for r in REPLICAS]
    assert_only(check(ops))
    # The same history with the starts at 0: a dirty read.
    at_zero = [
        Op("range", op.process, 2, None, 0, hw=1, replica=op.replica)
        if op.kind == "range" and op.partition == 2
        else op
        for op in ops
    ]
    result = check(at_zero)
    assert count(result, "phantoms", "dirty-read") == 1
    assert_only(result, "phantoms")


def test_reader_skip_across_its_reset_is_ok() -> None:
    # reader0 read 0 and 1, was refused at 2 (below the start), jumped to 4 and read on.
    ops = without(clean(), read(0, 2, val(0, 2), hw=3, t=21.0), read(0, 3, val(0, 3), hw=4, t=31.0))
    ops.append(reset(0, 2, 4, t=25.0))
    result = check(ranged(ops, {(0, r): 4 for r in REPLICAS}))
    assert_only(result)
    assert count(result, "order", "reader_resets") == 1
    assert count(result, "order", "skips_across_resets") == 1


def test_reader_skip_across_a_chain_of_resets_is_ok() -> None:
    ops = without(clean(), read(0, 2, val(0, 2), hw=3, t=21.0), read(0, 3, val(0, 3), hw=4, t=31.0))
    ops += [reset(0, 2, 3, t=25.0), reset(0, 3, 4, t=26.0)]
    assert_only(check(ranged(ops, {(0, r): 4 for r in REPLICAS})))


def test_reader_skip_without_a_matching_reset_fails() -> None:
    skipped = without(clean(), read(0, 2, val(0, 2), hw=3, t=21.0))
    for bad_reset in (
        [],  # no reset at all
        [reset(0, 2, 4, t=25.0)],  # a reset past where the reader went on reading
        [reset(1, 2, 3, t=25.0)],  # another reader's reset
        [reset(0, 1, 3, t=25.0)],  # from an offset the reader had already read
    ):
        result = check(ranged([*skipped, *bad_reset], {}))
        assert count(result, "order", "reader-skip") == 1, bad_reset
        assert_only(result, "order")


def test_a_reset_does_not_excuse_going_backwards() -> None:
    ops = [*clean(), reset(0, N, 2, t=55.0), read(0, 2, val(0, 2), hw=N, t=60.0)]
    result = check(ops)
    assert count(result, "order", "reader-backwards") == 1
    assert_only(result, "order")


def test_malformed_range_and_reset_ops_are_counted() -> None:
    ops = [*clean(), Op("range", "final-r1", 0, None, None, replica=1)]
    ops.append(Op("reset", "reader0", 0, "not-a-number", 3))
    result = check(ops)
    assert result.summary["malformed_ops"] == 2
    assert result.summary["unknown_kinds"] == {}
    assert_only(result)


# --------------------------------------------------------------------------- 9. leaderless


def test_a_short_leaderless_span_is_fine() -> None:
    ops = [*clean(), leader(0, "", 20.0), leader(0, "2", 21.5)]
    result = check(ops)
    assert_only(result)
    assert result.get("leaderless").counts["longest_leaderless_s"] == 1.5


def test_a_partition_leaderless_past_the_limit_is_reported() -> None:
    ops = [*clean(), leader(1, "", 20.0), leader(1, "3", 60.0)]
    result = check(ops, recovery_limit_s=30)
    assert_only(result, "leaderless")
    assert count(result, "leaderless", "leaderless-too-long") == 1
    assert (
        "partition 1 had no leader for 40.0 s"
        in result.get("leaderless").examples[0]["explanation"]
    )


def test_a_partition_leaderless_until_the_end_counts_to_the_last_op() -> None:
    ops = [*clean(), leader(0, "", 100.0)]  # the history ends at 210 s (status ops)
    result = check(ops, recovery_limit_s=30)
    assert_only(result, "leaderless")


def test_two_claimed_leaders_are_not_leaderless() -> None:
    ops = [*clean(), leader(0, "1,2", 20.0), leader(0, "2", 80.0)]
    assert_only(check(ops, recovery_limit_s=30))


# --------------------------------------------------------------------------- 10. health


def test_a_broker_not_serving_after_healing_is_reported() -> None:
    ops = without(clean(), status(2, -1, "SERVING"))
    result = check([*ops, status(2, -1, "NOT_SERVING")])
    assert_only(result, "health")
    assert count(result, "health", "not-serving") == 1


def test_a_replica_still_failed_after_healing_is_reported() -> None:
    ops = without(clean(), status(3, 1, "REPLICA_OK"))
    result = check([*ops, status(3, 1, "REPLICA_FAILED", "log: CRC mismatch at byte 4096")])
    assert_only(result, "health")
    assert "CRC mismatch" in result.get("health").examples[0]["explanation"]


def test_a_replica_that_says_ok_while_behind_is_a_silent_failure() -> None:
    ranges = [
        Op("range", f"final-{r}", 0, None, 0, "ok", 200, 200, hw=N if r != 2 else N - 2, replica=r)
        for r in REPLICAS
    ]
    result = check([*clean(), *ranges])
    assert "health" in {c.name for c in result.checks if c.status == VIOLATED}
    assert count(result, "health", "silent-failure") == 1
    # The same replica saying it is catching up is the truth, not a silent failure.
    ops = without(clean(), status(2, 0, "REPLICA_OK"))
    honest = check([*ops, *ranges, status(2, 0, "REPLICA_CATCHING_UP")])
    assert count(honest, "health", "silent-failure") == 0


def test_a_replica_that_says_ok_but_refused_its_final_read_is_a_silent_failure() -> None:
    ranges = [
        Op(
            "range",
            f"final-{r}",
            1,
            None,
            0,
            "ok",
            200,
            200,
            hw=N,
            replica=r,
            error="CORRUPT_DATA: offsets from 3 failed their checksum" if r == 3 else None,
        )
        for r in REPLICAS
    ]
    result = check([*clean(), *ranges])
    assert count(result, "health", "silent-failure") == 1
    assert "CORRUPT_DATA" in result.get("health").examples[0]["explanation"]


def replication(p: int, seconds: float, status: str = "ok", error: str | None = None) -> Op:
    return Op(
        "replication",
        "controller",
        p,
        "1,2,3",
        status=status,
        start=100.0,
        end=100.0 + seconds,
        error=error,
    )


def test_partitions_healed_back_to_their_factor_in_time_pass() -> None:
    result = check(clean() + [replication(p, 20.0) for p in PARTITIONS], heal_limit_s=60)
    assert_only(result)
    assert statuses(result)["replication"] == OK
    assert result.get("replication").counts["seconds"] == 20.0


def test_a_partition_not_healed_after_a_broker_died_is_reported() -> None:
    ops = [
        *clean(),
        replication(0, 5.0),
        replication(1, 90.0, "fail", "replicas [1, 2, 4] still include dead broker(s) [4]"),
    ]
    result = check(ops, heal_limit_s=60)
    assert_only(result, "replication")
    assert count(result, "replication", "not-healed") == 1
    assert "dead broker(s) [4]" in result.get("replication").examples[0]["explanation"]


def test_a_partition_healed_past_the_limit_is_reported() -> None:
    result = check([*clean(), replication(0, 75.0)], heal_limit_s=60)
    assert_only(result, "replication")
    assert count(result, "replication", "slow") == 1


# ------------------------------------------------- lost vs under-replicated (issue 20)


def range_op(p: int, r: int, start: int, hw: int, t: float = 200.0, answered: bool = True) -> Op:
    return Op(
        "range",
        f"final-r{r}",
        p,
        None,
        start,
        "ok" if answered else "fail",
        t,
        t,
        hw=hw,
        replica=r,
        error=None if answered else "no answer to ListOffsets",
    )


def short_on_replica_3(read_at: float) -> list[Op]:
    """Partition 0's replica 3 stopped at hw 2: offsets 2-4 only replicas 1 and 2 hold.
    Its final read ended at ``read_at`` (healing ended at 150)."""
    ops = without(clean(), *[final(0, i, val(0, i), N, 3) for i in range(2, N)])
    ops = _with_replica_hw(ops, partition=0, replica=3, hw=2)
    ops += [range_op(0, r, 0, N) for r in (1, 2)] + [range_op(0, 3, 0, 2, t=read_at)]
    catching_up = status(3, 0, "REPLICA_CATCHING_UP", "behind the leader's commit by 3 entries")
    return [*without(ops, status(3, 0, "REPLICA_OK")), catching_up]


def test_records_other_replicas_hold_are_under_replicated_not_lost() -> None:
    # Read 50 s after healing, past the 30 s bound: the partition did not heal in time.
    result = check(short_on_replica_3(read_at=200.0), recovery_limit_s=30)
    assert count(result, "lost", "lost") == 0
    assert count(result, "replicas", "under-replicated") == 3
    assert count(result, "replicas", "under-replicated-replicas") == 1
    (example,) = result.get("replicas").examples
    assert example["replica"] == 3 and example["held_by"] == [1, 2]
    assert example["state"] == "catching_up: behind the leader's commit by 3 entries"
    assert example["waited_s"] == 50.0
    assert "past the recovery limit of 30 s" in example["explanation"]
    assert "under-replicated, not lost" in example["explanation"]
    assert_only(result, "replicas")


def test_under_replication_within_the_recovery_bound_is_not_a_violation() -> None:
    # Read 10 s after healing: still inside the bound, so it may yet catch up.
    result = check(short_on_replica_3(read_at=160.0), recovery_limit_s=30)
    assert count(result, "replicas", "under-replicated") == 0
    assert count(result, "replicas", "under-replicated-healing") == 3
    assert "it may still catch up" in result.get("replicas").examples[0]["explanation"]
    assert_only(result)


def test_a_replica_that_cannot_open_does_not_turn_retention_into_loss() -> None:
    # Issue 20: retention moved replicas 1 and 2 of partition 0 to start 3; replica 3
    # could not open (no answer, reported failed). Its "start" must not pull the retention
    # floor to 0 (which made offsets 0-2 "lost"); offsets 3-4 are under-replicated on it.
    ops = [op for op in clean() if not (op.kind == "final" and op.partition == 0)]
    ops = [op for op in ops if not (op.kind == "digest" and op.partition == 0)]
    ops += [final(0, i, val(0, i), N, r) for r in (1, 2) for i in range(3, N)]
    ops += [range_op(0, 1, 3, N), range_op(0, 2, 3, N), range_op(0, 3, 0, 0, answered=False)]
    ops = without(ops, status(3, 0, "REPLICA_OK"))
    ops.append(status(3, 0, "REPLICA_FAILED", "segment 0: CRC mismatch at byte 4096"))
    result = check(ops)
    assert count(result, "lost", "lost") == 0
    assert count(result, "lost", "deleted-by-retention") == 3
    assert count(result, "replicas", "under-replicated") == 2
    example = result.get("replicas").examples[0]
    assert example["state"] == "failed: segment 0: CRC mismatch at byte 4096"
    assert "did not answer its final read" in example["explanation"]
    assert count(result, "health", "replica-failed") == 1
    # The live reader saw offsets 0-2, since deleted everywhere healthy: not dirty reads.
    assert_only(result, "replicas", "health")


def test_a_lost_example_names_each_replicas_state() -> None:
    ops = without(clean(), status(2, 0, "REPLICA_OK"))
    ops += [status(2, 0, "REPLICA_OPENING", "repairing segment 3 from broker 1")]
    result = check([*ops, send(0, N, N, t=60.0)])
    example = result.get("lost").examples[0]
    assert example["finals_at_offset"]["2"]["state"] == (
        "opening: repairing segment 3 from broker 1"
    )
    assert "replica 2 opening: repairing segment 3 from broker 1" in example["explanation"]


# --------------------------------------------------------- health: assignment (issue 20)


def assignment(broker: int, p: int, replicas: str = "1,2,3", leader_id: int = 1) -> Op:
    return Op(
        "assignment",
        f"status-{broker}",
        p,
        replicas,
        leader_id,
        start=210,
        end=210,
        replica=broker,
    )


def assigned_clean() -> list[Op]:
    return clean() + [assignment(b, p) for b in REPLICAS for p in PARTITIONS]


def test_every_assigned_replica_reported_passes() -> None:
    result = check(assigned_clean())
    assert_only(result)
    assert count(result, "health", "assigned") == len(REPLICAS) * len(PARTITIONS)


def test_an_assigned_replica_its_broker_does_not_report_is_a_violation() -> None:
    # Broker 3 serves, but lists no replica of partition 1: absent, not reported failed.
    result = check(without(assigned_clean(), status(3, 1, "REPLICA_OK")))
    assert count(result, "health", "replica-unreported") == 1
    assert count(result, "health", "replica-failed") == 0
    example = result.get("health").examples[0]
    assert (example["partition"], example["replica"]) == (1, 3)
    assert example["assigned"] == [1, 2, 3]
    assert "broker 3 does not report its replica" in example["explanation"]
    assert "per broker 1's metadata" in example["explanation"]  # the leader's answer
    assert_only(result, "health")


def test_the_leaders_assignment_wins_over_a_stale_one() -> None:
    # Broker 2 still lists broker 4 (moved away); the leader (1) lists 1,2,3: no finding.
    ops = [op for op in assigned_clean() if not (op.kind == "assignment" and op.replica == 2)]
    ops += [assignment(2, p, "1,2,4") for p in PARTITIONS]
    assert_only(check(ops))


def test_a_replica_still_opening_after_healing_is_a_violation() -> None:
    ops = without(assigned_clean(), status(2, 0, "REPLICA_OK"))
    ops.append(status(2, 0, "REPLICA_OPENING", "repairing segment 7 from broker 1"))
    result = check(ops)
    assert count(result, "health", "replica-opening") == 1
    example = result.get("health").examples[0]
    assert example["state"] == "opening"
    assert example["reason"] == "repairing segment 7 from broker 1"
    assert "still opening after healing: repairing segment 7" in example["explanation"]
    assert_only(result, "health")


def test_a_serving_broker_that_does_not_answer_metadata_leaves_its_replicas_unreported() -> None:
    ops = [op for op in assigned_clean() if not (op.kind == "status" and op.replica == 3)]
    ops.append(
        Op(
            "status",
            "status-3",
            -1,
            "SERVING",
            start=210,
            end=210,
            replica=3,
            error="its Metadata call got no answer",
        )
    )
    result = check(ops)
    assert count(result, "health", "replica-unreported") == len(PARTITIONS)
    assert count(result, "health", "not-serving") == 0
    assert (
        "broker 3 serves, but its Metadata call got no answer"
        in (result.get("health").examples[0]["explanation"])
    )
    assert_only(result, "health")


def test_a_replica_on_a_broker_the_sweep_did_not_ask_is_not_unreported() -> None:
    # Broker 3 was killed for good (no status op at all): the replication check's case.
    ops = [op for op in assigned_clean() if not (op.kind == "status" and op.replica == 3)]
    result = check(ops)
    assert count(result, "health", "replica-unreported") == 0
    assert count(result, "health", "assigned-to-unasked-brokers") == len(PARTITIONS)


def test_the_summary_says_what_the_brokers_gauges_showed_during_faults_and_after() -> None:
    """chaos.metrics_watch's ops: each broker's latest scrape summed over the brokers,
    at most while faults ran (before the recovery op) and after, and at the last scrape;
    a value that is not three integers is counted as malformed, not taken."""

    def scraped(broker: int, t: float, value: str) -> Op:
        return Op("metrics", f"metrics-{broker}", -1, value, start=t, end=t)

    ops = [
        scraped(1, 10.0, "0,0,0"),
        scraped(2, 10.5, "0,0,0"),
        scraped(1, 20.0, "2,1,0"),  # a follower cut off, an election under way
        scraped(2, 20.5, "1,0,1"),
        scraped(1, 30.0, "0,0,0"),
        scraped(2, 30.5, "bad"),
        recovery("1.0"),  # healed at 150
        scraped(1, 151.0, "1,0,0"),
        scraped(2, 160.0, "0,0,0"),
        scraped(1, 161.0, "0,0,0"),
    ]
    summary = check(ops).summary["metrics"]
    assert summary["samples"] == 8 and summary["malformed"] == 1
    assert summary["max_during_faults"] == {
        "under_replicated": 3,
        "leaderless": 1,
        "failed_replicas": 1,
    }
    # Broker 2's last good scrape before healing (1,0,1) counts until its next one.
    assert summary["max_after_healing"] == {
        "under_replicated": 2,
        "leaderless": 0,
        "failed_replicas": 1,
    }
    assert summary["last"] == {"under_replicated": 0, "leaderless": 0, "failed_replicas": 0}
    assert check([]).summary["metrics"] == {"samples": 0}
