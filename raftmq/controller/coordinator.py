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
from collections.abc import Iterable

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
from raftmq.controller.sessions import MemberSessions

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
        self.sessions = MemberSessions(
            quorum,
            "group",
            lambda state: state.consumer_groups,
            c.RemoveGroupMembers,
            DEFAULT_SESSION_TIMEOUT_MS,
        )
        self._commits: Batcher[c.OffsetCommit, tuple[c.CommitOutcome, int]] = Batcher(
            self._propose_commits,
            max_items=max_batch_commits,
            max_bytes=max_batch_bytes,
            linger_ms=linger_ms,
            name="group-commits",
        )

    # --- heartbeats ---------------------------------------------------------------------

    async def heartbeat(self, beat: c.GroupHeartbeat, session_timeout_ms: int) -> c.GroupAssignment:
        """The member's answer; ControllerRefusal (INVALID_GROUP, UNKNOWN_MEMBER,
        FENCED_MEMBER_EPOCH) and the quorum's other errors as for every command."""
        assert MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS
        answer, _ = await self.sessions.beat(
            beat, beat.group_id, c.GroupAssignment, session_timeout_ms
        )
        return answer

    def last_heartbeat_age_ms(self, group_id: str, member_id: str) -> int:
        return self.sessions.last_heartbeat_age_ms(group_id, member_id)

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
        """The metadata as of this call, on the leader (a read index)."""
        return await self.sessions.current()


def partitions_of(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """Topic: its partitions, sorted (the wire's GroupTopicPartitions)."""
    out: dict[str, list[int]] = {}
    for tp in sorted(tps):
        out.setdefault(tp.topic, []).append(tp.partition)
    return out
