"""Errors the core raises to its driver for requests it cannot take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raftmq.log.repair import Damage


class RaftError(Exception):
    pass


class NotLeaderError(RaftError):
    """Only the leader takes proposals; ``leader`` (0 if unknown) is where to go instead."""

    def __init__(self, leader: int) -> None:
        super().__init__(f"not the leader; leader is {leader or 'unknown'}")
        self.leader = leader


class ProposalDroppedError(RaftError):
    """The leader refuses for now (e.g. leadership transfer or a config change in flight)."""


class OutcomeUnknownError(RaftError):
    """This node stopped before it learnt whether a proposal committed: another leader may
    still commit it, so the caller must treat the write as possibly done."""


class GroupFailedError(RaftError):
    """This node's member of the group is quarantined after an error in its log, storage or
    apply (``reason`` says which); the driver reopens it from disk with backoff."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"group {name} failed here: {reason}")
        self.reason = reason


class ReadIndexError(RaftError):
    """No read point could be confirmed: the request was lost when leadership moved or
    this member stopped, or no leader confirmed one in time. Nothing was read; retry."""


class GroupDamagedError(RaftError):
    """``RaftHost.open_group`` read a damaged entry of the group's log (a CONFIG entry it
    replays, the entry at the commit hint or the snapshot boundary): the group is not open.
    ``damages`` lists the damaged ranges of sealed segments (``raftmq.log.repair.Damage``),
    which a healthy replica holds byte for byte: call ``RaftHost.repair_closed_group``,
    then ``open_group`` again. Empty when the damage is nothing a peer's entries can
    replace (``reason`` then says what to do)."""

    def __init__(self, name: str, reason: str, damages: Sequence[Damage] = ()) -> None:
        super().__init__(f"group {name} cannot open: {reason}")
        self.name = name
        self.reason = reason
        self.damages = tuple(damages)


class GroupRepairError(RaftError):
    """``RaftHost.repair_closed_group`` could not make the group's files whole: no peer
    supplied a damaged range, or what stops the open is not a damaged range at all.
    ``reason`` says which and what an operator can do; the group stays closed."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"group {name} was not repaired: {reason}")
        self.name = name
        self.reason = reason
