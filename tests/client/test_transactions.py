"""The transactional producer and read_committed consumer against real brokers and the
real coordinator (docs/transactions.md): what commits is seen whole, what aborts never,
offsets commit exactly with their transaction, and an older instance is fenced."""

from __future__ import annotations

import time

import pytest

from raftmq.client import (
    AdminClient,
    Consumer,
    Producer,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)
from raftmq.client.consumer import IsolationLevel
from raftmq.client.errors import ClientError, ErrorCode
from raftmq.devtools.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)


def _create(cluster: LocalCluster, topic: str, partitions: int = 2) -> None:
    with AdminClient(cluster.addresses) as admin:
        admin.create_topic(topic, partitions, 3)
        deadline = time.monotonic() + 30
        while not all(p.leader_id for p in admin.describe_topic(topic).partitions):
            assert time.monotonic() < deadline, f"{topic} has no leaders after 30 s"
            time.sleep(0.1)


def _read(
    cluster: LocalCluster, topic: str, isolation: IsolationLevel, idle_s: float = 2.0
) -> list[bytes]:
    with Consumer(
        cluster.addresses, auto_offset_reset="earliest", isolation_level=isolation
    ) as consumer:
        consumer.assign([(topic, p) for p in consumer.partitions_for(topic)])
        out: list[bytes] = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_s:
            records = consumer.poll(0.3)
            if records:
                idle_since = time.monotonic()
            out += [r.value or b"" for r in records]
    return out


def test_committed_is_seen_aborted_never(cluster: LocalCluster) -> None:
    _create(cluster, "txn-vis")
    with Producer(cluster.addresses, transactional_id="vis-1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send("txn-vis", f"c{i}".encode(), partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(10):
            producer.send("txn-vis", f"a{i}".encode(), partition=i % 2)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("txn-vis", b"last", partition=0)
        producer.commit_transaction()
    committed = _read(cluster, "txn-vis", "read_committed")
    assert sorted(committed) == sorted([f"c{i}".encode() for i in range(10)] + [b"last"])
    everything = _read(cluster, "txn-vis", "read_uncommitted")
    assert len(everything) == 21


def test_an_open_transaction_holds_read_committed_back(cluster: LocalCluster) -> None:
    """The last stable offset: records after an open transaction's first one wait for it,
    even those of other producers."""
    _create(cluster, "txn-lso", 1)
    with (
        Producer(cluster.addresses, transactional_id="lso-1") as txn,
        Producer(cluster.addresses) as plain,
    ):
        txn.init_transactions()
        txn.begin_transaction()
        txn.send("txn-lso", b"open", partition=0).result(10)
        plain.send("txn-lso", b"after", partition=0).result(10)
        assert _read(cluster, "txn-lso", "read_committed", idle_s=1.0) == []
        assert sorted(_read(cluster, "txn-lso", "read_uncommitted", idle_s=1.0)) == [
            b"after",
            b"open",
        ]
        txn.commit_transaction()
    assert sorted(_read(cluster, "txn-lso", "read_committed")) == [b"after", b"open"]


def test_offsets_commit_with_the_transaction_only(cluster: LocalCluster) -> None:
    _create(cluster, "txn-off-in", 1)
    with Producer(cluster.addresses) as plain:
        for i in range(5):
            plain.send("txn-off-in", f"in{i}".encode(), partition=0)
    with (
        Producer(cluster.addresses, transactional_id="off-1") as producer,
        Consumer(
            cluster.addresses,
            group_id="txn-off-group",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        ) as consumer,
    ):
        consumer.assign([("txn-off-in", 0)])
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({("txn-off-in", 0): 3}, consumer.group_metadata())
        producer.abort_transaction()
        assert consumer.committed({("txn-off-in", 0)}) == {("txn-off-in", 0): None}
        producer.begin_transaction()
        producer.send_offsets_to_transaction({("txn-off-in", 0): 4}, consumer.group_metadata())
        producer.commit_transaction()
        assert consumer.committed({("txn-off-in", 0)}) == {("txn-off-in", 0): 4}


def test_a_newer_instance_fences_the_older_and_aborts_its_transaction(
    cluster: LocalCluster,
) -> None:
    _create(cluster, "txn-fence", 1)
    old = Producer(cluster.addresses, transactional_id="fence-1")
    try:
        old.init_transactions()
        old.begin_transaction()
        old.send("txn-fence", b"zombie", partition=0).result(10)
        with Producer(cluster.addresses, transactional_id="fence-1") as new:
            new.init_transactions()  # aborts the old one's open transaction
            new.begin_transaction()
            new.send("txn-fence", b"new", partition=0)
            new.commit_transaction()
        with pytest.raises((ProducerFencedError, TransactionAbortableError)):
            old.send("txn-fence", b"late", partition=0).result(10)
            old.commit_transaction()
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
    finally:
        old.close(timeout=5)
    assert _read(cluster, "txn-fence", "read_committed") == [b"new"]


def test_calls_out_of_order_and_bad_settings_are_refused(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="idempotent"):
        Producer(cluster.addresses, transactional_id="x", acks=1)
    with Producer(cluster.addresses, transactional_id="order-1") as producer:
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            producer.send("txn-vis", b"x")
        with pytest.raises(TransactionStateError):
            producer.begin_transaction()  # before init_transactions
        producer.init_transactions()
        with pytest.raises(TransactionStateError, match="open transaction"):
            producer.commit_transaction()
    with Producer(cluster.addresses, transactional_id="bad id!") as producer:
        with pytest.raises(ClientError) as caught:
            producer.init_transactions()
        assert caught.value.code == ErrorCode.Value("ERROR_CODE_INVALID_TRANSACTIONAL_ID")
        assert "transactional id" in str(caught.value)
