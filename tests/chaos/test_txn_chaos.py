"""The chaos harness with exactly-once transactions (``--transactions``): a
consume-transform-produce pipeline, transactional producers that abort on purpose, and
read_committed and read_uncommitted readers, under faults, checked by
chaos/txn_checker.py.

CI runs a short schedule; ``pytest -m chaos`` runs longer ones with every fault kind."""

import json

import pytest

from chaos.run import ChaosOptions, run
from tests.chaos.test_txn_checker import TXN_CHECKS


def _assert_transactions_held(result, min_committed: int, min_pipeline: int) -> None:
    """Every check held, and enough happened for that to mean something (floors low
    enough for a loaded 2-core machine)."""
    violated = [c.to_dict() for c in result.checks if not c.ok]
    assert result.valid, json.dumps(violated, indent=1)[:6000]
    for name in TXN_CHECKS:
        assert result.get(name).status == "ok", name
    txns = result.summary["transactions"]
    assert txns["committed"] >= min_committed, txns
    assert txns["aborted"] >= 5, txns  # the direct producers abort a share on purpose
    once = result.get("txn-exactly-once").counts
    assert once["pipeline_txns_committed"] >= min_pipeline, once
    assert once["inputs_below_commit"] >= 100, once
    assert result.get("txn-torn").counts["writes_read_past"] >= 100


def test_short_schedule_of_transactions_under_kills_partitions_and_pauses(tmp_path):
    """Workers turn the idempotent producers' records into outputs, one transaction per
    poll with the input positions in it, while brokers are killed, cut off and paused:
    no aborted or uncommitted write is read committed, no transaction is torn or lost,
    each input below the group's committed offsets has exactly one committed output."""
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=30,
        faults=["kill", "partition", "pause"],
        seed=5,
        producers=2,
        consumers=2,
        group=True,
        idempotent=True,
        transactions=True,
    )
    result = run(options, say=print)
    _assert_transactions_held(result, min_committed=30, min_pipeline=10)


@pytest.mark.chaos
@pytest.mark.parametrize("seed", [1, 2])
def test_long_schedule_of_every_fault_kind_with_transactions(tmp_path, seed):
    out = tmp_path / f"run-{seed}"
    options = ChaosOptions(
        out=out,
        duration=150,
        faults=["all"],
        seed=seed,
        clients=True,
        group=True,
        idempotent=True,
        transactions=True,
    )
    result = run(options, say=print)
    _assert_transactions_held(result, min_committed=150, min_pipeline=40)


@pytest.mark.chaos
def test_long_schedule_of_controller_faults_with_transactions(tmp_path):
    """The coordinator lives in the controller: kill and isolate its leader while
    transactions commit, so commits meet unknown outcomes and new leaders finish them."""
    out = tmp_path / "run"
    options = ChaosOptions(
        out=out,
        duration=120,
        faults=["controller", "kill", "partition", "latency"],
        seed=3,
        clients=True,
        group=True,
        idempotent=True,
        transactions=True,
    )
    result = run(options, say=print)
    _assert_transactions_held(result, min_committed=100, min_pipeline=30)
