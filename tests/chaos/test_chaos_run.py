"""The chaos harness end to end: real brokers behind the toxiproxy server, faults, a verdict.

CI runs a short schedule; ``pytest -m chaos`` runs longer ones with every fault kind."""

import json

import pytest

from chaos.run import ChaosOptions, run


def _assert_clean(result, out, min_acked: int) -> None:
    data = result.to_dict()
    assert result.valid, json.dumps(data, indent=1)[:4000]
    summary = json.loads((out / "result.json").read_text())
    assert summary["valid"] is True
    assert (out / "timeline.png").stat().st_size > 10_000
    faults = json.loads((out / "faults.json").read_text())
    assert len([f for f in faults if f["status"] == "start"]) >= 2
    acked = sum(
        1
        for line in (out / "history.jsonl").read_text().splitlines()
        if '"kind": "send"' in line and '"status": "ok"' in line
    )
    assert acked >= min_acked, f"only {acked} writes were acknowledged"


def test_short_schedule_of_partitions_kills_and_pauses_loses_nothing(tmp_path):
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out, duration=20, faults=["partition", "kill", "pause"], seed=11, producers=3
    )
    result = run(options, say=lambda _line: None)
    _assert_clean(result, out, min_acked=100)


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_schedule_of_every_fault_kind_loses_nothing(tmp_path, seed):
    out = tmp_path / f"run-{seed}"
    options = ChaosOptions(
        out=out,
        duration=120,
        faults=["partition", "kill", "pause", "latency", "bandwidth", "reset", "hung"],
        seed=seed,
    )
    result = run(options, say=print)
    _assert_clean(result, out, min_acked=1000)
