"""The share consumer against real brokers: members of one share group consume a topic
together; every record is accepted once, never held by two members at once (checked
from each member's own log of what it received, with the lock deadlines the leader
gave); many members on few partitions all get work; a record that always fails goes to
the dead-letter topic after the delivery limit; ``raftmq consume --share-group``."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest

from raftmq.client import AcknowledgeType, AsyncShareConsumer, ShareConsumer
from raftmq.client import retry_headers as rh
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.test_broker_cluster import wait_until
from tests.client.test_records_cli import raftmq
from tests.share.conftest import earliest_group, now_ms, produce_numbered, read_topic

pytestmark = pytest.mark.timeout(180)


@dataclass(frozen=True, slots=True)
class Received:
    """One delivery, as the member that got it logged it."""

    member: int
    offset: int
    delivery_count: int
    received_ms: int
    lock_deadline_ms: int
    let_go_ms: int | None = None
    """When the member sent its RELEASE (the record may go to another from then on)."""


def test_one_consumer_gets_every_record_with_its_delivery_count(cluster: LocalCluster) -> None:
    topic, group = "sbasic", "g-basic"
    earliest_group(cluster, group)
    values = produce_numbered(cluster, topic, 50)
    got = []
    with ShareConsumer(cluster.addresses, group) as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            got += consumer.poll(0.5)
        results = consumer.commit_sync()  # implicit mode: accepts the last poll's records
    assert sorted(r.value for r in got) == sorted(values)
    assert {r.delivery_count for r in got} == {1}
    assert all(r.ok for r in results), results
    # Everything was accepted: a new member of the group gets nothing.
    with ShareConsumer(cluster.addresses, group) as again:
        again.subscribe(topic)
        assert again.poll(3.0) == []


def test_eight_members_on_one_partition_accept_each_record_exactly_once(
    cluster: LocalCluster,
) -> None:
    topic, group, count = "s8", "g-8", 400
    earliest_group(cluster, group, record_lock_duration_ms="15000")
    produce_numbered(cluster, topic, count)
    logs: dict[int, list[Received]] = defaultdict(list)
    accepted: dict[int, list[int]] = defaultdict(list)  # member: offsets confirmed accepted
    stop = threading.Event()
    errors: list[BaseException] = []

    def member(i: int) -> None:
        rng = random.Random(i)
        try:
            with ShareConsumer(
                cluster.addresses, group, acknowledgement_mode="explicit", max_poll_records=10
            ) as consumer:
                consumer.subscribe(topic)
                while not stop.is_set():
                    records = consumer.poll(0.2)
                    at = now_ms()
                    released = {}
                    for r in records:
                        deadline = consumer.lock_deadline_ms(r)
                        assert deadline is not None
                        if rng.random() < 0.1:  # give some back: they go to another
                            consumer.acknowledge(r, AcknowledgeType.RELEASE)
                            released[r.offset] = now_ms()
                        else:
                            consumer.acknowledge(r)
                        logs[i].append(
                            Received(
                                i,
                                r.offset,
                                r.delivery_count or 0,
                                at,
                                deadline,
                                released.get(r.offset),
                            )
                        )
                    for result in consumer.commit_sync():
                        if result.ok and result.type is AcknowledgeType.ACCEPT:
                            accepted[i] += range(result.first_offset, result.last_offset + 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until(
            lambda: sum(map(len, accepted.values())) >= count or errors, 90, "every record accepted"
        )
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    every = Counter(o for offsets in accepted.values() for o in offsets)
    assert sorted(every) == list(range(count)), "a record was never accepted"
    assert set(every.values()) == {1}, "a record was accepted twice"
    assert sum(1 for log in logs.values() if log) >= 2, "the members did not share the work"
    by_offset: dict[int, list[Received]] = defaultdict(list)
    for log in logs.values():
        for got in log:
            by_offset[got.offset].append(got)
    for offset, deliveries in by_offset.items():
        deliveries.sort(key=lambda d: d.delivery_count)
        assert [d.delivery_count for d in deliveries] == list(range(1, len(deliveries) + 1)), (
            offset,
            deliveries,
        )
        for before, after in itertools.pairwise(deliveries):
            # The next member got it only once the lock of the one before had ended:
            # expired, or given back.
            ended = min(before.lock_deadline_ms, before.let_go_ms or before.lock_deadline_ms)
            assert after.received_ms >= ended, (offset, before, after)
        accepted_by = [m for m, offsets in accepted.items() if offset in offsets]
        assert accepted_by == [deliveries[-1].member], (offset, deliveries, accepted_by)


async def test_fifty_consumers_on_three_partitions_all_get_work(cluster: LocalCluster) -> None:
    topic, group, members = "s50", "g-50", 50
    earliest_group(cluster, group)
    await asyncio.to_thread(produce_numbered, cluster, topic, 900, partitions=3)
    worked: Counter[int] = Counter()
    stop = asyncio.Event()

    async def member(i: int) -> None:
        async with AsyncShareConsumer(cluster.addresses, group, max_poll_records=3) as consumer:
            consumer.subscribe(topic)
            while not stop.is_set():
                records = await consumer.poll(0.2)
                if records:
                    worked[i] += len(records)
                    await asyncio.sleep(0.1)  # processing: the next poll accepts them

    tasks = [asyncio.create_task(member(i)) for i in range(members)]
    try:
        deadline = time.monotonic() + 90
        while len(worked) < members and time.monotonic() < deadline:
            if any(t.done() for t in tasks):
                break
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert len(worked) == members, f"{members - len(worked)} members got no record: {worked}"


def test_a_record_that_always_fails_is_dead_lettered_after_the_delivery_limit(
    cluster: LocalCluster,
) -> None:
    topic, group, dead = "sdlq", "g-dlq", "sdlq-dead"
    earliest_group(cluster, group, delivery_count_limit="3", dead_letter_topic=dead)
    values = produce_numbered(cluster, topic, 6)
    poison = values[2]
    deliveries: list[int] = []
    with ShareConsumer(cluster.addresses, group, acknowledgement_mode="explicit") as consumer:
        consumer.subscribe(topic)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(deliveries) < 3:
            for r in consumer.poll(0.5):
                if r.value == poison:
                    deliveries.append(r.delivery_count or 0)
                    consumer.acknowledge(r, AcknowledgeType.RELEASE)
                else:
                    consumer.acknowledge(r)
        assert deliveries == [1, 2, 3]
        assert all(r.ok for r in consumer.commit_sync())
        assert consumer.poll(2.0) == []  # archived: never delivered again
    letters = read_topic(cluster, dead, 1)
    assert [r.value for r in letters] == [poison]
    info = rh.decode(letters[0].headers)
    assert info is not None
    assert (info.original_topic, info.original_partition, info.original_offset) == (topic, 0, 2)
    assert info.attempts == 3


def test_consume_share_group_prints_and_accepts(cluster: LocalCluster) -> None:
    topic, group = "scli", "g-cli"
    earliest_group(cluster, group)
    values = produce_numbered(cluster, topic, 8)
    first = raftmq(cluster, "consume", topic, "--share-group", group, "--max-messages", "5")
    assert first.returncode == 0, first.stderr
    printed = first.stdout.splitlines()
    assert len(printed) == 5 and set(printed) <= set(values)
    rest = raftmq(
        cluster,
        "consume",
        topic,
        "--share-group",
        group,
        "--format",
        "json",
        "--idle-timeout-ms",
        "2000",
    )
    assert rest.returncode == 0, rest.stderr
    lines = [json.loads(line) for line in rest.stdout.splitlines()]
    # The first run accepted what it printed and released what it polled past
    # --max-messages unprinted: the second prints exactly the rest.
    assert sorted(printed + [line["value"].encode() for line in lines]) == sorted(values)
    assert all(line["delivery_count"] >= 1 for line in lines)
    bad = raftmq(cluster, "consume", topic, "--share-group", group, "--group", "x")
    assert bad.returncode == 2 and "leave out --group" in bad.stderr.decode()
