"""A group's committed progress never goes back (issue 20), against real brokers: a
member that lost its partition (its session ran out while its process stalled) and got it
back cannot commit the position it read before the loss, and resumes from the group's
committed offset, not from what it had buffered; a committed offset past the end of the
log a broker serves is waited for, not answered with ``auto_offset_reset``.

The chaos run that found it: a consumer committed 4842, its session ran out while two
brokers were killed, it joined again, read from 4772 (never committed: most likely the
log start of a replica rebuilt from a snapshot, where a fetch past a lagging broker's end
was reset to 'earliest'), and committed 4802."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raftmq.client.consumer import CommitFailedError, Consumer, ConsumerRecord
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import SHARED_BROKER_ARGS, cluster_spec, module_cluster

pytestmark = pytest.mark.timeout(180)

SESSION_MS = 2000
TOPICS = {"lost": 1, "ahead": 1}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("group-progress"), cluster_spec(TOPICS), SHARED_BROKER_ARGS, request
    ) as cluster:
        yield cluster


def produce(cluster: LocalCluster, topic: str, offsets: range) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in offsets:
            producer.send(topic, f"{topic}-{i}".encode(), partition=0).result(timeout=30)


def wait_until(check: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.05)
    return found


def poll_count(c: Consumer, count: int, timeout_s: float = 30) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"polled {len(got)} of {count} records"
        got += c.poll(0.2)
    return got


def member(cluster: LocalCluster, group: str, **settings: Any) -> Consumer:
    return Consumer(
        cluster.addresses,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS,
        fetch_max_wait_ms=100,
        **settings,
    )


def test_a_member_that_lost_its_partition_cannot_commit_where_it_was(
    cluster: LocalCluster,
) -> None:
    """a reads 10..19 (and has more buffered), then its process stalls past its session:
    b takes the partition, consumes on and commits 40, and leaves. a wakes, joins again
    and gets the partition back before its application commits the 20 it had read. That
    commit must be refused (it would take the group back from 40 to 20), and a resumes at
    40, with nothing it had buffered before."""
    topic, tp, group = "lost", ("lost", 0), "g-lost"
    produce(cluster, topic, range(40))
    with member(cluster, group, max_poll_records=10) as a:
        a.subscribe([topic])
        assert [r.offset for r in poll_count(a, 10)] == list(range(10))
        a.commit()
        assert [r.offset for r in poll_count(a, 10)] == list(range(10, 20))
        stale = {tp: 20}  # processed, not committed yet
        assert a._fetcher.states[tp].buffered, "the test wants records fetched ahead"
        session = a._session
        assert session is not None
        stalled_epoch = session.membership.epoch

        # The stall: a's I/O loop (heartbeats and fetches) blocks, as in a long GC pause.
        release = threading.Event()
        a._loop.call_soon_threadsafe(release.wait, 60)
        try:
            with member(cluster, group) as b:
                b.subscribe([topic])
                got = poll_count(b, 30)  # from the committed 10, once a's session expired
                assert [r.offset for r in got] == list(range(10, 40))
                b.commit()
                assert b.committed([tp]) == {tp: 40}
        finally:
            release.set()

        # a's session ran out on its own clock: it loses the partition and joins again,
        # getting it back (b left) before a's application polls.
        m = session.membership
        wait_until(
            lambda: tp in session.lost and m.joined and m.epoch != stalled_epoch and tp in m.held,
            "a losing the partition and joining again holding it",
        )
        with pytest.raises(CommitFailedError, match="lost") as refused:
            a.commit(stale)
        assert "lost/0" in str(refused.value)
        assert a.committed([tp]) == {tp: 40}

        produce(cluster, topic, range(40, 50))
        got = poll_count(a, 10)
        assert [r.offset for r in got] == list(range(40, 50))  # nothing left from before
        a.commit()
        assert a.committed([tp]) == {tp: 50}


def test_a_committed_offset_past_a_brokers_end_is_waited_for(cluster: LocalCluster) -> None:
    """The group committed 25 (so the log once reached it); the broker answering says its
    log ends at 10, as a lagging leader or a rebuilt replica would. The member waits for
    the log to reach 25 rather than reset to 'earliest' and consume (and commit) from 0."""
    topic, tp, group = "ahead", ("ahead", 0), "g-ahead"
    with member(cluster, group) as outside:
        outside.assign([tp])
        outside.commit({tp: 25})
    produce(cluster, topic, range(10))
    with member(cluster, group) as c:
        c.subscribe([topic])
        wait_until(lambda: c.poll(0.1) == [] and c.assignment(), "assignment")
        until = time.monotonic() + 2
        while time.monotonic() < until:
            assert c.poll(0.2) == []
        assert c.position(tp) == 25
        assert c.committed([tp]) == {tp: 25}
        produce(cluster, topic, range(10, 30))
        got = poll_count(c, 5)
        assert [(r.offset, r.value) for r in got] == [
            (o, f"ahead-{o}".encode()) for o in range(25, 30)
        ]
