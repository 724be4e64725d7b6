"""``--log-format json``: a broker writes one JSON object per line, with its node and, for a
line written while it served an RPC, the RPC, its request id (the client's
``x-request-id``, else one the broker makes), the partition the request names and the
principal (a mutual-TLS client's certificate's common name); the formatter itself, with
exceptions and ``extra`` fields."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import admin_pb2_grpc as apb_grpc
from raftmq.devtools import certs
from raftmq.log_records import CallContext, JsonFormatter, bind_call, unbind_call
from tests.broker.conftest import ClusterFactory, cluster_spec, module_cluster

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \S+ (INFO|WARNING|ERROR) ")


def record(message: str, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord("raftmq.x", logging.WARNING, __file__, 1, message, (), None)
    for key, value in extra.items():
        setattr(r, key, value)
    return r


def test_the_formatter_writes_the_bound_call_and_the_lines_own_fields() -> None:
    formatter = JsonFormatter(node="broker-7")
    plain = json.loads(formatter.format(record("no call")))
    assert plain["node"] == "broker-7" and plain["message"] == "no call"
    assert plain["level"] == "WARNING" and plain["logger"] == "raftmq.x"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", plain["ts"])
    assert "rpc" not in plain and "partition" not in plain

    request = SimpleNamespace(topic="orders", partition=3)
    call = CallContext("Produce", lambda: (("x-request-id", "req-1"),), request)
    token = bind_call(call)
    try:
        line = json.loads(formatter.format(record("in a call")))
        assert (line["rpc"], line["request_id"], line["partition"]) == (
            "Produce",
            "req-1",
            "orders/3",
        )
        assert line["principal"] == "User:ANONYMOUS"  # no client certificate
        own = json.loads(formatter.format(record("own", partition="other/0")))
        assert own["partition"] == "other/0"  # a line's own field wins
        try:
            raise ValueError("boom")
        except ValueError:
            failed = record("failed")
            failed.exc_info = sys.exc_info()
        assert "ValueError: boom" in json.loads(formatter.format(failed))["exception"]
    finally:
        unbind_call(token)
    assert "rpc" not in json.loads(formatter.format(record("after")))
    certified = CallContext("Fetch", auth=lambda: {"x509_common_name": [b"alice"]})
    assert certified.principal == "User:alice"
    # Without the client's id the broker makes one, the same for every line of the call.
    made = CallContext("CreateTopic", lambda: ())
    assert made.request_id == made.request_id and re.fullmatch(r"[0-9a-f]{16}", made.request_id)


def test_a_broker_writes_json_lines_with_the_rpc_and_request_id(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"t": 1}, extra_args=["--log-format", "json"])
    request = apb.CreateTopicRequest(name="logged", partitions=2, replication_factor=3)
    refusals = []
    for address in cluster.addresses:  # the controller leader takes it; the others refuse
        with grpc.insecure_channel(address) as channel:
            try:
                apb_grpc.AdminStub(channel).CreateTopic(
                    request, metadata=(("x-request-id", "req-42"),), timeout=30
                )
                break
            except grpc.RpcError as exc:
                refusals.append(exc)
    else:
        raise AssertionError(f"no broker created the topic: {refusals}")
    lines = [line for bid in cluster.spec.brokers for line in _lines(cluster.log_path(bid))]
    objects = [json.loads(line) for line in lines if line.startswith("{")]
    assert not [line for line in lines if TEXT_LINE.match(line)]  # no text-format line
    assert {o["node"] for o in objects} >= {"broker-1", "broker-2", "broker-3"}
    created = [o for o in objects if o["message"].startswith("created topic logged ")]
    assert len(created) == 1, created
    assert (created[0]["rpc"], created[0]["request_id"]) == ("CreateTopic", "req-42")
    assert "2 partitions of 3 replicas" in created[0]["message"]


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


def test_a_mutual_tls_clients_principal_is_its_certificates_common_name(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pki = certs.local_pki(tmp_path / "pki")
    args = ["--tick-ms", "20", "--election-ticks", "10", "--log-format", "json"]
    with module_cluster(
        tmp_path / "cluster", cluster_spec({"t": 1}), args, request, pki=pki, client_auth=True
    ) as cluster:
        with cluster.admin() as admin:
            admin.create_topic("by-cert", 1, 3)
        objects = [
            json.loads(line)
            for bid in cluster.spec.brokers
            for line in _lines(cluster.log_path(bid))
            if line.startswith("{")
        ]
    created = [o for o in objects if o["message"].startswith("created topic by-cert ")]
    assert [o["principal"] for o in created] == ["User:raftmq client"]
