"""``raftmq txn list|describe|abort`` and ``raftmq consume --isolation`` as an operator runs
them, against real brokers: an open transaction shows its producer, age and partitions,
an operator's abort ends it (its producer is then told to abort and begin again, and
read_committed readers move past it), and mistakes read as sentences."""

from __future__ import annotations

import json

import pytest

from raftmq.client import Producer, TransactionAbortableError
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.test_broker_cluster import wait_until
from tests.client.test_records_cli import raftmq

pytestmark = pytest.mark.timeout(180)


def run_json(cluster: LocalCluster, *args: str) -> dict:
    done = raftmq(cluster, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_txn_commands(cluster: LocalCluster) -> None:
    with Producer(cluster.addresses, transactional_id="cli-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("clit", b"kept", partition=0)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send("clit", b"hanging", partition=1).result(10)
        listed = run_json(cluster, "txn", "list")["transactions"]
        mine = next(t for t in listed if t["transactional_id"] == "cli-txn")
        assert mine["state"] == "ongoing" and int(mine["started_ms"]) > 0
        described = run_json(cluster, "txn", "describe", "cli-txn")
        assert described["partitions"] == [{"topic": "clit", "partitions": [1]}]
        table = raftmq(cluster, "txn", "describe", "cli-txn")
        assert b"ongoing" in table.stdout and b"clit:1" in table.stdout, table.stdout
        # Before the abort, a read_committed reader stops at the open transaction.
        committed = raftmq(
            cluster,
            "consume",
            "clit",
            "--from-beginning",
            "--isolation",
            "read_committed",
            "--idle-timeout-ms",
            "1500",
        )
        assert committed.stdout.split() == [b"kept"], committed.stdout
        aborted = raftmq(cluster, "txn", "abort", "cli-txn")
        assert aborted.returncode == 0 and b"Aborted" in aborted.stdout, aborted.stdout
        wait_until(
            lambda: run_json(cluster, "txn", "describe", "cli-txn")["state"] == "complete_abort",
            30,
            "the abort's markers written",
        )
        with pytest.raises(TransactionAbortableError, match=r"TRANSACTION_ABORTED|aborted"):
            producer.commit_transaction()
        producer.abort_transaction()  # takes the epoch to go on with
        producer.begin_transaction()
        producer.send("clit", b"after", partition=1)
        producer.commit_transaction()
    seen = raftmq(
        cluster,
        "consume",
        "clit",
        "--from-beginning",
        "--isolation",
        "read_committed",
        "--idle-timeout-ms",
        "1500",
    )
    assert sorted(seen.stdout.split()) == [b"after", b"kept"], seen.stdout
    everything = raftmq(cluster, "consume", "clit", "--from-beginning", "--idle-timeout-ms", "1500")
    assert sorted(everything.stdout.split()) == [b"after", b"hanging", b"kept"]


def test_txn_mistakes_read_as_sentences(cluster: LocalCluster) -> None:
    unknown = raftmq(cluster, "txn", "describe", "no-such-id")
    assert unknown.returncode == 1
    assert b"UNKNOWN_TRANSACTIONAL_ID" in unknown.stdout and b"Traceback" not in unknown.stderr
    nothing_open = raftmq(cluster, "txn", "abort", "no-such-id")
    assert nothing_open.returncode == 1 and b"Traceback" not in nothing_open.stderr
    bad = raftmq(cluster, "consume", "clit", "--isolation", "sometimes")
    assert bad.returncode == 2 and b"sometimes" in bad.stderr
