"""TLS with real brokers (docs/security.md): a cluster whose every listener is TLS, mutual
on the client listener and on the Raft transport, produces and consumes; Raft runs over
TLS (a follower killed and restarted catches up); each way a connection can be refused
says so in its own words, writes nothing, and leaves the brokers serving; a rotated
certificate reaches new connections while an open produce stream carries on.

The bad certificates are swapped into the running brokers' certificate files, which the
brokers re-read at the next handshake: that shows the reload and spares a cluster per case.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client import AsyncProducer, ClientError, Consumer, LowLevelClient, Producer
from raftmq.devtools import certs
from raftmq.devtools.certs import Issued, LocalPki
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format.records import Record, build_batch, iter_records
from tests.broker.conftest import REBALANCE_ARGS, cluster_spec, module_cluster

TOPIC = "secure"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> LocalPki:
    return certs.local_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pki: LocalPki, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("tls-cluster")
    args = ["--tick-ms", "20", "--election-ticks", "10", *REBALANCE_ARGS]
    spec = cluster_spec({TOPIC: 1})
    with module_cluster(data, spec, args, request, pki=pki, client_auth=True) as c:
        yield c


def _end_offset(cluster: LocalCluster) -> int:
    with cluster.client() as client:
        return client.metadata([TOPIC]).topics[0].partitions[0].high_watermark


def _wait(condition: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_tls_cluster_produces_and_consumes(cluster: LocalCluster) -> None:
    tls = cluster.client_tls
    with Consumer(cluster.addresses, auto_offset_reset="earliest", **tls) as consumer:
        start = _end_offset(cluster)
        with Producer(cluster.addresses, **tls) as producer:
            for i in range(50):
                producer.send(TOPIC, f"v{i}".encode(), key=b"k")
            producer.flush()
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), start)
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            got += [r.value or b"" for r in consumer.poll(timeout=0.5)]
    assert got == [f"v{i}".encode() for i in range(50)]


def test_raft_runs_over_mutual_tls(cluster: LocalCluster, pki: LocalPki) -> None:
    """A follower killed and restarted catches up over the TLS transport; the Raft port
    refuses a peer without a certificate, and speaks no plaintext."""
    broker = cluster.spec.brokers[3]
    raw = socket.create_connection((broker.host, broker.raft_port), timeout=5)
    context = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    # TLS 1.3: the server checks the client's certificate after the client's side of the
    # handshake, so the refusal arrives as the first read.
    with (
        raw,
        context.wrap_socket(raw, server_hostname=broker.host) as tls,
        pytest.raises((ssl.SSLError, ConnectionError)),
    ):
        tls.sendall(b"x")
        if not tls.recv(1):
            raise ConnectionError("closed")
    cluster.kill(3)
    with cluster.client() as client:
        batch = build_batch([Record(b"k", b"while-3-was-down", 0, ())])
        written = client.produce(TOPIC, 0, batch)
    cluster.start(3)

    def on_broker_3() -> list[bytes | None]:
        with LowLevelClient(cluster.addresses, retries=1, **cluster.client_tls) as client:
            try:
                resp = client.fetch(TOPIC, 0, written.base_offset, address=broker.address)
            except ClientError:
                return []
            return [r.value for r in iter_records(resp.entries)]

    _wait(lambda: on_broker_3()[:1] == [b"while-3-was-down"], "broker 3 to catch up over TLS")


def _refused(cluster: LocalCluster, **tls: str) -> ClientError:
    with (
        LowLevelClient(cluster.addresses, retries=2, **tls) as client,  # type: ignore[arg-type]
        pytest.raises(ClientError) as caught,
    ):
        client.metadata([TOPIC])  # a client's first call: what finds the partitions
    return caught.value


def test_plaintext_and_certificate_less_clients_are_refused(
    cluster: LocalCluster, pki: LocalPki
) -> None:
    before = _end_offset(cluster)
    plaintext = _refused(cluster)
    no_cert = _refused(cluster, ssl_cafile=str(pki.ca.cert_file))
    for err in (plaintext, no_cert):
        assert err.label == "UNAVAILABLE"
        assert "if its listener uses TLS, give this client ssl_cafile" in str(err)
    assert "ssl_certfile and ssl_keyfile" in str(no_cert)
    assert _end_offset(cluster) == before  # nothing written, brokers still serving


@pytest.fixture
def swap_server_cert(cluster: LocalCluster, pki: LocalPki, tmp_path: Path) -> Iterator[object]:
    """Installs another certificate in the brokers' files (they re-read them at the next
    handshake); the good one is put back after the test."""
    saved = tmp_path / "saved"
    saved.mkdir()
    for f in (pki.broker.cert_file, pki.broker.key_file):
        shutil.copy2(f, saved / f.name)

    def install(issued: Issued) -> None:
        for src, dst in (
            (issued.key_file, pki.broker.key_file),
            (issued.cert_file, pki.broker.cert_file),
        ):
            tmp = dst.with_suffix(".swap")
            shutil.copyfile(src, tmp)
            tmp.replace(dst)

    def restore() -> None:
        install(Issued(saved / pki.broker.cert_file.name, saved / pki.broker.key_file.name))
        _wait(lambda: _answers(cluster), "the brokers to serve their good certificate again")

    install.restore = restore  # type: ignore[attr-defined]
    yield install
    restore()


def _answers(cluster: LocalCluster) -> bool:
    try:
        _end_offset(cluster)
    except ClientError:
        return False
    return True


@pytest.mark.parametrize(
    ("case", "label"),
    [
        ("expired", "TLS_CERTIFICATE_EXPIRED"),
        ("self_signed", "TLS_CERTIFICATE_SELF_SIGNED"),
        ("wrong_host", "TLS_WRONG_HOST"),
        ("wrong_ca", "TLS_UNKNOWN_CA"),
    ],
)
def test_untrusted_server_certificates_are_refused(
    cluster: LocalCluster,
    pki: LocalPki,
    swap_server_cert: object,
    tmp_path: Path,
    case: str,
    label: str,
) -> None:
    before = _end_offset(cluster)
    ca = pki.ca
    if case == "expired":
        bad = certs.issue(ca, tmp_path, "bad", expired=True)
    elif case == "self_signed":
        bad = certs.issue(None, tmp_path, "bad")
    elif case == "wrong_host":
        bad = certs.issue(ca, tmp_path, "bad", hosts=("10.9.9.9", "elsewhere.example"))
    else:
        other = certs.make_ca(tmp_path / "other", common_name="another CA")
        bad = certs.issue(other, tmp_path, "bad")
    swap_server_cert(bad)  # type: ignore[operator]
    err = _refused(cluster, **cluster.client_tls)
    assert err.label == label, str(err)
    assert err.status is not None and err.status.name == "UNAUTHENTICATED"
    assert "certificate" in str(err)
    assert not err.retriable and not err.unreachable
    swap_server_cert.restore()  # type: ignore[attr-defined]
    assert _end_offset(cluster) == before  # nothing written, the brokers serve on


def test_rotated_certificate_reaches_new_connections_while_a_stream_goes_on(
    cluster: LocalCluster, pki: LocalPki, swap_server_cert: object, tmp_path: Path
) -> None:
    """The brokers' certificate is replaced by one of a new CA: a client that trusts only
    the old CA can no longer connect, one that trusts the new CA can, and a producer whose
    stream was open before keeps producing on it throughout."""
    new_ca = certs.make_ca(tmp_path / "new", common_name="rotated CA")
    rotated = certs.issue(new_ca, tmp_path / "new", "broker")
    both = tmp_path / "both-cas.pem"
    both.write_bytes(pki.ca.cert_file.read_bytes() + new_ca.cert_file.read_bytes())

    async def run() -> int:
        async with AsyncProducer(cluster.addresses, linger_ms=0, **cluster.client_tls) as p:
            await (await p.send(TOPIC, b"before"))
            swap_server_cert(rotated)  # type: ignore[operator]
            sent = 1
            old_refused = False
            deadline = time.monotonic() + 30
            while not old_refused:
                assert time.monotonic() < deadline, "the rotated certificate was not served"
                await (await p.send(TOPIC, f"during-{sent}".encode()))
                sent += 1
                try:
                    await asyncio.to_thread(_end_offset, cluster)
                except ClientError as exc:
                    assert exc.label == "TLS_UNKNOWN_CA", str(exc)
                    old_refused = True
            for _ in range(20):  # the stream opened before the rotation still carries them
                await (await p.send(TOPIC, f"after-{sent}".encode()))
                sent += 1
            return sent

    sent = asyncio.run(run())
    tls = {**cluster.client_tls, "ssl_cafile": str(both)}
    with LowLevelClient(cluster.addresses, **tls) as client:  # type: ignore[arg-type]
        assert client.metadata([TOPIC]).topics[0].partitions[0].high_watermark >= sent
