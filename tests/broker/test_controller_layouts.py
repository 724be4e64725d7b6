"""The dedicated-controller layout, brokers restarting while the controller is away (their
cached metadata), a broker added to a running cluster, wiped disks (a controller voter's,
an added broker's), and controller faults (SIGKILL of the leader, every node killed,
every controller paused), with real processes.

Dedicated clusters here: nodes 1-3 are controller-only voters, 4.. broker-only."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import controller_pb2 as cpb
from raftmq.api.v1 import controller_pb2_grpc as cpb_grpc
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from raftmq.broker.metadata_cache import MetadataCache
from raftmq.client.admin import AdminClient
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from tests.broker.conftest import REBALANCE_ARGS, ClusterFactory, log_tails
from tests.broker.test_broker_cluster import assert_error, batch, read_all, rpc_error, wait_until
from tests.broker.test_controller_wiring import (
    CONTROLLER_FAILOVER_S,
    produce_and_read,
    wait_led,
)

ARGS = ["--tick-ms", "20", "--election-ticks", "10", *REBALANCE_ARGS]
CONTROLLERS = (1, 2, 3)

Dedicated = Callable[..., LocalCluster]


@pytest.fixture
def dedicated(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Dedicated]:
    """``dedicated(brokers=3)`` starts 3 controller-only voters and ``brokers`` brokers
    and waits until the brokers registered; killed after the test."""
    clusters: list[LocalCluster] = []

    def make(brokers: int = 3) -> LocalCluster:
        spec = local_spec(brokers, {}, controllers=3, name="raftmq-test")
        cluster = LocalCluster(
            tmp_path / f"cluster-{len(clusters)}",
            spec,
            broker_args=ARGS,
            dedicated_controllers=True,
        )
        clusters.append(cluster)
        cluster.start()
        cluster.wait_for_leaders(timeout=60)  # no topics: waits for the registrations
        return cluster

    yield make
    for cluster in clusters:
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            print(log_tails(cluster))
        for bid in list(cluster.procs):
            cluster.kill(bid)
        cluster.close()


def controller_leader(addresses: list[str]) -> int:
    """The controller leader as the first voter that answers knows it (0: none)."""
    with AdminClient(addresses, attempts=1, timeout_s=2.0) as admin:
        try:
            return admin.describe_cluster().controller_leader_id
        except ClientError:
            return 0


def wait_brokers(admin: AdminClient, ids: set[int] | None, state: int, what: str) -> None:
    """Until every broker of ``ids`` (None: every registered one) is in ``state``."""

    def reached() -> bool:
        brokers = admin.describe_cluster().brokers
        wanted = [b for b in brokers if ids is None or b.id in ids]
        seen = {b.id for b in wanted}
        return (ids is None or ids <= seen) and all(b.state == state for b in wanted)

    wait_until(reached, 30, what)


def metadata_picture(admin: AdminClient) -> tuple[dict, dict, int]:
    """(topics: name -> (id, replicas, config), brokers: id -> (host, port), version)."""
    cluster = admin.describe_cluster()
    topics = {
        t.name: (
            t.topic_id,
            [tuple(p.replicas) for p in t.partitions],
            dict(t.config),
        )
        for t in (admin.describe_topic(t.name) for t in admin.list_topics().topics)
    }
    brokers = {b.id: (b.host, b.port) for b in cluster.brokers}
    return topics, brokers, cluster.metadata_version


def test_dedicated_controllers_serve_admin_place_on_brokers_and_survive_a_leader_kill(
    dedicated: Dedicated,
) -> None:
    cluster = dedicated()
    # Any node takes admin calls: a broker-only node redirects to the controller.
    with AdminClient(cluster.addresses) as admin:
        created = admin.create_topic("placed", 3, 3)
        described = admin.describe_cluster()
    assert sorted(described.controller_voters) == list(CONTROLLERS)
    # The Groups service too: a broker-only node redirects to a voter.
    broker_only = cluster.spec.brokers[4].address
    with grpc.insecure_channel(broker_only) as channel:
        err = rpc_error(
            lambda: gpb_grpc.GroupsStub(channel).ListGroups(gpb.ListGroupsRequest(), timeout=10)
        )
    assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER", "broker only")
    assert err.meta["raftmq-leader-address"] in cluster.controller_addresses
    with grpc.insecure_channel(broker_only) as channel:  # and Transactions
        err = rpc_error(
            lambda: tpb_grpc.TransactionsStub(channel).ListTransactions(
                tpb.ListTransactionsRequest(), timeout=10
            )
        )
    assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER", "broker only")
    with grpc.insecure_channel(broker_only) as channel:  # and ShareGroups
        err = rpc_error(
            lambda: spb_grpc.ShareGroupsStub(channel).ListShareGroups(
                spb.ListShareGroupsRequest(), timeout=10
            )
        )
    assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER", "broker only")
    assert err.meta["raftmq-leader-address"] in cluster.controller_addresses
    with AdminClient([broker_only]) as admin:
        assert list(admin.list_groups().groups) == []
        assert list(admin.list_share_groups().groups) == []
    assert sorted(b.id for b in described.brokers) == [4, 5, 6]
    assert all(set(p.replicas) == {4, 5, 6} for p in created.topic.partitions)
    with cluster.client() as client:
        wait_led(client, "placed", 3)
        for p in range(3):
            produce_and_read(client, "placed", p, [f"v{p}".encode()])
        # Controller-only nodes host no replica, but answer Metadata from their copy.
        for node in CONTROLLERS:
            assert not list((cluster.data / f"broker-{node}").glob("placed-*"))
            with LowLevelClient([cluster.spec.brokers[node].address]) as direct:
                answer = direct.metadata(["placed"])
            assert [list(p.replicas) for p in answer.topics[0].partitions] == [
                list(p.replicas) for p in created.topic.partitions
            ]

    leader = controller_leader(cluster.controller_addresses)
    assert leader in CONTROLLERS
    cluster.kill(leader)
    survivors = [cluster.spec.brokers[v].address for v in CONTROLLERS if v != leader]
    started = time.monotonic()
    new_leader = wait_until(
        lambda: controller_leader(survivors), CONTROLLER_FAILOVER_S, "a new controller leader"
    )
    took = time.monotonic() - started
    print(f"controller failover after SIGKILL: {took:.2f} s")
    assert new_leader not in (0, leader)
    with AdminClient(survivors) as admin:
        assert {t.name for t in admin.list_topics().topics} == {"placed"}
        admin.create_topic("after", 2, 3)
    with cluster.client() as client:
        wait_led(client, "after", 2)
        produce_and_read(client, "after", 1, [b"x"])
        records, _ = read_all(client, "placed", 2)
        assert [r.value for r in records] == [b"v2"]


def test_brokers_restarted_while_the_controllers_are_down_serve_from_cached_metadata(
    dedicated: Dedicated,
) -> None:
    """Every node killed; the brokers alone come back and serve (the partitions' own Raft
    groups elect leaders); then the controllers come back with the same metadata."""
    cluster = dedicated()
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("kept", 2, 3, {"retention.ms": "3600000"})
        wait_led(client, "kept", 2)
        for p in (0, 1):
            produce_and_read(client, "kept", p, [b"one", b"two"])
        before = metadata_picture(admin)
    brokers = cluster.broker_ids
    # The cache is written within MIN_WRITE_INTERVAL_S of the broker applying a version.
    wait_until(
        lambda: all(
            (state := MetadataCache(cluster.data / f"broker-{b}", cluster.spec.name).load())
            is not None
            and "kept" in state.topics
            for b in brokers
        ),
        10,
        "every broker caching the metadata that holds the topic",
    )
    for node in list(cluster.procs):
        cluster.kill(node)
    for b in brokers:
        cluster.start(b)
    cluster.wait_ready()
    assert controller_leader(cluster.controller_addresses) == 0, "the controllers are down"
    with LowLevelClient(cluster.addresses) as client:
        wait_led(client, "kept", 2)
        answer = client.metadata(["kept"])
        assert answer.metadata_version > 0, "Metadata answers from the cached copy"
        for p in (0, 1):
            records, _ = read_all(client, "kept", p)
            assert [r.value for r in records] == [b"one", b"two"]
        # acks=all among the brokers: the controller is not on the write path.
        produce_and_read(client, "kept", 0, [b"while-away"])
    for node in CONTROLLERS:
        cluster.start(node)
    cluster.wait_ready()
    with cluster.admin() as admin, cluster.client() as client:
        topics, registered, version = metadata_picture(admin)
        assert topics == before[0]
        assert set(registered) == set(before[1])
        assert version >= before[2]
        wait_brokers(admin, None, apb.BROKER_STATE_ALIVE, "every broker alive again")
        admin.create_topic("later", 1, 3)
        wait_led(client, "later", 1)
        produce_and_read(client, "later", 0, [b"new"])
        records, _ = read_all(client, "kept", 0)
        assert [r.value for r in records] == [b"one", b"two", b"while-away"]


def test_brokers_keep_serving_while_every_controller_is_paused(dedicated: Dedicated) -> None:
    """The controllers SIGSTOPped longer than a session timeout: the brokers keep taking
    acks=all writes for the partitions they lead; after, nothing acknowledged is lost and
    every broker is alive again."""
    cluster = dedicated()
    with cluster.admin() as admin, cluster.client() as client:
        admin.create_topic("steady", 2, 3)
        wait_led(client, "steady", 2)
    for node in CONTROLLERS:
        cluster.signal(node, signal.SIGSTOP)
    acked: dict[int, list[bytes]] = {0: [], 1: []}
    try:
        with cluster.client() as client:
            deadline = time.monotonic() + 8.0  # > SESSION_TIMEOUT_S
            i = 0
            while time.monotonic() < deadline:
                p = i % 2
                value = f"r{i}".encode()
                client.produce("steady", p, batch([value]), timeout_ms=5_000)
                acked[p].append(value)
                i += 1
                time.sleep(0.05)
    finally:
        for node in CONTROLLERS:
            cluster.signal(node, signal.SIGCONT)
    assert len(acked[0]) > 10 and len(acked[1]) > 10, acked
    time.sleep(2.0)  # a few rounds of the controllers' fencing loop
    with cluster.admin() as admin, cluster.client() as client:
        wait_brokers(admin, None, apb.BROKER_STATE_ALIVE, "every broker alive after the pause")
        # The pause was the controllers' own: it must not fence the brokers on waking.
        for node in CONTROLLERS:
            assert "fencing it" not in cluster.log_path(node).read_text()
        for p in (0, 1):
            records, _ = read_all(client, "steady", p)
            assert [r.value for r in records] == acked[p]


def voter_log_end(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return int(
            cpb_grpc.ControllerStub(channel)
            .DescribeVoter(cpb.DescribeVoterRequest(), timeout=5)
            .last_index
        )


def metadata_index(cluster: LocalCluster) -> int:
    """The metadata log's end on the voter that leads (what every voter must reach)."""
    leader = controller_leader(cluster.controller_addresses)
    return voter_log_end(cluster.spec.brokers[leader].address) if leader else 1 << 62


def create_topic_once(admin: AdminClient, name: str) -> None:
    """Create topic ``name``, riding out an election: a create whose outcome is unknown
    (the leader lost its quorum mid-way) is asked again, and "already exists" then means
    the first one committed."""
    for _ in range(5):
        try:
            admin.create_topic(name, 1, 1)
            return
        except ClientError as exc:
            if exc.code == pb.ERROR_CODE_TOPIC_ALREADY_EXISTS:
                return
            if exc.code != pb.ERROR_CODE_OUTCOME_UNKNOWN:
                raise
    raise AssertionError(f"creating topic {name}: five outcomes unknown in a row")


def test_a_wiped_controller_voter_cannot_vote_committed_metadata_away(
    dedicated: Dedicated,
) -> None:
    """Voter 3 misses topic b; voters 1 and 2 stop; 1 comes back with no data folder. With
    only 1 and 3 up, 1 must not vote for 3 (which lacks b): no leader until 2 is back."""
    cluster = dedicated(brokers=1)
    with cluster.admin() as admin:
        admin.create_topic("a", 1, 1)
    # Voter 3 must hold a past for the probe to find (on a loaded machine it may not
    # have received a single entry yet): the committed topic a.
    wait_until(
        lambda: voter_log_end(cluster.spec.brokers[3].address) >= metadata_index(cluster),
        30.0,
        "voter 3 to hold topic a",
    )
    cluster.kill(3)
    with AdminClient([cluster.spec.brokers[v].address for v in (1, 2)]) as admin:
        create_topic_once(admin, "b")
    cluster.kill(1)
    cluster.kill(2)
    shutil.rmtree(cluster.data / "broker-1")
    cluster.start(3)
    cluster.wait_ready(3)
    cluster.start(1)
    cluster.wait_ready(1)
    pair = [cluster.spec.brokers[v].address for v in (1, 3)]
    deadline = time.monotonic() + 4.0  # many election timeouts (200 ms)
    while time.monotonic() < deadline:
        assert controller_leader(pair) == 0, "a wiped voter helped elect a stale leader"
        time.sleep(0.2)
    assert "rejoins" in cluster.log_path(1).read_text()
    cluster.start(2)
    cluster.wait_ready(2)
    with cluster.admin() as admin:
        assert {t.name for t in admin.list_topics().topics} == {"a", "b"}
        create_topic_once(admin, "c")
    # Voter 1 caught up meanwhile: with 2 gone again, 1 and 3 make the quorum.
    time.sleep(1.0)
    cluster.kill(2)
    with AdminClient(pair) as admin:
        create_topic_once(admin, "d")
        assert {t.name for t in admin.list_topics().topics} == {"a", "b", "c", "d"}


@pytest.mark.parametrize("layout", ["combined", "dedicated"])
def test_a_broker_added_to_a_running_cluster_registers_and_takes_replicas(
    layout: str, make_cluster: ClusterFactory, dedicated: Dedicated
) -> None:
    """Its cluster file names only the voters and itself: in the dedicated layout it
    learns the other brokers' Raft addresses from the metadata alone."""
    cluster = make_cluster({}) if layout == "combined" else dedicated()
    new = cluster.add_broker()
    assert new == max(cluster.spec.brokers) and new not in cluster.spec.voters
    cluster.wait_ready(new)
    with cluster.admin() as admin:
        wait_brokers(admin, {new}, apb.BROKER_STATE_ALIVE, f"broker {new} registered and alive")
        created = admin.create_topic("wide", 4, 3)
    hosted = [p.partition for p in created.topic.partitions if new in p.replicas]
    assert hosted, "placement spreads a new topic onto the new broker"
    with cluster.client() as client:
        wait_led(client, "wide", 4)
        for p in range(4):
            produce_and_read(client, "wide", p, [f"w{p}".encode()])
        # Its replicas replicate: with the new broker as the only other live replica
        # besides the leader, an acks=all write needs it.
        p = hosted[0]
        replicas = list(created.topic.partitions[p].replicas)
        leader = client.refresh_leaders()["wide", p].broker_id
        third = next(b for b in replicas if b not in (new, leader))
        cluster.kill(third)
        produce_and_read(client, "wide", p, [b"needs-the-new-one"])
    # The new broker's replicas hold the data (read from it directly).
    with LowLevelClient([cluster.spec.brokers[new].address]) as client:
        answer = client.metadata(["wide"])
        assert answer.broker_id == new and answer.topics[0].name == "wide"
    for p in hosted:
        assert (cluster.data / f"broker-{new}" / f"wide-{p}").is_dir()


def test_an_added_broker_whose_disk_was_wiped_rejoins_its_partitions(
    dedicated: Dedicated,
) -> None:
    """Its cluster file names only the controller voters, which host no partition: it
    asks the brokers the metadata names whether its partitions have a past."""
    cluster = dedicated()
    new = cluster.add_broker()
    cluster.wait_ready(new)
    with cluster.admin() as admin:
        wait_brokers(admin, {new}, apb.BROKER_STATE_ALIVE, f"broker {new} alive")
        admin.create_topic("moved", 1, 3, assignment=[[new, 4, 5]])
    with cluster.client() as client:
        wait_led(client, "moved", 1)
        produce_and_read(client, "moved", 0, [b"a", b"b"])
    cluster.kill(new)
    shutil.rmtree(cluster.data / f"broker-{new}")
    cluster.start(new)
    cluster.wait_ready(new)
    address = cluster.spec.brokers[new].address
    with cluster.client() as client:
        wait_until(
            lambda: "know a past for 1 of its 1 replicas" in cluster.log_path(new).read_text(),
            30,
            "the wiped broker finding its partition's past",
        )
        produce_and_read(client, "moved", 0, [b"c"])

        def caught_up() -> bool:
            records, _ = read_all(client, "moved", 0, address=address)
            return [r.value for r in records] == [b"a", b"b", b"c"]

        wait_until(caught_up, 30, f"broker {new}'s replica holding every record")
