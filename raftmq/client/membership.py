"""A group member's side of the heartbeat protocol (groups.proto), as a pure state
machine: what it holds, what it must give up, what it starts, and what it says in its
next heartbeat. No I/O: the consumer's group session (raftmq.client.group_session) sends
the heartbeats and does what each :class:`Step` says, so the rules can be tested alone.

The rules (Kafka 4's KIP-848 member, in outline):

- Every answer names the full set the member may consume. What it holds and is not named
  is to be given up: the consumer stops returning it, calls on_revoke, commits its
  position, stops fetching it, and only then (``given_up``) stops reporting it as held,
  heartbeating at once so the coordinator can hand it on. A partition therefore never
  has two consumers: the coordinator gives it to another only once this member no
  longer reports it.
- What is named and not held is started: from the group's committed offset, else from
  ``auto_offset_reset``.
- UNKNOWN_MEMBER or FENCED_MEMBER_EPOCH (the group moved on without this member, or its
  session expired): everything held is lost at once (on_lost, no commit: another member
  may own it already), and the member joins again at epoch 0 holding nothing.
- No answer for a whole session timeout counts as fenced too: the coordinator has
  removed the member by then and may have given its partitions to another.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
FIRST_INTERVAL_MS = 1000
"""How long to wait before heartbeating again when no answer has named an interval."""


@dataclass(frozen=True, slots=True)
class Step:
    """What the consumer must do after an answer or a refusal, in this order: lose
    ``lost``, give up ``revoke``, start ``assign``."""

    assign: frozenset[TopicPartition] = frozenset()
    revoke: frozenset[TopicPartition] = frozenset()
    lost: frozenset[TopicPartition] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.assign or self.revoke or self.lost)


@dataclass(frozen=True, slots=True)
class Beat:
    """The fields of the next ConsumerGroupHeartbeatRequest."""

    member_id: str
    member_epoch: int
    subscriptions: tuple[str, ...]
    owned: tuple[TopicPartition, ...]


@dataclass(slots=True)
class Membership:
    """One member of one group. ``member_id`` is made here (a random id), so a join
    resent after a lost answer is the same member, not a second one."""

    member_id: str = field(default_factory=lambda: f"m-{uuid.uuid4().hex}")
    epoch: int = JOIN_EPOCH
    subscriptions: tuple[str, ...] = ()
    held: set[TopicPartition] = field(default_factory=set)
    """Consuming, about to start, or told to give up and not yet given up."""
    revoking: set[TopicPartition] = field(default_factory=set)
    """Told to give up; still held until ``given_up``."""
    interval_ms: int = FIRST_INTERVAL_MS
    due_now: bool = True
    """Heartbeat without waiting for the interval (a join, a change to report)."""
    left: bool = False

    @property
    def joined(self) -> bool:
        return self.epoch > JOIN_EPOCH

    def subscribe(self, topics: Iterable[str]) -> None:
        """Subscribe to exactly ``topics`` (a pattern resolved to names); a change is
        reported at once. Partitions of topics dropped are revoked by the coordinator."""
        topics = tuple(sorted(set(topics)))
        if topics != self.subscriptions:
            self.subscriptions = topics
            self.due_now = True

    def beat(self) -> Beat | None:
        """The heartbeat to send now, or None (nothing subscribed and not in the group,
        or left). With nothing subscribed, a member in the group leaves."""
        if self.left:
            return None
        if not self.subscriptions:
            if not self.joined:
                return None
            return self.leave()
        return Beat(self.member_id, self.epoch, self.subscriptions, tuple(sorted(self.held)))

    def leave(self) -> Beat:
        """The heartbeat that leaves the group (epoch -1)."""
        return Beat(self.member_id, LEAVE_EPOCH, self.subscriptions, ())

    def answered(
        self,
        member_id: str,
        member_epoch: int,
        assigned: set[TopicPartition],
        interval_ms: int,
    ) -> Step:
        """A heartbeat's answer: ``assigned`` is everything the member may consume."""
        self.interval_ms = interval_ms or FIRST_INTERVAL_MS
        self.due_now = False
        if member_epoch == LEAVE_EPOCH:
            return self._reset(lost=False)
        self.member_id = member_id or self.member_id
        self.epoch = member_epoch
        revoke = (self.held - assigned) - self.revoking
        self.revoking |= revoke
        assign = assigned - self.held
        self.held |= assign
        assert self.revoking <= self.held, "a partition is given up only while held"
        return Step(assign=frozenset(assign), revoke=frozenset(revoke))

    def given_up(self, partitions: Iterable[TopicPartition]) -> None:
        """The consumer stopped consuming and committed ``partitions``: stop reporting
        them, and say so at once."""
        partitions = set(partitions)
        self.held -= partitions
        self.revoking -= partitions
        self.due_now = True

    def fenced(self) -> Step:
        """UNKNOWN_MEMBER, FENCED_MEMBER_EPOCH, or a session's worth of silence: lose
        everything, and join again at epoch 0."""
        return self._reset(lost=True)

    def _reset(self, *, lost: bool) -> Step:
        held = frozenset(self.held)
        self.held = set()
        self.revoking = set()
        self.epoch = JOIN_EPOCH
        self.due_now = lost
        if not lost:
            self.left = True
        return Step(lost=held) if lost else Step(revoke=held)
