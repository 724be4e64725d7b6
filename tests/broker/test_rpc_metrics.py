"""The RPC interceptor on a server of its own (grpc.health.v1, as every broker serves it):
a unary call is counted and timed, a stream that writes its answers on the context
(health's Watch) is counted once when the client cancels it, with no latency sample, and
a method the server does not have is not counted at all (its label set stays bounded).
The broker's own services are covered with real brokers in test_metrics.py."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from raftmq import net
from raftmq.broker.rpc_metrics import RpcMetrics, method_label


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_method_labels_are_service_and_method() -> None:
    assert method_label("/raftmq.v1.Broker/Produce") == "Broker/Produce"
    assert method_label("/grpc.health.v1.Health/Check") == "Health/Check"


def test_health_calls_are_counted_and_unknown_methods_are_not() -> None:
    async def main() -> None:
        registry = CollectorRegistry()
        interceptor = RpcMetrics()
        registry.register(interceptor)
        server = net.aio_server(interceptors=[interceptor])
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = net.add_port(server, "127.0.0.1:0")
        await server.start()
        try:
            await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
            async with net.aio_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                for _ in range(3):
                    await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                with pytest.raises(grpc.aio.AioRpcError) as unknown:
                    await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
                assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
                watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
                first = await watch.read()
                assert first.status == health_pb2.HealthCheckResponse.SERVING
                watch.cancel()
                missing = channel.unary_unary("/raftmq.v1.Nothing/Here")
                with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
                    await missing(b"", timeout=5)
                assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED
            check = {"method": "Health/Check"}
            assert sample(registry, "raftmq_rpc_requests_total", code="OK", **check) == 3
            assert sample(registry, "raftmq_rpc_requests_total", code="NOT_FOUND", **check) == 1
            assert sample(registry, "raftmq_rpc_latency_seconds_count", **check) == 4
            for _ in range(200):  # the server sees the cancel a moment after the client
                watched = sample(
                    registry, "raftmq_rpc_requests_total", method="Health/Watch", code="CANCELLED"
                )
                if watched:
                    break
                await asyncio.sleep(0.01)
            assert watched == 1
            assert sample(registry, "raftmq_rpc_latency_seconds_count", method="Health/Watch") == 0
            methods = {
                s.labels["method"]
                for family in registry.collect()
                for s in family.samples
                if "method" in s.labels
            }
            assert methods == {"Health/Check", "Health/Watch"}
        finally:
            await server.stop(0)

    asyncio.run(main())
