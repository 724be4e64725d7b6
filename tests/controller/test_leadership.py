"""The preferred-leader policy, on its own: a group is handed back only after two checks
in a row found its preferred replica reachable and in sync."""

from raftmq.controller.leadership import HandBack, LedGroup
from raftmq.controller.placement import round_robin
from raftmq.raft.host.host import GroupStatus, PeerProgress
from raftmq.raft.progress import ProgressState
from raftmq.raft.ready import Role


def _led(
    match: int,
    *,
    alive: bool = True,
    state: ProgressState = ProgressState.REPLICATE,
    name: str = "t-0",
) -> LedGroup:
    status = GroupStatus(
        leader=1,
        term=3,
        commit=10,
        last_index=10,
        role=Role.LEADER,
        failed=None,
        leader_commit=0,
        followers={2: PeerProgress(match, state)},
    )
    return LedGroup(name, 2, status, alive)


def test_hands_back_only_after_two_checks_in_sync() -> None:
    policy = HandBack()
    assert policy.due([_led(10)]) == []
    assert [g.name for g in policy.due([_led(10)])] == ["t-0"]
    # Handed back once: it must be seen in sync twice again before the next time.
    assert policy.due([_led(10)]) == []


def test_a_lagging_unreachable_or_probing_replica_resets_the_count() -> None:
    for bad in (_led(9), _led(10, alive=False), _led(10, state=ProgressState.PROBE)):
        policy = HandBack()
        policy.due([_led(10)])
        assert policy.due([bad]) == []
        assert policy.due([_led(10)]) == []


def test_groups_past_the_limit_are_due_at_the_next_check() -> None:
    """A broker owed thousands of leaderships gets them at the full pace: a pass that hit
    the limit leaves the rest due for the next pass, not starting their two checks over."""
    policy = HandBack()
    led = [_led(10, name=f"t-{i}") for i in range(5)]
    assert policy.due(led, limit=2) == []
    first = policy.due(led, limit=2)
    assert [g.name for g in first] == ["t-0", "t-1"]
    rest = [g for g in led if g not in first]  # handed back: no longer led here
    assert [g.name for g in policy.due(rest, limit=2)] == ["t-2", "t-3"]
    assert [g.name for g in policy.due(rest[2:], limit=2)] == ["t-4"]


def test_round_robin_rotates_the_preferred_leader() -> None:
    assert round_robin([1, 2, 3], 4, 2) == ((1, 2), (2, 3), (3, 1), (1, 2))
