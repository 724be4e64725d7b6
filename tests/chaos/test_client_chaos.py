"""The chaos harness with the real clients: idempotent Producers and a committing
consumer group (or consumers with fixed assignments) reading from their racks' followers,
under faults, checked.

CI runs a short schedule; ``pytest -m chaos`` runs longer ones with more fault kinds."""

import bisect
import collections
import json

import pytest

from chaos.run import ChaosOptions, run


def _assert_clean(result, out, min_acked: int, min_consumed: int) -> None:
    violated = [c.to_dict() for c in result.checks if not c.ok]
    assert result.valid, json.dumps(violated, indent=1)[:4000]
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    acked = sum(1 for op in ops if op["kind"] == "send" and op["status"] == "ok")
    consumed = sum(1 for op in ops if op["kind"] == "consume")
    assert acked >= min_acked, f"only {acked} records were acknowledged"
    assert consumed >= min_consumed, f"only {consumed} records were consumed"
    assert result.get("consumer-groups").status == "ok"
    faults = json.loads((out / "faults.json").read_text())
    assert len([f for f in faults if f["status"] == "start"]) >= 2


def test_short_schedule_with_an_idempotent_producer_and_a_group_loses_nothing(tmp_path):
    """Idempotent Producers, a three-member group committing after each poll and reading
    from the followers in their racks, under kills, pauses and partitions: no acknowledged
    record lost or stored twice, no commit lost or gone back, nothing committed past an
    unconsumed record, and followers served a good share of the reads."""
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=20,
        faults=["partition", "kill", "pause"],
        seed=7,
        producers=2,
        consumers=3,
        group=True,
        idempotent=True,
        follower_reads=True,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=300, min_consumed=300)
    assert result.get("duplicates").status == "ok"  # a violation with idempotence
    groups = result.get("consumer-groups").counts
    assert groups["commits_acked"] >= 20 and groups["partitions_committed"] == 3, groups
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert _follower_served(ops) >= 50


@pytest.mark.chaos
@pytest.mark.parametrize(
    ("seed", "group"), [(1, True), (2, False)], ids=["group-idempotent", "assigned"]
)
def test_long_schedule_with_the_real_clients_loses_nothing(tmp_path, seed, group):
    out = tmp_path / f"run-{seed}"
    options = ChaosOptions(
        out=out,
        duration=120,
        faults=["partition", "kill", "pause", "latency", "reset", "controller"],
        seed=seed,
        clients=True,
        group=group,
        idempotent=group,
        follower_reads=True,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=3000, min_consumed=3000)


def test_a_secure_cluster_under_faults_loses_nothing(tmp_path):
    """``--secure``: TLS on every listener (Raft's through the proxies), every client on
    mutual TLS; kills and partitions reconnect through fresh handshakes."""
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=20,
        faults=["partition", "kill", "reset"],
        seed=11,
        producers=2,
        consumers=2,
        group=True,
        idempotent=True,
        secure=True,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=300, min_consumed=300)
    assert (out / "data" / "tls" / "ca.pem").exists()  # it did run with TLS


@pytest.mark.chaos
def test_long_secure_schedule_with_every_fault_loses_nothing(tmp_path):
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=120,
        faults=["all"],
        seed=12,
        clients=True,
        group=True,
        idempotent=True,
        secure=True,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=3000, min_consumed=3000)


def _follower_served(ops: list[dict]) -> int:
    """How many consumed records came from a broker that did not lead their partition
    then (by the monitor's ``leader`` ops)."""
    changes = collections.defaultdict(list)
    for op in ops:
        if op["kind"] == "leader":
            changes[op["partition"]].append((op["start"], set(op.get("value", "").split(","))))
    count = 0
    for op in ops:
        if op["kind"] != "consume" or op.get("replica") is None:
            continue
        times = changes[op["partition"]]
        at = bisect.bisect_right([t for t, _ in times], op["start"]) - 1
        leaders = times[at][1] - {""} if at >= 0 else set()
        count += bool(leaders) and str(op["replica"]) not in leaders
    return count
