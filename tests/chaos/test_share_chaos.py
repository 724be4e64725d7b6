"""The chaos harness with a share group: members in processes of their own accept,
release, reject and ignore records and are SIGKILLed and replaced while leaders are killed
and cut off, checked by chaos/share_checker.py.

CI runs a short schedule; ``pytest -m chaos`` runs a longer one with every fault kind."""

import json

import pytest

from chaos.run import ChaosOptions, run


def _checked(result) -> None:
    violated = [c.to_dict() for c in result.checks if not c.ok]
    assert result.valid, json.dumps(violated, indent=1)[:4000]
    settled = result.get("share-settled").counts
    assert settled["sent_ok"] >= 100 and settled["dead_lettered"] >= 1, settled
    assert result.get("share-exclusive").counts["redeliveries_checked"] >= 10
    assert result.summary["share_group"]["crashes"] >= 1, result.summary["share_group"]


def test_a_share_group_under_kills_and_partitions(tmp_path):
    """Every acknowledged record is accepted once or dead-lettered, none is held by two
    members at once, delivery counts grow within the limit, and committed ACCEPTs
    survive the leaders killed and cut off."""
    options = ChaosOptions(
        out=tmp_path / "run", duration=25, faults=["partition", "kill"], seed=31, share_group=True
    )
    _checked(run(options, say=print))


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [41, 42])
def test_long_schedule_of_a_share_group_with_every_fault(tmp_path, seed):
    options = ChaosOptions(
        out=tmp_path / f"run-{seed}",
        duration=120,
        faults=["all"],
        seed=seed,
        clients=True,
        group=True,
        idempotent=True,
        share_group=True,
    )
    _checked(run(options, say=print))
