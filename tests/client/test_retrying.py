"""RetryingConsumer and ``raftmq dlq`` against real brokers: a poison record is retried
through the retry topic no earlier than each back-off says, lands in the dead-letter
topic after the last attempt with its history in headers, while the records after it on
the same partition keep flowing; a consumer SIGKILLed between processing a record and
handing it off redelivers it; ``raftmq dlq list|replay`` show and send back dead letters,
each once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftmq.client import AdminClient, ClientError, Consumer, ConsumerRecord, Producer
from raftmq.client.retrying import AsyncRetryingConsumer, RetryingConsumer, RetryPolicy
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import retry_headers as rh
from raftmq.format.retry_headers import RetryInfo
from tests.broker.test_broker_cluster import wait_until
from tests.client.test_records_cli import raftmq

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def read_topic(cluster: LocalCluster, topic: str, count: int) -> list[ConsumerRecord]:
    """The first ``count`` records of ``topic`` (every partition, from the start), waiting
    up to 60 s for them; then a little more, to catch any record too many."""
    out: list[ConsumerRecord] = []
    with Consumer(cluster.addresses, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in consumer.partitions_for(topic)])
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            out += consumer.poll(0.5)
        out += consumer.poll(0.5)
    return out


def produce(cluster: LocalCluster, topic: str, values: list[tuple[int, bytes]]) -> None:
    """``values`` as (partition, value), keyed and with a header of their own."""
    with Producer(cluster.addresses, linger_ms=0) as producer:
        for partition, value in values:
            producer.send(
                topic, value, key=b"key-" + value, headers={"source": b"test"}, partition=partition
            )
        producer.flush()


def test_a_poison_record_is_retried_when_due_then_dead_lettered(cluster: LocalCluster) -> None:
    topic, group = "rq", "rq-app"
    produce(cluster, topic, [(0, b"poison" if i == 3 else f"ok-{i}".encode()) for i in range(6)])
    calls: list[tuple[bytes | None, str, int, dict[str, bytes | None]]] = []

    def handle(r: ConsumerRecord) -> None:
        calls.append((r.value, r.topic, now_ms(), dict(r.headers)))
        if r.value == b"poison":
            raise ValueError("cannot process poison")

    def poison() -> list[tuple[bytes | None, str, int, dict[str, bytes | None]]]:
        return [c for c in calls if c[0] == b"poison"]

    policy = RetryPolicy(max_attempts=3, backoff_ms=(2000, 3000))
    later = [(0, f"ok-{i}".encode()) for i in range(6, 10)]
    with RetryingConsumer(
        cluster.addresses,
        topic,
        handle,
        group_id=group,
        policy=policy,
        auto_offset_reset="earliest",
    ) as consumer:
        deadline = time.monotonic() + 60
        held = 0
        while len(poison()) < 3:  # the third failure's hand-off is acknowledged in process
            assert time.monotonic() < deadline, calls
            held += consumer.process(0.2).waiting
            if poison() and later:  # records behind the failed one keep coming
                produce(cluster, topic, later)
                later = []
        committed = consumer.consumer.committed([(topic, 0)])

    retry = rh.retry_topic(topic, group)
    assert [c[1] for c in poison()] == [topic, retry, retry]
    (_, _, t1, _), (_, _, t2, h2), (_, _, t3, h3) = poison()
    # Never earlier than due: each retry came at or after its deliver-at, failure + back-off.
    due2, due3 = int(h2["deliver-at"] or b""), int(h3["deliver-at"] or b"")
    assert t1 + 2000 <= due2 <= t2 and t2 + 3000 <= due3 <= t3
    assert h2["attempts"] == b"1" and h3["attempts"] == b"2"
    assert held == 0  # the broker's delayed delivery showed them when due: none came early
    others = [c for c in calls if c[0] != b"poison"]
    assert [c[0] for c in others] == [f"ok-{i}".encode() for i in range(10) if i != 3]
    assert max(c[2] for c in others) < t2  # none waited for the poison's retries
    assert committed == {(topic, 0): 10}

    [dead] = read_topic(cluster, rh.dead_letter_topic(topic, group), 1)
    assert (dead.key, dead.value) == (b"key-poison", b"poison")
    assert ("source", b"test") in dead.headers  # its own headers travel with it
    info = rh.decode(dead.headers)
    assert info is not None and t1 <= info.first_failure_ms == due2 - 2000
    assert info == RetryInfo(
        topic, 0, 3, 3, info.first_failure_ms, "ValueError: cannot process poison"
    )


def test_a_retry_that_arrives_early_waits_paused(cluster: LocalCluster) -> None:
    """A retry topic's record seen before its deliver-at (a clock ahead of the consumer's,
    or a record produced there by hand) is not handled before it is due; its partition
    waits, paused, while the original topic flows."""
    topic, group = "rw", "rw-app"
    calls: list[tuple[bytes | None, int]] = []
    with RetryingConsumer(
        cluster.addresses,
        topic,
        lambda r: calls.append((r.value, now_ms())),
        group_id=group,
        auto_offset_reset="earliest",
    ) as consumer:
        wait_until(
            lambda: consumer.process(0.1) and len(consumer.consumer.assignment()) == 2,
            60,
            "assignment",
        )
        due = now_ms() + 2000
        history = rh.encode(RetryInfo(topic, 0, 0, 1, due - 3000, "E: once"))
        with Producer(cluster.addresses, linger_ms=0) as producer:
            retry = rh.retry_topic(topic, group)
            producer.send(retry, b"early", headers=[*history, ("deliver-at", str(due).encode())])
            producer.send(retry, b"behind-it", headers=history)  # due at once, but queued
            producer.flush()
        produce(cluster, topic, [(0, b"fresh")])
        deadline = time.monotonic() + 60
        held = 0
        while len(calls) < 3:
            assert time.monotonic() < deadline, calls
            held += consumer.process(0.2).waiting
    assert held > 0
    when = dict(calls)
    assert [v for v, _ in calls if v != b"fresh"] == [b"early", b"behind-it"]
    assert when[b"fresh"] < due <= when[b"early"] <= when[b"behind-it"]


def test_a_hand_off_that_fails_commits_nothing_and_is_done_again(cluster: LocalCluster) -> None:
    """The dead-letter topic is gone when a record must go there: process raises, commits
    nothing, and the partition goes back, so once the topic is back the record is
    dead-lettered and nothing was skipped."""
    topic, group = "rf", "rf-app"
    dlq = rh.dead_letter_topic(topic, group)
    seen: list[bytes | None] = []

    def handle(r: ConsumerRecord) -> None:
        seen.append(r.value)
        if r.value == b"bad":
            raise ValueError("bad")

    with (
        RetryingConsumer(
            cluster.addresses,
            topic,
            handle,
            group_id=group,
            policy=RetryPolicy(max_attempts=1),
            auto_offset_reset="earliest",
        ) as consumer,
        AdminClient(cluster.addresses) as admin,
    ):
        admin.delete_topic(dlq)
        produce(cluster, topic, [(0, b"ok-0"), (0, b"bad"), (0, b"ok-2")])
        deadline = time.monotonic() + 60
        with pytest.raises(ClientError, match=dlq):
            while True:
                assert time.monotonic() < deadline, seen
                consumer.process(0.2)
        assert consumer.consumer.committed([(topic, 0)]) == {(topic, 0): None}
        admin.create_topic(dlq, 1, 3)
        wait_until(
            lambda: all(p.leader_id for p in admin.describe_topic(dlq).partitions), 30, "leader"
        )
        dead = 0
        while dead == 0:
            assert time.monotonic() < deadline, seen
            dead += consumer.process(0.2).dead_lettered
        assert consumer.consumer.committed([(topic, 0)]) == {(topic, 0): 3}
    assert seen.count(b"bad") == 2 and {b"ok-0", b"ok-2"} <= set(seen)
    [letter] = read_topic(cluster, dlq, 1)
    assert letter.value == b"bad"


def test_the_asyncio_retrying_consumer_with_a_coroutine_handler(cluster: LocalCluster) -> None:
    topic, group = "ra", "ra-app"
    produce(cluster, topic, [(0, b"ok-0"), (0, b"poison"), (0, b"ok-2")])
    calls: list[tuple[bytes | None, str, int, dict[str, bytes | None]]] = []

    async def handle(r: ConsumerRecord) -> None:
        await asyncio.sleep(0)
        calls.append((r.value, r.topic, now_ms(), dict(r.headers)))
        if r.value == b"poison":
            raise ValueError("cannot process poison")

    async def run() -> dict[tuple[str, int], int | None]:
        async with AsyncRetryingConsumer(
            cluster.addresses,
            topic,
            handle,
            group_id=group,
            policy=RetryPolicy(max_attempts=2, backoff_ms=[1000]),
            auto_offset_reset="earliest",
        ) as consumer:
            deadline = time.monotonic() + 60
            dead = 0
            while dead == 0:
                assert time.monotonic() < deadline, calls
                dead += (await consumer.process(0.2)).dead_lettered
            return await consumer.consumer.committed([(topic, 0)])

    assert asyncio.run(run()) == {(topic, 0): 3}
    poison = [c for c in calls if c[0] == b"poison"]
    assert [c[1] for c in poison] == [topic, rh.retry_topic(topic, group)]
    assert poison[0][2] + 1000 <= int(poison[1][3]["deliver-at"] or b"") <= poison[1][2]
    assert sorted(c[0] or b"" for c in calls if c[0] != b"poison") == [b"ok-0", b"ok-2"]
    [dead] = read_topic(cluster, rh.dead_letter_topic(topic, group), 1)
    info = rh.decode(dead.headers)
    assert info is not None and (info.original_offset, info.attempts) == (1, 2)


def worker(cluster: LocalCluster, out: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "client" / "retry_worker.py"),
            "--bootstrap",
            ",".join(cluster.addresses),
            "--group",
            "rk-app",
            "--topic",
            "rk",
            "--out",
            str(out),
            *args,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def calls_of(out: Path) -> list[dict]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]


def test_a_consumer_killed_between_processing_and_hand_off_redelivers(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    values = [b"ok-0", b"ok-1", b"poison-2", b"ok-3", b"ok-4"]
    produce(cluster, "rk", [(0, v) for v in values])
    out = tmp_path / "calls.jsonl"
    first = worker(cluster, out, "--hang-on", "poison-2")
    try:
        wait_until(
            lambda: any(c["value"] == "poison-2" for c in calls_of(out)), 90, "poison-2 handled"
        )
    finally:
        first.send_signal(signal.SIGKILL)  # processed, not handed off
        first.wait(30)
    second = worker(cluster, out)
    try:
        dead = read_topic(cluster, rh.dead_letter_topic("rk", "rk-app"), 1)
        wait_until(
            lambda: {c["value"] for c in calls_of(out)[1:]} >= {"ok-3", "ok-4"}, 60, "the rest"
        )
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    calls = calls_of(out)
    poison = [c["topic"] for c in calls if c["value"] == "poison-2"]
    # Killed after processing: the second consumer got it again from the original topic,
    # then once through the retry topic (max_attempts 2), then it was dead-lettered.
    assert poison == ["rk", "rk", "rk.rk-app.retry"], calls
    assert {c["value"] for c in calls} == {v.decode() for v in values}
    [letter] = dead
    info = rh.decode(letter.headers)
    assert info is not None and (info.original_topic, info.original_offset) == ("rk", 2)
    assert info.attempts == 2
    with Consumer(cluster.addresses, group_id="rk-app", enable_auto_commit=False) as reader:
        assert reader.committed([("rk", 0)]) == {("rk", 0): 5}


def test_bad_settings_are_refused_with_a_sentence(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="topic nope does not exist"):
        RetryingConsumer(cluster.addresses, "nope", print, group_id="rb-app")
    with pytest.raises(ValueError, match="leave enable_auto_commit out"):
        RetryingConsumer(
            cluster.addresses,
            "rb",
            print,
            group_id="rb-app",
            enable_auto_commit=True,  # type: ignore[call-arg]
        )
    with pytest.raises(ValueError, match="needs a group_id"):
        RetryingConsumer(cluster.addresses, "rb", print, group_id="")
    with pytest.raises(ValueError, match="at least 1"):
        RetryingConsumer(
            cluster.addresses, "rb", print, group_id="rb-app", policy=RetryPolicy(max_attempts=0)
        )


def run_json(cluster: LocalCluster, *args: str) -> dict:
    done = raftmq(cluster, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_dlq_list_and_replay(cluster: LocalCluster) -> None:
    topic, group = "rc", "rc-app"
    sent = [(0, b"good-0"), (0, b"bad-1"), (0, b"good-2"), (1, b"bad-3"), (1, b"bad-4")]
    produce(cluster, topic, sent)

    def handle(r: ConsumerRecord) -> None:
        if (r.value or b"").startswith(b"bad"):
            raise RuntimeError(f"no {r.value!r}")

    with RetryingConsumer(
        cluster.addresses,
        topic,
        handle,
        group_id=group,
        policy=RetryPolicy(max_attempts=1),  # no retries: straight to the dead letters
        auto_offset_reset="earliest",
    ) as consumer:
        dead = 0
        deadline = time.monotonic() + 60
        while dead < 3:
            assert time.monotonic() < deadline
            dead += consumer.process(0.2).dead_lettered

    listed = run_json(cluster, "dlq", "list", topic, "--group", group)
    assert listed["topic"] == "rc.rc-app.dlq" and listed["pending"] == 3
    letters = sorted(listed["dead_letters"], key=lambda x: x["original_offset"])
    letters.sort(key=lambda x: x["original_partition"])
    assert [(x["original_partition"], x["original_offset"]) for x in letters] == [
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert all(x["attempts"] == 1 and not x["replayed"] for x in letters)
    assert letters[0]["last_error"] == "RuntimeError: no b'bad-1'"
    table = raftmq(cluster, "dlq", "list", topic, "--group", group)
    assert table.returncode == 0 and b"3 to replay" in table.stdout, table.stdout

    done = raftmq(cluster, "dlq", "replay", topic, "--group", group)
    assert done.returncode == 0, done.stdout + done.stderr
    assert b"replayed 3 dead letters of rc.rc-app.dlq" in done.stdout and b"3 to rc" in done.stdout
    again = raftmq(cluster, "dlq", "replay", topic, "--group", group)
    assert again.returncode == 0 and b"replayed 0 dead letters" in again.stdout, again.stdout

    back = read_topic(cluster, topic, len(sent) + 3)
    by_partition = {p: [r.value for r in back if r.partition == p] for p in (0, 1)}
    assert by_partition == {
        0: [b"good-0", b"bad-1", b"good-2", b"bad-1"],
        1: [b"bad-3", b"bad-4", b"bad-3", b"bad-4"],
    }
    replayed = [r for r in back if r.offset >= (3 if r.partition == 0 else 2)]
    assert all(r.headers == (("source", b"test"),) for r in replayed)  # afresh, own headers
    assert all(r.key == b"key-" + (r.value or b"") for r in replayed)

    assert run_json(cluster, "dlq", "list", topic, "--group", group)["pending"] == 0
    everything = run_json(cluster, "dlq", "list", topic, "--group", group, "--all")
    assert len(everything["dead_letters"]) == 3
    assert all(x["replayed"] for x in everything["dead_letters"])

    missing = raftmq(cluster, "dlq", "replay", "nope", "--group", group)
    assert missing.returncode == 1 and b"rc-app" in missing.stdout
    assert b"does not exist" in missing.stdout, missing.stdout
    too_long = raftmq(cluster, "dlq", "list", topic, "--group", "g" * 250)
    assert too_long.returncode == 2 and b"over the 200" in too_long.stdout, too_long.stdout
