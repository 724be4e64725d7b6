"""What a broker does with a topic's settings and a partition's state once the metadata
changes them: the open replicas take an altered config live, a decommissioned partition
stops taking writes, and one whose ``delete_after_ms`` passed is due for deletion.

Why here and not in the broker's metadata loop: these are rules about topics (which
settings a replica runs with, when a partition's data may go), kept in one small module
the loop calls, so the loop only decides what opens and closes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping

from raftmq.controller.model import MetadataState, Partition, PartitionState, Topic
from raftmq.controller.topic_config import LOG_FIELDS
from raftmq.log.config import LogConfig
from raftmq.partition.replica import PartitionReplica

log = logging.getLogger(__name__)


def log_config_for(defaults: LogConfig, topic: Topic) -> LogConfig:
    """The broker's defaults with the settings the topic overrides."""
    settings = topic.settings.log_config
    overridden = {
        field: getattr(settings, field) for key, field in LOG_FIELDS.items() if key in topic.config
    }
    return dataclasses.replace(defaults, **overridden)


def expired(part: Partition, now_ms: int) -> bool:
    """Whether a partition's data is due for deletion: decommissioned, and the deadline
    the controller stamped on it (as it decommissioned it) has passed on this clock."""
    return (
        part.state == PartitionState.DECOMMISSIONED
        and part.delete_after_ms is not None
        and now_ms >= part.delete_after_ms
    )


def reported_leader(state: MetadataState, topic: str, partition: int) -> tuple[int, int]:
    """(leader, term) of a partition as its leader last reported it to the controller;
    (0, 0) when none did. A broker answers Metadata with it where it knows no better:
    for a partition it hosts no replica of."""
    part = state.topics[topic].partitions[partition]
    return (part.leader or 0, part.leader_term) if part.leader else (0, 0)


def expired_replicas(
    state: MetadataState, broker_id: int, now_ms: int
) -> Iterator[tuple[str, int]]:
    """The partitions with a replica on ``broker_id`` whose data is due for deletion."""
    for name, topic in sorted(state.topics.items()):
        for p, part in enumerate(topic.partitions):
            if broker_id in part.replicas + part.learners and expired(part, now_ms):
                yield name, p


class ReplicaSettings:
    """Keeps each open replica running with its topic's current settings."""

    def __init__(self, defaults: LogConfig) -> None:
        self.defaults = defaults
        self._applied: dict[tuple[str, int], tuple[Mapping[str, str], PartitionState]] = {}

    def apply(
        self, replicas: Mapping[tuple[str, int], PartitionReplica], state: MetadataState
    ) -> int:
        """Re-configure the replicas whose topic config or partition state differ from
        what they last took (a replica opened since takes it too: harmless, as it opened
        with the same); returns how many changed. One that fails to take it is logged and
        tried again on the next version; the others go on."""
        changed: dict[str, int] = {}
        for key in [k for k in self._applied if k not in replicas]:
            del self._applied[key]
        for key, replica in replicas.items():
            topic = state.topics.get(key[0])
            if topic is None or key[1] >= len(topic.partitions):
                continue  # being deleted
            part = topic.partitions[key[1]]
            wanted = (topic.config, part.state)
            if self._applied.get(key) == wanted:
                continue
            try:
                replica.decommissioned = part.state == PartitionState.DECOMMISSIONED
                replica.reconfigure(
                    log_config_for(self.defaults, topic), topic.settings.min_insync_replicas
                )
            except Exception:
                log.exception("%s/%d: taking its topic's settings failed", *key)
                continue
            if key in self._applied:
                changed[key[0]] = changed.get(key[0], 0) + 1
            self._applied[key] = wanted
        for name, count in sorted(changed.items()):
            topic = state.topics[name]
            decommissioned = sum(p.state == PartitionState.DECOMMISSIONED for p in topic.partitions)
            log.info(
                "%s: %d replicas here now run with config %s (%d of %d partitions decommissioned)",
                name,
                count,
                dict(topic.config) or "(defaults)",
                decommissioned,
                len(topic.partitions),
            )
        return sum(changed.values())
