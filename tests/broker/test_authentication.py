"""Authentication with real brokers (docs/security.md): a cluster whose client listener
takes SCRAM-SHA-256 and bearer tokens forms, registers, replicates, elects and heals, in
the dedicated-controller layout too (the brokers authenticate to each other by their
certificates, mapped by principal rules); each way a caller can fail to authenticate gets
UNAUTHENTICATED with its own code and sentence, and nothing is written; SCRAM users live in
the controller's metadata, survive a controller failover, and a SCRAM client produces and
consumes, through a broker restart too.

The cluster's own clients (the fixture's topic creation, its waits) authenticate with an
admin bearer token from the token file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from raftmq import net, scram
from raftmq.api.v1 import authentication_pb2 as apb
from raftmq.api.v1 import authentication_pb2_grpc as apb_grpc
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.token_file import token_line
from raftmq.client import AdminClient, ClientError, Consumer, LowLevelClient, Producer
from raftmq.client.connections import Connections
from raftmq.client.produce_stream import ProduceStream
from raftmq.client.sasl import security_of
from raftmq.devtools import certs
from raftmq.devtools.certs import LocalPki
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import REBALANCE_ARGS, cluster_spec, module_cluster
from tests.broker.test_broker_cluster import wait_until

TOPIC = "authn"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
OTHER_TOKEN = "other-token-0123456789abcdef"
RULES = r"RULE:^CN=([^,]+),O=raftmq local$/$1/L"
"""The brokers' certificates ("CN=raftmq broker,O=raftmq local") map to User:raftmq broker."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return certs.local_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.txt"
    path.write_text("# principal  sha256(token)\n" + token_line("User:admin", ADMIN_TOKEN))
    return path


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    pki: LocalPki,
    token_file: Path,
    request: pytest.FixtureRequest,
) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("authn-cluster")
    args = [
        *("--tick-ms", "20", "--election-ticks", "10", *REBALANCE_ARGS),
        *("--authentication", "scram-sha-256,oauthbearer"),
        *("--token-file", str(token_file)),
        *("--ssl-principal-mapping-rules", RULES),
    ]
    admin = {"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token": ADMIN_TOKEN}
    with module_cluster(
        data,
        cluster_spec({TOPIC: 1}),
        args,
        request,
        pki=pki,
        client_auth=True,
        client_credentials=admin,  # type: ignore[arg-type]
    ) as c:
        yield c


def tls_only(pki: LocalPki) -> dict[str, str]:
    return {
        "ssl_cafile": str(pki.ca.cert_file),
        "ssl_certfile": str(pki.client.cert_file),
        "ssl_keyfile": str(pki.client.key_file),
    }


def scram_settings(pki: LocalPki, user: str, password: str) -> dict[str, str]:
    return {
        **tls_only(pki),
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": user,
        "sasl_password": password,
    }


def _end_offset(cluster: LocalCluster) -> int:
    with cluster.client() as client:
        return client.metadata([TOPIC]).topics[0].partitions[0].high_watermark


def _wait(condition: Callable[[], bool], what: str) -> None:
    wait_until(condition, 30.0, what)


def _produce_refused(cluster: LocalCluster, **settings: str) -> ClientError:
    """What a produce with ``settings`` is told (and it wrote nothing)."""
    before = _end_offset(cluster)
    batch = build_batch([Record(b"k", b"must-not-land", 0, ())])
    with (
        LowLevelClient(cluster.addresses, retries=2, **settings) as client,  # type: ignore[arg-type]
        pytest.raises(ClientError) as caught,
    ):
        client.produce(TOPIC, 0, batch)
    assert _end_offset(cluster) == before
    return caught.value


def _add_user(cluster: LocalCluster, name: str, password: str) -> None:
    with cluster.admin() as admin:
        admin.upsert_user_scram_credential(name, password)


def _can_log_in(cluster: LocalCluster, pki: LocalPki, name: str, password: str) -> bool:
    """Whether every broker takes the login (each applies the metadata on its own)."""
    settings = scram_settings(pki, name, password)
    with LowLevelClient(cluster.addresses, retries=1, **settings) as client:  # type: ignore[arg-type]
        for address in cluster.addresses:
            try:
                client.stub(address).Metadata(_metadata_request(), timeout=5)
            except grpc.RpcError:
                return False
    return True


def _metadata_request() -> pb.MetadataRequest:
    return pb.MetadataRequest(topics=[TOPIC])


def test_a_call_without_credentials_is_told_which_methods_the_listener_expects(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    err = _produce_refused(cluster, **tls_only(pki))
    assert err.status == grpc.StatusCode.UNAUTHENTICATED
    assert err.label == "UNSUPPORTED_SASL_MECHANISM"
    assert "carries no credentials" in str(err)
    assert "SCRAM-SHA-256" in str(err) and "OAUTHBEARER" in str(err)


def test_a_token_of_the_wrong_shape_and_an_unknown_token_are_refused_apart(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    bearer = {**tls_only(pki), "sasl_mechanism": "OAUTHBEARER"}
    short = _produce_refused(cluster, **bearer, sasl_oauth_token="abc")
    assert short.status == grpc.StatusCode.UNAUTHENTICATED
    assert short.label == "UNSUPPORTED_SASL_MECHANISM"
    assert "not of the shape" in str(short)
    unknown = _produce_refused(cluster, **bearer, sasl_oauth_token="x" * 40)
    assert unknown.status == grpc.StatusCode.UNAUTHENTICATED
    assert unknown.label == "SASL_AUTHENTICATION_FAILED"
    assert "not in this broker's token file" in str(unknown)


def test_the_token_file_is_reloaded_when_it_changes(
    cluster: LocalCluster, pki: LocalPki, token_file: Path
) -> None:
    bearer = {**tls_only(pki), "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token": OTHER_TOKEN}
    _produce_refused(cluster, **bearer)
    token_file.write_text(token_file.read_text() + token_line("User:other", OTHER_TOKEN))

    def accepted() -> bool:
        with LowLevelClient(cluster.addresses, retries=1, **bearer) as client:  # type: ignore[arg-type]
            try:
                client.fetch(TOPIC, 0, 0, max_wait_ms=0)
            except ClientError:
                return False
        return True

    _wait(accepted, "the broker to take the new token")


def test_a_scram_client_produces_and_consumes(cluster: LocalCluster, pki: LocalPki) -> None:
    _add_user(cluster, "alice", "alice-secret")
    _wait(lambda: _can_log_in(cluster, pki, "alice", "alice-secret"), "alice's credential")
    settings = scram_settings(pki, "alice", "alice-secret")
    start = _end_offset(cluster)
    with Producer(cluster.addresses, **settings) as producer:  # type: ignore[arg-type]
        for i in range(20):
            producer.send(TOPIC, f"scram-{i}".encode(), key=b"k")
        producer.flush()
    with Consumer(cluster.addresses, auto_offset_reset="earliest", **settings) as consumer:  # type: ignore[arg-type]
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), start)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            got += [r.value or b"" for r in consumer.poll(timeout=0.5)]
    assert got == [f"scram-{i}".encode() for i in range(20)]
    with AdminClient(cluster.controller_addresses, **settings) as admin:  # type: ignore[arg-type]
        described = admin.describe_user_scram_credentials(["alice"])
    assert [(r.name, r.credentials[0].iterations) for r in described.results] == [
        ("alice", scram.DEFAULT_ITERATIONS)
    ]


def test_a_wrong_password_and_an_unknown_user_get_the_same_answer(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    _add_user(cluster, "bob", "bob-secret")
    _wait(lambda: _can_log_in(cluster, pki, "bob", "bob-secret"), "bob's credential")
    wrong = _produce_refused(cluster, **scram_settings(pki, "bob", "not-bobs"))
    unknown = _produce_refused(cluster, **scram_settings(pki, "nobody", "whatever"))
    for err in (wrong, unknown):
        assert err.status == grpc.StatusCode.UNAUTHENTICATED
        assert err.label == "SASL_AUTHENTICATION_FAILED"
        assert "invalid credentials" in str(err)
    assert str(wrong) == str(unknown)
    settings = scram_settings(pki, "bob", "not-bobs")
    started = time.monotonic()
    with (
        Producer(cluster.addresses, **settings) as producer,  # type: ignore[arg-type]
        pytest.raises(ClientError) as refused,
    ):
        producer.send(TOPIC, b"must-not-land").result(timeout=30)
    assert refused.value.label == "SASL_AUTHENTICATION_FAILED"
    assert time.monotonic() - started < 10  # at once: no wait or retry mends a password


def test_a_replayed_or_unknown_nonce_is_refused(cluster: LocalCluster, pki: LocalPki) -> None:
    _add_user(cluster, "carol", "carol-secret")
    _wait(lambda: _can_log_in(cluster, pki, "carol", "carol-secret"), "carol's credential")
    security = net.Security(
        str(pki.ca.cert_file), str(pki.client.cert_file), str(pki.client.key_file)
    )
    with net.channel(cluster.addresses[0], security=security) as channel:
        stub = apb_grpc.AuthenticationStub(channel)
        nonce = scram.new_nonce()
        first, bare = scram.client_first("carol", nonce)
        server_first = stub.ScramClientFirst(
            apb.ScramClientFirstRequest(mechanism="SCRAM-SHA-256", message=first), timeout=5
        ).message
        combined, salt, iterations = scram.parse_server_first(server_first, nonce)
        final, expected = scram.client_final(
            "carol-secret", bare, server_first, combined, salt, iterations
        )
        answer = stub.ScramClientFinal(apb.ScramClientFinalRequest(message=final), timeout=5)
        scram.check_server_final(answer.message, expected)
        assert answer.principal == "User:carol" and answer.session_token
        with pytest.raises(grpc.RpcError) as replayed:
            stub.ScramClientFinal(apb.ScramClientFinalRequest(message=final), timeout=5)
        stranger = final.replace(combined, combined[:-4] + "AAAA")
        with pytest.raises(grpc.RpcError) as never_issued:
            stub.ScramClientFinal(apb.ScramClientFinalRequest(message=stranger), timeout=5)
    for caught in (replayed, never_issued):
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ("raftmq-error", "ILLEGAL_SASL_STATE") in caught.value.trailing_metadata()
    assert "used already" in (replayed.value.details() or "")
    assert "did not issue" in (never_issued.value.details() or "")


def test_users_survive_a_controller_failover_and_a_scram_client_rides_a_restart(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    """The controller leader is killed: the next leader holds the users; a SCRAM client
    of the broker that restarted authenticates again by itself; the partition elects a
    leader and replicates meanwhile."""
    _add_user(cluster, "dave", "dave-secret")
    _wait(lambda: _can_log_in(cluster, pki, "dave", "dave-secret"), "dave's credential")
    with cluster.admin() as admin:
        leader = admin.describe_cluster().controller_leader_id
    settings = scram_settings(pki, "dave", "dave-secret")
    with LowLevelClient(cluster.addresses, **settings) as client:  # type: ignore[arg-type]
        address = cluster.spec.brokers[leader].address
        client.stub(address).Metadata(_metadata_request(), timeout=5)
        cluster.kill(leader)
        others = [b.address for bid, b in cluster.spec.brokers.items() if bid != leader]
        with AdminClient(others, **settings) as admin:  # type: ignore[arg-type]
            names = [r.name for r in admin.describe_user_scram_credentials().results]
            assert "dave" in names
            admin.upsert_user_scram_credential("erin", "erin-secret")  # the new leader writes
        written = client.produce(TOPIC, 0, build_batch([Record(b"k", b"after-failover", 0, ())]))
        cluster.start(leader)
        cluster.wait_ready(leader)
        # The restarted broker forgot every session: the client's next call there
        # authenticates again, unasked.

        def answers() -> bool:
            try:
                client.stub(address).Metadata(_metadata_request(), timeout=5)
            except grpc.RpcError:  # down; or up, its metadata not yet holding dave
                return False
            return True

        _wait(answers, "the restarted broker to answer dave's client")
        fetched = client.fetch(TOPIC, 0, written.base_offset)
        assert fetched.entries
    _wait(lambda: _can_log_in(cluster, pki, "erin", "erin-secret"), "erin's credential")
    cluster.wait_for_leaders(timeout=30)


def test_a_deleted_user_can_no_longer_log_in(cluster: LocalCluster, pki: LocalPki) -> None:
    _add_user(cluster, "frank", "frank-secret")
    _wait(lambda: _can_log_in(cluster, pki, "frank", "frank-secret"), "frank's credential")
    with cluster.admin() as admin:
        admin.delete_user_scram_credential("frank")
        with pytest.raises(ClientError) as missing:
            admin.delete_user_scram_credential("frank")
    assert missing.value.label == "RESOURCE_NOT_FOUND"
    _wait(lambda: not _can_log_in(cluster, pki, "frank", "frank-secret"), "frank's removal")


def test_a_stream_after_a_broker_restart_is_told_its_session_expired_then_authenticates(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    """The asyncio clients' path: a produce stream opened with a session the restarted
    broker forgot ends with the retriable SESSION_EXPIRED, and a later one logs in again
    by itself (a refusal of the request, such as NOT_LEADER, is an answer: it got in)."""
    _add_user(cluster, "gina", "gina-secret")
    _wait(lambda: _can_log_in(cluster, pki, "gina", "gina-secret"), "gina's credential")
    with cluster.admin() as admin:
        controller = admin.describe_cluster().controller_leader_id
    broker = next(b for b in cluster.broker_ids if b != controller)
    address = cluster.spec.brokers[broker].address
    security = security_of(SimpleNamespace(**scram_settings(pki, "gina", "gina-secret")))

    def restart() -> None:
        cluster.kill(broker)
        cluster.start(broker)
        cluster.wait_ready(broker)

    async def produce_once(links: Connections) -> str:
        stream = ProduceStream(links.channel(address), address)
        try:
            batch = build_batch([Record(b"k", b"v", 0, ())])
            await stream.produce(pb.ProduceRequest(topic=TOPIC, partition=0, entries=batch))
            return "answered"
        except ClientError as err:
            return err.label if err.code_name else "unreachable"
        finally:
            await stream.close()

    async def run() -> list[str]:
        links = Connections(tuple(cluster.addresses), security=security)
        try:
            assert await produce_once(links) in ("answered", "NOT_LEADER")  # a session
            await asyncio.to_thread(restart)
            outcomes = [await produce_once(links)]
            deadline = time.monotonic() + 30
            while outcomes[-1] not in ("answered", "NOT_LEADER"):
                assert time.monotonic() < deadline, outcomes
                await asyncio.sleep(0.1)
                outcomes.append(await produce_once(links))
            return [o for o in outcomes if o != "unreachable"]
        finally:
            await links.close()

    # Until the restarted broker's metadata catches up (its cached copy may predate gina),
    # it does not know her yet: SASL_AUTHENTICATION_FAILED a moment, then she gets in.
    outcomes = asyncio.run(run())
    assert outcomes[0] == "SESSION_EXPIRED", outcomes
    assert set(outcomes[1:-1]) <= {"SASL_AUTHENTICATION_FAILED"}, outcomes
    cluster.wait_for_leaders(timeout=30)


def test_a_dedicated_layout_with_authentication_heals_a_dead_broker(
    tmp_path: Path, pki: LocalPki, token_file: Path, request: pytest.FixtureRequest
) -> None:
    """Controller-only voters and broker-only nodes (the redirects, registration with a
    remote quorum), with authentication on: a broker killed for longer than the heal delay
    has its replicas replaced, the learners promoted by their leaders' reports."""
    spec = local_spec(4, {"healed": 2}, name="raftmq-test", controllers=3)
    args = [
        *("--tick-ms", "20", "--heal-delay-ms", "2000"),
        *("--authentication", "scram-sha-256,oauthbearer", "--token-file", str(token_file)),
    ]
    admin = {"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token": ADMIN_TOKEN}
    with module_cluster(
        tmp_path / "dedicated",
        spec,
        args,
        request,
        dedicated_controllers=True,
        pki=pki,
        client_auth=True,
        client_credentials=admin,
    ) as cluster:
        with cluster.admin() as client:
            victim = client.describe_topic("healed").partitions[0].replicas[1]
        cluster.kill(victim)

        def healed() -> bool:
            with cluster.admin() as client:
                parts = client.describe_topic("healed").partitions
            return all(victim not in p.replicas and not p.learners for p in parts)

        wait_until(healed, 90.0, f"broker {victim}'s replicas to be replaced")
