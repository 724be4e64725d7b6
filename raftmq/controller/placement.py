"""Where a topic's partitions get their replicas: written once, here.

:func:`plan` is the controller's placement (rack-aware, load-aware, preferred leaders
balanced); :func:`round_robin` stays for the static cluster file, the local cluster
launcher and the chaos harness until brokers take their topics from the controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """A broker that may take new replicas (alive: not fenced, not draining)."""

    broker_id: int
    rack: str | None = None


def plan(
    candidates: Sequence[Candidate],
    partitions: int,
    factor: int,
    *,
    replica_load: Mapping[int, int] | None = None,
    leader_load: Mapping[int, int] | None = None,
    first_partition: int = 0,
    even_out: bool = True,
) -> tuple[tuple[int, ...], ...]:
    """Replica lists (preferred leader first) for ``partitions`` new partitions of
    ``factor`` replicas each, over ``candidates``.

    Rules, in order of precedence:
    - no broker twice in one partition;
    - spread over as many racks as possible (none twice when there are at least
      ``factor`` racks; a broker without a rack counts as a rack of its own);
    - the fewest replicas, and for the preferred leader the fewest preferred
      leaderships, counting the cluster's existing ``replica_load`` and ``leader_load``
      (per broker id; missing ids count as zero).

    Greedy, partition by partition: the leader is the candidate leading least (then
    holding fewest replicas, then on the least-loaded rack); each follower the candidate
    on the least-used rack holding fewest replicas, then on the least-loaded rack, and
    among equals the one leading MOST: one that leads less will likely take a leadership,
    and so a replica, later. On a fresh cluster this keeps preferred leaderships within
    one of each other across brokers, and replicas too when there are no racks or every
    rack has as many brokers (the property tests check both); uneven racks make uneven
    replica counts, since rack spread comes first. New load goes to the least-loaded
    brokers first. A last pass (:func:`_even_out`) moves followers from the fullest
    brokers to the emptiest where the greedy one could not see a leadership coming.

    Deterministic: ties go by broker id, rotated with the partition index
    (``first_partition`` + i), so equal inputs give equal plans on every replica.
    """
    ids = sorted({c.broker_id for c in candidates})
    assert len(ids) == len(candidates), "a broker is listed twice"
    assert 1 <= factor <= len(ids), (factor, ids)
    assert partitions >= 0, partitions
    rack = {c.broker_id: rack_key(c.broker_id, c.rack) for c in candidates}
    replicas = {b: (replica_load or {}).get(b, 0) for b in ids}
    leaders = {b: (leader_load or {}).get(b, 0) for b in ids}
    on_rack: dict[str, int] = {}  # replicas per rack
    for b in ids:
        on_rack[rack[b]] = on_rack.get(rack[b], 0) + replicas[b]
    n = len(ids)
    out: list[tuple[int, ...]] = []
    for i in range(partitions):
        p = first_partition + i
        turn = {b: (k - p) % n for k, b in enumerate(ids)}
        chosen = [min(ids, key=lambda b: (leaders[b], replicas[b], on_rack[rack[b]], turn[b]))]
        used_racks = {rack[chosen[0]]: 1}
        while len(chosen) < factor:
            follower = _follower(
                (b for b in ids if b not in chosen),
                used_racks,
                rack,
                replicas,
                on_rack,
                leaders,
                turn,
            )
            chosen.append(follower)
            used_racks[rack[follower]] = used_racks.get(rack[follower], 0) + 1
        leaders[chosen[0]] += 1
        for b in chosen:
            replicas[b] += 1
            on_rack[rack[b]] += 1
        out.append(tuple(chosen))
    if even_out:  # False: as entries proposed before this pass existed were applied
        _even_out(out, ids, rack, replicas)
    return tuple(out)


def _even_out(
    out: list[tuple[int, ...]], ids: list[int], rack: Mapping[int, str], replicas: dict[int, int]
) -> None:
    """Move followers of the new partitions ``out`` from the brokers holding most replicas
    to those holding fewest, until they are within one or no move keeps every partition's
    rack spread (the follower's rack stays, or goes to a rack the partition lacks).

    Why: the greedy pass cannot see leaderships it hands out later, so a broker can take a
    follower early and a leadership after (8 brokers in 4 racks, 8 partitions of 2: 3
    replicas against 1). Preferred leaders are never moved, so theirs stay balanced."""
    while True:
        low = min(replicas[b] for b in ids)
        high = max(replicas[b] for b in ids)
        if high - low <= 1:
            return
        if not _move_one(out, ids, rack, replicas, low, high):
            return


def _move_one(
    out: list[tuple[int, ...]],
    ids: list[int],
    rack: Mapping[int, str],
    replicas: dict[int, int],
    low: int,
    high: int,
) -> bool:
    takers = [b for b in ids if replicas[b] == low]
    for i, chosen in enumerate(out):
        for k in range(1, len(chosen)):
            giver = chosen[k]
            if replicas[giver] != high:
                continue
            racks = {rack[b] for j, b in enumerate(chosen) if j != k}
            for taker in takers:
                if taker in chosen:
                    continue
                if rack[taker] != rack[giver] and rack[taker] in racks:
                    continue
                out[i] = (*chosen[:k], taker, *chosen[k + 1 :])
                replicas[giver] -= 1
                replicas[taker] += 1
                return True
    return False


def _follower(
    choices: Iterable[int],
    used_racks: Mapping[str, int],
    rack: Mapping[int, str],
    replicas: Mapping[int, int],
    on_rack: Mapping[str, int],
    leaders: Mapping[int, int],
    turn: Mapping[int, int],
) -> int:
    """The follower rule of :func:`plan`, shared with :func:`replacement`: the least-used
    rack in the partition, then the fewest replicas, then the least-loaded rack, then the
    broker leading most, then the rotation."""
    return min(
        choices,
        key=lambda b: (
            used_racks.get(rack[b], 0),
            replicas[b],
            on_rack[rack[b]],
            -leaders[b],
            turn[b],
        ),
    )


def rack_key(broker_id: int, rack: str | None) -> str:
    """A broker's rack for spreading; a broker without one counts as a rack of its own."""
    return rack if rack is not None else f"\0{broker_id}"


def replacement(
    candidates: Sequence[Candidate],
    keep: Mapping[int, str | None],
    *,
    replica_load: Mapping[int, int],
    leader_load: Mapping[int, int] | None = None,
    partition: int = 0,
) -> int | None:
    """The broker to take one replica of a partition whose other replicas (those that
    stay) are ``keep`` (broker id -> rack), by the same rule as a new partition's
    followers in :func:`plan`; None when every candidate holds the partition already.
    Used by healing, drains and rebalancing (controller/healing.py)."""
    ids = sorted(c.broker_id for c in candidates if c.broker_id not in keep)
    if not ids:
        return None
    rack = {c.broker_id: rack_key(c.broker_id, c.rack) for c in candidates}
    on_rack: dict[str, int] = {}
    for c in candidates:
        on_rack[rack[c.broker_id]] = on_rack.get(rack[c.broker_id], 0) + replica_load.get(
            c.broker_id, 0
        )
    used_racks: dict[str, int] = {}
    for b, r in keep.items():
        used_racks[rack_key(b, r)] = used_racks.get(rack_key(b, r), 0) + 1
    n = len(ids)
    turn = {b: (k - partition) % n for k, b in enumerate(ids)}
    loads = {b: replica_load.get(b, 0) for b in ids}
    leads = {b: (leader_load or {}).get(b, 0) for b in ids}
    return _follower(ids, used_racks, rack, loads, on_rack, leads, turn)


def round_robin(
    broker_ids: Sequence[int], partitions: int, replication: int
) -> tuple[tuple[int, ...], ...]:
    """Replica lists for ``partitions`` partitions, ``replication`` brokers each, placed
    round-robin over ``broker_ids`` (sorted by the caller). The first broker of each list
    (the preferred leader) rotates with the partition, so leaders spread evenly."""
    assert 1 <= replication <= len(broker_ids), (replication, broker_ids)
    n = len(broker_ids)
    return tuple(
        tuple(broker_ids[(p + k) % n] for k in range(replication)) for p in range(partitions)
    )
