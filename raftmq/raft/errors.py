"""Errors the core raises to its driver for requests it cannot take."""

from __future__ import annotations


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
