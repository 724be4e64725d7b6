"""Share groups under faults, with real brokers (``-m long``: each waits out locks and
elections): a consumer SIGKILLed mid-batch has its records redelivered to others once
their locks expire, none lost, none delivered more than the delivery limit; a partition
leader SIGKILLed while records are acquired loses no ACCEPT confirmed to a member, and
every record acquired and not acknowledged comes back once its lock expires, its
delivery count carried over; RENEW extends a lock until the group's maximum hold, then
LOCK_RENEWAL_LIMIT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from raftmq.api.v1 import share_pb2 as spb
from raftmq.client import AcknowledgeType, ConsumerRecord, ShareConsumer
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.share_settings import MAX_LOCK_HOLD_DURATIONS
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import leader_of, wait_until
from tests.share.conftest import earliest_group, now_ms, produce_numbered
from tests.share.raw import RawMember

pytestmark = [pytest.mark.long, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def consume_all(
    cluster: LocalCluster, group: str, topic: str, want: int, timeout_s: float = 120
) -> tuple[list[tuple[ConsumerRecord, int]], set[int]]:
    """A member that accepts everything until ``want`` offsets were accepted (confirmed):
    what it received (each with when) and the offsets confirmed."""
    got: list[tuple[ConsumerRecord, int]] = []
    accepted: set[int] = set()
    with ShareConsumer(
        cluster.addresses, group, acknowledgement_mode="explicit", max_poll_records=50
    ) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + timeout_s
        while len(accepted) < want and time.monotonic() < deadline:
            for r in consumer.poll(0.5):
                got.append((r, now_ms()))
                consumer.acknowledge(r)
            for result in consumer.commit_sync():
                if result.ok:
                    accepted.update(range(result.first_offset, result.last_offset + 1))
    return got, accepted


def test_a_consumer_killed_mid_batch_has_its_records_redelivered_after_the_lock(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    topic, group, count, lock_ms = "skill", "g-killed", 60, 3000
    earliest_group(cluster, group, record_lock_duration_ms=str(lock_ms), delivery_count_limit="3")
    produce_numbered(cluster, topic, count, prefix="killed")
    out = tmp_path / "worker.jsonl"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.share.share_worker",
            "--bootstrap",
            ",".join(cluster.addresses),
            "--group",
            group,
            "--topic",
            topic,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    try:
        wait_until(lambda: out.exists() and out.read_text().count("\n") > 0, 60, "a batch")
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    held = [json.loads(line) for line in out.read_text().splitlines()]
    assert held and all(h["delivery_count"] == 1 for h in held)
    got, accepted = consume_all(cluster, group, topic, count)
    offsets = {r.offset for r, _ in got}
    assert len(accepted) == count, "a record was lost"
    assert {h["offset"] for h in held} <= offsets
    for h in held:
        again = [(r, at) for r, at in got if r.offset == h["offset"]]
        assert len(again) == 1, again
        r, at = again[0]
        assert r.delivery_count == 2, r  # the killed member's delivery counted
        assert at >= h["lock_deadline_ms"], "redelivered before the killed member's lock ended"
    assert all(1 <= (r.delivery_count or 0) <= 3 for r, _ in got)


def test_a_leader_killed_while_records_are_acquired_keeps_accepts_and_locks(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"sfail": 1})
    topic, group, count, lock_ms = "sfail", "g-failover", 100, 8000
    earliest_group(cluster, group, record_lock_duration_ms=str(lock_ms))
    produce_numbered(cluster, topic, count, prefix="failover")
    holder = RawMember(cluster, group, [topic])
    try:
        holder.heartbeat(0)
        answer = holder.fetch(topic, max_records=40)
        acquired = [(a.first_offset, a.last_offset) for a in answer.acquired]
        assert acquired == [(0, 39)], acquired
        done = holder.acknowledge(topic, 0, 19, spb.ACKNOWLEDGE_TYPE_ACCEPT)
        assert not done.error.code, done  # confirmed: must survive the failover
        renewed = holder.acknowledge(topic, 30, 39, spb.ACKNOWLEDGE_TYPE_RENEW)
        assert not renewed.error.code, renewed
        with cluster.client() as client:
            leader = leader_of(client, topic)
            cluster.kill(leader)
            cluster.wait_for_leaders(timeout=60, among=set(cluster.spec.brokers) - {leader})
        got, accepted = consume_all(cluster, group, topic, count - 20)
    finally:
        holder.close()
    by_offset: dict[int, list[tuple[ConsumerRecord, int]]] = defaultdict(list)
    for r, at in got:
        by_offset[r.offset].append((r, at))
    assert not set(by_offset) & set(range(20)), "a confirmed ACCEPT was lost in the failover"
    assert accepted == set(range(20, count)), "a record was lost"
    for offset in range(20, 40):  # acquired by the holder, not acknowledged
        (r, at), *more = by_offset[offset]
        assert not more
        assert r.delivery_count == 2, r  # its first delivery counted across the failover
        deadline = renewed.lock_deadline_ms if offset >= 30 else answer.lock_deadline_ms
        assert at >= deadline, (offset, at, deadline)  # the lock survived the failover
    for offset in range(40, count):
        assert [r.delivery_count for r, _ in by_offset[offset]] == [1]


def test_renew_extends_a_lock_up_to_the_maximum_hold(cluster: LocalCluster) -> None:
    topic, group, lock_ms = "srenew", "g-renew", 1000
    earliest_group(cluster, group, record_lock_duration_ms=str(lock_ms))
    produce_numbered(cluster, topic, 1)
    with ShareConsumer(cluster.addresses, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe(topic)
        records: list[ConsumerRecord] = []
        while not records:
            records = consumer.poll(0.5)
        (record,) = records
        first_deadline = consumer.lock_deadline_ms(record)
        assert first_deadline is not None
        acquired_ms = first_deadline - lock_ms
        deadlines = []
        while True:
            time.sleep(0.4)
            consumer.acknowledge(record, AcknowledgeType.RENEW)
            (result,) = consumer.commit_sync()
            if not result.ok:
                break
            assert result.lock_deadline_ms is not None
            deadlines.append(result.lock_deadline_ms)
            assert consumer.lock_deadline_ms(record) == result.lock_deadline_ms
        assert result.error is not None and result.error.code_name == "LOCK_RENEWAL_LIMIT"
        held_ms = now_ms() - acquired_ms
        max_hold_ms = MAX_LOCK_HOLD_DURATIONS * lock_ms
        assert max_hold_ms - lock_ms - 1000 <= held_ms <= max_hold_ms + 1000, held_ms
        assert deadlines == sorted(deadlines) and len(deadlines) >= 10
        # Still held until its deadline: the refused RENEW changed nothing.
        consumer.acknowledge(record)
        (accepted,) = consumer.commit_sync()
        assert accepted.ok, accepted
