"""``raftmq group ...``: list, describe, reset the offsets of, and delete consumer groups,
through the controller's Groups API (groups.proto) on the admin client's routing. Any
broker of the cluster will do as a bootstrap address.

``describe`` shows, per partition, the committed offset (and the metadata committed with
it, when there is some) beside the log end (the high watermark, asked of the partition's
leader with ListOffsets) and the lag between them: how far the group is behind. Reads
print rich tables, or with ``--json`` JSON for scripts; errors are the controller's
sentences with their code, exit status 1 (2 for bad usage).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
    console,
)
from raftmq.cli.connection import client_tls
from raftmq.cli.topic_cmd import JsonFlag, _call, _json
from raftmq.client import AdminClient, ClientError, LowLevelClient

app = typer.Typer(
    help="Consumer groups: list, describe (members, assignments, committed offsets and lag), "
    "reset offsets, delete."
)

METADATA_CELL_CHARS = 40
"""How much of a committed offset's metadata the table shows (--json has all of it)."""
GroupArg = Annotated[str, typer.Argument(help="The consumer group's id.")]
ToEarliest = Annotated[
    bool, typer.Option("--to-earliest", help="To the log start: consume everything kept.")
]
ToLatest = Annotated[
    bool, typer.Option("--to-latest", help="To the log end: skip what is there now.")
]
ToOffset = Annotated[
    int | None,
    typer.Option(
        "--to-offset",
        min=0,
        help="To this offset (clamped to the log start and end of each partition).",
    ),
]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    topic: str
    partition: int
    member_id: str
    """The member assigned the partition ("" for none)."""
    committed_offset: int
    """-1 when the group committed none."""
    log_end_offset: int
    """-1 when the partition's leader did not answer."""
    lag: int
    """log end - committed (the whole log end without a commit); -1 when unknown."""
    metadata: str = ""
    """The text committed with the offset (Consumer.commit with OffsetAndMetadata)."""


def _tps(listed: Any) -> list[tuple[str, int]]:
    return [(tp.topic, p) for tp in listed for p in tp.partitions]


def _short(listed: Any) -> str:
    return " ".join(f"{tp.topic}:{','.join(map(str, tp.partitions))}" for tp in listed) or "-"


def _log_end(client: LowLevelClient, topic: str, partition: int) -> int:
    try:
        return client.list_offsets(topic, partition, position=pb.LATEST).high_watermark
    except ClientError:
        return -1


def partition_lags(described: gpb.GroupDescription, client: LowLevelClient) -> list[PartitionLag]:
    """Every partition the group holds or committed, with its lag."""
    owner = {tp: m.member_id for m in described.members for tp in _tps(m.assigned)}
    committed = {(o.topic, o.partition): o for o in described.offsets}
    out = []
    for tp in sorted({*owner, *committed}):
        end = _log_end(client, *tp)
        c = committed.get(tp)
        offset = c.offset if c is not None else -1
        lag = -1 if end < 0 else max(0, end - max(offset, 0))
        meta = c.metadata if c is not None else ""
        out.append(PartitionLag(*tp, owner.get(tp, ""), offset, end, lag, meta))
    return out


@app.command("list")
def list_groups(
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Every consumer group: its state (empty, stable, or reconciling while partitions
    move between members), member count and group epoch."""
    answer = _call(data, bootstrap, lambda a: a.list_groups())
    if json_out:
        _json(answer)
        return
    if not answer.groups:
        console.print("No consumer groups.")
        return
    table = Table(title="consumer groups")
    for col in ("group", "state", "members", "epoch"):
        table.add_column(col)
    for g in answer.groups:
        table.add_row(g.group_id, g.state, str(g.member_count), str(g.group_epoch))
    console.print(table)


@app.command()
def describe(
    group: GroupArg,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """A group's members (epoch, subscriptions, assigned and target partitions, seconds
    since the coordinator last heard them) and, per partition, the member consuming it,
    the committed offset, the log end offset and the lag between them."""
    described = _call(data, bootstrap, lambda a: a.describe_group(group))
    with LowLevelClient(cluster_addresses(data, bootstrap), retries=10, **client_tls()) as client:
        lags = partition_lags(described, client)
    if json_out:
        _json(described, partitions=[asdict(p) for p in lags])
        return
    members = Table(
        title=f"group {described.group_id}: {described.state}, epoch {described.group_epoch}, "
        f"assignor {described.assignor}"
    )
    for col in ("member", "instance", "epoch", "subscribed", "assigned", "target", "heard"):
        members.add_column(col)
    for m in described.members:
        age = m.last_heartbeat_age_ms
        members.add_row(
            m.member_id,
            m.instance_id or "-",
            str(m.member_epoch),
            ",".join(m.subscriptions),
            _short(m.assigned),
            _short(m.target),
            f"{age / 1000:.1f} s ago" if age >= 0 else "not yet",
        )
    console.print(members if described.members else "No members.")
    table = Table(title="partitions (lag: log end - committed)")
    with_metadata = any(p.metadata for p in lags)
    for col in ("topic", "partition", "member", "committed", "log end", "lag"):
        table.add_column(col)
    if with_metadata:
        # cut to one short line here (--json has it whole)
        table.add_column(
            "metadata", overflow="ellipsis", no_wrap=True, max_width=METADATA_CELL_CHARS
        )
    for p in lags:
        row = [
            p.topic,
            str(p.partition),
            p.member_id or "-",
            str(p.committed_offset) if p.committed_offset >= 0 else "-",
            str(p.log_end_offset) if p.log_end_offset >= 0 else "?",
            str(p.lag) if p.lag >= 0 else "?",
        ]
        if with_metadata:
            row.append(p.metadata or "-")
        table.add_row(*row)
    console.print(table)


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 date/time (UTC unless it names a zone)."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither milliseconds since the epoch nor an ISO date/time such as "
            "2026-01-31T12:00:00"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _targets(
    client: LowLevelClient,
    topic: str,
    partitions: list[int],
    to_offset: int | None,
    to_earliest: bool,
    to_latest: bool,
    to_time_ms: int | None,
) -> dict[tuple[str, int], int]:
    out = {}
    for p in partitions:
        if to_time_ms is not None:
            out[topic, p] = client.list_offsets(topic, p, timestamp_ms=to_time_ms).offset
            continue
        ends = client.list_offsets(topic, p, position=pb.LATEST)
        if to_earliest:
            out[topic, p] = ends.log_start_offset
        elif to_latest:
            out[topic, p] = ends.high_watermark
        else:
            assert to_offset is not None
            # As Kafka's tool does: an offset outside the log is clamped to its ends.
            out[topic, p] = min(max(to_offset, ends.log_start_offset), ends.high_watermark)
    return out


@app.command("reset-offsets")
def reset_offsets(
    group: GroupArg,
    topic: Annotated[str, typer.Option("--topic", help="The topic whose offsets to reset.")],
    partition: Annotated[
        list[int] | None,
        typer.Option("--partition", min=0, help="Only this partition (repeatable); else all."),
    ] = None,
    to_earliest: ToEarliest = False,
    to_latest: ToLatest = False,
    to_offset: ToOffset = None,
    to_timestamp: Annotated[
        str | None,
        typer.Option(
            "--to-timestamp",
            help="To the first record at or after this time: milliseconds since the epoch, "
            "or an ISO date/time (UTC unless it names a zone).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Reset even while the group has members (their next commits overwrite it).",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the new offsets, change nothing.")
    ] = False,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Set a group's committed offsets of a topic, so its consumers start there next time:
    to the earliest or latest offset, a given offset, or a time. Refused while the group
    has members unless --force; --dry-run shows the change without making it."""
    chosen = [to_earliest, to_latest, to_offset is not None, to_timestamp is not None]
    if sum(chosen) != 1:
        console.print(
            "[red]Say where to: exactly one of --to-earliest, --to-latest, --to-offset N, "
            "--to-timestamp TIME.[/]"
        )
        raise typer.Exit(2)
    time_ms = parse_time_ms(to_timestamp) if to_timestamp is not None else None

    def plan(admin: AdminClient) -> tuple[dict[tuple[str, int], int], dict, int]:
        count = len(admin.describe_topic(topic).partitions)
        wanted = sorted(set(partition)) if partition else list(range(count))
        missing = [p for p in wanted if p >= count]
        if missing:
            console.print(
                f"[red]Topic {topic} has partitions 0-{count - 1}; there is no partition "
                f"{missing[0]}.[/]"
            )
            raise typer.Exit(1)
        try:
            described = admin.describe_group(group)
        except ClientError as exc:
            if exc.code != pb.ERROR_CODE_UNKNOWN_GROUP:
                raise
            described = gpb.GroupDescription(group_id=group)
        before = {(o.topic, o.partition): o.offset for o in described.offsets}
        with LowLevelClient(
            cluster_addresses(data, bootstrap), retries=10, **client_tls()
        ) as client:
            targets = _targets(client, topic, wanted, to_offset, to_earliest, to_latest, time_ms)
        return targets, before, len(described.members)

    targets, before, members = _call(data, bootstrap, plan)
    if members and not force and not dry_run:
        console.print(
            f"[red]Group {group} has {members} active members, whose next commits would "
            "overwrite the reset. Stop its consumers first, or pass --force.[/]"
        )
        raise typer.Exit(1)
    if not dry_run:
        done = _call(data, bootstrap, lambda a: a.reset_group_offsets(group, targets, force=force))
    rows = [
        {"topic": t, "partition": p, "before": before.get((t, p), -1), "after": o}
        for (t, p), o in sorted(targets.items())
    ]
    if json_out:
        print(json.dumps({"group": group, "dry_run": dry_run, "offsets": rows}, indent=2))
        return
    verb = "would be" if dry_run else "are now"
    table = Table(title=f"group {group}: committed offsets of {topic} {verb}")
    for col in ("partition", "before", "after"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            str(row["partition"]),
            str(row["before"]) if row["before"] >= 0 else "-",
            str(row["after"]),
        )
    console.print(table)
    if dry_run:
        note = f" ({members} members active: it needs --force)" if members and not force else ""
        console.print(f"Dry run: nothing changed{note}.", highlight=False)
    else:
        console.print(f"Reset (metadata version {done.metadata_version}).", highlight=False)


@app.command()
def delete(
    group: GroupArg,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Forget a group and its committed offsets; refused while it has members."""
    done = _call(data, bootstrap, lambda a: a.delete_group(group))
    console.print(
        f"Deleted group {group} (metadata version {done.metadata_version}).", highlight=False
    )
