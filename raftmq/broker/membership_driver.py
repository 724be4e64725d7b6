"""The broker side of replica moves: each partition this broker leads has its Raft group's
configuration follow the replica set the controller's metadata names, one single-step
change at a time (the decisions: :mod:`raftmq.partition.membership_steps`), and tells the
controller when a learner has caught up (PromoteReplica). A replica this broker hosts
but the metadata no longer lists is handed back to the broker for deletion once the
group can do without it.

Re-checked on every metadata version, and on a short timer while some group is not yet
what the metadata says (a change committing, a learner catching up, a report owed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from raftmq.broker.layout import same_partition
from raftmq.controller.model import MetadataState, Partition
from raftmq.partition.membership_steps import (
    Propose,
    Transfer,
    Wait,
    in_sync,
    learners_to_report,
    next_step,
)
from raftmq.partition.replica import PartitionReplica, group_name
from raftmq.raft.errors import RaftError
from raftmq.raft.host.host import RaftHost

log = logging.getLogger(__name__)

PERIOD_S = 0.2
"""How often groups not yet in line with the metadata are looked at again."""
TRANSFER_EVERY_S = 2.0
"""A leadership transfer stops proposals until it ends (an election timeout at most): never
start one for the same group more often than this."""
REPORT_TIMEOUT_S = 10.0
REPORT_ATTEMPTS = 8
REPORT_BACKOFF_FIRST_S = 0.5
REPORT_BACKOFF_MAX_S = 8.0
LEAVE_GRACE_S = 10.0
"""A replica the metadata dropped waits for its group to hold the metadata's voters as
voters (seen in its own log) before it is deleted, at most this long: a replica that was
down while the group moved on never hears of the change, and must still go."""

Key = tuple[str, int]
Report = Callable[[str, int, int], Awaitable[int]]
Leave = Callable[[str, int, str], Coroutine[Any, Any, None]]


class MembershipDriver:
    def __init__(
        self,
        host: RaftHost,
        replicas: Mapping[Key, PartitionReplica],
        *,
        report: Report,
        leave: Leave,
        alive: Callable[[int], bool],
        newest_version: Callable[[], int] = lambda: 0,
    ) -> None:
        """``replicas`` is the broker's own map of hosted replicas (read, never changed);
        ``report`` tells the controller a learner caught up (ControllerLink.promote_replica);
        ``leave`` deletes a replica the metadata dropped, with the reason to log;
        ``newest_version`` is the newest metadata version the controller named (a copy
        older than it lags: no change is made from it, so a broker restarted on a lagging
        voter's copy does not undo a move the group already made)."""
        self.id = host.node_id
        self._host = host
        self._replicas = replicas
        self._report = report
        self._leave = leave
        self._alive = alive
        self._newest_version = newest_version
        self.state: MetadataState | None = None
        self._unsettled: set[Key] = set()
        self._seen: set[Key] = set()
        self._leaving: dict[Key, tuple[float, str]] = {}
        self._leaving_now: set[Key] = set()
        self._transferred_at: dict[Key, float] = {}
        self._reports: dict[tuple[str, int, int], asyncio.Task[None]] = {}
        self._reported: dict[tuple[str, int, int], int] = {}
        """Learner -> the metadata version whose PromoteReplica answered: not reported again
        before a version at least that new arrives."""
        self._wake = asyncio.Event()
        self._said: dict[Key, str] = {}

    # --- inputs ---------------------------------------------------------------------------

    def update(self, state: MetadataState) -> None:
        """A new metadata version: look again at the replicas whose partition's replicas
        or learners it changed and those opened since the last one (a group in line with
        an unchanged partition needs nothing; one that is not stays looked at until it
        is)."""
        before, self.state = self.state, state
        for key in self._replicas:
            if before is None or key not in self._seen:
                self._unsettled.add(key)
                continue
            # A new leader alone changes nothing here (a follower that becomes the
            # group's leader is still unsettled if its configuration differs).
            if not same_partition(_partition(before, key), _partition(state, key)):
                self._unsettled.add(key)
        self._seen = set(self._replicas)
        self._reported = {k: v for k, v in self._reported.items() if v > state.version}
        self._wake.set()

    def leaving(self, topic: str, partition: int, why: str) -> None:
        """The metadata no longer lists this broker's replica of ``topic``/``partition``."""
        self._leaving.setdefault((topic, partition), (time.monotonic(), why))
        self._unsettled.add((topic, partition))
        self._wake.set()

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), PERIOD_S)
                self._wake.clear()
                try:
                    self.check()
                except Exception:  # one bad pass must not end the moves of every group
                    log.exception("broker %d: following replica sets failed", self.id)
        finally:
            for task in self._reports.values():
                task.cancel()

    def check(self) -> None:
        """One pass over the groups not known to be in line with the metadata."""
        state = self.state
        if state is None:
            return
        for key in sorted(self._unsettled):
            replica = self._replicas.get(key)
            part = _partition(state, key)
            if replica is None or part is None:
                self._unsettled.discard(key)
                self._leaving.pop(key, None)
                continue
            try:
                unsettled = self._check_one(key, replica, part, state.version)
            except Exception as exc:  # this group alone; looked at again on the next pass
                if self._said.get(key) != repr(exc):  # the traceback once, not every pass
                    self._said[key] = repr(exc)
                    log.exception("broker %d: following %s/%d's replica set failed", self.id, *key)
                continue
            if not unsettled:
                self._unsettled.discard(key)
                self._said.pop(key, None)
                self._transferred_at.pop(key, None)

    def _check_one(
        self, key: Key, replica: PartitionReplica, part: Partition, version: int
    ) -> bool:
        """Act on one group; True while it still needs looking at."""
        name = group_name(*key)
        if key in self._leaving and self.id in part.replicas + part.learners:
            del self._leaving[key]  # listed again (a later move brought it back)
        try:
            st = self._host.status(name)
        except KeyError:
            return False
        membership = st.membership
        assert membership is not None, "a group's status names its configuration"
        if st.failed is not None:
            return key in self._leaving and self._maybe_leave(key, replica, part, failed=True)
        if key in self._leaving and not replica.is_leader:
            return self._maybe_leave(key, replica, part, failed=False)
        if not replica.is_leader:
            # A follower acts on nothing; it is looked at again while its configuration
            # differs or a learner awaits its report, in case it becomes the leader.
            return bool(part.learners) or not in_sync(membership, part.replicas, part.learners)
        commit = st.commit
        followers = st.followers
        step = next_step(
            self.id,
            membership,
            pending=st.config_pending,
            commit=commit,
            followers=followers,
            voters=part.replicas,
            learners=part.learners,
            alive=[p for p in followers if self._alive(p)],
        )
        reports = learners_to_report(
            membership, commit=commit, followers=followers, learners=part.learners
        )
        for learner in reports:
            self._start_report(key, learner, version)
        if step is None:
            return bool(part.learners) or key in self._leaving
        if not isinstance(step, Wait) and version < self._newest_version():
            self._say(key, f"metadata version {version} lags the controller's; waiting")
            return True
        if isinstance(step, Propose):
            try:
                done = self._host.propose_membership(name, step.membership)
            except RaftError as exc:
                log.debug("%s: configuration change not proposed yet: %s", name, exc)
            else:
                done.add_done_callback(_committed(name, step.why))
                log.info(
                    "%s: proposing voters %s, learners %s (%s)",
                    name,
                    sorted(step.membership.voters),
                    sorted(step.membership.learners),
                    step.why,
                )
        elif isinstance(step, Transfer):
            now = time.monotonic()
            if now - self._transferred_at.get(key, -TRANSFER_EVERY_S) >= TRANSFER_EVERY_S:
                self._transferred_at[key] = now
                log.info("%s: %s", name, step.why)
                try:
                    self._host.transfer_leadership(name, step.to)
                except RaftError as exc:
                    log.info("%s: no transfer to broker %d yet: %s", name, step.to, exc)
        else:
            assert isinstance(step, Wait)
            self._say(key, step.why)
        return True

    def _say(self, key: Key, why: str) -> None:
        """Log a waiting reason once (not every pass)."""
        if self._said.get(key) != why:
            self._said[key] = why
            log.info("%s/%d: %s", key[0], key[1], why)

    # --- leaving --------------------------------------------------------------------------

    def _maybe_leave(
        self, key: Key, replica: PartitionReplica, part: Partition, *, failed: bool
    ) -> bool:
        """Delete a replica the metadata dropped once the group holds the metadata's voters
        as voters (as this replica's log shows it: the leader promoted the replacement, so
        leaving costs the group no caught-up voter), or it is quarantined, or the grace
        period passed. True while it waits."""
        since, why = self._leaving[key]
        if key in self._leaving_now:
            return False
        ready = failed or time.monotonic() - since >= LEAVE_GRACE_S
        if not ready:
            with contextlib.suppress(KeyError):
                membership = self._host.status(group_name(*key)).membership
                ready = membership is not None and frozenset(part.replicas) <= membership.voters
        if not ready:
            return True
        self._leaving_now.add(key)
        del self._leaving[key]
        task = asyncio.get_running_loop().create_task(self._leave(key[0], key[1], why))
        task.add_done_callback(lambda _: self._leaving_now.discard(key))
        return False

    # --- reports --------------------------------------------------------------------------

    def _start_report(self, key: Key, learner: int, version: int) -> None:
        rkey = (key[0], key[1], learner)
        if rkey in self._reports or self._reported.get(rkey, 0) > version:
            return
        task = asyncio.get_running_loop().create_task(self._report_caught_up(rkey))
        self._reports[rkey] = task
        task.add_done_callback(lambda _: self._reports.pop(rkey, None))

    async def _report_caught_up(self, rkey: tuple[str, int, int]) -> None:
        """PromoteReplica, retried with backoff a bounded number of times (a later pass
        starts over if the learner is still a caught-up learner then)."""
        topic, p, learner = rkey
        backoff_s = REPORT_BACKOFF_FIRST_S
        for attempt in range(1, REPORT_ATTEMPTS + 1):
            try:
                version = await asyncio.wait_for(self._report(topic, p, learner), REPORT_TIMEOUT_S)
            except TimeoutError:
                why = f"no controller answered within {REPORT_TIMEOUT_S:.0f} s"
            except Exception as exc:  # a refusal: promoted already, or the move given up
                log.info(
                    "%s/%d: the controller did not promote learner %d: %s",
                    topic,
                    p,
                    learner,
                    exc,
                )
                self._reported[rkey] = (self.state.version if self.state else 0) + 1
                return
            else:
                log.info(
                    "%s/%d: learner %d caught up; the controller lists it as a voter from "
                    "metadata version %d",
                    topic,
                    p,
                    learner,
                    version,
                )
                self._reported[rkey] = version
                return
            log.warning(
                "%s/%d: reporting learner %d caught up failed (attempt %d of %d): %s",
                topic,
                p,
                learner,
                attempt,
                REPORT_ATTEMPTS,
                why,
            )
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, REPORT_BACKOFF_MAX_S)


def _partition(state: MetadataState, key: Key) -> Partition | None:
    topic = state.topics.get(key[0])
    if topic is None or key[1] >= len(topic.partitions):
        return None
    return topic.partitions[key[1]]


def _committed(name: str, why: str) -> Callable[[asyncio.Future[int]], None]:
    def done(fut: asyncio.Future[int]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            log.info("%s: configuration change committed at index %d (%s)", name, fut.result(), why)
        else:
            log.info("%s: configuration change not committed: %s", name, exc)

    return done
