"""The share group coordinator as a running service on the controller quorum's leader:
heartbeats and member sessions (raftmq.controller.sessions, as consumer groups'), the
settings, deletion and reads, over the pure transitions of
:mod:`raftmq.controller.share_groups`.

A steady heartbeat is answered from the leader's state without an entry; one that
changes the group (a join, a leave, a new subscription, a new share of the partitions)
is proposed. Every answer names a metadata version that holds the member as answered:
the partition leaders, which judge a member by their own copy of the metadata, wait for
that version before calling the member unknown (docs/share-groups.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from raftmq.controller import commands as c
from raftmq.controller.groups import (
    DEFAULT_SESSION_TIMEOUT_MS,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
)
from raftmq.controller.model import MetadataState
from raftmq.controller.quorum import ControllerQuorum
from raftmq.controller.sessions import MemberSessions


class ShareCoordinator:
    """The coordinator of every share group, on one controller voter; it answers only
    while the voter leads the quorum (else NotControllerError, as every command)."""

    def __init__(self, quorum: ControllerQuorum) -> None:
        self.quorum = quorum
        self.sessions = MemberSessions(
            quorum,
            "share group",
            lambda state: state.share_groups,
            c.RemoveShareMembers,
            DEFAULT_SESSION_TIMEOUT_MS,
        )

    async def heartbeat(self, beat: c.ShareGroupHeartbeat) -> tuple[c.ShareAssignment, int]:
        """The member's answer and the metadata version that holds it as answered;
        ControllerRefusal (INVALID_GROUP, UNKNOWN_MEMBER, FENCED_MEMBER_EPOCH,
        INCONSISTENT_GROUP_TYPE) and the quorum's other errors as for every command."""
        timeout_ms = beat.session_timeout_ms
        assert beat.member_epoch == -1 or (
            MIN_SESSION_TIMEOUT_MS <= timeout_ms <= MAX_SESSION_TIMEOUT_MS
        )
        return await self.sessions.beat(beat, beat.group_id, c.ShareAssignment, timeout_ms)

    async def alter_config(self, group_id: str, settings: Mapping[str, str]) -> int:
        await self.quorum.propose(c.AlterShareGroupConfig(group_id, dict(settings)), c.Done)
        return self.quorum.local_state()[0]

    async def delete_group(self, group_id: str) -> int:
        await self.quorum.propose(c.DeleteShareGroup(group_id), c.Done)
        return self.quorum.local_state()[0]

    async def current(self) -> MetadataState:
        """The metadata as of this call, on the leader (a read index)."""
        return await self.sessions.current()

    def last_heartbeat_age_ms(self, group_id: str, member_id: str) -> int:
        return self.sessions.last_heartbeat_age_ms(group_id, member_id)
