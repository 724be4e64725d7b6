"""``raftmq status``: ask every broker of a cluster for Metadata and grpc health, and show in
one table which broker serves, who leads each partition, and how each replica is doing.

Why every broker: each one knows only its own replicas (the only report that can say a
replica FAILED) and, where it leads, its followers' progress; no single answer is the whole
picture. Exit status 1 when a replica failed or a partition has no leader, so scripts and
supervisors can use it as a check.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Annotated

import grpc
import typer
from rich.table import Table

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
    console,
)
from raftmq.cli.connection import client_tls
from raftmq.client import ClientError, LowLevelClient
from raftmq.client.errors import error_of

RPC_TIMEOUT_S = 3.0
STATE_NAMES = {
    # ReplicaState (broker.proto) as status and the other read commands print it
    pb.REPLICA_OK: "ok",
    pb.REPLICA_CATCHING_UP: "catching_up",
    pb.REPLICA_FAILED: "failed",
    pb.REPLICA_OPENING: "opening",
}
_STATE_STYLE = {
    "ok": "green",
    "catching_up": "yellow",
    "opening": "red",
    "failed": "red",
    "unknown": "dim",
}
_OWN_WORD = frozenset({pb.REPLICA_FAILED, pb.REPLICA_OPENING})
"""States only a replica's own broker can know, so its own report wins over the leader's
view (a leader sees a follower that cannot open only as one that does not answer)."""


@dataclass
class BrokerHealth:
    id: int
    address: str
    health: str
    """SERVING, NOT_SERVING, or UNREACHABLE (it answered neither health nor Metadata)."""
    error: str = ""


@dataclass
class ReplicaHealth:
    broker_id: int
    state: str
    """ok, catching_up, opening (assigned, not open yet: opening or being repaired),
    failed, or unknown (its broker did not answer)."""
    reason: str = ""


@dataclass
class PartitionHealth:
    topic: str
    partition: int
    leader: int | None
    term: int
    high_watermark: int
    replicas: list[ReplicaHealth] = field(default_factory=list)


@dataclass
class ClusterHealth:
    cluster: str
    brokers: list[BrokerHealth]
    partitions: list[PartitionHealth]
    problems: list[str]
    """What makes the status fail (exit 1): failed or unopened replicas, partitions without
    a leader."""
    warnings: list[str]
    """What an operator should know but does not fail it: brokers not serving."""

    @property
    def ok(self) -> bool:
        return not self.problems


def collect(client: LowLevelClient) -> ClusterHealth:
    """Metadata and health from every broker the bootstrap brokers name, merged."""
    answers: dict[int, pb.MetadataResponse] = {}
    first = client.metadata(timeout=RPC_TIMEOUT_S)
    brokers = []
    for b in sorted(first.brokers, key=lambda b: b.id):
        address = f"{b.host}:{b.port}"
        entry = BrokerHealth(b.id, address, "UNREACHABLE")
        try:
            answers[b.id] = client.stub(address).Metadata(
                pb.MetadataRequest(), timeout=RPC_TIMEOUT_S
            )
            entry.health = client.health(address, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            entry.error = str(error_of(exc))
        brokers.append(entry)
    partitions = [_merge(t.name, p, answers) for t in first.topics for p in t.partitions]
    warnings = [
        f"Broker {b.id} at {b.address} is {b.health}" + (f": {b.error}" if b.error else ".")
        for b in brokers
        if b.health != "SERVING"
    ]
    return ClusterHealth(first.cluster, brokers, partitions, _problems(partitions), warnings)


def _merge(
    topic: str, info: pb.PartitionInfo, answers: dict[int, pb.MetadataResponse]
) -> PartitionHealth:
    """One partition as the brokers see it: the leader of the highest term any broker
    reports, with the high watermark it reports; each replica's state from its own broker
    when that says FAILED (only it can know), else from the leader's view of its
    followers, else from its own broker."""
    seen = {
        broker_id: p
        for broker_id, md in answers.items()
        for t in md.topics
        if t.name == topic
        for p in t.partitions
        if p.partition == info.partition
    }
    led = [p for p in seen.values() if p.leader_id in answers]
    best = max(led, key=lambda p: p.leader_term, default=None)
    leader = best.leader_id if best is not None else None
    hw = max((p.high_watermark for p in seen.values()), default=-1)
    if leader is not None and leader in seen:
        hw = seen[leader].high_watermark
    own = {b: rs for b, p in seen.items() for rs in p.replica_status if rs.broker_id == b}
    by_leader = {rs.broker_id: rs for rs in seen[leader].replica_status} if leader in seen else {}
    replicas = []
    for broker_id in info.replicas:
        mine, leaders = own.get(broker_id), by_leader.get(broker_id)
        own_word = mine is not None and mine.state in _OWN_WORD
        chosen = mine if own_word or leaders is None else leaders
        if chosen is None:
            replicas.append(ReplicaHealth(broker_id, "unknown", "its broker did not answer"))
        else:
            state = STATE_NAMES.get(chosen.state, "unknown")
            replicas.append(ReplicaHealth(broker_id, state, chosen.reason))
    term = best.leader_term if best is not None else 0
    return PartitionHealth(topic, info.partition, leader, term, hw, replicas)


def _problems(partitions: list[PartitionHealth]) -> list[str]:
    problems = [
        f"Partition {p.topic}/{p.partition} has no leader." for p in partitions if p.leader is None
    ]
    problems += [
        f"The replica of {p.topic}/{p.partition} on broker {r.broker_id} failed: {r.reason}"
        for p in partitions
        for r in p.replicas
        if r.state == "failed"
    ]
    problems += [
        f"The replica of {p.topic}/{p.partition} on broker {r.broker_id} is not open: {r.reason}"
        for p in partitions
        for r in p.replicas
        if r.state == "opening"
    ]
    return problems


def render(health: ClusterHealth) -> None:
    table = Table(title=f"brokers of cluster '{health.cluster}'")
    for col in ("broker", "address", "health"):
        table.add_column(col)
    for b in health.brokers:
        style = "green" if b.health == "SERVING" else "red"
        text = b.health + (f" ({b.error})" if b.error else "")
        table.add_row(str(b.id), b.address, f"[{style}]{text}[/]")
    console.print(table)
    table = Table(title="partitions")
    for col in ("partition", "leader", "term", "high watermark", "replicas"):
        table.add_column(col)
    for p in health.partitions:
        cells = []
        for r in p.replicas:
            text = f"{r.broker_id}: {r.state}" + (f" ({r.reason})" if r.reason else "")
            cells.append(f"[{_STATE_STYLE.get(r.state, 'dim')}]{text}[/]")
        table.add_row(
            f"{p.topic}/{p.partition}",
            str(p.leader) if p.leader is not None else "[red]none[/]",
            str(p.term),
            str(p.high_watermark),
            "\n".join(cells),
        )
    console.print(table, highlight=False)
    if health.ok:
        count = sum(len(p.replicas) for p in health.partitions)
        console.print(
            f"[green]Every partition has a leader and all of its {count} replicas are open; "
            "none failed.[/]"
        )
    for warning in health.warnings:
        console.print(f"[yellow]{warning}[/]", highlight=False)
    for problem in health.problems:
        console.print(f"[red]{problem}[/]", highlight=False)


def status(
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the status as JSON instead of tables.")
    ] = False,
) -> None:
    """Show each broker's health and each partition's leader, term, high watermark and
    replicas (ok, catching up, opening, or failed and why). Exits 1 if a replica failed or
    is not open, or a partition has no leader."""
    addresses = cluster_addresses(data, bootstrap)
    with LowLevelClient(addresses, **client_tls()) as client:
        try:
            if not as_json:
                console.print(f"Asking the brokers at {', '.join(addresses)} how they are...")
            health = collect(client)
        except ClientError as exc:  # no broker answered: say so in a sentence
            message = (
                f"None of the brokers at {', '.join(addresses)} answered; is the cluster "
                f"running? ({exc})"
            )
            if as_json:
                print(json.dumps({"ok": False, "problems": [message]}))
                raise typer.Exit(1) from None
            console.print(f"[red]{message}[/]", highlight=False)
            raise typer.Exit(1) from None
    if as_json:
        print(json.dumps({**asdict(health), "ok": health.ok}, indent=2))
    else:
        render(health)
    if not health.ok:
        raise typer.Exit(1)


__all__ = ["STATE_NAMES", "ClusterHealth", "collect", "status"]
