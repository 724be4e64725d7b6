"""What clients know of the cluster, merged from the Metadata answers of several brokers.

Each broker knows the leaders of the partitions it hosts best, so a client asks more than
one and keeps, per partition, the leader reported with the highest Raft term. One merge
for every client (the low-level client, the producer), so they cannot disagree about who
leads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.api.v1 import broker_pb2 as pb


@dataclass(frozen=True, slots=True)
class Leader:
    broker_id: int
    address: str


@dataclass(slots=True)
class ClusterView:
    brokers: dict[int, str] = field(default_factory=dict)
    """Broker id: its client address host:port."""
    partitions: dict[str, int] = field(default_factory=dict)
    """Topic: its partition count."""
    leaders: dict[tuple[str, int], Leader] = field(default_factory=dict)
    racks: dict[int, str] = field(default_factory=dict)
    """Broker id: its rack, for the brokers that have one."""
    in_sync: dict[tuple[str, int], frozenset[int]] = field(default_factory=dict)
    """The in-sync replicas of each partition, as its leader reported them."""
    replicas: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)

    def rack_follower(self, topic: str, partition: int, rack: str) -> int | None:
        """The broker id of the partition's replica in ``rack`` when it is not the
        leader's, in sync or not; None when the leader is there, or no replica is.
        Placement puts no two replicas of a partition in one rack: at most one is."""
        key = (topic, partition)
        leader = self.leaders.get(key)
        for broker_id in self.replicas.get(key, ()):
            if self.racks.get(broker_id) == rack:
                return None if leader is not None and broker_id == leader.broker_id else broker_id
        return None

    def closest_replica(self, topic: str, partition: int, rack: str) -> Leader | None:
        """The follower of the partition in ``rack`` to read from (KIP-392) when its
        leader counts it in sync, else None: read from the leader then."""
        broker_id = self.rack_follower(topic, partition, rack)
        if broker_id is None or broker_id not in self.in_sync.get((topic, partition), ()):
            return None
        address = self.brokers.get(broker_id)
        return None if address is None else Leader(broker_id, address)


def merge_metadata(answers: Iterable[pb.MetadataResponse]) -> ClusterView:
    view = ClusterView()
    terms: dict[tuple[str, int], int] = {}
    reported: dict[tuple[str, int], tuple[int, frozenset[int]]] = {}
    answers = list(answers)
    for md in answers:
        for b in md.brokers:
            view.brokers[b.id] = f"{b.host}:{b.port}"
            if b.rack:
                view.racks[b.id] = b.rack
    for md in answers:
        for t in md.topics:
            view.partitions[t.name] = max(view.partitions.get(t.name, 0), len(t.partitions))
            for p in t.partitions:
                key = (t.name, p.partition)
                view.replicas.setdefault(key, tuple(p.replicas))
                address = view.brokers.get(p.leader_id)
                if p.leader_id and address and p.leader_term > terms.get(key, -1):
                    terms[key] = p.leader_term
                    view.leaders[key] = Leader(p.leader_id, address)
                if md.broker_id == p.leader_id:  # the leader's own answer
                    reported[key] = (p.leader_term, frozenset(p.in_sync_replicas))
    for key, (term, in_sync) in reported.items():
        if terms.get(key) == term:
            view.in_sync[key] = in_sync
    return view
