"""The Consumer against real brokers: what it polls is what was produced, in offset order
per partition, from where the reset policy or a seek says; pause, resume, the
'error' policy, the fetch buffer bound, and the asyncio flavour."""

from __future__ import annotations

import asyncio
import time

import pytest

from raftmq.client.consumer import AsyncConsumer, Consumer, ConsumerRecord, NoOffsetError
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)


def produce(
    cluster: LocalCluster, topic: str, values: list[bytes], partition: int, batch: int = 1 << 18
) -> list[int]:
    with Producer(cluster.addresses, linger_ms=1, batch_size=batch) as producer:
        futures = [producer.send(topic, v, partition=partition) for v in values]
    return [f.result(timeout=0).offset for f in futures]


def poll_until(consumer: Consumer, count: int, timeout: float = 30) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"polled {len(out)} of {count} records"
        out += consumer.poll(0.5)
    return out


def wait_positioned(consumer: Consumer, *tps: tuple[str, int]) -> None:
    deadline = time.monotonic() + 20
    while any(consumer.position(tp) is None for tp in tps):
        assert time.monotonic() < deadline, "the reset policy never gave a position"
        consumer.poll(0.1)


def test_polls_everything_from_the_beginning_in_offset_order(cluster: LocalCluster) -> None:
    sent = {p: [f"c{p}-{i}".encode() * 20 for i in range(700)] for p in (0, 1)}
    offsets = {p: produce(cluster, "c", sent[p], p) for p in (0, 1)}
    with Consumer(cluster.addresses, auto_offset_reset="earliest", max_poll_records=97) as c:
        c.assign([("c", 0), ("c", 1)])
        got = poll_until(c, 1400)
        assert all(len(batch) <= 97 for batch in [got[i : i + 97] for i in range(0, 1400, 97)])
        for p in (0, 1):
            mine = [r for r in got if r.partition == p]
            assert [r.offset for r in mine] == offsets[p]
            assert [r.value for r in mine] == sent[p]
            assert c.position(("c", p)) == offsets[p][-1] + 1
        assert c.poll(0.3) == []


def test_latest_sees_only_what_comes_after(cluster: LocalCluster) -> None:
    produce(cluster, "cl", [b"old"] * 10, 0)
    with Consumer(cluster.addresses, auto_offset_reset="latest", fetch_max_wait_ms=100) as c:
        c.assign([("cl", 0)])
        wait_positioned(c, ("cl", 0))
        produce(cluster, "cl", [b"new-1", b"new-2"], 0)
        assert [r.value for r in poll_until(c, 2)] == [b"new-1", b"new-2"]


def test_seek_position_and_offsets_for_times(cluster: LocalCluster) -> None:
    before = int(time.time() * 1000)
    first = produce(cluster, "cs", [b"a", b"b", b"c"], 0)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    later = produce(cluster, "cs", [b"d", b"e"], 0)
    tp = ("cs", 0)
    with Consumer(cluster.addresses, auto_offset_reset="latest") as c:
        c.assign([tp])
        c.seek(tp, first[1])
        assert [r.value for r in poll_until(c, 4)] == [b"b", b"c", b"d", b"e"]
        assert c.offsets_for_times({tp: before})[tp] == first[0]
        assert c.offsets_for_times({tp: middle})[tp] == later[0]
        c.seek_to_beginning(tp)
        assert poll_until(c, 5)[0].value == b"a"
        c.seek_to_end()
        assert c.position(tp) == later[-1] + 1
        with pytest.raises(ValueError, match="negative"):
            c.seek(tp, -1)


def test_a_paused_partition_is_held_back_until_resumed(cluster: LocalCluster) -> None:
    produce(cluster, "cp", [b"zero"] * 5, 0)
    produce(cluster, "cp", [b"one"] * 5, 1)
    with Consumer(cluster.addresses, auto_offset_reset="earliest") as c:
        c.assign([("cp", 0), ("cp", 1)])
        c.pause(("cp", 1))
        got = poll_until(c, 5)
        assert {r.partition for r in got} == {0}
        assert c.poll(0.5) == []
        c.resume(("cp", 1))
        assert {r.partition for r in poll_until(c, 5)} == {1}


def test_the_error_policy_asks_for_a_seek(cluster: LocalCluster) -> None:
    produce(cluster, "ce", [b"x", b"y"], 0)
    with Consumer(cluster.addresses, auto_offset_reset="error") as c:
        c.assign([("ce", 0)])
        deadline = time.monotonic() + 10
        with pytest.raises(NoOffsetError, match="auto_offset_reset is 'error'; seek"):
            while time.monotonic() < deadline:
                c.poll(0.2)
        c.seek(("ce", 0), 1)
        assert [r.value for r in poll_until(c, 1)] == [b"y"]


def test_fetching_ahead_stays_within_the_buffer_bound(cluster: LocalCluster) -> None:
    value = b"v" * 4000
    for p in range(3):
        produce(cluster, "cb", [value] * 300, p, batch=8192)  # 1.2 MB each, 2 records per entry
    fetch_bytes, cap = 16 * 1024, 64 * 1024
    with Consumer(
        cluster.addresses,
        auto_offset_reset="earliest",
        fetch_max_bytes=fetch_bytes,
        max_buffer_bytes=cap,
    ) as c:
        c.assign([("cb", p) for p in range(3)])
        time.sleep(2)  # no poll: the fetcher fills what it may and stops
        held = c._fetcher.total_bytes
        # each partition may finish the fetch it started when the cap was reached
        assert 0 < held <= cap + 3 * (fetch_bytes + len(value) + 200), held
        assert len(poll_until(c, 900)) == 900


def test_async_consumer_polls_what_was_produced(cluster: LocalCluster) -> None:
    offsets = produce(cluster, "ca", [f"a{i}".encode() for i in range(50)], 0)

    async def main() -> list[ConsumerRecord]:
        async with AsyncConsumer(cluster.addresses, auto_offset_reset="earliest") as c:
            c.assign([("ca", 0)])
            out: list[ConsumerRecord] = []
            async for record in c:
                out.append(record)
                if len(out) == 50:
                    return out
        raise AssertionError("unreachable")

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert [r.offset for r in got] == offsets


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"auto_offset_reset": "smallest"}, "auto_offset_reset must be"),
        ({"max_poll_records": 0}, "max_poll_records must be at least 1"),
        ({"fetch_max_wait_ms": 70_000}, "fetch_max_wait_ms must be 0-60000"),
        ({"max_buffer_bytes": 10}, "must hold at least one fetch"),
    ],
)
def test_invalid_settings_are_refused_at_construction(
    settings: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        Consumer("127.0.0.1:1", **settings)  # type: ignore[arg-type]
