"""The chaos harness with the real clients: Producers and Consumers (and, once the
client features land, idempotence and a consumer group) under faults, checked.

CI runs a short schedule; ``pytest -m chaos`` runs a longer one with more fault kinds."""

import bisect
import collections
import json

import pytest

from chaos.run import ChaosOptions, run


def _assert_clean(result, out, min_acked: int, min_consumed: int) -> None:
    assert result.valid, json.dumps(result.to_dict(), indent=1)[:4000]
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    acked = sum(1 for op in ops if op["kind"] == "send" and op["status"] == "ok")
    consumed = sum(1 for op in ops if op["kind"] == "consume")
    assert acked >= min_acked, f"only {acked} records were acknowledged"
    assert consumed >= min_consumed, f"only {consumed} records were consumed"
    assert result.get("consumer-groups").status == "ok"
    faults = json.loads((out / "faults.json").read_text())
    assert len([f for f in faults if f["status"] == "start"]) >= 2


def test_short_schedule_with_the_real_clients_loses_nothing(tmp_path):
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=20,
        faults=["partition", "kill", "pause"],
        seed=7,
        producers=2,
        clients=True,
        consumers=2,
        follower_reads=True,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=300, min_consumed=300)
    # Consumer k reads from broker k + 1, in its rack: the leader of some partitions and
    # a follower of others, whose reads the checker held to the same rules.
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert _follower_served(ops) >= 50


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


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [1, 2])
def test_long_schedule_with_the_real_clients_loses_nothing(tmp_path, seed):
    out = tmp_path / f"run-{seed}"
    options = ChaosOptions(
        out=out,
        duration=120,
        faults=["partition", "kill", "pause", "latency", "reset", "controller"],
        seed=seed,
        clients=True,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=3000, min_consumed=3000)
