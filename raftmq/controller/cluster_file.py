"""The bootstrap file (TOML) a broker starts from: which nodes there are, where they listen,
and which of them are the controller quorum's voters (KRaft's ``controller.quorum.voters``).
Topics, replica sets and topic configs are not here: the controller holds them.

    cluster = "local"
    controller_voters = [1, 2, 3]   # optional; default: every listed node
    [[brokers]]
    id = 1
    host = "127.0.0.1"
    port = 9091        # client gRPC (and, on a voter, the Controller and Admin services)
    raft_port = 9191   # node-to-node Raft traffic (partitions and the metadata group)

:class:`ClusterSpec` also carries, in memory only, the topics a launcher (the local
cluster, the chaos harness) creates through the admin API once the cluster is up; a file
that lists ``[[topics]]`` is refused by the broker, with what to do instead.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.placement import round_robin


class ClusterFileError(ValueError):
    """The file is unreadable or inconsistent; the message says where and how to fix it."""


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    """A ``[[brokers]]`` entry: a node and where it listens. Only for finding the controller
    and for launchers: a running broker reads its peers from the metadata (model.Broker)."""

    id: int
    host: str
    port: int
    raft_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic a launcher creates through the admin API once its cluster is up (in memory
    only: a file listing topics is refused)."""

    name: str
    replicas: tuple[tuple[int, ...], ...]  # per partition

    @property
    def partitions(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    brokers: dict[int, BrokerSpec]
    topics: dict[str, TopicSpec] = field(default_factory=dict)
    controller_voters: tuple[int, ...] = ()
    """Empty: every node is a voter."""

    @property
    def voters(self) -> tuple[int, ...]:
        return self.controller_voters or tuple(sorted(self.brokers))


def load(path: str | Path) -> ClusterSpec:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ClusterFileError(f"there is no cluster file at {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClusterFileError(f"{path} is not valid TOML: {exc}") from None
    return parse(raw, str(path))


def parse(raw: dict, where: str = "cluster file") -> ClusterSpec:
    brokers: dict[int, BrokerSpec] = {}
    for i, b in enumerate(raw.get("brokers", [])):
        try:
            spec = BrokerSpec(int(b["id"]), str(b["host"]), int(b["port"]), int(b["raft_port"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterFileError(
                f"{where}: broker #{i + 1} needs integer id, port, raft_port and a host ({exc})"
            ) from None
        if spec.id <= 0 or spec.id in brokers:
            raise ClusterFileError(f"{where}: broker ids must be positive and unique ({spec.id})")
        brokers[spec.id] = spec
    if not brokers:
        raise ClusterFileError(f"{where}: no [[brokers]] listed")
    ids = sorted(brokers)
    topics: dict[str, TopicSpec] = {}
    for t in raw.get("topics", []):
        name = str(t.get("name", ""))
        if not TOPIC_NAME.fullmatch(name):
            raise ClusterFileError(
                f"{where}: topic name {name!r} must be 1-200 characters of A-Z a-z 0-9 . _ -"
            )
        if "replicas" in t:
            replicas = tuple(tuple(int(x) for x in r) for r in t["replicas"])
        else:
            count, factor = int(t.get("partitions", 1)), int(t.get("replication", len(ids)))
            if not 1 <= factor <= len(ids):
                raise ClusterFileError(
                    f"{where}: topic {name} asks for {factor} replicas but there are "
                    f"{len(ids)} brokers"
                )
            replicas = round_robin(ids, count, factor)
        for p, r in enumerate(replicas):
            unknown = set(r) - set(ids)
            if not r or unknown or len(set(r)) != len(r):
                raise ClusterFileError(
                    f"{where}: topic {name} partition {p} has replicas {list(r)}; they must be "
                    f"distinct broker ids among {ids}"
                )
        if not replicas:
            raise ClusterFileError(f"{where}: topic {name} needs at least one partition")
        topics[name] = TopicSpec(name, replicas)
    try:
        voters = tuple(sorted({int(v) for v in raw.get("controller_voters", [])}))
    except (TypeError, ValueError):
        raise ClusterFileError(f"{where}: controller_voters must be a list of node ids") from None
    if set(voters) - set(ids):
        raise ClusterFileError(
            f"{where}: controller_voters {list(voters)} names nodes not listed in [[brokers]] "
            f"({ids})"
        )
    return ClusterSpec(str(raw.get("cluster", "raftmq")), brokers, topics, voters)


def dump(spec: ClusterSpec) -> str:
    """TOML text for ``spec``'s nodes and voters (used by ``raftmq dev`` to write the local
    cluster's bootstrap file); its topics are not written: the controller holds them."""
    lines = [f'cluster = "{spec.name}"']
    if spec.controller_voters:
        lines.append(f"controller_voters = [{', '.join(map(str, spec.controller_voters))}]")
    lines.append("")
    for b in spec.brokers.values():
        lines += [
            "[[brokers]]",
            f"id = {b.id}",
            f'host = "{b.host}"',
            f"port = {b.port}",
            f"raft_port = {b.raft_port}",
            "",
        ]
    return "\n".join(lines)
