"""Client quotas on a real cluster (docs/quotas.md): a producer and a consumer under a
byte-rate quota are held to about the rate, see throttle_time_ms, and lose nothing, while
other client ids go at full speed; request_percentage slows a client spinning on Metadata;
every broker follows a quota's change and deletion; and `raftmq quota` sets, lists and
deletes them.

Rates are measured over a few seconds and checked within a wide band: they are rates, not
timings, and the machine is shared (and a leader moving to another broker starts afresh
with a second's burst there: quotas are per broker)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.cli.main import app
from raftmq.client import ClientError, Consumer, LowLevelClient, Producer
from raftmq.controller.quotas import DEFAULT, KEYS
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import SHARED_BROKER_ARGS, cluster_spec, module_cluster
from tests.broker.test_broker_cluster import wait_until
from tests.broker.test_metrics import scrape, value

RATE = 100_000
"""Bytes a second of the byte-rate quotas under test."""
RECORD = 1000
RECORDS = 400
"""400 KB: the one-second burst and three seconds at the rate."""


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    spec = cluster_spec({"slow": 1, "fast": 1, "read": 1})
    with module_cluster(
        tmp_path_factory.mktemp("quotas"), spec, SHARED_BROKER_ARGS, request
    ) as cluster:
        yield cluster


def _applied_everywhere(cluster: LocalCluster, version: int) -> None:
    """Wait until every broker applied metadata ``version``."""
    with LowLevelClient(cluster.addresses) as client:

        def everywhere() -> bool:
            return all(
                client.stub(a)
                .Metadata(pb.MetadataRequest(routing_only=True), timeout=5)
                .metadata_version
                >= version
                for a in cluster.addresses
            )

        wait_until(everywhere, 30, f"every broker at metadata version {version}")


def _set(cluster: LocalCluster, user: str = "", client_id: str = "", **values: int) -> None:
    with cluster.admin() as admin:
        answer = admin.alter_client_quotas(user, client_id, set_values=values)
    _applied_everywhere(cluster, answer.metadata_version)


def _delete(cluster: LocalCluster, user: str = "", client_id: str = "") -> None:
    with cluster.admin() as admin:
        answer = admin.alter_client_quotas(
            user,
            client_id,
            remove=list(KEYS),
        )
    _applied_everywhere(cluster, answer.metadata_version)


def _produce(cluster: LocalCluster, topic: str, client_id: str) -> float:
    """Send RECORDS records of RECORD bytes; the seconds until all are acknowledged."""
    with Producer(cluster.addresses, client_id=client_id, batch_size=16_384) as producer:
        started = time.monotonic()
        futures = [
            producer.send(topic, i.to_bytes(4, "big") * (RECORD // 4), partition=0)
            for i in range(RECORDS)
        ]
        producer.flush(timeout=120)
        elapsed = time.monotonic() - started
    assert all(f.exception() is None for f in futures)
    return elapsed


def _read_all(cluster: LocalCluster, topic: str, client_id: str) -> tuple[float, list[bytes]]:
    """Every record of ``topic``/0 from the start; the seconds it took and the values."""
    values: list[bytes] = []
    with Consumer(
        cluster.addresses, client_id=client_id, auto_offset_reset="earliest", fetch_max_wait_ms=100
    ) as consumer:
        consumer.assign([(topic, 0)])
        started = time.monotonic()
        deadline = started + 120
        while len(values) < RECORDS and time.monotonic() < deadline:
            values += [r.value or b"" for r in consumer.poll(timeout=0.5)]
        return time.monotonic() - started, values


def _seconds(cluster: LocalCluster, metric: str, kind: str) -> float:
    """``metric``{kind} summed over the brokers."""
    return sum(
        value(scrape(bound.metrics), metric, kind=kind) for bound in cluster.wait_ready().values()
    )


def _throttle_given(cluster: LocalCluster, kind: str) -> float:
    return _seconds(cluster, "raftmq_quota_throttle_seconds_total", kind)


def _held(cluster: LocalCluster, kind: str) -> float:
    return _seconds(cluster, "raftmq_quota_held_seconds_total", kind)


def _expected(values: list[bytes]) -> None:
    assert values == [i.to_bytes(4, "big") * (RECORD // 4) for i in range(RECORDS)]


def test_a_producer_is_held_to_its_produce_quota_and_keeps_every_record(
    cluster: LocalCluster,
) -> None:
    _set(cluster, client_id="slow-producer", producer_byte_rate=RATE)
    throttled_before = _throttle_given(cluster, "produce")
    elapsed = _produce(cluster, "slow", "slow-producer")
    rate = RECORDS * RECORD / elapsed
    # A second's burst, then the rate: 400 KB take about 3 s at 100 KB/s.
    assert RATE * 0.3 < rate < RATE * 2.5, f"{rate:.0f} B/s under a {RATE} B/s quota"
    assert _throttle_given(cluster, "produce") > throttled_before

    fast_elapsed = _produce(cluster, "fast", "fast-producer")  # another client id
    assert fast_elapsed < elapsed / 2, (fast_elapsed, elapsed)

    _, values = _read_all(cluster, "slow", "reader")
    _expected(values)  # nothing dropped, nothing twice, in order

    # The answer itself says so, at once (KIP-219): a LowLevelClient sees the field.
    with LowLevelClient(cluster.addresses, client_id="slow-producer") as client:
        batch = build_batch([Record(None, b"x" * 50_000, 1)])
        throttles = [client.produce("fast", 0, batch).throttle_time_ms for _ in range(6)]
    assert max(throttles) > 0, throttles
    _delete(cluster, client_id="slow-producer")


def test_a_consumer_is_held_to_its_fetch_quota(cluster: LocalCluster) -> None:
    _produce(cluster, "read", "filler")
    fast_elapsed, fast_values = _read_all(cluster, "read", "fast-consumer")
    _expected(fast_values)

    _set(cluster, client_id="slow-consumer", consumer_byte_rate=RATE)
    throttled_before, held_before = _throttle_given(cluster, "fetch"), _held(cluster, "fetch")
    elapsed, values = _read_all(cluster, "read", "slow-consumer")
    _expected(values)
    rate = RECORDS * RECORD / elapsed
    assert RATE * 0.3 < rate < RATE * 2.5, f"{rate:.0f} B/s under a {RATE} B/s quota"
    assert fast_elapsed < elapsed / 2, (fast_elapsed, elapsed)
    throttled = _throttle_given(cluster, "fetch") - throttled_before
    assert throttled > 1.0, throttled
    # The fetcher honoured each throttle (one fetch at a time): its calls were never held
    # at the broker for long, the way a client ignoring the throttle is (below).
    held = _held(cluster, "fetch") - held_before
    assert held < throttled / 4, (held, throttled)
    _delete(cluster, client_id="slow-consumer")


def _spin(address: str, client_id: str, seconds: float) -> tuple[int, int]:
    """Metadata calls made in ``seconds``, and the largest throttle_time_ms seen."""
    with LowLevelClient([address], client_id=client_id) as client:
        stub = client.stub(address)
        calls, most_ms = 0, 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            answer = stub.Metadata(pb.MetadataRequest(), timeout=30)
            calls, most_ms = calls + 1, max(most_ms, answer.throttle_time_ms)
    return calls, most_ms


def test_request_percentage_slows_a_client_spinning_on_metadata(cluster: LocalCluster) -> None:
    address = cluster.addresses[0]
    _set(cluster, client_id="spinner", request_percentage=1)
    free_calls, free_ms = _spin(address, "free", 2.0)
    calls, most_ms = _spin(address, "spinner", 2.0)
    assert free_ms == 0
    assert most_ms > 0
    assert calls < free_calls / 2, (calls, free_calls)
    assert _held(cluster, "request") > 0.5  # it ignored the throttle: the broker held it
    _delete(cluster, client_id="spinner")


def test_every_broker_follows_a_change_and_a_deletion(cluster: LocalCluster) -> None:
    # A default user quota (every client here is User:ANONYMOUS) for one client id.
    _set(cluster, user=DEFAULT, client_id="changer", request_percentage=1)
    for address in cluster.addresses:
        wait_until(lambda a=address: _spin(a, "changer", 0.5)[1] > 0, 30, f"throttled at {address}")
    _set(cluster, user=DEFAULT, client_id="changer", request_percentage=100)
    _delete(cluster, user=DEFAULT, client_id="changer")
    with LowLevelClient(cluster.addresses) as client:
        assert not client.metadata().throttle_time_ms
    for address in cluster.addresses:
        calls, most_ms = _spin(address, "changer", 0.5)
        assert most_ms == 0 and calls > 0, address


def test_the_cli_sets_lists_and_deletes_quotas(cluster: LocalCluster, tmp_path: Path) -> None:
    runner = CliRunner()
    bootstrap = ["--bootstrap", ",".join(cluster.controller_addresses)]

    def run(*args: str) -> str:
        result = runner.invoke(app, [*args, *bootstrap])
        assert result.exit_code == 0, result.output
        return result.output

    run("quota", "set", "--user", "User:alice", "--client-default", "--producer-byte-rate", "5000")
    run("quota", "set", "--client-id", "app", "--request-percentage", "20")
    listed = json.loads(run("quota", "list", "--json"))["quotas"]
    assert {(q["entity"]["user"], q["entity"]["client_id"]): q["values"] for q in listed} == {
        ("", "app"): {"request_percentage": "20"},
        ("alice", DEFAULT): {"producer_byte_rate": "5000"},
    }
    assert "alice" in run("quota", "list", "--user", "alice")
    run("quota", "delete", "--user", "alice", "--client-default")
    run("quota", "delete", "--client-id", "app", "--request-percentage")
    assert "No client quotas" in run("quota", "list")

    refused = runner.invoke(
        app, ["quota", "set", "--client-id", "app", "--request-percentage", "500", *bootstrap]
    )
    assert refused.exit_code == 1 and "INVALID_CLIENT_QUOTA" in refused.output
    unnamed = runner.invoke(app, ["quota", "set", "--producer-byte-rate", "5", *bootstrap])
    assert unnamed.exit_code == 2 and "Name the entity" in unnamed.output

    # The records commands take a client id too, checked as the clients check it.
    produced = runner.invoke(
        app, ["produce", "fast", "--client-id", "cli-tool", *bootstrap], input="one\ntwo\n"
    )
    assert produced.exit_code == 0, produced.output
    bad = runner.invoke(
        app, ["produce", "fast", "--client-id", "tab\there", *bootstrap], input="x\n"
    )
    assert bad.exit_code == 2 and "client_id" in bad.output


def test_bad_quotas_are_refused_quoted_short(cluster: LocalCluster) -> None:
    with cluster.admin() as admin:
        for user, client_id, values in (
            ("x" * 100_000, "", {"producer_byte_rate": 1}),
            ("", "app", {"k" * 100_000: 1}),
            ("", "", {"producer_byte_rate": 1}),
            ("", "app", {"request_percentage": 0}),
        ):
            with pytest.raises(ClientError) as refused:
                admin.alter_client_quotas(user, client_id, set_values=values)
            assert refused.value.code == pb.ERROR_CODE_INVALID_CLIENT_QUOTA, refused.value
            assert refused.value.status == grpc.StatusCode.INVALID_ARGUMENT
            assert len(str(refused.value)) < 500, str(refused.value)
        assert not admin.describe_client_quotas().quotas
