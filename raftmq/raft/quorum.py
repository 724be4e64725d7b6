"""Majority arithmetic, in one place: elections, commits and check-quorum all count voters
the same way (learners never count), so the rule lives here once.

A quorum of ``n`` voters is ``n // 2 + 1``: any two quorums of one configuration share a
member, which is what makes a committed entry or a granted vote survive a leader change.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from enum import Enum


class VoteResult(Enum):
    """Where an election stands after the answers so far."""

    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def size(voters: int) -> int:
    """How many of ``voters`` make a majority."""
    assert voters > 0, "a configuration has at least one voter"
    return voters // 2 + 1


def vote_result(voters: Collection[int], votes: Mapping[int, bool]) -> VoteResult:
    """WON once a majority of ``voters`` granted, LOST once so many refused that no
    majority can grant any more; ``votes`` holds only voters' answers."""
    q = size(len(voters))
    yes = sum(1 for granted in votes.values() if granted)
    if yes >= q:
        return VoteResult.WON
    if len(votes) - yes > len(voters) - q:
        return VoteResult.LOST
    return VoteResult.PENDING


def committed_index(voters: Collection[int], match: Callable[[int], int]) -> int:
    """The highest index that a majority of ``voters`` hold (``match(voter)`` is what each
    holds): the q-th largest of their match indexes."""
    matches = sorted((match(v) for v in voters), reverse=True)
    return matches[size(len(voters)) - 1]


def has_quorum(voters: Collection[int], active: Callable[[int], bool]) -> bool:
    """Whether a majority of ``voters`` is ``active`` (check-quorum: a leader that heard
    from fewer steps down)."""
    return sum(1 for v in voters if active(v)) >= size(len(voters))
