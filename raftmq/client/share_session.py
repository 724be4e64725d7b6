"""A share consumer's membership (share.proto's ShareGroupHeartbeat), on its I/O loop: join,
heartbeat at the interval the coordinator names, rejoin when fenced, leave at close.

Simpler than a consumer group's session (raftmq.client.group_session): a share group
has no revocation handshake (several members may fetch one partition, and the records'
locks keep them apart), so every answer's assignment is simply the set of partitions to
fetch from now. What the member holds is its records' locks, which live with the
partition leaders: a member fenced or expired has them released there, so rejoining
loses nothing but those locks (the records go to whoever fetches next).

Each answer's ``metadata_version`` is kept for the fetches (a leader whose metadata is
older waits for it rather than call the member unknown). A leader that still calls the
member unknown makes the fetcher ``suspect`` it: the next heartbeat goes at once, and its
answer (or UNKNOWN_MEMBER, then a join) settles it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client.backoff import backoff
from raftmq.client.connections import Connections
from raftmq.client.errors import ClientError
from raftmq.client.group_link import GroupLink, flat, is_fenced
from raftmq.client.membership import FIRST_INTERVAL_MS, JOIN_EPOCH, LEAVE_EPOCH
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
LEAVE_DEADLINE_S = 3.0


class ShareSession:
    """Create, use and close it on the loop of ``links``. ``on_assigned`` is called on
    the loop with the partitions to fetch from after every answer that changes them (and
    with none when the member is fenced, until it has joined again)."""

    def __init__(
        self,
        links: Connections,
        group_id: str,
        *,
        session_timeout_ms: int,
        on_assigned: Callable[[frozenset[TopicPartition]], None],
        on_error: Callable[[ClientError], None],
    ) -> None:
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.on_assigned = on_assigned
        self.on_error = on_error
        self.link = GroupLink(links)
        self.member_id = ""
        self.epoch = JOIN_EPOCH
        self.metadata_version = 0
        self.assigned: frozenset[TopicPartition] = frozenset()
        self.subscriptions: tuple[str, ...] = ()
        self.interval_ms = FIRST_INTERVAL_MS
        self.joined_event = asyncio.Event()
        self.left = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._alive_since = time.monotonic()

    @property
    def joined(self) -> bool:
        return self.epoch > JOIN_EPOCH

    def subscribe(self, topics: Iterable[str]) -> None:
        self.subscriptions = tuple(sorted(set(topics)))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._heartbeats())
        self._wake.set()

    def suspect(self) -> None:
        """A leader called this member unknown: heartbeat now to find out."""
        self._wake.set()

    async def _heartbeats(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # a bug: say so in poll rather than go silent
            log.exception("share group %s: the heartbeat task failed", self.group_id)
            self.on_error(
                ClientError(
                    f"the share consumer's group session failed ({exc!r}); close the "
                    "consumer and create another",
                    pb.ERROR_CODE_UNSPECIFIED,
                    None,
                    {},
                )
            )

    async def _loop(self) -> None:
        attempt = 0
        while not self.left:
            if not self.subscriptions:
                await self._sleep(1.0)
                continue
            sent = time.monotonic()
            if self.joined and sent - self._alive_since > self.session_timeout_ms / 1000:
                log.warning("share group %s: no answer for a session; rejoining", self.group_id)
                self._fenced()
            try:
                answer = await self.link.call(
                    "ShareGroupHeartbeat",
                    self._request(self.epoch),
                    deadline_s=max(0.05, self.session_timeout_ms / 2000),
                    service=spb_grpc.ShareGroupsStub,
                )
                attempt = 0
            except ClientError as err:
                if is_fenced(err):
                    log.info("share group %s: %s; joining again", self.group_id, err)
                    self._fenced()
                elif err.retriable or err.unreachable or err.timed_out:
                    await backoff(attempt)
                    attempt += 1
                else:
                    self.on_error(err)
                    await self._sleep(self.interval_ms / 1000)
                continue
            self._alive_since = sent
            self._answered(answer)
            await self._sleep(self.interval_ms / 1000)

    def _request(self, epoch: int) -> spb.ShareGroupHeartbeatRequest:
        return spb.ShareGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id if epoch != JOIN_EPOCH else "",
            member_epoch=epoch,
            subscriptions=list(self.subscriptions),
            session_timeout_ms=self.session_timeout_ms,
        )

    def _answered(self, answer: spb.ShareGroupHeartbeatResponse) -> None:
        self.interval_ms = answer.heartbeat_interval_ms or FIRST_INTERVAL_MS
        if answer.member_epoch == LEAVE_EPOCH:
            return
        self.member_id = answer.member_id or self.member_id
        self.epoch = answer.member_epoch
        self.metadata_version = max(self.metadata_version, int(answer.metadata_version))
        self.joined_event.set()
        assigned = frozenset(flat(answer.assigned))
        if assigned != self.assigned:
            self.assigned = assigned
            self.on_assigned(assigned)

    def _fenced(self) -> None:
        """Out of the group: fetch nothing until joined again (as a new member)."""
        self.epoch = JOIN_EPOCH
        self.member_id = ""
        self.joined_event.clear()
        if self.assigned:
            self.assigned = frozenset()
            self.on_assigned(self.assigned)

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def close(self) -> None:
        """Stop heartbeating and leave the group: the leaders give back at once every
        record the member still holds."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await stop_task(self._task)
        if self.joined:
            with contextlib.suppress(ClientError):
                await self.link.call(
                    "ShareGroupHeartbeat",
                    self._request(LEAVE_EPOCH),
                    deadline_s=LEAVE_DEADLINE_S,
                    service=spb_grpc.ShareGroupsStub,
                )
        self.left = True
        self.epoch = JOIN_EPOCH
