"""The controller's metadata behind the read interface brokers already use
(:class:`~raftmq.controller.metadata.ClusterMetadata`), so switching a broker from the
static cluster file to the controller changes where its metadata comes from, not how it
reads it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from raftmq.controller.metadata import BrokerSpec, TopicSpec
from raftmq.controller.model import MetadataState


class ControllerMetadata:
    """One version of the metadata, read-only. Brokers are listed whatever their state
    (a fenced broker's replicas still need its address); a topic's replicas per
    partition are the voting ones, preferred leader first, decommissioned partitions
    included (they stay readable until deleted)."""

    def __init__(self, state: MetadataState) -> None:
        self.state = state
        self._brokers = MappingProxyType(
            {
                b.id: BrokerSpec(b.id, b.host, b.port, b.raft_port)
                for _, b in sorted(state.brokers.items())
            }
        )
        self._topics = MappingProxyType(
            {
                t.name: TopicSpec(t.name, tuple(p.replicas for p in t.partitions))
                for _, t in sorted(state.topics.items())
            }
        )

    @property
    def name(self) -> str:
        return self.state.cluster_name

    @property
    def version(self) -> int:
        return self.state.version

    @property
    def brokers(self) -> Mapping[int, BrokerSpec]:
        return self._brokers

    @property
    def topics(self) -> Mapping[str, TopicSpec]:
        return self._topics

    def replicas(self, topic: str, partition: int) -> tuple[int, ...]:
        return self.state.topics[topic].partitions[partition].replicas

    def preferred_leader(self, topic: str, partition: int) -> int:
        return self.state.topics[topic].partitions[partition].preferred_leader
