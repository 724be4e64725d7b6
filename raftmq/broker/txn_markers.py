"""The wire side of the transaction coordinator's marker driver
(:class:`~raftmq.controller.txn_coordinator.MarkerDriver`): Broker.WriteTxnMarkers to a
partition leader over gRPC (broker.proto), its answers read back as plain values. The
controller floor does not speak the api, so this adapter lives here."""

from __future__ import annotations

import grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.controller.txn_coordinator import MarkerAnswer, MarkersUnsent, MarkerTarget

WAIT_MS = 5_000
"""How long a leader waits for each marker to commit (the request's timeout_ms)."""
DEADLINE_S = 10.0
MAX_CHANNELS = 256
"""Channels kept open (one per broker address); past it they are all closed and opened
again as needed (addresses change only when brokers move)."""


class MarkerSender:
    """Sends markers; one cached channel per broker address."""

    def __init__(self, *, security: net.Security = net.PLAINTEXT) -> None:
        self._channels = net.AioChannels(max_channels=MAX_CHANNELS, security=security)

    async def __call__(self, address: str, targets: list[MarkerTarget]) -> list[MarkerAnswer]:
        request = pb.WriteTxnMarkersRequest(
            markers=[
                pb.TxnMarker(
                    topic=t.partition.topic,
                    partition=t.partition.partition,
                    producer_id=t.producer_id,
                    producer_epoch=t.producer_epoch,
                    commit=t.commit,
                )
                for t in targets
            ],
            timeout_ms=WAIT_MS,
        )
        try:
            stub = pb_grpc.BrokerStub(await self._channels.get(address))
            response = await stub.WriteTxnMarkers(request, timeout=DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            raise MarkersUnsent(f"{exc.code().name}: {exc.details()}") from None
        answers = [MarkerAnswer(False, "NO_ANSWER")] * len(targets)
        for result in response.results:
            if result.index >= len(targets):
                continue
            if not result.HasField("error"):
                answers[result.index] = MarkerAnswer(True)
            else:
                error = result.error
                answers[result.index] = MarkerAnswer(False, error.code, error.leader_address)
        return answers

    async def close(self) -> None:
        await self._channels.close()
