"""Group members' sessions, kept in the controller leader's memory: the part of a group
coordinator that consumer groups (raftmq.controller.coordinator) and share groups
(raftmq.controller.share_coordinator) share.

Why in memory and not in the metadata: a member beats every few seconds, and a beat that
changes nothing must cost no Raft entry (every broker would apply each one). So a beat is
judged against the leader's state first and proposed only when it changes the group; the
time each member was last heard is the leader's own, and the leader's timer proposes the
removal of members silent past their session timeout. A new leader counts every member
as heard when it took over (:attr:`ControllerQuorum.led_since`), so a failover never
expires a live member.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from raftmq.controller import commands as c
from raftmq.controller.model import MetadataState
from raftmq.controller.quorum import ControllerQuorum, ControllerRefusal
from raftmq.controller.transitions import apply_command

log = logging.getLogger(__name__)


class Group(Protocol):
    @property
    def members(self) -> Mapping[str, object]: ...


A = TypeVar("A", c.GroupAssignment, c.ShareAssignment)
"""A heartbeat's result: the member it is for, and its epoch (-1 once it left)."""


@dataclass(frozen=True, slots=True)
class Session:
    timeout_s: float
    heard_s: float
    """``monotonic_s`` of the member's last beat on this leader."""


class MemberSessions:
    """The sessions of one kind of group on one controller voter. ``groups``: that kind's
    groups in a state; ``removal``: the command that removes a group's silent members."""

    def __init__(
        self,
        quorum: ControllerQuorum,
        kind: str,
        groups: Callable[[MetadataState], Mapping[str, Group]],
        removal: Callable[[str, tuple[str, ...]], c.Command],
        default_timeout_ms: int,
    ) -> None:
        self.quorum = quorum
        self.kind = kind
        self.groups = groups
        self.removal = removal
        self.default_timeout_s = default_timeout_ms / 1000
        self._sessions: dict[tuple[str, str], Session] = {}
        self._proposing: dict[str, int] = {}
        """Group id: heartbeats of it being proposed. A member that joined in one is in
        the state before its session is recorded; the timer must not take it for silent."""
        quorum.on_tick(self.expire_silent)

    async def beat(
        self, beat: c.Command, group_id: str, expect: type[A], session_timeout_ms: int
    ) -> tuple[A, int]:
        """The member's answer and a metadata version that holds the member as answered;
        ControllerRefusal (the transition's) and the quorum's other errors as for every
        command."""
        self.quorum.require_leader()
        # Judged on a current state: the local copy when this leader applied everything
        # committed (the common case, no round trip), else after a read index (an
        # election just now, an entry in its apply): a beat answered from a lagging copy
        # could hand back what the member gave up in an entry not applied yet.
        current = self.quorum.applied_all_committed()
        state = self.quorum.local_state()[1] if current else await self.current()
        after, result = apply_command(state, state.version + 1, beat)
        if isinstance(result, c.Refused):  # without an entry: a zombie's beats write nothing
            raise ControllerRefusal(result.code, result.message)
        assert isinstance(result, expect), result
        answer, version = result, state.version
        if self.groups(after).get(group_id) != self.groups(state).get(group_id):
            self._proposing[group_id] = self._proposing.get(group_id, 0) + 1
            try:
                answer = await self.quorum.propose(beat, expect)
            finally:
                self._proposing[group_id] -= 1
                if not self._proposing[group_id]:
                    del self._proposing[group_id]
            version = self.quorum.local_state()[0]
        key = (group_id, answer.member_id)
        if answer.member_epoch == -1:
            self._sessions.pop(key, None)
        else:
            self._sessions[key] = Session(session_timeout_ms / 1000, self.quorum.monotonic_s())
        return answer, version

    async def current(self) -> MetadataState:
        """The metadata as of this call, on the leader (a read index: a deposed leader
        cannot answer with what a newer one changed)."""
        self.quorum.require_leader()
        _, state = await self.quorum.metadata(linearizable=True)
        return state

    async def expire_silent(self) -> None:
        """Propose the removal of every member silent past its session timeout (run by
        the quorum's fencing timer)."""
        led_since = self.quorum.led_since
        if led_since is None or not self.quorum.is_leader:
            return
        now_s = self.quorum.monotonic_s()
        _, state = self.quorum.local_state()
        default = Session(self.default_timeout_s, led_since)
        for group_id, group in sorted(self.groups(state).items()):
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
                "%s %s: members %s sent no heartbeat within their session timeout: removing them",
                self.kind,
                group_id,
                ", ".join(silent),
            )
            try:
                await self.quorum.propose(self.removal(group_id, tuple(silent)), c.Done)
            except ControllerRefusal as exc:  # the group went away meanwhile
                log.info("%s %s: removing silent members refused: %s", self.kind, group_id, exc)
            for member_id in silent:
                self._sessions.pop((group_id, member_id), None)
        # Forget sessions of members gone from the metadata (left, replaced, removed);
        # no await between this read and the pruning, so a session recorded since the
        # loop above is of a member this state holds.
        _, state = self.quorum.local_state()
        groups = self.groups(state)
        for key in [k for k in self._sessions if k[1] not in _members(groups, k[0])]:
            del self._sessions[key]

    def last_heartbeat_age_ms(self, group_id: str, member_id: str) -> int:
        """Since this leader last heard the member; -1 when it has not since it took over
        (or woke from a pause)."""
        session = self._sessions.get((group_id, member_id))
        led_since = self.quorum.led_since
        if session is None or led_since is None or session.heard_s < led_since:
            return -1
        return int((self.quorum.monotonic_s() - session.heard_s) * 1000)


def _members(groups: Mapping[str, Group], group_id: str) -> Iterable[str]:
    group = groups.get(group_id)
    return group.members if group is not None else ()
