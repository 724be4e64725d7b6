"""Partition assignors for consumer groups: which member of a group consumes which
partition. Pure and deterministic (sorted inputs, no randomness): the group coordinator
computes a target assignment while applying a metadata entry, so every controller
replica must compute the same one.

Three, as Kafka offers: ``range`` (per topic, consecutive partitions to members in
member-id order: co-partitioned topics land together), ``round_robin`` (all subscribed
partitions dealt in turn), and ``sticky``, the default: balanced like round robin, but
starting from the current assignment and moving as few partitions as it can. Moving
fewer partitions is what makes a rebalance cheap: every partition that stays keeps
flowing while the group changes (issue 14's incremental rebalance).

Every assignor gives each subscribed partition to exactly one member subscribed to its
topic; ``round_robin`` and ``sticky`` keep members with the same subscriptions within one
partition of each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set

TopicPartition = tuple[str, int]
Subscriptions = Mapping[str, Set[str]]
"""Member id: the topics it subscribes to."""
Assignment = dict[str, set[TopicPartition]]


def _partitions(topics: Set[str], counts: Mapping[str, int]) -> list[TopicPartition]:
    return [(t, p) for t in sorted(topics) for p in range(counts.get(t, 0))]


def _empty(members: Subscriptions) -> Assignment:
    return {m: set() for m in members}


def range_assign(
    members: Subscriptions, counts: Mapping[str, int], current: Mapping[str, Set[TopicPartition]]
) -> Assignment:
    """Per topic, its partitions split into consecutive ranges over its subscribers in
    member-id order, the first ones one larger when it does not divide evenly."""
    out = _empty(members)
    for topic in sorted({t for ts in members.values() for t in ts}):
        subscribers = sorted(m for m, ts in members.items() if topic in ts)
        n = counts.get(topic, 0)
        share, extra = divmod(n, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = share + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + size))
            start += size
    return out


def round_robin_assign(
    members: Subscriptions, counts: Mapping[str, int], current: Mapping[str, Set[TopicPartition]]
) -> Assignment:
    """Every subscribed partition, in topic and partition order, dealt to the next member
    (in member-id order) that subscribes to its topic."""
    out = _empty(members)
    order = sorted(members)
    turn = 0
    for tp in _partitions({t for ts in members.values() for t in ts}, counts):
        for step in range(len(order)):
            m = order[(turn + step) % len(order)]
            if tp[0] in members[m]:
                out[m].add(tp)
                turn = (turn + step + 1) % len(order)
                break
    return out


def sticky_assign(
    members: Subscriptions, counts: Mapping[str, int], current: Mapping[str, Set[TopicPartition]]
) -> Assignment:
    """Balanced within one partition per member (among members whose subscriptions allow
    it), keeping every partition where it is unless balance needs it elsewhere.

    1. Each member keeps what it owns that still exists and it still subscribes to,
       unless another member kept it already (a partition has one owner).
    2. Members over their fair share give back their excess (the highest partitions).
    3. Free partitions go, one by one, to the least loaded member that may take them.
    4. While a member has two more than another that may take one of its partitions, one
       moves (bounded: each move lowers the spread)."""
    out = _empty(members)
    owner: dict[TopicPartition, str] = {}
    wanted = set(_partitions({t for ts in members.values() for t in ts}, counts))
    for m in sorted(members):
        for tp in sorted(current.get(m, ())):
            if tp in wanted and tp[0] in members[m] and tp not in owner:
                owner[tp] = m
                out[m].add(tp)
    if not out:
        return out
    quota = -(-len(wanted) // len(out))  # ceil: nobody needs more than this
    for m in sorted(out):
        for tp in sorted(out[m], reverse=True)[: max(0, len(out[m]) - quota)]:
            out[m].discard(tp)
            del owner[tp]
    for tp in sorted(wanted - owner.keys()):
        takers = [m for m in out if tp[0] in members[m]]
        if takers:
            m = min(takers, key=lambda x: (len(out[x]), x))
            out[m].add(tp)
            owner[tp] = m
    _even_out(members, out)
    return out


def _even_out(members: Subscriptions, out: Assignment) -> None:
    for _ in range(sum(len(a) for a in out.values()) + 1):
        moved = False
        for rich in sorted(out, key=lambda x: (-len(out[x]), x)):
            for tp in sorted(out[rich]):
                takers = [
                    m for m in out if tp[0] in members[m] and len(out[m]) + 1 < len(out[rich])
                ]
                if takers:
                    poor = min(takers, key=lambda x: (len(out[x]), x))
                    out[rich].discard(tp)
                    out[poor].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


Assignor = Callable[
    [Subscriptions, Mapping[str, int], Mapping[str, Set[TopicPartition]]], Assignment
]
ASSIGNORS: dict[str, Assignor] = {
    "range": range_assign,
    "round_robin": round_robin_assign,
    "sticky": sticky_assign,
}
DEFAULT_ASSIGNOR = "sticky"


def next_assignment(
    member: str,
    owned: Set[TopicPartition],
    target: Mapping[str, Set[TopicPartition]],
    owned_by_others: Mapping[TopicPartition, str],
) -> tuple[set[TopicPartition], set[TopicPartition]]:
    """One step of a member's incremental rebalance: (what it may consume now, what it
    must give up). It keeps what it owns of its target and gives up the rest at once; it
    gets a partition of its target only once no other member still owns it, so no
    partition ever has two consumers, and partitions that do not move never pause."""
    mine = set(target.get(member, ()))
    revoke = set(owned) - mine
    assigned = {tp for tp in mine if tp in owned or owned_by_others.get(tp, member) == member}
    return assigned, revoke
