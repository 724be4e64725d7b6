"""A low-level, synchronous client of the raftmq.v1.Broker API: one gRPC channel per broker,
partition leaders from Metadata, redirects on NOT_LEADER, bounded retries while a leader is
being elected. The Producer and Consumer (later) are built on it; tools and tests use it
directly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.client.backoff import backoff_s
from raftmq.client.cluster_view import Leader, merge_metadata
from raftmq.client.connections import SecuritySettings, checked_client_id, client_id_headers
from raftmq.client.errors import ClientError, error_of
from raftmq.client.sasl import client_security

BROKER_SERVICE = "raftmq.v1.Broker"


class LowLevelClient:
    def __init__(
        self,
        bootstrap: list[str],
        *,
        retries: int = 60,
        backoff: float = 0.05,
        retry_unavailable: bool = False,
        client_id: str | None = None,
        **security: Unpack[SecuritySettings],
    ) -> None:
        """Produce retries what proves nothing was written: NOT_LEADER and friends, and a
        connection that never opened. A call that failed after it may have reached the
        broker (UNAVAILABLE mid-call) is raised, not retried, because the write may have
        happened and a retry could store it twice; ``retry_unavailable=True`` accepts
        that (at-least-once) for callers that prefer it. Idempotent producers lift this.
        ``security``: ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile`` (TLS) and
        ``sasl_mechanism``, ``sasl_username``, ``sasl_password``, ``sasl_oauth_token``
        (authentication), as the Producer's; ``client_id``: Kafka's ``client.id``, as the
        Producer's (None: ``client-N``)."""
        if not bootstrap:
            raise ValueError("give at least one broker address host:port")
        self.bootstrap = list(bootstrap)
        self.retries = retries
        self.backoff = backoff
        self.retry_unavailable = retry_unavailable
        self.client_id = checked_client_id(client_id, "client")
        self._channels = net.Channels(
            security=client_security(**security), headers=client_id_headers(self.client_id)
        )
        self._leaders: dict[tuple[str, int], Leader] = {}
        self._brokers: dict[int, str] = {}

    def stub(self, address: str) -> pb_grpc.BrokerStub:
        return pb_grpc.BrokerStub(self._channel(address))

    def _channel(self, address: str) -> grpc.Channel:
        return self._channels.of(address)

    def health(self, address: str, *, service: str = BROKER_SERVICE, timeout: float = 2.0) -> str:
        """The grpc.health.v1 status of ``service`` at ``address``: "SERVING" while its
        Raft host runs, "NOT_SERVING" once it failed or the broker is stopping. Raises
        grpc.RpcError when the broker does not answer."""
        stub = health_pb2_grpc.HealthStub(self._channel(address))
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)

    def close(self) -> None:
        self._channels.close()

    def __enter__(self) -> LowLevelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- metadata -----------------------------------------------------------------------

    def metadata(
        self, topics: list[str] | None = None, timeout: float = 5.0
    ) -> pb.MetadataResponse:
        """Metadata from the first broker that answers; leaders are merged from every
        broker that reports one, since each knows the leaders of what it hosts."""
        last: Exception | None = None
        for address in self._addresses():
            try:
                return self.stub(address).Metadata(
                    pb.MetadataRequest(topics=topics or []), timeout=timeout
                )
            except grpc.RpcError as exc:
                last = error_of(exc)
                if last.status == grpc.StatusCode.PERMISSION_DENIED:
                    raise last from None  # ACLs: every broker would say the same
        if isinstance(last, ClientError) and last.tls_refusal is not None:
            raise last  # its own words say what to change
        raise ClientError(
            f"no broker answered Metadata ({last})",
            pb.ERROR_CODE_UNSPECIFIED,
            grpc.StatusCode.UNAVAILABLE,
            {},
        )

    def refresh_leaders(self, timeout: float = 2.0) -> dict[tuple[str, int], Leader]:
        answers = []
        for address in self._addresses():
            try:
                request = pb.MetadataRequest(routing_only=True)
                answers.append(self.stub(address).Metadata(request, timeout=timeout))
            except grpc.RpcError:
                continue
        view = merge_metadata(answers)
        self._brokers.update(view.brokers)
        self._leaders = view.leaders
        return dict(self._leaders)

    def _addresses(self) -> Iterator[str]:
        known = list(dict.fromkeys([*self.bootstrap, *self._brokers.values()]))
        yield from known

    def _leader(self, topic: str, partition: int) -> str:
        leader = self._leaders.get((topic, partition))
        if leader is None:
            self.refresh_leaders()
            leader = self._leaders.get((topic, partition))
        return leader.address if leader else self.bootstrap[0]

    # --- data ---------------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        partition: int,
        entries: bytes,
        *,
        acks: pb.Acks = pb.ACKS_ALL,
        timeout_ms: int = 30_000,
    ) -> pb.ProduceResponse:
        """Send to the leader, following NOT_LEADER hints and waiting out elections.

        Retrying after a timeout could duplicate a write (it may have committed), so a
        DEADLINE_EXCEEDED is raised, not retried; idempotent producers come later.
        """
        request = pb.ProduceRequest(
            topic=topic, partition=partition, entries=entries, acks=acks, timeout_ms=timeout_ms
        )
        address = self._leader(topic, partition)
        for attempt in range(self.retries):
            try:
                # The broker answers within timeout_ms; a frozen one must not hold us longer.
                return self.stub(address).Produce(request, timeout=timeout_ms / 1000 + 1)
            except grpc.RpcError as exc:
                err = error_of(exc)
                if err.unreachable:
                    self._leaders.pop((topic, partition), None)  # re-resolve next time
                    never_sent = "failed to connect" in str(err).lower()
                    if not (never_sent or self.retry_unavailable):
                        raise err from None
                elif not err.retriable:
                    raise err from None
                hinted = err.meta.get("raftmq-leader-address")
                if hinted:
                    address = hinted
                    self._leaders[topic, partition] = Leader(
                        int(err.meta.get("raftmq-leader-id", 0)), hinted
                    )
                    continue
                self._sleep(attempt)
                self.refresh_leaders()
                address = self._leader(topic, partition)
        raise ClientError(
            f"no leader for {topic}/{partition} accepted the write after {self.retries} tries",
            pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
            grpc.StatusCode.UNAVAILABLE,
            {},
        )

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 0,
        min_bytes: int = 0,
        address: str | None = None,
        read_committed: bool = False,
        tag_filter: str = "",
    ) -> pb.FetchResponse:
        """Fetch from ``address`` (any replica), or from the leader when None.

        A named replica's refusal is raised as it is: whoever names a replica wants that
        replica's answer (chaos reads each one to compare them). Without ``address`` the
        read retries whatever broker.proto marks retriable, a replica under repair
        (CORRUPT_DATA) included: at the leader the answer points to when there is one,
        else at the partition's leader once it has restored the range from a peer.
        ``read_committed``: only below the last stable offset, with the aborted
        transactions of the range listed (docs/transactions.md). ``tag_filter``: only the
        entries that may match it (FetchRequest.tag_filter, docs/tags.md)."""
        request = pb.FetchRequest(
            topic=topic,
            partition=partition,
            offset=offset,
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            isolation_level=pb.READ_COMMITTED if read_committed else pb.READ_UNCOMMITTED,
            tag_filter=tag_filter,
        )
        return self._read(topic, partition, "Fetch", request, max_wait_ms / 1000 + 10, address)

    def list_offsets(
        self,
        topic: str,
        partition: int,
        *,
        position: pb.OffsetPosition | None = None,
        timestamp_ms: int = 0,
    ) -> pb.ListOffsetsResponse:
        """At the partition's leader: the offset of ``position`` (pb.EARLIEST or
        pb.LATEST), else of the first entry at or after ``timestamp_ms``; the answer
        carries the log start and the high watermark too."""
        if position is not None:
            request = pb.ListOffsetsRequest(topic=topic, partition=partition, position=position)
        else:
            request = pb.ListOffsetsRequest(
                topic=topic, partition=partition, timestamp_ms=timestamp_ms
            )
        return self._read(topic, partition, "ListOffsets", request, 10.0, None)

    def call_leader(self, topic: str, partition: int, service: type, rpc: str, request: Any) -> Any:
        """``rpc`` of another service the partition's leader serves (``service``: its
        generated stub class, e.g. SharePartitionsStub), routed and retried as a read."""
        return self._read(topic, partition, rpc, request, 10.0, None, service)

    def _read(
        self,
        topic: str,
        partition: int,
        rpc: str,
        request: Any,
        timeout: float,
        address: str | None,
        service: type = pb_grpc.BrokerStub,
    ) -> Any:
        """``rpc`` at ``address``, or at the leader when None, retrying what is retriable
        there (see :meth:`fetch`)."""
        target = address or self._leader(topic, partition)
        for attempt in range(self.retries):
            try:
                return getattr(service(self._channel(target)), rpc)(request, timeout=timeout)
            except grpc.RpcError as exc:
                err = error_of(exc)
                if address is not None or not (err.retriable or err.unreachable):
                    raise err from None
                hinted = err.meta.get("raftmq-leader-address")
                if hinted and hinted != target:  # NOT_LEADER, or CORRUPT_DATA at a follower
                    target = hinted
                    continue
                self._sleep(attempt)
                self.refresh_leaders()
                target = self._leader(topic, partition)
        raise ClientError(
            f"no replica of {topic}/{partition} answered",
            pb.ERROR_CODE_UNSPECIFIED,
            grpc.StatusCode.UNAVAILABLE,
            {},
        )

    def _sleep(self, attempt: int) -> None:
        time.sleep(backoff_s(attempt, self.backoff))
