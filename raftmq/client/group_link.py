"""The consumer's asyncio link to the Groups service (groups.proto): heartbeats, commits
and committed offsets, sent to the controller quorum's leader.

Routing is the admin client's (raftmq.client.admin): a voter that does not lead answers
NOT_CONTROLLER with the leader's address and the call is resent there; with no leader
yet (CONTROLLER_NOT_AVAILABLE) or no answer, the next bootstrap address is tried after a
backoff. Retries are bounded by a deadline per call, so a member whose controller is gone
learns it in time to stop (its session would expire anyway). The channels are the
fetcher's (raftmq.client.connections), one per address.

A commit resent after a broken connection may have been applied by the first try; that
is harmless (the same offsets again). A heartbeat resent likewise may have moved the
member on: the coordinator answers a repeated one from its memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.client.backoff import backoff
from raftmq.client.connections import Connections
from raftmq.client.errors import ClientError, error_of

_REDIRECTED = pb.ERROR_CODE_NOT_CONTROLLER
_TRY_AGAIN = (pb.ERROR_CODE_CONTROLLER_NOT_AVAILABLE, pb.ERROR_CODE_OUTCOME_UNKNOWN)
CALL_TIMEOUT_S = 5.0
MAX_FREE_REDIRECTS = 3
"""Redirects followed at once in a row; past them (nodes pointing at each other during
an election) each costs a backoff."""


class OffsetAndMetadata(NamedTuple):
    """A committed offset (the next offset to consume) with the free text the group keeps
    beside it (at most MAX_OFFSET_METADATA_CHARS characters; "" for none), as Kafka's
    OffsetAndMetadata: e.g. where the application's own state stood at that offset."""

    offset: int
    metadata: str = ""


Commits = Mapping[tuple[str, int], "int | OffsetAndMetadata"]
"""What a commit names per partition: the offset, or the offset with its metadata."""


class GroupLink:
    """Create and use it inside the loop of the ``Connections`` it shares."""

    def __init__(self, links: Connections, *, deadline_s: float = 30.0) -> None:
        self.links = links
        self.deadline_s = deadline_s
        self._leader: str | None = None  # the controller leader's address, once known
        self._turn = 0

    async def call(
        self,
        rpc: str,
        request: Any,
        *,
        deadline_s: float | None = None,
        service: Callable[[grpc.aio.Channel], Any] = gpb_grpc.GroupsStub,
        also_retry: frozenset[int] = frozenset(),
    ) -> Any:
        """``rpc`` of the Groups service (or another ``service`` the controller leader
        serves, such as Transactions) at the controller leader, retried as the module says
        until ``deadline_s``, and on the codes in ``also_retry`` too; raises the last
        ClientError."""
        give_up = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        attempt = redirects = 0
        while True:
            address = self._leader or self._next_bootstrap()
            timeout_s = max(0.1, min(CALL_TIMEOUT_S, give_up - time.monotonic()))
            try:
                stub = service(self.links.channel(address))
                return await getattr(stub, rpc)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                err = error_of(exc)
            hint = err.meta.get("raftmq-leader-address", "")
            if err.code == _REDIRECTED and hint and hint != address:
                self._leader = hint
                redirects += 1
                if redirects <= MAX_FREE_REDIRECTS and time.monotonic() < give_up:
                    continue  # a redirect costs no backoff (nodes behind the news do, below)
            redirects = 0
            retry = (
                err.code == _REDIRECTED
                or err.code in _TRY_AGAIN
                or err.code in also_retry
                or err.unreachable
            )
            if err.timed_out:
                retry = True  # the leader may have died mid-call; every Groups call may repeat
            if not retry or time.monotonic() >= give_up:
                raise err
            if not (err.code == _REDIRECTED and hint):
                self._leader = None  # ask the bootstrap nodes again
            await backoff(attempt)
            attempt += 1

    def _next_bootstrap(self) -> str:
        addresses = self.links.bootstrap
        self._turn += 1
        return addresses[self._turn % len(addresses)]

    # --- the calls ----------------------------------------------------------------------

    async def heartbeat(
        self, request: gpb.ConsumerGroupHeartbeatRequest, *, deadline_s: float
    ) -> gpb.ConsumerGroupHeartbeatResponse:
        answer: gpb.ConsumerGroupHeartbeatResponse = await self.call(
            "ConsumerGroupHeartbeat", request, deadline_s=deadline_s
        )
        return answer

    async def commit(
        self, group_id: str, member_id: str, member_epoch: int, offsets: Commits
    ) -> int:
        """Commit ``offsets`` (the next offset to consume per partition, with or without
        metadata); returns the metadata version that holds them."""
        listed = []
        for (t, p), o in sorted(offsets.items()):
            o = o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o)
            listed.append(gpb.OffsetToCommit(topic=t, partition=p, offset=o[0], metadata=o[1]))
        request = gpb.CommitOffsetsRequest(
            group_id=group_id, member_id=member_id, member_epoch=member_epoch, offsets=listed
        )
        answer: gpb.CommitOffsetsResponse = await self.call("CommitOffsets", request)
        return int(answer.metadata_version)

    async def fetch_offsets(
        self, group_id: str, partitions: list[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], OffsetAndMetadata]:
        """The group's committed positions of ``partitions`` (None: all it has), with
        their metadata; a partition without one is left out."""
        request = gpb.FetchOffsetsRequest(group_id=group_id, partitions=by_topic(partitions or ()))
        answer: gpb.FetchOffsetsResponse = await self.call("FetchOffsets", request)
        return {
            (o.topic, o.partition): OffsetAndMetadata(int(o.offset), o.metadata)
            for o in answer.offsets
        }


def by_topic(partitions: Any) -> list[gpb.GroupTopicPartitions]:
    """Partitions as the proto lists them: per topic, sorted."""
    topics: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        topics.setdefault(topic, []).append(partition)
    return [gpb.GroupTopicPartitions(topic=t, partitions=ps) for t, ps in topics.items()]


def flat(groups: Any) -> set[tuple[str, int]]:
    """The proto's per-topic lists as a set of (topic, partition)."""
    return {(g.topic, int(p)) for g in groups for p in g.partitions}


def is_fenced(err: ClientError) -> bool:
    """The member is no longer in the group at its epoch: it must stop consuming
    everything and join again."""
    return err.code in (pb.ERROR_CODE_UNKNOWN_MEMBER, pb.ERROR_CODE_FENCED_MEMBER_EPOCH)
