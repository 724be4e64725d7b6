"""Consumer groups against real brokers, with members in real processes
(tests/client/group_member.py) where a crash is involved: one consumer per partition
across join, leave and crash, checked from each member's own record of what it received;
a SIGKILLed member replaced after its session timeout, the group resuming from the last
committed offsets; redelivery after a crash between processing and commit; a zombie's
commit refused; an incremental rebalance that leaves the other partitions flowing; and
the in-process API (committed offsets, callbacks in poll, static membership, assign
mode's commits)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.client.admin import AdminClient
from raftmq.client.consumer import AsyncConsumer, CommitFailedError, Consumer
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import SHARED_BROKER_ARGS, cluster_spec, module_cluster
from tests.broker.test_controller_layouts import Dedicated, controller_leader, dedicated

__all__ = ["dedicated"]  # the fixture: dedicated controllers, broker-only nodes

pytestmark = pytest.mark.timeout(180)

SESSION_MS = 2000
TOPICS = {"join": 6, "kill": 3, "redo": 3, "zombie": 2, "flow": 6, "api": 2, "static": 2, "aio": 2}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("group-cluster"),
        cluster_spec(TOPICS),
        SHARED_BROKER_ARGS,
        request,
    ) as cluster:
        yield cluster


# --- helpers ---------------------------------------------------------------------------


class Member:
    """A group_member.py process and what it wrote."""

    def __init__(self, cluster: LocalCluster, tmp: Path, name: str, topic: str, *extra: str):
        self.name = name
        self.out = tmp / f"{name}.jsonl"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.client.group_member",
                "--bootstrap",
                ",".join(cluster.addresses),
                "--group",
                f"g-{topic}",
                "--topic",
                topic,
                "--out",
                str(self.out),
                "--session-timeout-ms",
                str(SESSION_MS),
                *extra,
            ],
            env=env,
            cwd=ROOT,
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        lines = self.out.read_text().splitlines()
        out = [json.loads(line) for line in lines if line.endswith("}")]
        return [e for e in out if kind is None or e["kind"] == kind]

    def offsets(self) -> set[tuple[int, int]]:
        return {(e["p"], e["o"]) for e in self.events("record")}

    def wait_for(self, kind: str, count: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events(kind)) < count:
            assert self.proc.poll() is None or kind == "closed", f"{self.name} exited"
            assert time.monotonic() < deadline, f"{self.name}: no {kind} in {timeout} s"
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM: close, which commits nothing more here (it commits per poll) and
        leaves the group."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == 0
        assert self.events("closed")

    def kill(self) -> float:
        self.proc.kill()
        self.proc.wait(timeout=10)
        return time.time()


class Feed:
    """Produces to every partition of ``topic`` in the background (about ``rate``
    records a second) until stopped; ``sent`` holds each partition's offsets."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int, rate: int = 150):
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.producer = Producer(cluster.addresses, linger_ms=1)
        self.sent: dict[int, list[int]] = {p: [] for p in range(partitions)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            futures = [
                self.producer.send(self.topic, f"v{i}-{p}".encode(), partition=p)
                for p in range(self.partitions)
            ]
            for f in futures:
                md = f.result(timeout=30)
                self.sent[md.partition].append(md.offset)
            i += 1
            time.sleep(self.partitions / self.rate)

    def stop(self) -> set[tuple[int, int]]:
        self._stop.set()
        self._thread.join(timeout=30)
        self.producer.close()
        return {(p, o) for p, offsets in self.sent.items() for o in offsets}


def wait_all_delivered(members: list[Member], sent: set[tuple[int, int]], timeout=60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got: set[tuple[int, int]] = set().union(*(m.offsets() for m in members))
        if sent <= got:
            return
        missing = sorted(sent - got)
        assert time.monotonic() < deadline, f"{len(missing)} never delivered: {missing[:10]}"
        time.sleep(0.3)


def check_one_consumer_at_a_time(members: list[Member]) -> None:
    """Per partition, each member's stints (from its first to its last record of one
    assignment) never overlap another member's: no two members consumed it at once."""
    stints: dict[int, list[tuple[float, float, str]]] = {}
    for m in members:
        spans: dict[tuple[int, int], list[float]] = {}
        for e in m.events("record"):
            spans.setdefault((e["p"], e["stint"]), []).append(e["t"])
        for (p, _), times in spans.items():
            stints.setdefault(p, []).append((min(times), max(times), m.name))
    for p, spans_of_p in stints.items():
        latest = (0.0, "")  # the end of the stint reaching furthest so far, and its member
        for start, end, member in sorted(spans_of_p):
            assert latest[1] in ("", member) or latest[0] <= start, (
                f"partition {p}: {latest[1]} consumed it until {latest[0]:.3f} while "
                f"{member} started at {start:.3f}"
            )
            latest = max(latest, (end, member))


def committed(cluster: LocalCluster, group: str, partitions: list[tuple[str, int]]) -> dict:
    with Consumer(cluster.addresses, group_id=group) as c:
        return c.committed(partitions)


# --- processes --------------------------------------------------------------------------


def test_one_consumer_per_partition_across_join_leave_and_crash(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    feed = Feed(cluster, "join", 6)
    a = Member(cluster, tmp_path, "a", "join")
    a.wait_for("record")
    b = Member(cluster, tmp_path, "b", "join")
    b.wait_for("record")
    c = Member(cluster, tmp_path, "c", "join")
    c.wait_for("record")
    time.sleep(1)
    b.stop()  # leaves: its partitions go to a and c
    time.sleep(1.5)
    c.kill()  # crashes: its partitions go to a after its session timeout
    time.sleep(SESSION_MS / 1000 + 2)
    sent = feed.stop()
    members = [a, b, c]
    wait_all_delivered(members, sent)
    # each joined and had partitions; a ends with all six
    assert all(m.events("assign") for m in members)
    held: set[int] = set()
    for e in a.events():
        if e["kind"] == "assign":
            held |= set(e["ps"])
        elif e["kind"] in ("revoke", "lost"):
            held -= set(e["ps"])
    assert held == set(range(6))
    a.stop()
    check_one_consumer_at_a_time(members)


def test_a_killed_member_is_replaced_after_its_session_and_the_group_resumes(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    feed = Feed(cluster, "kill", 3)
    a = Member(cluster, tmp_path, "a", "kill")
    a.wait_for("record", 60)
    killed_at = a.kill()
    feed_before = feed.stop()
    at_kill = committed(cluster, "g-kill", [("kill", p) for p in range(3)])
    assert any(o is not None for o in at_kill.values()), at_kill  # a had committed
    b = Member(cluster, tmp_path, "b", "kill")
    # Its partitions, not a record: a may have committed everything fed before it died
    # (a loaded machine), and then nothing is left to deliver again.
    b.wait_for("assign", timeout=60)
    first_assign = b.events("assign")[0]
    assert first_assign["t"] - killed_at >= SESSION_MS / 1000 * 0.8, "a was replaced too soon"
    assert sorted(first_assign["ps"]) == [0, 1, 2]
    # b delivers everything from the last commit on: what a did after it comes again
    start = {p: at_kill[("kill", p)] or 0 for p in range(3)}
    wait_all_delivered([b], {(p, o) for p, o in feed_before if o >= start[p]})
    for p in range(3):
        mine = [o for q, o in b.offsets() if q == p]
        assert min(mine, default=start[p]) == start[p], f"partition {p}: b began at {min(mine)}"
    b.stop()


def test_a_crash_between_processing_and_commit_redelivers(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(60):
            producer.send("redo", f"r{i}".encode(), partition=i % 3)
    a = Member(cluster, tmp_path, "a", "redo", "--crash-after", "25")
    assert a.proc.wait(timeout=60) == 3
    processed_by_a = a.offsets()
    assert len(processed_by_a) == 25
    at_crash = committed(cluster, "g-redo", [("redo", p) for p in range(3)])
    start = {p: at_crash[("redo", p)] or 0 for p in range(3)}
    b = Member(cluster, tmp_path, "b", "redo")
    wait_all_delivered([b], {(p, o) for p in range(3) for o in range(start[p], 20)})
    b.stop()
    again = processed_by_a & b.offsets()
    assert again, "nothing a processed without committing came again"
    for p in range(3):
        first = min((o for q, o in b.offsets() if q == p), default=20)  # 20: a did it all
        assert first == start[p], f"partition {p}: b started at {first}, not {start[p]}"
        assert {(p, o) for o in range(start[p])} <= processed_by_a  # committed: done


def test_a_zombie_members_commit_is_refused_and_progress_stays(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    tps = [("zombie", 0), ("zombie", 1)]

    def produce(count: int) -> None:
        with Producer(cluster.addresses, linger_ms=1) as producer:
            for i in range(count):
                producer.send("zombie", f"z{i}".encode(), partition=i % 2)

    produce(40)
    a = Member(cluster, tmp_path, "a", "zombie")
    a.wait_for("record", 40)
    a.wait_for("committed")
    a.proc.send_signal(signal.SIGSTOP)  # a stalls (a GC pause, a stuck disk)
    try:
        produce(20)
        b = Member(cluster, tmp_path, "b", "zombie")
        wait_all_delivered([b], {(p, o) for p in (0, 1) for o in range(20, 30)})
        deadline = time.monotonic() + 10
        while committed(cluster, "g-zombie", tps) != {tp: 30 for tp in tps}:
            assert time.monotonic() < deadline, "b never committed its progress"
            time.sleep(0.2)
    finally:
        a.proc.send_signal(signal.SIGCONT)  # a wakes, and commits where it was: 20, 20
    a.wait_for("commit_failed", timeout=20)
    refusal = a.events("commit_failed")[0]
    assert refusal["code"] in ("UNKNOWN_MEMBER", "FENCED_MEMBER_EPOCH", "PARTITION_NOT_ASSIGNED")
    assert not [e for e in a.events("committed") if e["offsets"] is not None]
    time.sleep(1)
    assert committed(cluster, "g-zombie", tps) == {tp: 30 for tp in tps}  # b's progress stays
    a.stop()
    b.stop()


def test_a_commit_at_a_stale_epoch_is_refused_by_the_group(cluster: LocalCluster) -> None:
    settings: dict[str, Any] = {
        "group_id": "g-stale",
        "session_timeout_ms": SESSION_MS,
        "enable_auto_commit": False,
    }
    with Consumer(cluster.addresses, **settings) as a:
        a.subscribe(["kill"])
        wait_assigned(a, 3)
        session = a._session
        assert session is not None
        stale = session.membership.epoch
        with Consumer(cluster.addresses, **settings) as b:
            b.subscribe(["kill"])
            wait_assigned(b, 1, others=[a])
            assert session.membership.epoch != stale
            session.membership.epoch = stale  # a commit stamped as before the rebalance
            with pytest.raises(CommitFailedError, match="epoch") as refused:
                a.commit({tp: 0 for tp in a.assignment()})
            assert refused.value.code_name == "FENCED_MEMBER_EPOCH"


def wait_assigned(c: Consumer, count: int, others: list[Consumer] = ()) -> None:  # type: ignore[assignment]
    deadline = time.monotonic() + 30
    while len(c.assignment()) < count:
        assert time.monotonic() < deadline, f"assigned {c.assignment()}"
        c.poll(0.1)
        for o in others:
            o.poll(0.1)


def test_an_incremental_rebalance_keeps_the_other_partitions_flowing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    feed = Feed(cluster, "flow", 6, rate=300)
    a = Member(cluster, tmp_path, "a", "flow")
    a.wait_for("record", 50)
    time.sleep(1)
    b_started = time.time()
    b = Member(cluster, tmp_path, "b", "flow")
    b.wait_for("record")
    time.sleep(1)
    feed.stop()
    given = {p for e in b.events("assign") for p in e["ps"]}
    revoked = {p for e in a.events("revoke") for p in e["ps"]}
    assert given and revoked == given, (given, revoked)  # a gave up only what moved
    kept = set(range(6)) - revoked
    assert len(kept) >= 2
    b_first = b.events("record")[0]["t"]
    for p in kept:
        times = sorted(e["t"] for e in a.events("record") if e["p"] == p)
        window = [t for t in times if b_started - 0.5 <= t <= b_first + 0.5]
        gaps = [y - x for x, y in itertools.pairwise(window)]
        assert window and max(gaps, default=0) < 0.75, f"partition {p} paused: {gaps}"
    a.stop()
    b.stop()


# --- in-process API ---------------------------------------------------------------------


def poll_records(consumer: Consumer, count: int, timeout: float = 30) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"polled {len(out)} of {count}"
        out += consumer.poll(0.3)
    return out


def test_commit_committed_callbacks_and_assign_mode(cluster: LocalCluster) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(10):
            producer.send("api", f"x{i}".encode(), partition=i % 2)
    calls: list[tuple[str, str, set]] = []
    main_thread = threading.current_thread().name

    def on_assign(tps: set) -> None:
        calls.append(("assign", threading.current_thread().name, tps))

    settings: dict[str, Any] = {"session_timeout_ms": SESSION_MS, "auto_offset_reset": "earliest"}
    with Consumer(cluster.addresses, group_id="g-api", enable_auto_commit=False, **settings) as c:
        with pytest.raises(ValueError, match="group"):
            Consumer(cluster.addresses).subscribe(["api"])
        c.subscribe(
            ["api"], on_assign=on_assign, on_revoke=lambda tps: calls.append(("revoke", "", tps))
        )
        got = poll_records(c, 10)
        assert calls[0] == ("assign", main_thread, {("api", 0), ("api", 1)})  # in poll's thread
        assert c.committed() == {("api", 0): None, ("api", 1): None}
        c.commit({("api", 0): 3})
        future = c.commit(asynchronous=True)
        assert future is not None
        future.result(timeout=10)
        assert c.committed() == {("api", 0): 5, ("api", 1): 5}
        assert len(got) == 10
        with pytest.raises(RuntimeError, match="subscribed"):
            c.assign([("api", 0)])
    assert calls[-1][0] == "revoke"  # close gave them up
    # assign mode commits for the group outside its membership, once it is empty
    manual = {**settings, "enable_auto_commit": False}
    with Consumer(cluster.addresses, group_id="g-api", **manual) as c:
        c.assign([("api", 0)])
        c.commit({("api", 0): 2})
        assert c.committed([("api", 0)]) == {("api", 0): 2}
    # a member of the group resumes from there, and auto-commits on close
    with Consumer(cluster.addresses, group_id="g-api", **settings) as c:
        c.subscribe(["api"])
        got = poll_records(c, 3)
        assert [(r.partition, r.offset) for r in got] == [(0, 2), (0, 3), (0, 4)]
        # assign mode's commit is refused while the group has members
        with Consumer(cluster.addresses, group_id="g-api", **manual) as other:
            other.assign([("api", 1)])
            with pytest.raises(CommitFailedError, match="members"):
                other.commit({("api", 1): 0})
    assert committed(cluster, "g-api", [("api", 0), ("api", 1)]) == {
        ("api", 0): 5,
        ("api", 1): 5,
    }


def test_a_static_member_takes_its_partitions_back_at_once(cluster: LocalCluster) -> None:
    settings: dict[str, Any] = {
        "group_id": "g-static",
        "group_instance_id": "worker-1",
        "session_timeout_ms": 10_000,
    }
    with Consumer(cluster.addresses, **settings) as c:
        c.subscribe(["static"])
        deadline = time.monotonic() + 20
        while len(c.assignment()) < 2:
            assert time.monotonic() < deadline
            c.poll(0.2)
    # closed without leaving: a restart well within the 10 s session gets both back
    started = time.monotonic()
    with Consumer(cluster.addresses, **settings) as c:
        c.subscribe(["static"])
        while len(c.assignment()) < 2:
            assert time.monotonic() - started < 5, "the restarted static member waited"
            c.poll(0.2)


def test_the_async_consumer_in_a_group(cluster: LocalCluster) -> None:
    import asyncio
    import re

    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(6):
            producer.send("aio", f"y{i}".encode(), partition=i % 2)

    async def run() -> None:
        assigned: list[set] = []

        async def on_assign(tps: set) -> None:
            assigned.append(tps)

        c = AsyncConsumer(
            cluster.addresses,
            group_id="g-async",
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
        )
        async with c:
            c.subscribe(re.compile(r"ai."), on_assign=on_assign)
            got: list = []
            deadline = time.monotonic() + 30
            while len(got) < 6:
                assert time.monotonic() < deadline
                got += await c.poll(0.3)
            assert assigned == [{("aio", 0), ("aio", 1)}]
            await c.commit()
            assert await c.committed() == {("aio", 0): 3, ("aio", 1): 3}

    asyncio.run(run())


def test_a_group_through_broker_only_nodes_survives_a_controller_leader_kill(
    dedicated: Dedicated,
) -> None:
    """The consumer knows only broker-only nodes: they answer NOT_CONTROLLER and it
    follows them to the controller leader; killing that leader delays heartbeats and
    commits until another takes over, and loses no commit."""
    cluster = dedicated()
    with AdminClient(cluster.controller_addresses) as admin:
        admin.create_topic("d", 2, 3)
    tps = [("d", 0), ("d", 1)]

    def produce(start: int) -> None:
        with Producer(cluster.addresses, linger_ms=1) as producer:
            for i in range(start, start + 20):
                producer.send("d", f"d{i}".encode(), partition=i % 2)

    settings: dict[str, Any] = {
        "group_id": "g-dedicated",
        "session_timeout_ms": 10_000,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }
    with Consumer(cluster.addresses, **settings) as c:
        c.subscribe(["d"])
        produce(0)
        assert len(poll_records(c, 20)) == 20
        c.commit()
        assert c.committed(tps) == {tp: 10 for tp in tps}
        leader = controller_leader(cluster.controller_addresses)
        assert leader in cluster.spec.voters
        cluster.kill(leader)
        produce(20)
        assert len(poll_records(c, 20)) == 20  # fetching never needed the controller
        assert c.committed(tps) == {tp: 10 for tp in tps}  # the next leader kept the commit
        c.commit()  # waits for the next controller leader
        assert c.committed(tps) == {tp: 20 for tp in tps}


def test_group_settings_and_misuse_are_sentences() -> None:
    nowhere = ["127.0.0.1:1"]  # nothing is sent for any of these
    for settings, words in (
        ({"group_id": "g", "session_timeout_ms": 10}, "session_timeout_ms must be"),
        ({"group_instance_id": "w-1"}, "group_instance_id needs a group_id"),
        ({"group_id": "g", "assignor": "eager"}, "assignor must be one of"),
        ({"group_id": ""}, "group_id is a name"),
    ):
        with pytest.raises(ValueError, match=words):
            Consumer(nowhere, **settings)
    with Consumer(nowhere) as c:
        with pytest.raises(ValueError, match="needs a consumer group"):
            c.commit({("t", 0): 1})
        with pytest.raises(ValueError, match="needs a consumer group"):
            c.subscribe(["t"])
    with Consumer(nowhere, group_id="g") as c:
        with pytest.raises(ValueError, match="topic names"):
            c.subscribe([])
        with pytest.raises(ValueError, match="negative"):
            c.commit({("t", 0): -1})
        c.assign([("t", 0)])
        with pytest.raises(RuntimeError, match="assign"):
            c.subscribe(["t"])


def test_a_pattern_takes_in_a_topic_created_later(cluster: LocalCluster) -> None:
    import re

    with Consumer(cluster.addresses, group_id="g-pattern", session_timeout_ms=SESSION_MS) as c:
        c.subscribe(re.compile(r"later-\d+"))
        c.poll(0.5)
        assert c.assignment() == set()  # nothing matches yet: not even a member
        with AdminClient(cluster.addresses) as admin:
            admin.create_topic("later-1", 2, 3)
        deadline = time.monotonic() + 30
        while c.assignment() != {("later-1", 0), ("later-1", 1)}:
            assert time.monotonic() < deadline, f"assigned {c.assignment()}"
            c.poll(0.2)


def test_a_frozen_cluster_delays_the_group_without_failing_poll(
    cluster: LocalCluster,
) -> None:
    """Every broker frozen (SIGSTOP) for longer than half the session timeout, as a
    network blip would: the member's heartbeats time out (DEADLINE_EXCEEDED, no raftmq
    code) and must be retried until the session's own clock runs out, not raised out of
    poll (the chaos run with the real clients found that, with the controller cut off)."""
    with AdminClient(cluster.addresses) as admin:
        admin.create_topic("frozen", 2, 3)
    tps = [("frozen", 0), ("frozen", 1)]
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(10):
            producer.send("frozen", f"f{i}".encode(), partition=i % 2)
    settings: dict[str, Any] = {
        "group_id": "g-frozen",
        # Beats every 3 s, each given 7.5 s (half the session): a freeze of 10.7 s holds
        # one beat for its whole deadline, and ends before the member's own session
        # clock (15 s from its last answered beat) would fence it.
        "session_timeout_ms": 15_000,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
    }
    with Consumer(cluster.addresses, **settings) as c:
        c.subscribe(["frozen"])
        assert len(poll_records(c, 10)) == 10
        c.commit()
        for bid in cluster.spec.brokers:
            cluster.signal(bid, signal.SIGSTOP)
        try:
            until = time.monotonic() + 10.7
            while time.monotonic() < until:
                c.poll(0.3)  # raised when a heartbeat's timeout ended the session task
        finally:
            for bid in cluster.spec.brokers:
                cluster.signal(bid, signal.SIGCONT)
        with Producer(cluster.addresses, linger_ms=1) as producer:
            for i in range(10, 20):
                producer.send("frozen", f"f{i}".encode(), partition=i % 2)
        got = poll_records(c, 10, timeout=60)
        assert sorted(r.value for r in got) == sorted(f"f{i}".encode() for i in range(10, 20))
        c.commit()
        assert c.committed(tps) == {tp: 10 for tp in tps}
