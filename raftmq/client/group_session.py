"""A consumer's life in a group, on its I/O loop: the heartbeat task, the group's
committed offsets, and the fetcher's partitions following the member's assignment.

The heartbeat task sends what :class:`~raftmq.client.membership.Membership` says, at the
interval the coordinator names (at once when there is news), and turns each answer into
events for the consumer's ``poll``: callbacks run in the caller's thread inside ``poll``,
as Kafka's do, never on the I/O loop. Partitions to give up or lost stop returning
records at once (paused here); the caller's ``poll`` then runs on_revoke / on_lost and
calls back (:meth:`GroupSession.finish`), which commits (given up, with auto-commit),
drops them from the fetcher and heartbeats at once. Partitions to start get their
committed offsets first, so ``poll`` adds them already positioned.

A subscription may be a compiled pattern: it is resolved to topic names from the
cluster's metadata, refreshed every ``METADATA_MAX_AGE_S``, so topics created later join
the subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.client.backoff import backoff
from raftmq.client.errors import ClientError
from raftmq.client.fetcher import Fetcher
from raftmq.client.group_link import Commits, GroupLink, by_topic, flat, is_fenced
from raftmq.client.membership import Beat, Membership, Step, TopicPartition
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

METADATA_MAX_AGE_S = 5.0
LEAVE_DEADLINE_S = 3.0


class CommitFailedError(ClientError):
    """The group refused a commit: the member was fenced (the group moved on without
    it, so another member may consume those partitions now) or does not hold them."""


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """For ``poll`` to handle in the caller's thread, in order."""

    kind: Literal["assign", "revoke", "lost"]
    partitions: frozenset[TopicPartition]


class GroupSession:
    """Create, use and close it on the fetcher's loop. ``notify`` wakes a waiting
    ``poll`` (it may be called from the loop)."""

    def __init__(
        self,
        fetcher: Fetcher,
        group_id: str,
        *,
        instance_id: str | None,
        session_timeout_ms: int,
        assignor: str,
        notify: Callable[[], None],
    ) -> None:
        self.fetcher = fetcher
        self.group_id = group_id
        self.instance_id = instance_id
        self.session_timeout_ms = session_timeout_ms
        self.assignor = assignor
        self.notify = notify
        self.link = GroupLink(fetcher.links)
        self.membership = Membership()
        self.events: deque[GroupEvent] = deque()
        self.error: ClientError | None = None
        """A refusal no retry mends (a bad group id): raised by the next ``poll``."""
        self.stopping: set[TopicPartition] = set()
        """Paused here until ``poll`` gives them up: resume must not restart them."""
        self.lost: set[TopicPartition] = set()
        """Lost and not yet dropped by ``poll``: their positions are not this member's to
        commit any more, even if the group hands them back before ``poll`` runs."""
        self.tenures: dict[TopicPartition, int] = {}
        """Per partition, how many times this member stopped holding it (lost it, or gave
        it up): a commit stamped with an older count names a position from an earlier
        tenure, which the group may have moved past since, so it is refused."""
        self._topics: tuple[str, ...] | re.Pattern[str] = ()
        self._commit_turn = asyncio.Lock()
        """Held by the commit being sent (:meth:`commit` says why one at a time)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._metadata_at = 0.0
        self._alive_since = time.monotonic()
        """When the last answered heartbeat was sent: the coordinator cannot have expired
        this member before that plus the session timeout, so it stops consuming by then."""

    # --- subscription ---------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | re.Pattern[str]) -> None:
        if isinstance(topics, re.Pattern):
            self._topics = topics
            self._metadata_at = 0.0  # resolve it now
        else:
            self._topics = tuple(sorted(set(topics)))
            self.membership.subscribe(self._topics)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._heartbeats())
        self._wake.set()

    async def _resolve(self) -> None:
        """A pattern's topics, from metadata at most METADATA_MAX_AGE_S old."""
        if not isinstance(self._topics, re.Pattern):
            return
        if time.monotonic() - self._metadata_at < METADATA_MAX_AGE_S:
            return
        if await self.fetcher.links.refresh():
            self._metadata_at = time.monotonic()
            pattern = self._topics
            names = [t for t in self.fetcher.links.view.partitions if pattern.fullmatch(t)]
            self.membership.subscribe(names)

    # --- heartbeats -----------------------------------------------------------------------

    async def _heartbeats(self) -> None:
        try:
            await self._heartbeat_loop()
        except Exception as exc:  # a bug: say so in poll rather than go silent
            log.exception("group %s: the heartbeat task failed", self.group_id)
            self.error = ClientError(
                f"the consumer's group session failed ({exc!r}); close the consumer and "
                "create another",
                pb.ERROR_CODE_UNSPECIFIED,
                None,
                {},
            )
            self.notify()

    async def _heartbeat_loop(self) -> None:
        attempt = 0
        while not self.membership.left:
            await self._resolve()
            m = self.membership
            beat = m.beat()
            if beat is None:
                await self._sleep(min(1.0, METADATA_MAX_AGE_S))
                continue
            sent = time.monotonic()
            session_left_s = self._alive_since + self.session_timeout_ms / 1000 - sent
            if m.joined and session_left_s <= 0:
                log.warning("group %s: no answer for a session timeout; rejoining", self.group_id)
                await self._apply(m.fenced())
                continue
            if not m.joined:
                session_left_s = self.session_timeout_ms / 1000
            try:
                answer = await self.link.heartbeat(
                    self._request(beat),
                    deadline_s=max(0.05, min(self.session_timeout_ms / 2000, session_left_s)),
                )
                attempt = 0
            except ClientError as err:
                if is_fenced(err):
                    log.info("group %s: %s; rejoining", self.group_id, err)
                    await self._apply(m.fenced())
                elif err.retriable or err.unreachable or err.timed_out:
                    # No controller leader for now: keep beating until the session's own
                    # clock says the member is fenced (above), as Kafka's consumer does.
                    await backoff(attempt)
                    attempt += 1
                else:
                    self.error = err
                    self.notify()
                    await self._sleep(m.interval_ms / 1000)
                continue
            self._alive_since = sent
            step = m.answered(
                answer.member_id,
                answer.member_epoch,
                flat(answer.assigned),
                answer.heartbeat_interval_ms,
            )
            await self._apply(step)
            if not m.due_now:
                await self._sleep(m.interval_ms / 1000)

    def _request(self, beat: Beat) -> gpb.ConsumerGroupHeartbeatRequest:
        return gpb.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=beat.member_id,
            instance_id=self.instance_id or "",
            member_epoch=beat.member_epoch,
            subscriptions=list(beat.subscriptions),
            owned=by_topic(beat.owned),
            assignor=self.assignor,
            session_timeout_ms=self.session_timeout_ms,
        )

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _apply(self, step: Step) -> None:
        """Stop returning what is lost or given up at once; queue the caller's part."""
        self.lost |= step.lost
        for tp in step.lost:
            self.tenures[tp] = self.tenures.get(tp, 0) + 1
        for event in (GroupEvent("lost", step.lost), GroupEvent("revoke", step.revoke)):
            if not event.partitions:
                continue
            for tp in event.partitions:
                self.stopping.add(tp)
                if tp in self.fetcher.states:
                    self.fetcher.set_paused(tp, True)
            self.events.append(event)
        if step.assign:
            self.events.append(GroupEvent("assign", step.assign))
        if step:
            self.notify()

    # --- the caller's part, called back by poll ------------------------------------------

    async def finish(self, event: GroupEvent, *, commit: bool) -> None:
        """After ``poll`` ran the event's callback: start, or commit (``commit``, for a
        revoke) and drop, the partitions."""
        tps = event.partitions
        if event.kind == "assign":
            try:
                committed = await self._committed_for(sorted(tps & self.membership.held))
            except ClientError:
                self.events.appendleft(event)  # the next poll tries again
                raise
            # Not revoked or lost meanwhile (the fetch of offsets may take a while); a
            # partition lost and assigned again is started by its own later event.
            held = (tps & self.membership.held) - self.lost
            self.fetcher.assign([*self.fetcher.states, *sorted(held - set(self.fetcher.states))])
            for tp in sorted(held):
                # A fresh start whatever the fetcher held: its buffer and any fetch in
                # flight are dropped (a new generation), and the position is the group's.
                self.fetcher.seek(tp, committed.get(tp), reached=True)
            return
        # Lost since it was told to give them up: nothing left to commit or give up (and
        # a partition the rejoin got back is the new assignment's, not this event's).
        still = tps & self.membership.revoking if event.kind == "revoke" else frozenset()
        if still and commit:
            with contextlib.suppress(ClientError):  # fenced meanwhile: the heartbeat knows
                await self.commit(self._positions(still))
        self.fetcher.assign([tp for tp in self.fetcher.states if tp not in tps])
        self.stopping -= tps
        if event.kind == "lost":
            self.lost -= tps
        if still:
            for tp in still:
                self.tenures[tp] = self.tenures.get(tp, 0) + 1
            self.membership.given_up(still)
            self._wake.set()

    async def _committed_for(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        attempt = 0
        while True:
            try:
                found = await self.link.fetch_offsets(self.group_id, tps) if tps else {}
                return {tp: o.offset for tp, o in found.items()}
            except ClientError as err:
                if not (err.retriable or err.unreachable or err.timed_out) or attempt >= 5:
                    raise
                await backoff(attempt)
                attempt += 1

    # --- commits --------------------------------------------------------------------------

    def _positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        wanted = set(tps)
        return {tp: o for tp, o in positions(self.fetcher).items() if tp in wanted}

    def stamp(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The tenure of each partition now, for a commit of positions read now (from the
        caller's thread): :meth:`commit` refuses it if one was lost or given up since."""
        tenures = self.tenures
        return {tp: tenures.get(tp, 0) for tp in tps}

    def positions(self) -> dict[TopicPartition, int]:
        """What a commit without offsets commits: the position of every partition the
        member holds and has not lost. Safe from the caller's thread."""
        held, lost = self.membership.held, self.lost
        return {tp: o for tp, o in positions(self.fetcher).items() if tp in held and tp not in lost}

    async def commit(
        self, offsets: Commits, stamp: dict[TopicPartition, int] | None = None
    ) -> None:
        """Commit ``offsets`` as this member (at its current epoch); raises
        CommitFailedError when the group refuses them, or before asking it when one of
        the partitions was lost, or lost or given up since ``stamp`` (:meth:`stamp`, taken
        when the offsets were read): those offsets are a position from before, and the
        group may have moved past it since (another member consumed on), so committing
        them could move its progress back.

        One commit at a time, in the order they were made: a commit the link retries
        (a controller failover, an outcome unknown) must not land after a later one
        the group already acknowledged, as an auto-commit overlapping the next would."""
        if not offsets:
            return
        async with self._commit_turn:
            await self._commit_now(offsets, stamp)

    async def _commit_now(self, offsets: Commits, stamp: dict[TopicPartition, int] | None) -> None:
        stale = sorted(
            tp
            for tp in offsets
            if tp in self.lost or (stamp is not None and stamp.get(tp) != self.tenures.get(tp, 0))
        )
        if stale:
            self._wake.set()
            raise CommitFailedError(
                f"group {self.group_id} did not get the commit: this consumer lost "
                f"{', '.join(f'{t}/{p}' for t, p in stale)} after reading those offsets, so "
                "they may be behind what the group has consumed since; poll, and commit "
                "what the next polls return",
                pb.ERROR_CODE_FENCED_MEMBER_EPOCH,
                None,
                {},
            )
        m = self.membership
        if not m.joined:
            raise CommitFailedError(
                f"this consumer is not a member of group {self.group_id} right now (it is "
                "joining or rejoining), so it holds no partitions to commit",
                pb.ERROR_CODE_UNKNOWN_MEMBER,
                None,
                {},
            )
        try:
            await self.link.commit(self.group_id, m.member_id, m.epoch, offsets)
        except ClientError as err:
            if is_fenced(err) or err.code == pb.ERROR_CODE_PARTITION_NOT_ASSIGNED:
                self._wake.set()  # the heartbeat finds out what changed
                raise CommitFailedError(
                    f"group {self.group_id} refused the commit: {err}",
                    err.code,
                    err.status,
                    err.meta,
                    err.code_name,
                ) from None
            raise

    async def close(self, *, leave: bool) -> None:
        """Stop heartbeating; ``leave`` the group (a static member does not: its restart
        takes its partitions back within the session timeout)."""
        if self._task is not None:
            with contextlib.suppress(Exception):  # its failure was reported to poll already
                await stop_task(self._task)
        m = self.membership
        if leave and m.joined:
            beat = m.leave()
            with contextlib.suppress(ClientError):
                await self.link.heartbeat(self._request(beat), deadline_s=LEAVE_DEADLINE_S)
        m.left = True


def positions(fetcher: Fetcher) -> dict[TopicPartition, int]:
    """Every partition's position (those that have one), read from any thread: the
    states are copied first, as the loop may add or drop partitions meanwhile."""
    states = dict(fetcher.states)
    with fetcher.lock:
        return {tp: s.position for tp, s in states.items() if s.position is not None}
