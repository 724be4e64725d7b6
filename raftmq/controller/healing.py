"""Which replica moves the controller starts next: healing (replace replicas on fenced
brokers), drains (move replicas off draining brokers) and rebalancing (even out replicas
and preferred leaders). Pure and deterministic: :func:`plan` reads a
:class:`~raftmq.controller.model.MetadataState` and the time the caller stamped, and
returns commands; the mover (controller/mover.py) proposes them on the controller leader.

A move is ``AddReplica(learner, replacing=X)``: the partition's Raft leader adds the
learner, proposes ``PromoteReplica`` once it caught up (X leaves in the same entry), so a
partition never has fewer than its factor of caught-up voters, and at most one replica
beyond it. The plan never finishes a move itself; it only starts moves, gives up moves
whose learner can no longer finish (``RemoveReplica`` of a learner on a fenced or
draining broker), and reorders replica lists (``ReorderReplicas``: a preferred leader
changed without copying anything, which the brokers' hand-back then follows).

Order of urgency: give-ups, then healing (a partition short of a healthy replica), then
drains, then rebalancing. Moves already under way count against the limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from raftmq.controller.commands import (
    AddReplica,
    Command,
    PromoteReplica,
    RemoveReplica,
    ReorderReplicas,
)
from raftmq.controller.model import Broker, MetadataState, Partition, PartitionState
from raftmq.controller.placement import Candidate, rack_key, replacement
from raftmq.controller.transitions import apply_command

HEAL_DELAY_MS = 60_000
"""How long a broker stays fenced before its replicas are replaced. A replacement copies
the partition's whole log over the network and writes it to another disk, while a
restarted or briefly partitioned broker comes back with its data and only catches up the
tail: a crash-and-restart under a supervisor, a rolling upgrade or a network blip is over
within a minute, and during that minute every partition of factor >= 3 keeps a majority.
Kafka makes the same bet by never replacing replicas on its own."""
MOVES_PER_BROKER = 2
"""Moves a broker takes part in at once, as the learner's broker (it writes a whole log)
or as the partition's leader (Raft learners copy from the leader, so the leader is where
the data comes from). Two keeps a broker's disk and network mostly for clients while
one move's tail catches up as the other copies; a dead broker's partitions still heal in
parallel, since their leaders and new homes spread over the surviving brokers."""
MOVES_TOTAL = 10
"""Moves under way in the whole cluster: bounds the metadata churn and the cluster's total
copy bandwidth (each move is a full log copy) whatever the cluster's size."""
REORDERS_PER_ROUND = 50
"""Preferred-leader changes proposed in one round: cheap (no copy) but each one makes a
broker hand its leadership over, a short pause for that partition's clients."""


class Reason(StrEnum):
    HEAL = "heal"  # a voter on a broker fenced for longer than the heal delay
    DRAIN = "drain"  # a voter on a draining broker
    REBALANCE = "rebalance"  # from a broker holding two or more replicas above another


@dataclass(frozen=True, slots=True)
class Limits:
    heal_delay_ms: int = HEAL_DELAY_MS
    moves_per_broker: int = MOVES_PER_BROKER
    moves_total: int = MOVES_TOTAL
    reorders_per_round: int = REORDERS_PER_ROUND

    def __post_init__(self) -> None:
        assert self.heal_delay_ms >= 0, self.heal_delay_ms
        assert self.moves_per_broker >= 1 and self.moves_total >= 1, self
        assert self.reorders_per_round >= 0, self


DEFAULT_LIMITS = Limits()
UNLIMITED = Limits(moves_per_broker=1 << 30, moves_total=1 << 30, reorders_per_round=1 << 30)
"""For a forecast of every move a rebalance would make (``RebalanceCluster``)."""


@dataclass(frozen=True, slots=True)
class Move:
    topic: str
    partition: int
    learner: int
    replacing: int
    reason: Reason

    @property
    def command(self) -> AddReplica:
        return AddReplica(self.topic, self.partition, self.learner, replacing=self.replacing)


@dataclass(frozen=True, slots=True)
class Plan:
    give_ups: tuple[RemoveReplica, ...] = ()
    moves: tuple[Move, ...] = ()
    reorders: tuple[ReorderReplicas, ...] = ()
    stuck: tuple[str, ...] = ()
    """Sentences for replicas that must move but have nowhere to go (too few placeable
    brokers): shown to operators, retried every round."""
    balanced: bool = True
    """Rebalancing: nothing is left to even out (as far as the replica sets allow) and no
    move is under way; the mover then clears the metadata's rebalance request. Only
    meaningful for a plan made with ``rebalance=True``."""

    @property
    def commands(self) -> list[Command]:
        """In the order to propose them: give-ups free their partitions and limits first."""
        return [*self.give_ups, *(m.command for m in self.moves), *self.reorders]


@dataclass(frozen=True, slots=True)
class MoveUnderWay:
    topic: str
    partition: int
    learner: int
    replacing: int | None


def moves_under_way(state: MetadataState) -> list[MoveUnderWay]:
    """Every learner in the metadata, with the voter its move replaces."""
    return [
        MoveUnderWay(name, p, learner, part.replacing)
        for name, topic in sorted(state.topics.items())
        for p, part in enumerate(topic.partitions)
        for learner in part.learners
    ]


def under_replicated(state: MetadataState) -> list[tuple[str, int]]:
    """Active partitions with a voter on a fenced broker, or fewer voters than the factor."""
    fenced = {b.id for b in state.brokers.values() if b.fenced}
    return [
        (name, p)
        for name, topic in sorted(state.topics.items())
        for p, part in enumerate(topic.partitions)
        if part.state == PartitionState.ACTIVE
        and (
            len(part.replicas) < topic.replication_factor
            or any(b in fenced or b not in state.brokers for b in part.replicas)
        )
    ]


def leaderless(state: MetadataState) -> list[tuple[str, int]]:
    """Active partitions with no reported leader, or one on a fenced broker."""
    out = []
    for name, topic in sorted(state.topics.items()):
        for p, part in enumerate(topic.partitions):
            if part.state != PartitionState.ACTIVE:
                continue
            leader = state.brokers.get(part.leader) if part.leader is not None else None
            if leader is None or leader.fenced:
                out.append((name, p))
    return out


# -- planning ------------------------------------------------------------------------------

Key = tuple[str, int]


@dataclass(slots=True)
class _Round:
    """What one call of :func:`plan` works with: the cluster as it will be once every
    move under way and every move planned so far finishes, and the limits' counters."""

    state: MetadataState
    limits: Limits
    sets: dict[Key, list[int]] = field(default_factory=dict)  # projected voters, in order
    busy: set[Key] = field(default_factory=set)  # a move under way or planned this round
    load: dict[int, int] = field(default_factory=dict)  # projected replicas per broker
    moving: dict[int, int] = field(default_factory=dict)  # moves per broker (target, leader)
    total: int = 0
    moves: list[Move] = field(default_factory=list)

    def broker(self, b: int) -> Broker | None:
        return self.state.brokers.get(b)

    def placeable(self) -> list[Candidate]:
        return [
            Candidate(b.id, b.rack) for _, b in sorted(self.state.brokers.items()) if b.placeable
        ]

    def rack_of(self, b: int) -> str | None:
        broker = self.broker(b)
        return broker.rack if broker is not None else None

    def rack(self, b: int) -> str:
        return rack_key(b, self.rack_of(b))

    def sender(self, key: Key) -> int | None:
        """The broker a learner copies from: the partition's leader, when known and alive."""
        leader = self.state.topics[key[0]].partitions[key[1]].leader
        broker = self.broker(leader) if leader is not None else None
        return leader if broker is not None and not broker.fenced else None

    def room(self, b: int | None) -> bool:
        return b is None or self.moving.get(b, 0) < self.limits.moves_per_broker

    def take(self, move: Move) -> None:
        key = (move.topic, move.partition)
        members = self.sets[key]
        members[members.index(move.replacing)] = move.learner
        self.load[move.replacing] -= 1
        self.load[move.learner] = self.load.get(move.learner, 0) + 1
        for b in {move.learner, self.sender(key)} - {None}:
            assert b is not None
            self.moving[b] = self.moving.get(b, 0) + 1
        self.total += 1
        self.busy.add(key)
        self.moves.append(move)


def _round(state: MetadataState, limits: Limits) -> tuple[_Round, list[RemoveReplica]]:
    r = _Round(state, limits)
    give_ups = []
    for name, topic in sorted(state.topics.items()):
        for p, part in enumerate(topic.partitions):
            key = (name, p)
            members = _projected(part)
            r.sets[key] = members
            for b in members:
                r.load[b] = r.load.get(b, 0) + 1
            if not part.learners:
                continue
            r.busy.add(key)
            for learner in part.learners:
                broker = state.brokers.get(learner)
                if broker is None or not broker.placeable or part.state != PartitionState.ACTIVE:
                    # its broker went away or is leaving, or the partition was
                    # decommissioned (no promotion any more): the move cannot finish
                    give_ups.append(RemoveReplica(name, p, learner))
                    continue
                r.total += 1
                for busy in (learner, r.sender(key)):
                    if busy is not None:
                        r.moving[busy] = r.moving.get(busy, 0) + 1
    return r, give_ups


def _projected(part: Partition) -> list[int]:
    """The voters once the move under way (if any) finishes."""
    members = list(part.replicas)
    for learner in part.learners:
        if part.replacing is not None and part.replacing in members:
            members[members.index(part.replacing)] = learner
        else:
            members.append(learner)
    return members


def plan(
    state: MetadataState, now_ms: int, limits: Limits = DEFAULT_LIMITS, *, rebalance: bool = False
) -> Plan:
    """The next moves to start, as of ``now_ms`` (the caller's clock, the same one that
    stamps fences). ``rebalance``: also even out replicas and preferred leaders (an
    operator asked, or the timer is on)."""
    r, give_ups = _round(state, limits)
    stuck = _evacuate(r, now_ms)
    if not rebalance:
        return Plan(tuple(give_ups), tuple(r.moves), (), tuple(stuck), balanced=True)
    under_way = bool(r.total or give_ups)
    even = _even_out_replicas(r)
    reorders, leaders_even = _even_out_leaders(r) if even else ([], False)
    balanced = even and leaders_even and not under_way and not r.moves and not reorders
    return Plan(tuple(give_ups), tuple(r.moves), tuple(reorders), tuple(stuck), balanced)


def _evacuate(r: _Round, now_ms: int) -> list[str]:
    """Heal and drain: a move for each active partition with a voter on a broker fenced
    for the heal delay or draining, most urgent first (fewest healthy voters). Returns
    sentences for the replicas that cannot move: no broker to go to, or no majority left
    to commit the move."""
    wanted: list[tuple[int, Key, int, Reason]] = []
    stuck = []
    for name, topic in sorted(r.state.topics.items()):
        for p, part in enumerate(topic.partitions):
            key = (name, p)
            if part.state != PartitionState.ACTIVE or key in r.busy:
                continue
            leaving = []
            for b in part.replicas:
                broker = r.broker(b)
                if broker is None or (
                    broker.fenced and now_ms - broker.fenced_at_ms >= r.limits.heal_delay_ms
                ):
                    leaving.append((0, b, Reason.HEAL))
                elif broker.draining:
                    leaving.append((1, b, Reason.DRAIN))
            if not leaving:
                continue
            _, b, reason = min(leaving)
            if not _has_majority(r, part):
                stuck.append(
                    f"{name}/{p} lost the majority of its voters {list(part.replicas)} to "
                    "fenced brokers; its replicas can move once enough of them are back"
                )
                continue
            healthy = sum(
                1 for v in part.replicas if (br := r.broker(v)) is not None and br.placeable
            )
            wanted.append((healthy, key, b, reason))
    candidates = r.placeable()
    for _, key, leaving_b, reason in sorted(
        wanted, key=lambda w: (w[0], w[3] != Reason.HEAL, w[1])
    ):
        keep = {b: r.rack_of(b) for b in r.sets[key] if b != leaving_b}
        target = replacement(candidates, keep, replica_load=r.load, partition=key[1])
        if target is None:
            stuck.append(
                f"{key[0]}/{key[1]}: broker {leaving_b}'s replica ({reason}) has no broker to "
                "go to; every placeable broker holds the partition already"
            )
            continue
        if r.total >= r.limits.moves_total or not r.room(r.sender(key)):
            continue
        roomy = [c for c in candidates if r.room(c.broker_id)]
        target = replacement(roomy, keep, replica_load=r.load, partition=key[1])
        if target is not None:
            r.take(Move(key[0], key[1], target, leaving_b, reason))
    return stuck


def _has_majority(r: _Round, part: Partition) -> bool:
    """Whether a majority of the partition's voters is on unfenced brokers: a move is a
    membership change of the partition's Raft group, which only a majority can commit, so
    a move planned for a partition without one would hold a move slot for nothing."""
    up = sum(1 for b in part.replicas if (br := r.broker(b)) is not None and not br.fenced)
    return up > len(part.replicas) // 2


def _even_out_replicas(r: _Round) -> bool:
    """Moves from the most to the least loaded placeable brokers until their replica
    counts are within one (or no move keeps the racks spread); True when nothing more is
    wanted, False when the limits cut it short."""
    candidates = {c.broker_id: c for c in r.placeable()}
    if len(candidates) < 2:
        return True
    on: dict[int, list[Key]] = {b: [] for b in candidates}
    for key, members in sorted(r.sets.items()):
        for b in members:
            if b in on:
                on[b].append(key)
    while True:
        found = _replica_move(r, candidates, on)
        if found is None:
            return True
        if r.total >= r.limits.moves_total:
            return False
        key, src, dst = found
        if not (r.room(dst) and r.room(r.sender(key))):
            return False
        r.take(Move(key[0], key[1], dst, src, Reason.REBALANCE))
        on[src].remove(key)
        on[dst].append(key)


def _replica_move(
    r: _Round, candidates: Mapping[int, Candidate], on: Mapping[int, list[Key]]
) -> tuple[Key, int, int] | None:
    """The next (partition, from, to) that evens out replica counts, or None."""
    by_load = sorted(candidates, key=lambda b: (r.load.get(b, 0), b))
    for src in reversed(by_load):
        for dst in by_load:
            if r.load.get(src, 0) - r.load.get(dst, 0) < 2:
                break
            for key in on[src]:
                if _movable(r, key, src, dst):
                    return key, src, dst
    return None


def _movable(r: _Round, key: Key, src: int, dst: int) -> bool:
    """A rebalance may move ``key``'s replica from ``src`` to ``dst``: the partition is
    active, idle and healthy, ``dst`` does not hold it, and the racks stay as spread."""
    topic = r.state.topics[key[0]]
    if key in r.busy or topic.partitions[key[1]].state != PartitionState.ACTIVE:
        return False
    members = r.sets[key]
    if dst in members or any(not _placeable(r, b) for b in members):
        return False
    after = [dst if b == src else b for b in members]
    return len({r.rack(b) for b in after}) >= len({r.rack(b) for b in members})


def _placeable(r: _Round, b: int) -> bool:
    broker = r.broker(b)
    return broker is not None and broker.placeable


def _even_out_leaders(r: _Round) -> tuple[list[ReorderReplicas], bool]:
    """Preferred leaderships handed from brokers with two or more above another voter of
    the same partition, by reordering the replica list (no copy). Returns the reorders and
    whether nothing more is wanted."""
    leads: dict[int, int] = {}
    for key, members in r.sets.items():
        if r.state.topics[key[0]].partitions[key[1]].state == PartitionState.ACTIVE:
            leads[members[0]] = leads.get(members[0], 0) + 1
    reorders: list[ReorderReplicas] = []
    while True:
        found = _leader_swap(r, leads)
        if found is None:
            return reorders, True
        if len(reorders) >= r.limits.reorders_per_round:
            return reorders, False
        key, v = found
        members = r.sets[key]
        i = members.index(v)
        leads[members[0]] -= 1
        leads[v] = leads.get(v, 0) + 1
        members[0], members[i] = members[i], members[0]
        r.busy.add(key)
        reorders.append(ReorderReplicas(key[0], key[1], tuple(members)))


def _leader_swap(r: _Round, leads: Mapping[int, int]) -> tuple[Key, int] | None:
    """An idle partition whose preferred leader leads two or more partitions more than
    another of its voters, and that voter (the one leading fewest, then lowest id)."""
    best: tuple[int, Key, int] | None = None
    for key, members in sorted(r.sets.items()):
        part = r.state.topics[key[0]].partitions[key[1]]
        if key in r.busy or part.state != PartitionState.ACTIVE:
            continue
        if any(not _placeable(r, b) for b in members):
            continue
        p = members[0]
        v = min(members[1:], key=lambda b: (leads.get(b, 0), b), default=None)
        if v is None:
            continue
        gap = leads.get(p, 0) - leads.get(v, 0)
        if gap >= 2 and (best is None or gap > best[0]):
            best = (gap, key, v)
    return None if best is None else (best[1], best[2])


def brokers_holding(state: MetadataState, broker_ids: Iterable[int]) -> dict[int, int]:
    """Replicas (voters and learners) per broker, for the brokers asked about."""
    wanted = set(broker_ids)
    held = dict.fromkeys(sorted(wanted), 0)
    for topic in state.topics.values():
        for part in topic.partitions:
            for b in part.replicas + part.learners:
                if b in wanted:
                    held[b] += 1
    return held


def forecast(
    state: MetadataState, now_ms: int, limits: Limits = UNLIMITED, *, max_rounds: int = 64
) -> Plan:
    """Every move and preferred-leader change a rebalance would make from ``state``, round
    after round, as if each move finished at once (its learner promoted): what an operator
    is told to expect (moves already under way count as finished first). The mover plans
    each real round afresh, so the real moves may differ
    when the cluster changes meanwhile. A partition reordered twice is listed with its
    last order."""
    moves: list[Move] = []
    reorders: dict[Key, ReorderReplicas] = {}
    stuck: tuple[str, ...] = ()
    index = state.version
    for m in moves_under_way(state):  # as if they finished first
        index += 1
        state, _ = apply_command(state, index, PromoteReplica(m.topic, m.partition, m.learner))
    for _ in range(max_rounds):
        p = plan(state, now_ms, limits, rebalance=True)
        stuck = stuck or p.stuck
        if p.balanced or not p.commands:
            break
        moves.extend(p.moves)
        reorders.update({(r.name, r.partition): r for r in p.reorders})
        finishing = [PromoteReplica(m.topic, m.partition, m.learner) for m in p.moves]
        for command in [*p.commands, *finishing]:
            index += 1
            state, _ = apply_command(state, index, command)
    return Plan(moves=tuple(moves), reorders=tuple(reorders.values()), stuck=stuck)
