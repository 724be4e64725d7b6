"""The idempotent producer against real brokers: a resent batch is acknowledged once with
its original offsets, also after every broker was killed and restarted (the state comes
back from the checkpoint and the log), and a stream of sends across a leader SIGKILLed
and restarted leaves the partition holding each record exactly once, in send order
(checked by reading the whole partition)."""

from __future__ import annotations

import asyncio
import time

import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.producer import AsyncProducer, Producer
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import LEADER_TIMEOUT, ClusterFactory
from tests.broker.test_broker_cluster import read_all

pytestmark = pytest.mark.timeout(180)


def values(cluster: LocalCluster, topic: str) -> list[bytes | None]:
    with cluster.client() as c:
        return [r.value for r in read_all(c, topic, 0)[0]]


def init_producer_id(cluster: LocalCluster) -> int:
    with cluster.client() as c:
        answer = c.stub(cluster.addresses[0]).InitProducerId(pb.InitProducerIdRequest(), timeout=15)
    assert answer.producer_epoch == 0
    return int(answer.producer_id)


def test_a_resent_batch_is_stored_once_also_after_every_broker_restarted(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"i": 1, "a": 2})
    pid = init_producer_id(cluster)
    assert init_producer_id(cluster) != pid  # never handed out twice

    def body(seq: int, *vals: bytes) -> bytes:
        records = [Record(None, v, int(time.time() * 1000)) for v in vals]
        return build_batch(records, producer_id=pid, producer_epoch=0, base_sequence=seq)

    with cluster.client() as c:
        first = c.produce("i", 0, body(0, b"a", b"b"))
        resent = c.produce("i", 0, body(0, b"a", b"b"))  # as after a lost answer
        assert (resent.base_offset, resent.last_offset) == (first.base_offset, first.last_offset)
        second = c.produce("i", 0, body(2, b"c"))
    assert values(cluster, "i") == [b"a", b"b", b"c"]
    for broker in cluster.spec.brokers:  # SIGKILL: no graceful save of anything
        cluster.kill(broker)
    cluster.start()
    cluster.wait_for_leaders(timeout=LEADER_TIMEOUT)
    with cluster.client() as c:
        again = c.produce("i", 0, body(2, b"c"))
        assert again.base_offset == second.base_offset
        third = c.produce("i", 0, body(3, b"d"))
        assert third.base_offset == second.base_offset + 1
    assert values(cluster, "i") == [b"a", b"b", b"c", b"d"]
    # Every stored entry carries the producer's id and its sequence.
    with cluster.client() as c:
        raw = read_all(c, "i", 0)[1]
    triples = [
        (h.producer_id, h.base_sequence)
        for h in entry.iter_headers(raw)
        if h.type == entry.EntryType.DATA
    ]
    assert triples == [(pid, 0), (pid, 2), (pid, 3)]

    # The asyncio producer numbers its batches the same way: one id, per-partition
    # sequences from 0 that follow each batch's records, and several batches in flight.
    async def send_async() -> None:
        async with AsyncProducer(cluster.addresses, linger_ms=1, batch_size=1024) as p:
            futures = [await p.send("a", f"a{i:04d}".encode(), partition=i % 2) for i in range(600)]
            await p.flush()
            for f in futures:
                await f

    asyncio.run(send_async())
    ids = set()
    with cluster.client() as c:
        for part in (0, 1):
            records, raw = read_all(c, "a", part)
            assert [r.value for r in records] == [f"a{i:04d}".encode() for i in range(part, 600, 2)]
            expected = 0
            for h in entry.iter_headers(raw):
                if h.type == entry.EntryType.DATA:
                    ids.add(h.producer_id)
                    assert h.base_sequence == expected
                    expected += h.record_count
    assert len(ids) == 1 and ids != {pid} and min(ids) >= 0


def test_a_leader_killed_and_restarted_mid_stream_leaves_no_duplicate_and_no_gap(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"f": 1})
    with cluster.client() as c:
        leader = c.refresh_leaders()["f", 0].broker_id
    sent = [f"r{i:05d}".encode() for i in range(6000)]
    futures = []
    with Producer(cluster.addresses, linger_ms=1, batch_size=2048, retry_backoff_ms=20) as producer:
        assert producer.config.idempotent  # the default with acks='all'
        for i, value in enumerate(sent):
            futures.append(producer.send("f", value))
            if i == 1500:
                cluster.kill(leader)
            if i == 3500:
                cluster.start(leader)
            if i % 200 == 0:
                time.sleep(0.01)
    metas = [f.result(timeout=0) for f in futures]  # every send was acknowledged
    stored = values(cluster, "f")
    assert len(stored) == len(set(stored)), "a record is stored twice"
    assert stored == sent  # no gap, send order
    assert [m.offset for m in metas] == list(range(len(sent)))
