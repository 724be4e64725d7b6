"""The controller's move planner (controller/healing.py): every planned command is one the
state machine accepts; a fenced broker's replicas are replaced after the heal delay, a
draining broker's at once; the limits hold, moves under way counted; racks stay spread;
nothing is planned when nothing is wrong; rebalancing converges to replica counts and
preferred leaderships within one."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.controller import healing
from raftmq.controller.commands import (
    AddReplica,
    CreateTopic,
    DecommissionPartitions,
    Done,
    DrainBroker,
    FenceBroker,
    PromoteReplica,
    Refused,
    ReportLeader,
    RequestRebalance,
)
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.healing import UNLIMITED, Limits, Reason, plan
from raftmq.controller.model import MetadataState
from tests.controller.machine import Driver

DELAY = healing.HEAL_DELAY_MS


def cluster(brokers: int, racks: list[str | None] | None = None) -> Driver:
    d = Driver()
    for b in range(1, brokers + 1):
        assert d.register(b, racks[b - 1] if racks else None).ok
    return d


def state(d: Driver) -> MetadataState:
    return d.machine.state


def apply_all(d: Driver, p: healing.Plan) -> None:
    for command in p.commands:
        result = d(command)
        assert result == Done(), (command, result)


def promote_all(d: Driver) -> None:
    """Plays every partition leader: each learner caught up and promoted."""
    for name, topic in sorted(state(d).topics.items()):
        for i, part in enumerate(topic.partitions):
            for learner in part.learners:
                assert d(PromoteReplica(name, i, learner)) == Done()


def test_fenced_broker_is_healed_after_the_delay_and_not_before() -> None:
    d = cluster(4)
    d(CreateTopic("t", 3, 3, replica_assignment=((1, 2, 3), (2, 3, 1), (3, 1, 2))))
    d(FenceBroker(1, now_ms=10_000))
    assert plan(state(d), 10_000 + DELAY - 1) == healing.Plan()
    p = plan(state(d), 10_000 + DELAY)
    # broker 4 is the only place to go, and it takes MOVES_PER_BROKER moves at once
    assert [(m.partition, m.learner, m.replacing) for m in p.moves] == [(0, 4, 1), (1, 4, 1)]
    assert all(m.reason == Reason.HEAL for m in p.moves)
    apply_all(d, p)
    assert plan(state(d), 10_000 + DELAY).moves == ()  # broker 4's slots are taken
    promote_all(d)
    p = plan(state(d), 10_000 + DELAY)
    assert [(m.partition, m.learner, m.replacing) for m in p.moves] == [(2, 4, 1)]
    apply_all(d, p)
    promote_all(d)
    parts = state(d).topics["t"].partitions
    assert [part.replicas for part in parts] == [(4, 2, 3), (2, 3, 4), (3, 4, 2)]
    assert healing.under_replicated(state(d)) == []
    assert plan(state(d), 10_000 + DELAY) == healing.Plan()


def test_refencing_keeps_the_first_fence_time() -> None:
    d = cluster(3)
    d(FenceBroker(1, now_ms=5))
    d(FenceBroker(1, now_ms=99))
    assert state(d).brokers[1].fenced_at_ms == 5


def test_nothing_to_heal_when_every_broker_holds_the_partition() -> None:
    d = cluster(3)
    d(CreateTopic("t", 1, 3))
    d(FenceBroker(2, now_ms=0))
    p = plan(state(d), DELAY)
    assert p.moves == ()
    assert len(p.stuck) == 1 and "t/0" in p.stuck[0]
    assert healing.under_replicated(state(d)) == [("t", 0)]


def test_no_move_for_a_partition_without_a_majority() -> None:
    """A move is a membership change of the partition's Raft group: without a majority it
    could never commit, and would hold a move slot for good."""
    d = cluster(5)
    d(CreateTopic("one", 1, 1, replica_assignment=((1,),)))
    d(CreateTopic("three", 1, 3, replica_assignment=((1, 2, 3),)))
    d(CreateTopic("ok", 1, 3, replica_assignment=((1, 4, 5),)))
    d(FenceBroker(1, now_ms=0))
    d(FenceBroker(2, now_ms=0))
    p = plan(state(d), DELAY, UNLIMITED)
    assert [(m.topic, m.replacing) for m in p.moves] == [("ok", 1)]
    assert sorted(s.split()[0] for s in p.stuck) == ["one/0", "three/0"]
    assert "lost the majority" in p.stuck[0]


def test_drain_moves_replicas_at_once_and_is_refused_without_room() -> None:
    d = cluster(3)
    d(CreateTopic("t", 2, 3))
    refused = d(DrainBroker(2))
    assert isinstance(refused, Refused) and refused.code == Code.NOT_ENOUGH_BROKERS
    assert "start another broker" in refused.message
    unknown = d(DrainBroker(9))
    assert isinstance(unknown, Refused) and unknown.code == Code.UNKNOWN_BROKER
    d.register(4)
    d.register(5)
    assert d(DrainBroker(2)) == Done()
    assert d(DrainBroker(2)) == Done()  # again: nothing changes
    p = plan(state(d), 0, UNLIMITED)
    assert {(m.partition, m.replacing, m.reason) for m in p.moves} == {
        (0, 2, Reason.DRAIN),
        (1, 2, Reason.DRAIN),
    }
    assert {m.learner for m in p.moves} == {4, 5}  # least loaded first: one each
    apply_all(d, p)
    promote_all(d)
    assert healing.brokers_holding(state(d), [2]) == {2: 0}


def test_a_move_whose_learner_is_fenced_or_draining_is_given_up() -> None:
    d = cluster(4)
    d(CreateTopic("t", 1, 3, replica_assignment=((1, 2, 3),)))
    assert d(AddReplica("t", 0, 4, replacing=1)) == Done()
    d(FenceBroker(4, now_ms=0))
    p = plan(state(d), 0)
    assert [(g.partition, g.broker_id) for g in p.give_ups] == [(0, 4)]
    apply_all(d, p)
    assert state(d).topics["t"].partitions[0].learners == ()


def test_no_move_for_a_decommissioned_partition() -> None:
    d = cluster(4)
    d(CreateTopic("t", 2, 3, replica_assignment=((1, 2, 3), (1, 2, 3))))
    d(DecommissionPartitions("t", (1,), now_ms=0))
    d(FenceBroker(1, now_ms=0))
    p = plan(state(d), DELAY, UNLIMITED, rebalance=True)
    assert [m.partition for m in p.moves] == [0]


def test_the_partition_leader_counts_as_a_moves_source() -> None:
    d = cluster(6)
    d(CreateTopic("t", 3, 3, replica_assignment=((1, 2, 3),) * 3))
    for i in range(3):
        d(ReportLeader("t", i, 2, 1))
    d(FenceBroker(1, now_ms=0))
    p = plan(state(d), DELAY)
    assert len(p.moves) == healing.MOVES_PER_BROKER  # broker 2 sends them all


def test_racks_stay_spread_when_healing() -> None:
    d = cluster(5, ["a", "b", "c", "a", "c"])
    d(CreateTopic("t", 1, 3, replica_assignment=((1, 2, 3),)))
    d(FenceBroker(1, now_ms=0))
    p = plan(state(d), DELAY)
    assert [m.learner for m in p.moves] == [4]  # 5 shares rack c with broker 3


def test_rebalance_onto_a_new_broker_converges_within_one() -> None:
    d = cluster(3)
    d(CreateTopic("t", 12, 3))
    d(CreateTopic("u", 5, 2))
    d.register(4)
    assert plan(state(d), 0) == healing.Plan()  # nothing without a request
    assert d(RequestRebalance(True)) == Done() and state(d).rebalance_requested
    rounds = 0
    while not (p := plan(state(d), 0, rebalance=True)).balanced:
        for m in p.moves:
            assert m.reason == Reason.REBALANCE
        apply_all(d, p)
        promote_all(d)
        rounds += 1
        assert rounds < 50
    replicas = Counter(
        b for t in state(d).topics.values() for x in t.partitions for b in x.replicas
    )
    leaders = Counter(x.replicas[0] for t in state(d).topics.values() for x in t.partitions)
    assert max(replicas.values()) - min(replicas.values()) <= 1
    assert set(leaders) == {1, 2, 3, 4}
    assert max(leaders.values()) - min(leaders.values()) <= 1
    assert d(RequestRebalance(False)) == Done() and not state(d).rebalance_requested


# -- properties ----------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Driver, int, Limits, bool]:
    n = draw(st.integers(2, 8))
    rack_names = draw(st.sampled_from([[None], ["a", "b"], ["a", "b", "c"]]))
    d = cluster(n, [draw(st.sampled_from(rack_names)) for _ in range(n)])
    for t in range(draw(st.integers(1, 3))):
        factor = draw(st.integers(1, min(3, n)))
        assert d(CreateTopic(f"t{t}", draw(st.integers(1, 8)), factor)).ok
    for name, topic in sorted(state(d).topics.items()):
        for i, part in enumerate(topic.partitions):
            if draw(st.booleans()):
                d(ReportLeader(name, i, draw(st.sampled_from(part.replicas)), 1))
    # some moves under way, as an earlier round left them
    for m in plan(state(d), 0, UNLIMITED, rebalance=True).moves:
        if draw(st.booleans()):
            assert d(m.command) == Done()
    now = 10 * DELAY
    for b in range(1, n + 1):
        what = draw(st.sampled_from(["ok", "ok", "fenced", "fenced-recently", "draining"]))
        if what == "fenced":
            d(FenceBroker(b, now_ms=now - DELAY))
        elif what == "fenced-recently":
            d(FenceBroker(b, now_ms=now - DELAY + 1))
        elif what == "draining":
            d(DrainBroker(b))  # refused when the rest cannot hold the replicas: fine
    limits = Limits(
        moves_per_broker=draw(st.integers(1, 3)),
        moves_total=draw(st.integers(1, 6)),
        reorders_per_round=draw(st.integers(0, 5)),
    )
    return d, now, draw(st.sampled_from([limits, UNLIMITED])), draw(st.booleans())


def moving(s: MetadataState) -> tuple[Counter[int], int]:
    """Moves per broker (learner's and sending leader's) and in all, as the plan counts."""
    per: Counter[int] = Counter()
    total = 0
    for topic in s.topics.values():
        for part in topic.partitions:
            for learner in part.learners:
                total += 1
                per[learner] += 1
                leader = s.brokers.get(part.leader) if part.leader else None
                if leader is not None and not leader.fenced and part.leader != learner:
                    per[part.leader] += 1
    return per, total


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_plans_are_accepted_respect_limits_and_keep_placement(
    scenario: tuple[Driver, int, Limits, bool],
) -> None:
    d, now, limits, rebalance = scenario
    before = state(d)
    p = plan(before, now, limits, rebalance=rebalance)
    assert p == plan(before, now, limits, rebalance=rebalance)  # deterministic
    _, total_before = moving(before)
    for g in p.give_ups:
        assert d(g) == Done()
    per_freed, total_freed = moving(state(d))
    apply_all(d, healing.Plan(moves=p.moves, reorders=p.reorders))
    after = state(d)
    per_after, total_after = moving(after)
    assert total_after <= max(total_freed, limits.moves_total)
    for b, count in per_after.items():
        assert count <= max(per_freed[b], limits.moves_per_broker), (b, count)
    assert total_before >= total_freed
    moved = [(m.topic, m.partition) for m in p.moves]
    assert len(set(moved)) == len(moved)  # one move per partition
    rack = {b: x.rack or f"own{b}" for b, x in after.brokers.items()}
    for m in p.moves:
        old = before.topics[m.topic].partitions[m.partition]
        assert old.learners == () and m.replacing in old.replicas
        assert after.brokers[m.learner].placeable
        keep = [b for b in old.replicas if b != m.replacing]
        if m.reason == Reason.REBALANCE:
            new = [*keep, m.learner]
            assert len({rack[b] for b in new}) >= len({rack[b] for b in old.replicas})
        elif limits == UNLIMITED:
            free = {rack[b] for b, x in after.brokers.items() if x.placeable and b not in keep}
            if free - {rack[b] for b in keep}:
                assert rack[m.learner] not in {rack[b] for b in keep}
    for part in (x for t in after.topics.values() for x in t.partitions):
        members = part.replicas + part.learners
        assert len(set(members)) == len(members)
    if not rebalance:
        assert p.reorders == ()


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_every_leaving_replica_gets_a_move_when_brokers_suffice(
    scenario: tuple[Driver, int, Limits, bool],
) -> None:
    d, now, _, rebalance = scenario
    s = state(d)
    p = plan(s, now, UNLIMITED, rebalance=rebalance)
    planned = {(m.topic, m.partition) for m in p.moves}
    for name, topic in s.topics.items():
        for i, part in enumerate(topic.partitions):
            leaving = [
                b
                for b in part.replicas
                if s.brokers[b].draining
                or (s.brokers[b].fenced and now - s.brokers[b].fenced_at_ms >= DELAY)
            ]
            room = [b for b, x in s.brokers.items() if x.placeable and b not in part.replicas]
            up = [b for b in part.replicas if not s.brokers[b].fenced]
            majority = len(up) > len(part.replicas) // 2
            if leaving and room and majority and not part.learners:
                assert (name, i) in planned
            if not leaving and not rebalance:
                assert (name, i) not in planned


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_nothing_is_planned_for_a_healthy_cluster(
    scenario: tuple[Driver, int, Limits, bool],
) -> None:
    d, now, limits, _ = scenario
    s = state(d)
    if any(b.fenced or b.draining for b in s.brokers.values()):
        return
    p = plan(s, now, limits)
    assert p.moves == () and p.reorders == () and p.stuck == ()
    assert p.give_ups == ()


def test_a_forecast_lists_every_move_to_balance_and_changes_nothing() -> None:
    d = cluster(3)
    d(CreateTopic("t", 6, 3))
    d.register(4)
    before = state(d)
    expected = healing.forecast(before, 0)
    assert state(d) is before
    # 18 replicas over 4 brokers: 5, 5, 4, 4, so 4 or 5 land on broker 4
    assert {m.learner for m in expected.moves} == {4}
    assert len(expected.moves) in (4, 5)
    assert len({(m.topic, m.partition) for m in expected.moves}) == len(expected.moves)
    # replaying it (every move finished at once) gives what the mover converges to
    for m in expected.moves:
        assert d(m.command) == Done()
        assert d(PromoteReplica(m.topic, m.partition, m.learner)) == Done()
    for r in expected.reorders:
        assert d(r) == Done()
    assert plan(state(d), 0, rebalance=True).balanced
