"""Replica moves with real processes (four brokers, combined mode): MoveReplica records the
move, the partition's Raft leader adds the new replica as a learner, reports it caught up,
promotes it and removes the old voter; the old broker deletes its copy. Checked by reading
every replica: each record acknowledged (acks=all) during the move is on the new replica
and on every voter, the old replica's directory is gone, and the group's members (as its
leader reports them) are the metadata's. Also: moving the leader's own replica (it hands
leadership over first), replacing a voter that is dead (2 of 3 alive), a learner that
needs a snapshot, and a move to a dead broker that stays under way without harm."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.cli.topic_cmd import learner_progress
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from tests.broker.conftest import REBALANCE_ARGS, log_tails
from tests.broker.test_broker_cluster import batch, offsets, read_all, wait_until

TOPIC = "moving"
MOVE_TIMEOUT_S = 60.0
RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]


def raftmq(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    bootstrap = ["--bootstrap", ",".join(cluster.addresses)]
    return subprocess.run(
        [*RAFTMQ, "topic", *args, *bootstrap], capture_output=True, text=True, timeout=120
    )


def move_cli(
    cluster: LocalCluster, source: int, to: int, *flags: str
) -> subprocess.CompletedProcess[str]:
    """``raftmq topic move-replica`` of the test topic's partition 0."""
    return raftmq(
        cluster,
        "move-replica",
        TOPIC,
        "--partition",
        "0",
        "--from",
        str(source),
        "--to",
        str(to),
        *flags,
    )


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Four brokers (20 ms ticks) and a topic of one partition on brokers 1, 2, 3 (1 leads).
    Parametrized indirectly with a dict, the topic gets those settings and the brokers
    apply retention every 200 ms."""
    args = ["--tick-ms", "20", "--election-ticks", "10", *REBALANCE_ARGS]
    config = getattr(request, "param", {})
    if config:
        args += ["--retention-check-ms", "200"]
    c = LocalCluster(tmp_path / "c", local_spec(4, {}, name="raftmq-test"), broker_args=args)
    try:
        c.start()
        c.wait_for_leaders()
        with c.admin() as admin:
            admin.create_topic(TOPIC, 1, 3, config, assignment=[(1, 2, 3)])
        with c.client() as client:
            wait_until(
                lambda: client.refresh_leaders(timeout=1.0).get((TOPIC, 0)),
                30,
                "a leader for the topic",
            )
        yield c
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(log_tails(c, 60))
        for bid in list(c.procs):
            c.kill(bid)
        c.close()


class Producer:
    """Produces numbered records (acks=all) in a thread; remembers the acknowledged ones."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.client = LowLevelClient(cluster.addresses)
        self.acked: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            values = [f"r{n}-{i}".encode() * 20 for i in range(5)]
            n += 1
            try:
                self.client.produce(TOPIC, 0, batch(values), timeout_ms=5_000)
            except ClientError:
                continue  # not acknowledged: not counted
            self.acked += values
            time.sleep(0.01)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.client.close()


def replica_dir(cluster: LocalCluster, broker_id: int) -> Path:
    return cluster.data / f"broker-{broker_id}" / f"{TOPIC}-0"


def wait_moved(cluster: LocalCluster, to: int) -> tuple[int, ...]:
    """Until the metadata lists ``to`` as a voter and no learner; the replicas then."""
    with cluster.admin() as admin:

        def done() -> tuple[int, ...] | None:
            part = admin.describe_topic(TOPIC).partitions[0]
            return tuple(part.replicas) if to in part.replicas and not part.learners else None

        return wait_until(done, MOVE_TIMEOUT_S, f"broker {to} voting in the metadata")  # type: ignore[return-value]


def group_members(client: LowLevelClient, cluster: LocalCluster) -> tuple[int, set[int]]:
    """The partition's leader and its group's members as the leader reports them (itself
    and every follower it replicates to: voters and learners)."""
    leader = client.refresh_leaders(timeout=1.0)[TOPIC, 0].broker_id
    md = client.stub(cluster.spec.brokers[leader].address).Metadata(
        pb.MetadataRequest(topics=[TOPIC]), timeout=5
    )
    part = md.topics[0].partitions[0]
    return leader, {s.broker_id for s in part.replica_status}


def wait_members(client: LowLevelClient, cluster: LocalCluster, want: set[int]) -> int:
    """Until the group's members are ``want``; its leader then."""
    found: list[tuple[int, set[int]]] = []

    def check() -> bool:
        try:
            found.append(group_members(client, cluster))
        except Exception:  # no leader known for a moment
            return False
        return found[-1][1] == want

    wait_until(check, MOVE_TIMEOUT_S, f"the group's members to be {sorted(want)} ({found[-1:]})")
    return found[-1][0]


def check_every_replica(
    client: LowLevelClient, cluster: LocalCluster, brokers: set[int], acked: list[bytes]
) -> None:
    """Every acknowledged record is on the replica of each of ``brokers`` (read there, up
    to its high watermark once that reached the leader's), all replicas alike."""
    leader_records, _ = read_all(client, TOPIC, 0)
    values = [r.value for r in leader_records]
    assert set(acked) <= set(values), "an acknowledged record is missing on the leader"
    for b in sorted(brokers):
        address = cluster.spec.brokers[b].address
        wait_until(
            lambda a=address: len(read_all(client, TOPIC, 0, address=a)[0]) >= len(values),
            30,
            f"broker {b}'s replica reaching the leader's high watermark",
        )
        records, _ = read_all(client, TOPIC, 0, address=address)
        assert [r.value for r in records][: len(values)] == values, f"broker {b} differs"


def check_group_votes_without(
    client: LowLevelClient, cluster: LocalCluster, voters: set[int]
) -> None:
    """The group commits with only the leader and one other of ``voters`` alive: the
    third of ``voters`` votes (a learner would not count) and no removed voter does
    (it would make four, of which two are no majority)."""
    leader, _ = group_members(client, cluster)
    victim = max(voters - {leader})
    cluster.kill(victim)
    client.produce(TOPIC, 0, batch([b"after-the-move"]), timeout_ms=10_000)


def test_a_replica_moves_to_a_new_broker_while_records_are_produced(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        with Producer(cluster) as producer:
            wait_until(
                lambda: len(producer.acked) >= 50, 30, "records acknowledged before the move"
            )
            with cluster.admin() as admin:
                admin.move_replica(TOPIC, 0, 3, 4)
                # one move at a time per partition, with a sentence and a code
                with pytest.raises(ClientError) as busy:
                    admin.move_replica(TOPIC, 0, 2, 4)
                assert busy.value.label == "INVALID_REPLICA_CHANGE", busy.value
            assert wait_moved(cluster, 4) == (1, 2, 4)
            wait_until(
                lambda: not replica_dir(cluster, 3).exists(), 30, "broker 3 deleting its copy"
            )
            count = len(producer.acked)
            wait_until(lambda: len(producer.acked) >= count + 50, 30, "records after the move")
        assert wait_members(client, cluster, {1, 2, 4})
        check_every_replica(client, cluster, {1, 2, 4}, producer.acked)
        assert "moved to broker 4" in cluster.log_path(3).read_text()
        check_group_votes_without(client, cluster, {1, 2, 4})


def test_moving_the_leaders_own_replica_hands_leadership_over_first(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        leader = client.refresh_leaders(timeout=1.0)[TOPIC, 0].broker_id
        stays = {1, 2, 3} - {leader}
        with Producer(cluster) as producer:
            wait_until(
                lambda: len(producer.acked) >= 50, 30, "records acknowledged before the move"
            )
            started = move_cli(cluster, leader, 4, "--no-wait")
            assert started.returncode == 0, started.stdout + started.stderr
            assert f"Moving {TOPIC}/0 from broker {leader} to broker 4" in started.stdout
            replicas = wait_moved(cluster, 4)
            assert set(replicas) == stays | {4}
            wait_until(
                lambda: not replica_dir(cluster, leader).exists(),
                30,
                f"broker {leader} deleting its copy",
            )
        new_leader = wait_members(client, cluster, stays | {4})
        assert new_leader != leader
        assert "leaves the replicas" in cluster.log_path(leader).read_text()
        check_every_replica(client, cluster, stays | {4}, producer.acked)
        check_group_votes_without(client, cluster, stays | {4})


def test_a_dead_voter_is_replaced_with_two_of_three_alive(cluster: LocalCluster) -> None:
    with cluster.client() as client:
        acked = []
        for i in range(20):
            values = [f"before-{i}".encode()]
            client.produce(TOPIC, 0, batch(values))
            acked += values
        cluster.kill(3)
        with Producer(cluster) as producer:
            wait_until(lambda: len(producer.acked) >= 20, 30, "records acknowledged, 3 dead")
            moved = move_cli(cluster, 3, 4)
            assert moved.returncode == 0, moved.stdout + moved.stderr
            assert "Moved moving/0 from broker 3 to broker 4: replicas now 1,2,4" in moved.stdout
            assert wait_moved(cluster, 4) == (1, 2, 4)
        wait_members(client, cluster, {1, 2, 4})
        check_every_replica(client, cluster, {1, 2, 4}, acked + producer.acked)
        # broker 3 comes back: its copy is deleted, nothing else of it is needed
        assert replica_dir(cluster, 3).exists()
        cluster.start(3)
        wait_until(lambda: not replica_dir(cluster, 3).exists(), 30, "broker 3 deleting its copy")
        check_group_votes_without(client, cluster, {1, 2, 4})


@pytest.mark.parametrize(
    "cluster", [{"segment.bytes": "4096", "retention.bytes": "16384"}], indirect=True
)
def test_a_learner_behind_the_leaders_log_start_takes_a_snapshot(cluster: LocalCluster) -> None:
    """The leader deleted its log's first segments (retention) before the move: the new
    replica starts from the leader's log start, as any follower that far behind does."""
    with cluster.client() as client:
        acked = []
        for i in range(60):
            values = [f"old-{i}".encode() * 40]
            client.produce(TOPIC, 0, batch(values))
            acked += values
        leader = client.refresh_leaders(timeout=1.0)[TOPIC, 0].broker_id
        address = cluster.spec.brokers[leader].address
        start = wait_until(
            lambda: offsets(client, address, TOPIC)[0], 30, "retention deleting old segments"
        )
        with cluster.admin() as admin:
            admin.move_replica(TOPIC, 0, 3, 4)
        assert wait_moved(cluster, 4) == (1, 2, 4)
        wait_members(client, cluster, {1, 2, 4})
        last = client.produce(TOPIC, 0, batch([b"new"])).last_offset
        # A follower learns the commit index with the leader's next append or heartbeat.
        wait_until(
            lambda: offsets(client, cluster.spec.brokers[4].address, TOPIC)[1] > last,
            10,
            "broker 4's high watermark passing the new record",
        )
        new_start, hw = offsets(client, cluster.spec.brokers[4].address, TOPIC)
        assert new_start >= start and hw > new_start, (start, new_start, hw)
        records, _ = read_all(
            client, TOPIC, 0, address=cluster.spec.brokers[4].address, start=new_start
        )
        assert records[-1].value == b"new"
        check_group_votes_without(client, cluster, {1, 2, 4})


def test_bad_moves_are_refused_with_a_sentence_and_a_code(cluster: LocalCluster) -> None:
    cases = [
        (["--from", "9", "--to", "4"], "NOT_A_REPLICA", "no voting replica"),
        (["--from", "3", "--to", "2"], "INVALID_REPLICA_CHANGE", "holds moving/0 already"),
        (["--from", "3", "--to", "3"], "INVALID_REPLICA_CHANGE", "two different brokers"),
        (["--from", "3", "--to", "9"], "UNKNOWN_BROKER", "has not registered"),
    ]
    for args, code, words in cases:
        got = raftmq(cluster, "move-replica", TOPIC, "--partition", "0", *args)
        assert got.returncode == 1, (args, got.stdout, got.stderr)
        assert code in got.stdout and words in got.stdout, (args, got.stdout)
        assert "Traceback" not in got.stdout + got.stderr
    for topic, partition, code in (
        ("nope", "0", "UNKNOWN_TOPIC"),
        (TOPIC, "5", "UNKNOWN_PARTITION"),
    ):
        got = raftmq(
            cluster, "move-replica", topic, "--partition", partition, "--from", "3", "--to", "4"
        )
        assert got.returncode == 1 and code in got.stdout, got.stdout
    with cluster.admin() as admin:
        part = admin.describe_topic(TOPIC).partitions[0]
        assert (tuple(part.replicas), tuple(part.learners)) == ((1, 2, 3), ()), "nothing changed"


@pytest.mark.serial  # the CLI must finish within the dead broker's 6 s session
def test_a_move_to_a_dead_broker_stays_under_way_and_says_how_far_it_is(
    cluster: LocalCluster,
) -> None:
    with cluster.client() as client:
        client.produce(TOPIC, 0, batch([b"x"] * 10))
        cluster.kill(4)  # not fenced yet: still a placement target for a while
        got = move_cli(cluster, 3, 4, "--timeout", "2")
        assert got.returncode == 1, got.stdout + got.stderr
        assert "still under way after 2 s" in got.stdout, got.stdout
        progress = learner_progress(client, TOPIC, 0, 4)
        assert "holds entries up to 0 of the commit" in progress, progress
    with cluster.admin() as admin:
        part = admin.describe_topic(TOPIC).partitions[0]
        assert (tuple(part.replicas), tuple(part.learners)) == ((1, 2, 3), (4,))
    assert replica_dir(cluster, 3).exists()  # nothing leaves before its replacement votes
