"""The chaos harness with the message features: delayed records and a filtered consumer
under faults, checked (chaos/feature_checker.py).

CI runs a short schedule; ``pytest -m chaos`` runs a longer one with every fault kind."""

import json

import pytest

from chaos.run import ChaosOptions, run


def _feature_ops(out, kind: str) -> list[dict]:
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [op for op in ops if op["kind"] == kind]


def test_delayed_records_and_a_tag_filter_under_kills_and_partitions(tmp_path):
    """Delayed records sent while leaders are killed and cut off all arrive, none early or
    twice, and quietly within the bound once the faults are over; a consumer with a tag
    filter gets every matching record and no other."""
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=20,
        faults=["partition", "kill"],
        seed=11,
        producers=2,
        consumers=2,
        idempotent=True,
        delayed=True,
        tags=True,
    )
    result = run(options, say=print)
    violated = [c.to_dict() for c in result.checks if not c.ok]
    assert result.valid, json.dumps(violated, indent=1)[:4000]
    delayed = result.get("delayed").counts
    assert delayed["sent_acked"] >= 200 and delayed["late_checked"] >= 50, delayed
    tags = result.get("tag-filter").counts
    assert tags["matching_checked"] >= 50 and tags["consumed"] >= 50, tags
    assert _feature_ops(out, "tag-position"), "the filtered consumer said where it stopped"


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [21, 22])
def test_long_schedule_of_the_message_features_with_every_fault(tmp_path, seed):
    out = tmp_path / f"run-{seed}"
    options = ChaosOptions(
        out=out,
        duration=120,
        faults=["all"],
        seed=seed,
        clients=True,
        group=True,
        idempotent=True,
        delayed=True,
        tags=True,
    )
    result = run(options, say=print)
    violated = [c.to_dict() for c in result.checks if not c.ok]
    assert result.valid, json.dumps(violated, indent=1)[:4000]
