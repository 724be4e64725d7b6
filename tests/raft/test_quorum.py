"""Majority arithmetic (raftmq/raft/quorum.py): the one rule elections, commits and
check-quorum share."""

from __future__ import annotations

import pytest

from raftmq.raft import quorum
from raftmq.raft.quorum import VoteResult


@pytest.mark.parametrize(("voters", "majority"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_size_is_a_strict_majority(voters: int, majority: int) -> None:
    assert quorum.size(voters) == majority


def test_vote_result_is_decided_as_soon_as_it_can_be() -> None:
    voters = {1, 2, 3, 4, 5}
    assert quorum.vote_result(voters, {1: True, 2: True}) is VoteResult.PENDING
    assert quorum.vote_result(voters, {1: True, 2: True, 3: True}) is VoteResult.WON
    assert quorum.vote_result(voters, {1: False, 2: False}) is VoteResult.PENDING
    assert quorum.vote_result(voters, {1: True, 2: False, 3: False, 4: False}) is VoteResult.LOST
    # With four voters two grants are not enough, and two refusals already lose.
    assert quorum.vote_result({1, 2, 3, 4}, {1: True, 2: True}) is VoteResult.PENDING
    assert quorum.vote_result({1, 2, 3, 4}, {1: False, 2: False}) is VoteResult.LOST


def test_committed_index_is_what_a_majority_holds() -> None:
    match = {1: 9, 2: 7, 3: 3}
    assert quorum.committed_index({1, 2, 3}, match.__getitem__) == 7
    match = {1: 9, 2: 7, 3: 3, 4: 2}
    assert quorum.committed_index({1, 2, 3, 4}, match.__getitem__) == 3


def test_has_quorum_counts_only_active_voters() -> None:
    active = {1, 2}
    assert quorum.has_quorum({1, 2, 3}, active.__contains__)
    assert not quorum.has_quorum({1, 2, 3, 4}, active.__contains__)
