"""The asyncio clients' link to the cluster: one gRPC channel per broker, the merged view
of who leads what (raftmq.client.cluster_view), and the one way to follow a leader hint
or forget a leader that failed. The producer's engine and the consumer's fetcher share it
so they route requests alike."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import TypedDict

import grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.client.cluster_view import ClusterView, Leader, merge_metadata
from raftmq.client.errors import ClientError, error_of
from raftmq.client.sasl import SaslSettings
from raftmq.limits import CLIENT_ID, CLIENT_ID_HEADER

AUTO_CREATE_TIMEOUT_S = 12.0
"""A broker waits up to 10 s for a topic it auto-creates (raftmq.broker.auto_create)."""
METADATA_TIMEOUT_S = 5.0


def bootstrap_addresses(bootstrap: str | Sequence[str]) -> tuple[str, ...]:
    """Broker addresses given as a list or as one comma-separated string."""
    return tuple(bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap)


def no_leader(topic: str, partition: int) -> ClientError:
    return ClientError(
        f"no leader is known for {topic}/{partition}",
        pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
        grpc.StatusCode.UNAVAILABLE,
        {},
        "LEADER_NOT_AVAILABLE",
    )


_instances = itertools.count(1)


def checked_client_id(client_id: str | None, kind: str) -> str:
    """A client's id (Kafka's ``client.id``; quotas may be set per client id,
    docs/quotas.md): ``client_id``, or for None one made as Kafka's clients make theirs
    (``producer-1``, ``consumer-2``: ``kind`` and a number counting this process's
    clients), so that each instance has its own. Raises ValueError for one gRPC metadata
    cannot carry."""
    if client_id is None:
        return f"{kind}-{next(_instances)}"
    if not CLIENT_ID.fullmatch(client_id):
        raise ValueError(f"client_id {client_id[:64]!r} must be 1-255 printable ASCII characters")
    return client_id


def client_id_headers(client_id: str) -> net.Headers:
    """The metadata every call of a client carries: its id."""
    return ((CLIENT_ID_HEADER, client_id),)


class TlsSettings(TypedDict, total=False):
    """The TLS keyword settings every client takes, by Kafka's names (docs/security.md):
    the CA file that signed the brokers' certificates, and this client's certificate and
    key for brokers that require one. Any of them set turns TLS on."""

    ssl_cafile: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None


class SecuritySettings(TlsSettings, SaslSettings, total=False):
    """The TLS and authentication keyword settings together (docs/security.md)."""


class Connections:
    """Create and use it inside one event loop."""

    def __init__(
        self,
        bootstrap: tuple[str, ...],
        *,
        security: net.Security = net.PLAINTEXT,
        headers: net.Headers = (),
    ) -> None:
        """``headers``: sent on every call (:func:`client_id_headers`)."""
        self.bootstrap = bootstrap
        self.view = ClusterView()
        self._channels = net.AioChannels(security=security, headers=headers)
        self._refreshing: asyncio.Task[bool] | None = None
        self.refused: ClientError | None = None
        """Why the last :meth:`refresh` was refused, when a broker refused to say who the
        caller is (authentication): no retry mends that, so a caller waiting for metadata
        raises it rather than wait on."""
        self._throttled_until: dict[str, float] = {}
        """Broker address -> when (loop time) its client-quota throttle ends."""

    def channel(self, address: str) -> grpc.aio.Channel:
        return self._channels.of(address)

    def stub(self, address: str) -> pb_grpc.BrokerStub:
        return pb_grpc.BrokerStub(self.channel(address))

    async def refresh(self) -> bool:
        """Ask every known broker for Metadata; callers at the same time share one round.
        False when no broker answered (the view stays as it was)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        return await asyncio.shield(self._refreshing)

    async def _refresh(self) -> bool:
        addresses = list(dict.fromkeys([*self.bootstrap, *self.view.brokers.values()]))

        async def ask(address: str) -> pb.MetadataResponse | ClientError:
            try:
                answer: pb.MetadataResponse = await self.stub(address).Metadata(
                    pb.MetadataRequest(routing_only=True), timeout=METADATA_TIMEOUT_S
                )
                return answer
            except grpc.aio.AioRpcError as exc:
                return error_of(exc)

        results = await asyncio.gather(*map(ask, addresses))
        answers = [a for a in results if isinstance(a, pb.MetadataResponse)]
        if answers:
            self.view = merge_metadata(answers)
        self.refused = next(
            (
                e
                for e in results
                if isinstance(e, ClientError)
                and e.status == grpc.StatusCode.UNAUTHENTICATED
                and not e.retriable
            ),
            None,
        )
        return bool(answers)

    async def ask_to_create(self, topic: str) -> None:
        """Ask a bootstrap broker to create ``topic`` if it auto-creates topics (a
        producer's first send to it); whatever the answer, :meth:`refresh` tells, but for
        a refusal by the ACLs (raised: the topic is hidden from this principal, so the
        listing :meth:`refresh` reads would only say it does not exist)."""
        for address in self.bootstrap:
            try:
                await self.stub(address).Metadata(
                    pb.MetadataRequest(topics=[topic], allow_auto_create=True),
                    timeout=AUTO_CREATE_TIMEOUT_S,
                )
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise error_of(exc) from None

    async def leader(self, topic: str, partition: int) -> str:
        """The leader's address, asking the cluster when none is known; raises
        LEADER_NOT_AVAILABLE (retriable) when no broker knows one."""
        leader = self.view.leaders.get((topic, partition))
        if leader is None:
            await self.refresh()
            leader = self.view.leaders.get((topic, partition))
        if leader is None:
            raise no_leader(topic, partition)
        return leader.address

    def learn(self, topic: str, partition: int, error: ClientError) -> None:
        """After a failed request: a NOT_LEADER's hint is used at once; any other failure
        forgets the leader, so the next request asks again."""
        key = (topic, partition)
        hinted = error.meta.get("raftmq-leader-address")
        if hinted:
            self.view.leaders[key] = Leader(int(error.meta.get("raftmq-leader-id", 0)), hinted)
        else:
            self.view.leaders.pop(key, None)

    def hold_back(self, address: str, throttle_time_ms: int) -> None:
        """The broker at ``address`` answered with ``throttle_time_ms``: this client is over
        a quota there (docs/quotas.md), so nothing more goes to it until the time passes,
        as Kafka's clients do (the broker would hold the calls anyway)."""
        if throttle_time_ms > 0:
            until = asyncio.get_running_loop().time() + throttle_time_ms / 1000
            if until > self._throttled_until.get(address, 0.0):
                self._throttled_until[address] = until

    async def throttle(self, address: str) -> None:
        """Wait until a throttle the broker at ``address`` gave has passed."""
        until = self._throttled_until.get(address)
        if until is None:
            return
        wait_s = until - asyncio.get_running_loop().time()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        if self._throttled_until.get(address) == until:
            del self._throttled_until[address]

    async def close(self) -> None:
        await self._channels.close()
