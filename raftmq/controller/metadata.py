"""The read interface to cluster metadata. Brokers, the CLI and the tools read metadata
only through :class:`ClusterMetadata`; where it comes from (a static file today, a
Raft-replicated controller group later) is the controller package's business alone."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

TOPIC_NAME = re.compile(r"\A[A-Za-z0-9._-]{1,200}\Z")
r"""Valid topic names. ``\Z``, not ``$``: ``$`` also matches before a final newline, which
let "demo\n" through; callers use ``fullmatch`` all the same."""


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    id: int
    host: str
    port: int
    raft_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    replicas: tuple[tuple[int, ...], ...]  # per partition

    @property
    def partitions(self) -> int:
        return len(self.replicas)


class ClusterMetadata(Protocol):
    """What a broker knows about its cluster: read-only, and the same on every broker."""

    @property
    def name(self) -> str: ...

    @property
    def brokers(self) -> Mapping[int, BrokerSpec]: ...

    @property
    def topics(self) -> Mapping[str, TopicSpec]: ...

    def replicas(self, topic: str, partition: int) -> tuple[int, ...]:
        """The replica set of one partition, preferred leader first."""
        ...

    def preferred_leader(self, topic: str, partition: int) -> int:
        """The broker that should lead the partition when it can (the first replica)."""
        ...
