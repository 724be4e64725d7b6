"""The consumer group coordinator as a running service on the controller quorum's leader:
heartbeats, member sessions, batched offset commits and the group reads, over the pure
transitions of :mod:`raftmq.controller.groups`.

What is written and what is kept in memory follows the broker heartbeats' rule
(:mod:`raftmq.controller.quorum`): the log records decisions, the leader's memory the
beats they are drawn from.

- A heartbeat is computed against the leader's state with the same transition the
  state machine applies. When it changes nothing (the same member, epoch, holdings and
  assignment: the steady beat every few seconds of every member) it is answered from
  that computation, and nothing is proposed; otherwise the ``GroupHeartbeat`` command is
  proposed and its applied result is the answer. It is judged on the leader's own copy
  when that holds every committed entry (the common case), else on a read index (right
  after an election, or an entry committed and not applied yet); a refusal is answered
  without an entry.
- Each member's last beat and session timeout live in this leader's memory. The quorum's
  fencing timer (:meth:`ControllerQuorum.on_tick`) runs :meth:`expire_silent`, which
  proposes ``RemoveGroupMembers`` for members silent past their timeout; a new leader
  (or one that woke from a pause) counts every member as heard when its count started
  (``led_since``), so nobody is removed for the old leader's silence, and a member it
  has not heard yet is held to the default timeout until its first beat says its own.
- Commits from many clients are gathered into one ``CommitOffsets`` command per Raft
  round (:class:`~raftmq.controller.batching.Batcher`): one batch is proposed at a
  time, commits arriving meanwhile wait for it and go in the next (bounded in commits
  and bytes), and each caller gets its own commit's outcome. Thousands of commits a
  second then cost tens of entries, not thousands.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from raftmq.controller import commands as c
from raftmq.controller.batching import LINGER_MS, Batcher
from raftmq.controller.errors import RefusalCode
from raftmq.controller.groups import (
    DEFAULT_SESSION_TIMEOUT_MS,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
)
from raftmq.controller.model import ConsumerGroup, MetadataState, TopicPartition
from raftmq.controller.quorum import ControllerQuorum, ControllerRefusal
from raftmq.controller.transitions import apply_command

log = logging.getLogger(__name__)

MAX_HEARTBEAT_INTERVAL_MS = 3_000
"""A member beats every third of its session timeout, at most this long apart: a lost
beat or two do not expire it, and a revocation it was told of is not long delayed."""
MAX_BATCH_COMMITS = 1_000
MAX_BATCH_BYTES = 768 * 1024
"""Bounds of one CommitOffsets command, under the 1 MiB bound of a metadata command
(commands.MAX_COMMAND_BYTES) with room for its encoding."""


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    return min(MAX_HEARTBEAT_INTERVAL_MS, session_timeout_ms // 3)


def commit_bytes(commit: c.OffsetCommit) -> int:
    """A bound on what a commit adds to a CommitOffsets command's encoding (canonical JSON,
    ASCII: a character may take up to 12 bytes; the names and numbers of each offset at
    most 80, the commit's group, member and epoch at most 600)."""
    strings = sum(len(json.dumps(o.topic)) + len(json.dumps(o.metadata)) for o in commit.offsets)
    return 600 + 80 * len(commit.offsets) + strings


def group_state(group: ConsumerGroup) -> str:
    """ "empty" (no members), "stable" (every member holds exactly its target) or
    "reconciling" (some partition is still moving between members)."""
    if not group.members:
        return "empty"
    for member in group.members.values():
        target = group.target.get(member.member_id, ())
        if member.assigned != target or tuple(sorted(member.owned)) != member.assigned:
            return "reconciling"
    return "stable"


@dataclass(frozen=True, slots=True)
class Session:
    timeout_s: float
    heard_s: float
    """``monotonic_s`` of the member's last beat on this leader."""


class GroupCoordinator:
    """The coordinator of every consumer group, on one controller voter; it answers only
    while the voter leads the quorum (else NotControllerError, as every command)."""

    def __init__(
        self,
        quorum: ControllerQuorum,
        *,
        max_batch_commits: int = MAX_BATCH_COMMITS,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        linger_ms: float = LINGER_MS,
    ) -> None:
        self.quorum = quorum
        self._sessions: dict[tuple[str, str], Session] = {}
        self._proposing: dict[str, int] = {}
        """Group id: heartbeats of it being proposed. A member that joined in one is in
        the state before its session is recorded; the timer must not take it for silent."""
        self._commits: Batcher[c.OffsetCommit, tuple[c.CommitOutcome, int]] = Batcher(
            self._propose_commits,
            max_items=max_batch_commits,
            max_bytes=max_batch_bytes,
            linger_ms=linger_ms,
            name="group-commits",
        )
        quorum.on_tick(self.expire_silent)

    # --- heartbeats ---------------------------------------------------------------------

    async def heartbeat(self, beat: c.GroupHeartbeat, session_timeout_ms: int) -> c.GroupAssignment:
        """The member's answer; ControllerRefusal (INVALID_GROUP, UNKNOWN_MEMBER,
        FENCED_MEMBER_EPOCH) and the quorum's other errors as for every command."""
        assert MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS
        self.quorum.require_leader()
        # Judged on a current state: the local copy when this leader applied everything
        # committed (the common case, no round trip), else after a read index (an
        # election just now, an entry in its apply): a beat answered from a lagging copy
        # could hand back partitions the member gave up in an entry not applied yet.
        current = self.quorum.applied_all_committed()
        state = self.quorum.local_state()[1] if current else await self.current()
        answer = _unchanged(state, beat)
        if isinstance(answer, c.Refused):  # without an entry: a zombie's beats write nothing
            raise ControllerRefusal(answer.code, answer.message)
        if answer is None:
            group_id = beat.group_id
            self._proposing[group_id] = self._proposing.get(group_id, 0) + 1
            try:
                answer = await self.quorum.propose(beat, c.GroupAssignment)
            finally:
                self._proposing[group_id] -= 1
                if not self._proposing[group_id]:
                    del self._proposing[group_id]
        key = (beat.group_id, answer.member_id)
        if answer.member_epoch == -1:
            self._sessions.pop(key, None)
        else:
            self._sessions[key] = Session(session_timeout_ms / 1000, self.quorum.monotonic_s())
        return answer

    # --- sessions -----------------------------------------------------------------------

    async def expire_silent(self) -> None:
        """Propose the removal of every member silent past its session timeout (run by
        the quorum's fencing timer)."""
        led_since = self.quorum.led_since
        if led_since is None or not self.quorum.is_leader:
            return
        now_s = self.quorum.monotonic_s()
        _, state = self.quorum.local_state()
        default = Session(DEFAULT_SESSION_TIMEOUT_MS / 1000, led_since)
        for group_id, group in sorted(state.consumer_groups.items()):
            silent = []
            for member_id in sorted(group.members):
                session = self._sessions.get((group_id, member_id))
                if session is None:
                    if group_id in self._proposing:
                        continue  # maybe joining right now
                    session = default
                if now_s - max(session.heard_s, led_since) > session.timeout_s:
                    silent.append(member_id)
            if not silent:
                continue
            log.warning(
                "group %s: members %s sent no heartbeat within their session timeout: "
                "removing them",
                group_id,
                ", ".join(silent),
            )
            try:
                await self.quorum.propose(c.RemoveGroupMembers(group_id, tuple(silent)), c.Done)
            except ControllerRefusal as exc:  # the group went away meanwhile
                log.info("group %s: removing silent members refused: %s", group_id, exc)
            for member_id in silent:
                self._sessions.pop((group_id, member_id), None)
        # Forget sessions of members gone from the metadata (left, replaced, removed);
        # no await between this read and the pruning, so a session recorded since the
        # loop above is of a member this state holds.
        _, state = self.quorum.local_state()
        for key in [k for k in self._sessions if k[1] not in _members(state, k[0])]:
            del self._sessions[key]

    def last_heartbeat_age_ms(self, group_id: str, member_id: str) -> int:
        """Since this leader last heard the member; -1 when it has not since it took over
        (or woke from a pause)."""
        session = self._sessions.get((group_id, member_id))
        led_since = self.quorum.led_since
        if session is None or led_since is None or session.heard_s < led_since:
            return -1
        return int((self.quorum.monotonic_s() - session.heard_s) * 1000)

    # --- offsets ------------------------------------------------------------------------

    @property
    def batches(self) -> int:
        """CommitOffsets commands proposed so far (the batching test reads it)."""
        return self._commits.batches

    async def commit(self, commit: c.OffsetCommit) -> int:
        """Commit in the next batch; the metadata version that holds it. ControllerRefusal
        with this commit's own refusal, or the quorum's error for the whole batch."""
        self.quorum.require_leader()
        outcome, version = await self._commits.submit(commit, commit_bytes(commit))
        if outcome.code:
            raise ControllerRefusal(RefusalCode(outcome.code), outcome.message)
        return version

    async def _propose_commits(
        self, commits: list[c.OffsetCommit]
    ) -> list[tuple[c.CommitOutcome, int]]:
        command = c.CommitOffsets(tuple(commits), self.quorum.now_ms())
        applied = await self.quorum.propose(command, c.CommitsApplied)
        version, _ = self.quorum.local_state()
        assert len(applied.outcomes) == len(commits), (len(applied.outcomes), len(commits))
        return [(outcome, version) for outcome in applied.outcomes]

    async def reset_offsets(
        self, group_id: str, offsets: tuple[c.OffsetEntry, ...], force: bool
    ) -> int:
        await self.quorum.propose(
            c.ResetOffsets(group_id, offsets, force, self.quorum.now_ms()), c.Done
        )
        return self.quorum.local_state()[0]

    async def delete_group(self, group_id: str) -> int:
        await self.quorum.propose(c.DeleteGroup(group_id), c.Done)
        return self.quorum.local_state()[0]

    # --- reads --------------------------------------------------------------------------

    async def current(self) -> MetadataState:
        """The metadata as of this call, on the leader (a read index: a deposed leader
        cannot answer with what a newer one changed)."""
        self.quorum.require_leader()
        _, state = await self.quorum.metadata(linearizable=True)
        return state


def _unchanged(
    state: MetadataState, beat: c.GroupHeartbeat
) -> c.GroupAssignment | c.Refused | None:
    """The answer to ``beat`` if it changes nothing in ``state``, its refusal, or None
    when it changes something (propose it: the applied result is the answer)."""
    after, result = apply_command(state, state.version + 1, beat)
    if isinstance(result, c.Refused):
        return result
    assert isinstance(result, c.GroupAssignment), result
    group_id = beat.group_id
    if after.consumer_groups.get(group_id) != state.consumer_groups.get(group_id):
        return None
    return result


def _members(state: MetadataState, group_id: str) -> Iterable[str]:
    group = state.consumer_groups.get(group_id)
    return group.members if group is not None else ()


def partitions_of(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """Topic: its partitions, sorted (the wire's GroupTopicPartitions)."""
    out: dict[str, list[int]] = {}
    for tp in sorted(tps):
        out.setdefault(tp.topic, []).append(tp.partition)
    return out
