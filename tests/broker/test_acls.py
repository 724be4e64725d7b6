"""ACLs with real brokers (docs/security.md, "ACLs"): a TLS cluster whose brokers run the
ACL authorizer, with the brokers' and the operator's certificates as super users, and
clients whose certificates name other principals (alice, bob, carol).

Each denied request is refused with PERMISSION_DENIED, its resource type's code and a
sentence naming the principal, the operation and the resource, and a super user reads
back that nothing was written or changed. Then: allow then deny (deny wins), prefixed
patterns, listings that leave out what a principal may not describe, the CLI round trip,
producers and consumers told why, a broker added and a replica moved with the authorizer
on, and (last: it kills a broker) ACLs that outlive the controller leader.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from raftmq import net
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from raftmq.client import AdminClient, ClientError, Consumer, LowLevelClient, Producer
from raftmq.client.connections import TlsSettings
from raftmq.client.errors import error_of
from raftmq.devtools import certs
from raftmq.devtools.certs import LocalPki
from raftmq.devtools.local_cluster import LocalCluster, acl_broker_args
from raftmq.format.records import Record, build_batch, iter_records
from tests.broker.conftest import REBALANCE_ARGS, cluster_spec, module_cluster

ORDERS, SECRET, PUB = "orders", "secret", "pub-a"
PEOPLE = ("alice", "bob", "carol")
CLUSTER_NAME = "raftmq-cluster"
LITERAL, PREFIXED = apb.ACL_PATTERN_TYPE_LITERAL, apb.ACL_PATTERN_TYPE_PREFIXED


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    folder = tmp_path_factory.mktemp("pki")
    made = certs.local_pki(folder)
    for name in PEOPLE:
        certs.issue(made.ca, folder, name)
    return made


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pki: LocalPki, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("acl-cluster")
    args = ["--tick-ms", "20", "--election-ticks", "10", *REBALANCE_ARGS, *acl_broker_args(pki)]
    spec = cluster_spec({ORDERS: 1, SECRET: 1, PUB: 1})
    with module_cluster(data, spec, args, request, pki=pki, client_auth=True) as c:
        yield c


def tls(pki: LocalPki, who: str) -> TlsSettings:
    folder = pki.ca.cert_file.parent
    return {
        "ssl_cafile": str(pki.ca.cert_file),
        "ssl_certfile": str(folder / f"{who}.pem"),
        "ssl_keyfile": str(folder / f"{who}-key.pem"),
    }


def acl(
    who: str,
    op: int,
    rtype: int = apb.ACL_RESOURCE_TYPE_TOPIC,
    name: str = ORDERS,
    *,
    pattern: int = LITERAL,
    permission: int = apb.ACL_PERMISSION_ALLOW,
) -> apb.AclBinding:
    return apb.AclBinding(
        principal=f"User:{who}",
        host="*",
        resource_type=rtype,  # type: ignore[arg-type]
        resource_name=name,
        pattern_type=pattern,  # type: ignore[arg-type]
        operation=op,  # type: ignore[arg-type]
        permission=permission,  # type: ignore[arg-type]
    )


def settle(cluster: LocalCluster, version: int, timeout_s: float = 30.0) -> None:
    """Wait until every broker's copy of the metadata holds ``version`` (ACLs apply
    where a broker's own copy has them)."""
    deadline = time.monotonic() + timeout_s
    with cluster.client() as client:
        for address in cluster.addresses:
            while client.stub(address).Metadata(_metadata_request()).metadata_version < version:
                assert time.monotonic() < deadline, f"{address} did not reach {version}"
                time.sleep(0.05)


def _metadata_request() -> pb.MetadataRequest:
    return pb.MetadataRequest(routing_only=True)


def grant(cluster: LocalCluster, *bindings: apb.AclBinding) -> None:
    with cluster.admin() as admin:
        settle(cluster, admin.create_acls(bindings).metadata_version)


def revoke(cluster: LocalCluster, *bindings: apb.AclBinding) -> None:
    filters = [apb.AclFilter(**{f.name: v for f, v in b.ListFields()}) for b in bindings]
    with cluster.admin() as admin:
        settle(cluster, admin.delete_acls(filters).metadata_version)


def denied(work: Callable[[], object], code: str, *words: str) -> ClientError:
    with pytest.raises(ClientError) as caught:
        work()
    err = caught.value
    assert err.status == grpc.StatusCode.PERMISSION_DENIED, err
    assert err.code_name == code, err
    for word in words:
        assert word in str(err), (word, str(err))
    return err


def end_offset(cluster: LocalCluster, topic: str = ORDERS) -> int:
    with cluster.client() as client:  # a super user
        return client.metadata([topic]).topics[0].partitions[0].high_watermark


def batch(*values: bytes) -> bytes:
    return build_batch([Record(key=None, value=v) for v in values])


def test_denied_produce_and_fetch_write_and_read_nothing(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    before = end_offset(cluster)
    with LowLevelClient(cluster.addresses, **tls(pki, "alice")) as alice:
        denied(
            lambda: alice.produce(ORDERS, 0, batch(b"x")),
            "TOPIC_AUTHORIZATION_FAILED",
            "User:alice",
            "WRITE",
            repr(ORDERS),
        )
        denied(lambda: alice.fetch(ORDERS, 0, 0), "TOPIC_AUTHORIZATION_FAILED", "READ")
    assert end_offset(cluster) == before


def test_denied_create_and_delete_change_nothing(cluster: LocalCluster, pki: LocalPki) -> None:
    with AdminClient(cluster.controller_addresses, **tls(pki, "alice")) as alice:
        denied(
            lambda: alice.create_topic("alice-new", 1, 1),
            "TOPIC_AUTHORIZATION_FAILED",
            "CREATE",
            "nor CREATE on the cluster",
        )
        denied(lambda: alice.delete_topic(ORDERS), "TOPIC_AUTHORIZATION_FAILED", "DELETE")
        denied(lambda: alice.drain_broker(1), "CLUSTER_AUTHORIZATION_FAILED", "ALTER")
        denied(
            lambda: alice.create_acls([acl("alice", apb.ACL_OPERATION_ALL)]),
            "CLUSTER_AUTHORIZATION_FAILED",
        )
    with cluster.admin() as admin:
        names = {t.name for t in admin.list_topics().topics}
        assert ORDERS in names and "alice-new" not in names
        assert not admin.describe_acls().acls


def _channels(pki: LocalPki, who: str) -> net.Channels:
    settings = tls(pki, who)
    security = net.Security(
        settings["ssl_cafile"], settings["ssl_certfile"], settings["ssl_keyfile"]
    )
    return net.Channels(security=security)


def _call(stub_call: Callable[..., Any], request: object) -> Any:
    try:
        return stub_call(request, timeout=10)
    except grpc.RpcError as exc:
        raise error_of(exc) from None


def test_denied_group_join_commit_and_transactional_id(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    channels = _channels(pki, "alice")
    try:
        channel = channels.of(cluster.controller_addresses[0])
        groups = gpb_grpc.GroupsStub(channel)
        join = gpb.ConsumerGroupHeartbeatRequest(
            group_id="g-alice", member_epoch=0, subscriptions=[ORDERS], session_timeout_ms=10_000
        )
        denied(
            lambda: _call(groups.ConsumerGroupHeartbeat, join),
            "GROUP_AUTHORIZATION_FAILED",
            "User:alice",
            "READ",
            "'g-alice'",
        )
        commit = gpb.CommitOffsetsRequest(
            group_id="g-alice", offsets=[gpb.OffsetToCommit(topic=ORDERS, partition=0, offset=1)]
        )
        denied(lambda: _call(groups.CommitOffsets, commit), "GROUP_AUTHORIZATION_FAILED")
        grant(cluster, acl("alice", apb.ACL_OPERATION_READ, apb.ACL_RESOURCE_TYPE_GROUP, "g-alice"))
        # the group now, but not the topic: still refused, for the topic
        denied(
            lambda: _call(groups.CommitOffsets, commit),
            "TOPIC_AUTHORIZATION_FAILED",
            "READ",
            repr(ORDERS),
        )
        txns = tpb_grpc.TransactionsStub(channel)
        init = tpb.InitTransactionsRequest(
            transactional_id="tx-alice", transaction_timeout_ms=60_000
        )
        denied(
            lambda: _call(txns.InitTransactions, init),
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            "WRITE",
            "'tx-alice'",
        )
    finally:
        channels.close()
    with cluster.admin() as admin:
        assert "g-alice" not in {g.group_id for g in admin.list_groups().groups}
        assert "tx-alice" not in {
            t.transactional_id for t in admin.list_transactions().transactions
        }
    revoke(cluster, acl("alice", apb.ACL_OPERATION_READ, apb.ACL_RESOURCE_TYPE_GROUP, "g-alice"))


def test_allow_then_deny_wins(cluster: LocalCluster, pki: LocalPki) -> None:
    allow = acl("bob", apb.ACL_OPERATION_WRITE)
    deny = acl(
        "bob",
        apb.ACL_OPERATION_ALL,
        name="ord",
        pattern=PREFIXED,
        permission=apb.ACL_PERMISSION_DENY,
    )
    grant(cluster, allow)
    with LowLevelClient(cluster.addresses, **tls(pki, "bob")) as bob:
        written = bob.produce(ORDERS, 0, batch(b"allowed"))
        grant(cluster, deny)
        before = end_offset(cluster)
        denied(lambda: bob.produce(ORDERS, 0, batch(b"denied")), "TOPIC_AUTHORIZATION_FAILED")
        assert end_offset(cluster) == before
    with cluster.client() as admin:
        got = admin.fetch(ORDERS, 0, written.base_offset)
        assert [r.value for r in iter_records(got.entries)] == [b"allowed"]
    revoke(cluster, allow, deny)


def test_prefixed_patterns_and_filtered_listings(cluster: LocalCluster, pki: LocalPki) -> None:
    grant(cluster, acl("carol", apb.ACL_OPERATION_READ, name="pub-", pattern=PREFIXED))
    with LowLevelClient(cluster.addresses, **tls(pki, "carol")) as carol:
        carol.fetch(PUB, 0, 0)  # allowed by the prefix
        denied(lambda: carol.fetch(ORDERS, 0, 0), "TOPIC_AUTHORIZATION_FAILED")
        listed = {t.name for t in carol.metadata().topics}
        assert listed == {PUB}, listed  # READ implies DESCRIBE; nothing else shows
        denied(lambda: carol.metadata([SECRET]), "TOPIC_AUTHORIZATION_FAILED", "DESCRIBE")
    with AdminClient(cluster.controller_addresses, **tls(pki, "carol")) as admin:
        assert [t.name for t in admin.list_topics().topics] == [PUB]
        said = [
            denied(lambda n=name: admin.describe_topic(n), "TOPIC_AUTHORIZATION_FAILED")
            for name in (SECRET, "no-such-topic")
        ]
        # the same sentence whether or not the topic exists
        assert str(said[0]).replace(repr(SECRET), "T") == str(said[1]).replace(
            repr("no-such-topic"), "T"
        )
    revoke(cluster, acl("carol", apb.ACL_OPERATION_READ, name="pub-", pattern=PREFIXED))


def test_super_users_may_do_everything(cluster: LocalCluster) -> None:
    with cluster.admin() as admin:
        admin.create_topic("super-made", 1, 1)
        admin.delete_topic("super-made")
        assert admin.describe_cluster().brokers


def _cli(cluster: LocalCluster, pki: LocalPki, *args: str) -> subprocess.CompletedProcess[str]:
    tls_flags = [
        "--tls-ca",
        str(pki.ca.cert_file),
        "--tls-cert",
        str(pki.client.cert_file),
        "--tls-key",
        str(pki.client.key_file),
    ]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "raftmq.cli.main",
            "acl",
            *args,
            "--bootstrap",
            ",".join(cluster.controller_addresses),
            *tls_flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_round_trip(cluster: LocalCluster, pki: LocalPki) -> None:
    added = _cli(
        cluster,
        pki,
        "add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--operation",
        "Describe",
        "--topic",
        "cli-",
        "--resource-pattern-type",
        "prefixed",
    )
    assert added.returncode == 0, added.stdout + added.stderr
    listed = _cli(cluster, pki, "list", "--principal", "User:alice", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = json.loads(listed.stdout)["acls"]
    assert sorted(r["operation"] for r in rows) == ["DESCRIBE", "READ"]
    assert {r["pattern_type"] for r in rows} == {"PREFIXED"}
    assert {r["resource_name"] for r in rows} == {"cli-"}
    bad = _cli(
        cluster, pki, "add", "--allow-principal", "alice", "--operation", "Read", "--topic", "x"
    )
    assert bad.returncode == 1 and "INVALID_ACL" in bad.stdout + bad.stderr
    removed = _cli(
        cluster, pki, "remove", "--allow-principal", "User:alice", "--topic", "cli-", "--json"
    )
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert len(json.loads(removed.stdout)["acls"]) == 2
    assert json.loads(_cli(cluster, pki, "list", "--json").stdout)["acls"] == []


def test_a_producer_and_a_group_consumer_are_told_why(cluster: LocalCluster, pki: LocalPki) -> None:
    before = end_offset(cluster)
    with Producer(cluster.addresses, **tls(pki, "alice")) as producer:
        # a topic it may not even describe: the producer cannot find it, and says why
        with pytest.raises(ClientError) as caught:
            producer.send(ORDERS, b"never").result(timeout=30)
        assert caught.value.code_name == "TOPIC_AUTHORIZATION_FAILED", caught.value
        assert "DESCRIBE" in str(caught.value)
        # one it may describe, but no right to write anywhere: no producer id for it
        grant(cluster, acl("alice", apb.ACL_OPERATION_DESCRIBE))
        with pytest.raises(ClientError) as caught:
            producer.send(ORDERS, b"never").result(timeout=30)
        assert caught.value.code_name == "CLUSTER_AUTHORIZATION_FAILED", caught.value
        assert "IDEMPOTENT_WRITE" in str(caught.value)
    # WRITE on another topic: a producer id, and each batch judged on its own, the
    # stream going on past a refused one
    may_write = acl("alice", apb.ACL_OPERATION_WRITE, name=PUB)
    grant(cluster, may_write)
    with Producer(cluster.addresses, **tls(pki, "alice")) as producer:
        with pytest.raises(ClientError) as caught:
            producer.send(ORDERS, b"never").result(timeout=30)
        assert caught.value.code_name == "TOPIC_AUTHORIZATION_FAILED", caught.value
        assert "WRITE" in str(caught.value)
        assert producer.send(PUB, b"allowed").result(timeout=30).topic == PUB
    revoke(cluster, acl("alice", apb.ACL_OPERATION_DESCRIBE), may_write)
    with Consumer(cluster.addresses, group_id="g-nobody", **tls(pki, "alice")) as consumer:
        consumer.subscribe([ORDERS])
        with pytest.raises(ClientError) as caught:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                consumer.poll(timeout=0.5)
    assert caught.value.status == grpc.StatusCode.PERMISSION_DENIED, caught.value
    assert end_offset(cluster) == before


def test_a_new_broker_joins_and_a_replica_moves_with_the_authorizer_on(
    cluster: LocalCluster,
) -> None:
    """Brokers register, follow the metadata, copy a log and report the move done under
    their own principal, a super user's."""
    new = cluster.add_broker()
    deadline = time.monotonic() + 60
    with cluster.admin() as admin:
        while new not in {b.id for b in admin.describe_cluster().brokers}:
            assert time.monotonic() < deadline, f"broker {new} did not register"
            time.sleep(0.1)
        admin.move_replica(SECRET, 0, 3, new)
        while True:
            part = admin.describe_topic(SECRET).partitions[0]
            if new in part.replicas and not part.learners:
                break
            assert time.monotonic() < deadline, f"the move to broker {new} did not finish"
            time.sleep(0.1)
    assert sorted(part.replicas) == [1, 2, new]


def test_acls_survive_a_controller_leader_change(cluster: LocalCluster, pki: LocalPki) -> None:
    """Last in the module: it stops the controller's leader (and starts it again)."""
    grant(cluster, acl("bob", apb.ACL_OPERATION_DESCRIBE, name=SECRET))
    with cluster.admin() as admin:
        old = admin.describe_cluster().controller_leader_id
    cluster.kill(old)
    try:
        others = [a for b, a in zip(cluster.broker_ids, cluster.addresses, strict=True) if b != old]
        deadline = time.monotonic() + 60
        with AdminClient(others, **cluster.client_tls) as admin:
            while True:
                try:
                    new = admin.describe_cluster().controller_leader_id
                except ClientError:
                    new = 0
                if new not in (0, old):
                    break
                assert time.monotonic() < deadline, "no new controller leader"
                time.sleep(0.1)
            held = admin.describe_acls(apb.AclFilter(principal="User:bob")).acls
            assert [b.resource_name for b in held] == [SECRET]
        with LowLevelClient(others, **tls(pki, "bob")) as bob:
            assert [t.name for t in bob.metadata([SECRET]).topics] == [SECRET]
    finally:
        cluster.start(old)
        cluster.wait_for_leaders(timeout=60)
