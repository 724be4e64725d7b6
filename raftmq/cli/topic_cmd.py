"""``raftmq topic ...``: create, list, describe, alter, grow and delete topics through the
controller's admin API (admin.proto). Any broker of the cluster will do as a bootstrap
address: a voter that does not lead the controller says which one does.

Reads print rich tables, or with ``--json`` the admin API's answer as JSON for scripts.
Errors are the controller's sentences with their code, exit status 1 (2 for bad usage).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.table import Table

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
    console,
)
from raftmq.cli.connection import client_tls
from raftmq.client import AdminClient, ClientError, LowLevelClient
from raftmq.client.admin import DelayedSummary

app = typer.Typer(
    help="Topics: create, list, describe, alter, add partitions, move replicas, delete."
)

ADMIN_ATTEMPTS = 30
"""Calls retried while the controller elects a leader (0.1 s apart, then given up)."""
T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ConfigPairs = Annotated[
    list[str] | None,
    typer.Option("--config", help="A topic setting as key=value (repeatable)."),
]


def _admin(data: Path, bootstrap: str) -> AdminClient:
    return AdminClient(cluster_addresses(data, bootstrap), attempts=ADMIN_ATTEMPTS, **client_tls())


def _call(data: Path, bootstrap: str, work: Callable[[AdminClient], T]) -> T:
    """``work`` on an admin client; a refusal or no answer is printed as a sentence."""
    try:
        with _admin(data, bootstrap) as admin:
            return work(admin)
    except ClientError as exc:
        if exc.unreachable:
            console.print(
                "[red]No broker answered. Is the cluster running? Pass --bootstrap "
                "host:port of any broker.[/]"
            )
        else:
            console.print(f"[red]{exc} ({exc.label})[/]", highlight=False)
        raise typer.Exit(1) from None


def _pairs(
    items: list[str] | None, option: str = "--config", example: str = "retention.ms=3600000"
) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            console.print(f"[red]{option} {item!r} is not key=value (e.g. {example})[/]")
            raise typer.Exit(2)
        out[key] = value
    return out


def _json(message: Message, **extra: Any) -> None:
    """``message`` as JSON, with ``extra`` keys beside its fields."""
    as_dict: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    as_dict.update(extra)
    print(json.dumps(as_dict, indent=2, sort_keys=True))


def _ids(values: Any) -> str:
    return ",".join(map(str, values)) or "-"


def _describe_table(topic: apb.TopicDescription) -> Table:
    table = Table(
        title=f"topic {topic.name} (id {topic.topic_id}, replication factor "
        f"{topic.replication_factor})"
    )
    for col in ("partition", "replicas", "learners", "leader", "high watermark", "log start"):
        table.add_column(col)
    for col in ("in sync", "state"):
        table.add_column(col)
    for p in topic.partitions:
        table.add_row(
            str(p.partition),
            _ids(p.replicas),
            _ids(p.learners),
            str(p.leader_id or "-"),
            str(p.high_watermark) if p.live else "?",
            str(p.log_start_offset) if p.live else "?",
            _in_sync(p),
            apb.PartitionState.Name(p.state).removeprefix("PARTITION_STATE_").lower(),
        )
    return table


def _in_sync(p: apb.PartitionDescription) -> str:
    """Each replica with its state as the leader sees it: ``1 2 3~`` (3 catching up),
    ``!`` failed, ``?`` unknown; the whole cell ``?`` when no leader answered."""
    if not p.live:
        return f"? ({p.live_unknown_reason})" if p.live_unknown_reason else "?"
    marks = {"in_sync": "", "catching_up": "~", "failed": "!"}
    return " ".join(f"{s.broker_id}{marks.get(s.state, '?')}" for s in p.replica_states) or "-"


def _config_table(topic: apb.TopicDescription) -> Table:
    table = Table(title="config (* set on the topic, else the default)")
    table.add_column("key")
    table.add_column("value")
    for key, value in sorted(topic.effective_config.items()):
        table.add_row(("* " if key in topic.config else "  ") + key, value)
    return table


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="The topic's name: 1-200 of A-Z a-z 0-9 . _ -")],
    partitions: Annotated[int, typer.Option(min=1, help="How many partitions.")] = 1,
    replication_factor: Annotated[
        int, typer.Option(min=1, help="Replicas per partition, on distinct brokers.")
    ] = 3,
    config: ConfigPairs = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Create a topic; the controller places its replicas over the alive brokers."""
    settings = _pairs(config)
    created = _call(
        data,
        bootstrap,
        lambda a: a.create_topic(name, partitions, replication_factor, settings),
    )
    console.print(
        f"Created topic {name} with {partitions} partitions of {replication_factor} "
        f"replicas (metadata version {created.metadata_version}).",
        highlight=False,
    )


@app.command("list")
def list_topics(
    internal: Annotated[
        bool, typer.Option("--internal", help="Show internal topics too (__delay).")
    ] = False,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Every topic, with its partition count and replication factor."""
    answer = _call(data, bootstrap, lambda a: a.list_topics())
    if not internal:
        shown = [t for t in answer.topics if not t.name.startswith("__")]
        del answer.topics[:]
        answer.topics.extend(shown)
    if json_out:
        _json(answer)
        return
    table = Table(title=f"topics (metadata version {answer.metadata_version})")
    for col in ("name", "id", "partitions", "replication factor", "config set"):
        table.add_column(col)
    for t in answer.topics:
        overrides = ", ".join(f"{k}={v}" for k, v in sorted(t.config.items())) or "-"
        table.add_row(
            t.name, str(t.topic_id), str(len(t.partitions)), str(t.replication_factor), overrides
        )
    console.print(table)


@app.command()
def describe(
    name: Annotated[str, typer.Argument(help="The topic.")],
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """A topic's partitions (replicas, learners, leader, high watermark, log start, each
    replica in sync or not: ``~`` catching up, ``!`` failed, ``?`` unknown, as the
    partition's leader sees it; ``?`` where no leader answered) and its config with
    defaults filled in."""
    topic = _call(data, bootstrap, lambda a: a.describe_topic(name))
    delayed = _call(data, bootstrap, lambda a: a.describe_delayed(name))
    if json_out:
        _json(topic, delayed=dataclasses.asdict(delayed))
        return
    console.print(_describe_table(topic))
    console.print(_config_table(topic))
    console.print(_delayed_line(delayed), highlight=False)


def _delayed_line(delayed: DelayedSummary) -> str:
    """Pending delayed messages and when the next is due (docs/delayed-delivery.md)."""
    count = f"{delayed.pending}" if delayed.complete else f"at least {delayed.pending}"
    if delayed.next_due_ms < 0:
        return f"delayed messages pending: {count}"
    due = datetime.datetime.fromtimestamp(delayed.next_due_ms / 1000, datetime.UTC)
    return (
        f"delayed messages pending: {count}; next due {due.isoformat(timespec='milliseconds')} "
        f"({delayed.next_due_ms} ms since the epoch)"
    )


@app.command()
def alter(
    name: Annotated[str, typer.Argument(help="The topic.")],
    config: ConfigPairs = None,
    reset: Annotated[
        list[str] | None, typer.Option("--reset", help="A key back to its default (repeatable).")
    ] = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Set or reset topic settings. Brokers apply them to replicas they open from then on
    (a replica already open keeps its settings until its broker restarts)."""
    settings = _pairs(config)
    if not settings and not reset:
        console.print("[red]Give at least one --config key=value or --reset key.[/]")
        raise typer.Exit(2)
    done = _call(data, bootstrap, lambda a: a.alter_topic_config(name, settings, reset or []))
    console.print(f"Altered {name} (metadata version {done.metadata_version}).", highlight=False)


@app.command("add-partitions")
def add_partitions(
    name: Annotated[str, typer.Argument(help="The topic.")],
    count: Annotated[int, typer.Option(min=1, help="The partition count in all, after.")],
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Grow a topic to COUNT partitions; existing partitions and their data stay put."""
    added = _call(data, bootstrap, lambda a: a.add_partitions(name, count))
    console.print(
        f"{name} now has {len(added.topic.partitions)} partitions "
        f"(metadata version {added.metadata_version}).",
        highlight=False,
    )


@app.command()
def delete(
    name: Annotated[str, typer.Argument(help="The topic.")],
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Delete a topic: every broker removes its replicas' data, also one that is down now
    (when it comes back)."""
    done = _call(data, bootstrap, lambda a: a.delete_topic(name))
    console.print(f"Deleted {name} (metadata version {done.metadata_version}).", highlight=False)


MOVE_POLL_S = 0.5


def learner_progress(client: LowLevelClient, topic: str, partition: int, learner: int) -> str:
    """How far the learner is, as the partition's leader sees it (", it holds entries up
    to X of the commit at Y"), or nothing when no leader answers."""
    try:
        leader = client.refresh_leaders(timeout=1.0).get((topic, partition))
        if leader is None:
            return ""
        md = client.stub(leader.address).Metadata(pb.MetadataRequest(topics=[topic]), timeout=2)
    except (ClientError, grpc.RpcError):
        return ""
    for t in md.topics:
        for p in t.partitions:
            for r in p.replica_status if p.partition == partition else ():
                if r.broker_id == learner:
                    return f", leader {leader.broker_id}: " + (r.reason or "caught up")
    return f", leader {leader.broker_id}: not sending to it yet"


@app.command("move-replica")
def move_replica(
    name: Annotated[str, typer.Argument(help="The topic.")],
    partition: Annotated[int, typer.Option("--partition", min=0, help="The partition.")],
    from_broker: Annotated[
        int, typer.Option("--from", help="The broker whose replica moves away (may be down).")
    ],
    to_broker: Annotated[int, typer.Option("--to", help="The broker that takes it.")],
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Return once the move is recorded.")
    ] = False,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for the move to finish.")
    ] = 600.0,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Move one replica of a partition to another broker: the new replica copies the log
    as a learner, votes in the old one's place once caught up, and the old one's data is
    deleted. Waits, showing progress, until the move is done (or --no-wait)."""
    started = _call(
        data, bootstrap, lambda a: a.move_replica(name, partition, from_broker, to_broker)
    )
    what = f"{name}/{partition} from broker {from_broker} to broker {to_broker}"
    console.print(f"Moving {what} (metadata version {started.metadata_version}).", highlight=False)
    if no_wait:
        return
    deadline = time.monotonic() + timeout
    leaders = LowLevelClient(cluster_addresses(data, bootstrap), retries=1, **client_tls())
    with leaders, console.status(f"broker {to_broker} copies the log as a learner...") as status:
        while True:
            topic = _call(data, bootstrap, lambda a: a.describe_topic(name))
            part = topic.partitions[partition]
            if to_broker not in part.learners:
                break
            if time.monotonic() > deadline:
                console.print(
                    f"[red]The move of {what} is still under way after {timeout:.0f} s "
                    f"(learners {_ids(part.learners)}); it goes on: see 'raftmq topic "
                    f"describe {name}'.[/]",
                    highlight=False,
                )
                raise typer.Exit(1)
            progress = learner_progress(leaders, name, partition, to_broker)
            status.update(
                f"broker {to_broker} copies the log as a learner{progress} (replicas "
                f"{_ids(part.replicas)})..."
            )
            time.sleep(MOVE_POLL_S)
    if to_broker in part.replicas:
        console.print(f"Moved {what}: replicas now {_ids(part.replicas)}.", highlight=False)
        return
    console.print(
        f"[red]The move of {what} was given up (replicas {_ids(part.replicas)}).[/]",
        highlight=False,
    )
    raise typer.Exit(1)
