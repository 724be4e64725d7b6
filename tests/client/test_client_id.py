"""Every call of a client carries its client id (Kafka's client.id) as gRPC metadata, put
on by the channel (raftmq.net) rather than by each call site: unary calls and streams, on
synchronous and asyncio channels alike; and a bad id is refused when the client is made."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.client import AdminClient, LowLevelClient, Producer
from raftmq.client.connections import checked_client_id, client_id_headers
from raftmq.limits import CLIENT_ID_HEADER


class Recorder(pb_grpc.BrokerServicer):
    """A Broker service that answers Metadata and ProduceStream and keeps the client id
    each call carried."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def _note(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        ids = [v for k, v in context.invocation_metadata() or () if k == CLIENT_ID_HEADER]
        self.seen.append((rpc, ids[0] if ids else ""))

    async def Metadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._note("Metadata", context)
        return pb.MetadataResponse(cluster="c")

    async def ProduceStream(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        self._note("ProduceStream", context)
        async for message in requests:
            yield pb.ProduceStreamResponse(
                responses=[pb.ProduceResponse(request_id=r.request_id) for r in message.requests]
            )


async def test_asyncio_and_sync_channels_send_the_id_on_every_call() -> None:
    recorder = Recorder()
    server = net.aio_server()
    pb_grpc.add_BrokerServicer_to_server(recorder, server)
    port = net.add_port(server, "127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        async with net.aio_channel(address, headers=client_id_headers("app-1")) as channel:
            stub = pb_grpc.BrokerStub(channel)
            await stub.Metadata(pb.MetadataRequest(), timeout=5)
            call = stub.ProduceStream()  # the write API the producer's stream uses
            await call.write(pb.ProduceStreamRequest(requests=[pb.ProduceRequest(request_id=7)]))
            answer = await call.read()
            assert answer.responses[0].request_id == 7
            await call.done_writing()
        sync = net.channel(address, headers=client_id_headers("tool-2"))
        try:
            stub_sync = pb_grpc.BrokerStub(sync)
            await asyncio.to_thread(stub_sync.Metadata, pb.MetadataRequest(), timeout=5)
        finally:
            sync.close()
    finally:
        await server.stop(0)
    assert recorder.seen == [
        ("Metadata", "app-1"),
        ("ProduceStream", "app-1"),
        ("Metadata", "tool-2"),
    ]


def test_ids_are_checked_and_defaults_are_kafkas() -> None:
    assert checked_client_id("billing", "producer") == "billing"
    made = checked_client_id(None, "producer")
    assert made.startswith("producer-") and made != checked_client_id(None, "producer")
    for bad in ("", "x" * 256, "caf\u00e9", "tab\there"):
        with pytest.raises(ValueError, match="client_id"):
            checked_client_id(bad, "producer")
    with pytest.raises(ValueError, match="client_id"):
        Producer("127.0.0.1:1", client_id="new\nline")
    with LowLevelClient(["127.0.0.1:1"]) as client:
        assert client.client_id.startswith("client-")
    with AdminClient(["127.0.0.1:1"], client_id="ops") as admin:
        assert admin.client_id == "ops"
