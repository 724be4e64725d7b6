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


def merge_metadata(answers: Iterable[pb.MetadataResponse]) -> ClusterView:
    view = ClusterView()
    terms: dict[tuple[str, int], int] = {}
    answers = list(answers)
    for md in answers:
        for b in md.brokers:
            view.brokers[b.id] = f"{b.host}:{b.port}"
    for md in answers:
        for t in md.topics:
            view.partitions[t.name] = max(view.partitions.get(t.name, 0), len(t.partitions))
            for p in t.partitions:
                key = (t.name, p.partition)
                address = view.brokers.get(p.leader_id)
                if p.leader_id and address and p.leader_term > terms.get(key, -1):
                    terms[key] = p.leader_term
                    view.leaders[key] = Leader(p.leader_id, address)
    return view
