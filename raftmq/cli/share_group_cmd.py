"""``raftmq share-group ...``: list, describe, configure, reset and delete share groups
(docs/share-groups.md), through the controller's ShareGroups API (share.proto) on the
admin client's routing. Any broker of the cluster will do as a bootstrap address.

``describe`` shows the members and settings the controller keeps, and, per partition of
every topic the group consumed, the share-partition state its leader keeps (asked of each
leader with DescribeSharePartition): the start offset (below it every record is done),
the records in flight, acquired and archived, and how long the oldest acquired record
has been held. A partition whose leader does not answer is shown with the reason, the
others still are. Reads print rich tables, or with ``--json`` JSON for scripts; errors are
sentences with their code, exit status 1 (2 for bad usage).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
    console,
)
from raftmq.cli.connection import client_tls
from raftmq.cli.group_cmd import ToEarliest, ToLatest, ToOffset, _short, _targets
from raftmq.cli.topic_cmd import JsonFlag, _call, _json, _pairs
from raftmq.client import AdminClient, LowLevelClient
from raftmq.client.admin import SharePartitionState

app = typer.Typer(
    help="Share groups (queues): list, describe (members, settings, and per partition the "
    "records in flight, acquired and archived), alter settings, reset offsets, delete."
)

GroupArg = Annotated[str, typer.Argument(help="The share group's id.")]
SettingPairs = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "--config",
        help="A share group setting as name=value (repeatable), e.g. "
        "share.record.lock.duration.ms=60000 (--config, as topics take it, works too).",
    ),
]


def _partition_json(state: SharePartitionState) -> dict[str, Any]:
    out: dict[str, Any] = {"topic": state.topic, "partition": state.partition}
    d = state.description
    if d is not None:  # every field a number or a bool: as JSON numbers, not strings
        out.update({f.name: getattr(d, f.name) for f in d.DESCRIPTOR.fields})
    else:
        assert state.error is not None
        out["error"] = f"{state.error} ({state.error.label})"
    return out


def _age(ms: int) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 0 else "-"


@app.command("list")
def list_groups(
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Every share group: its member count and group epoch."""
    answer = _call(data, bootstrap, lambda a: a.list_share_groups())
    if json_out:
        _json(answer)
        return
    if not answer.groups:
        console.print("No share groups.")
        return
    table = Table(title="share groups")
    for col in ("group", "members", "epoch"):
        table.add_column(col)
    for g in answer.groups:
        table.add_row(g.group_id, str(g.member_count), str(g.group_epoch))
    console.print(table)


@app.command()
def describe(
    group: GroupArg,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """A share group's members (epoch, subscriptions, the partitions they fetch from,
    seconds since the coordinator last heard them), its settings, and per partition of
    each topic it consumed: the start offset, the records in flight, acquired and
    archived, and the age of the oldest acquired record."""

    def read(admin: AdminClient) -> tuple[Any, list[SharePartitionState]]:
        described = admin.describe_share_group(group)
        return described, admin.describe_share_partitions(group, described.topics)

    described, partitions = _call(data, bootstrap, read)
    if json_out:
        _json(described, partitions=[_partition_json(p) for p in partitions])
        return
    members = Table(
        title=f"share group {described.group_id}: epoch {described.group_epoch}, created at "
        f"metadata version {described.created_version}"
    )
    for col in ("member", "epoch", "subscribed", "assigned", "heard"):
        members.add_column(col)
    for m in described.members:
        age = m.last_heartbeat_age_ms
        members.add_row(
            m.member_id,
            str(m.member_epoch),
            ",".join(m.subscriptions),
            _short(m.assigned),
            f"{age / 1000:.1f} s ago" if age >= 0 else "not yet",
        )
    console.print(members if described.members else "No members.")
    settings = Table(title="settings")
    for col in ("name", "value"):
        settings.add_column(col)
    for s in described.settings:
        settings.add_row(s.name, s.value or "-")
    console.print(settings)
    if not partitions:
        console.print("No partitions consumed yet.")
        return
    table = Table(title="partitions (as each partition's leader has them)")
    columns = ["topic", "partition", "start", "end", "in flight", "acquired", "archived"]
    columns += ["dead-lettered", "oldest acquired", "high watermark"]
    for col in columns:
        table.add_column(col)
    problems = []
    for p in partitions:
        d = p.description
        if d is None:
            assert p.error is not None
            table.add_row(p.topic, str(p.partition), *["?"] * (len(columns) - 2))
            problems.append(f"{p.topic}/{p.partition}: {p.error} ({p.error.label})")
            continue
        if not d.exists:
            row = ["-"] * (len(columns) - 3) + [str(d.high_watermark)]
            table.add_row(p.topic, str(p.partition), *row)
            continue
        table.add_row(
            p.topic,
            str(p.partition),
            str(d.start_offset),
            str(d.end_offset),
            str(d.in_flight),
            str(d.acquired),
            str(d.archived_total),
            str(d.dead_lettered_total),
            _age(d.oldest_acquired_age_ms),
            str(d.high_watermark),
        )
    console.print(table)
    for problem in problems:
        console.print(f"[yellow]{problem}[/]", highlight=False)


@app.command("alter-config")
def alter_config(
    group: GroupArg,
    config: SettingPairs = None,
    reset: Annotated[
        list[str] | None,
        typer.Option("--reset", help="A setting back to its default (repeatable)."),
    ] = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Set or reset a share group's settings (share.record.lock.duration.ms,
    share.delivery.count.limit, share.auto.offset.reset, share.dead.letter.topic,
    share.record.lock.partition.limit). Creates the group, empty, when it does not exist,
    so a group can be configured before its first consumer starts."""
    settings = _pairs(config, "--set", "share.delivery.count.limit=3")
    for name in reset or []:
        if name in settings:
            console.print(f"[red]{name} is both set and reset; choose one.[/]")
            raise typer.Exit(2)
        settings[name] = ""
    if not settings:
        console.print("[red]Give at least one --set name=value or --reset name.[/]")
        raise typer.Exit(2)
    done = _call(data, bootstrap, lambda a: a.alter_share_group_config(group, settings))
    console.print(
        f"Altered share group {group} (metadata version {done.metadata_version}).",
        highlight=False,
    )


@app.command("reset-offsets")
def reset_offsets(
    group: GroupArg,
    topic: Annotated[
        str | None,
        typer.Option("--topic", help="Only this topic; else every topic the group consumed."),
    ] = None,
    to_earliest: ToEarliest = False,
    to_latest: ToLatest = False,
    to_offset: ToOffset = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Reset even while the group has members (what they hold is then done or "
            "available again, whatever they acknowledge next).",
        ),
    ] = False,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Move a share group's start offset on each partition: records below it are done,
    records from it are available again with delivery count 0. Refused while the group
    has members unless --force."""
    if sum([to_earliest, to_latest, to_offset is not None]) != 1:
        console.print(
            "[red]Say where to: exactly one of --to-earliest, --to-latest, --to-offset N.[/]"
        )
        raise typer.Exit(2)

    def reset(admin: AdminClient) -> dict[tuple[str, int], int]:
        described = admin.describe_share_group(group)
        if described.members and not force:
            console.print(
                f"[red]Share group {group} has {len(described.members)} active members, "
                "which hold records the reset would move under them. Stop its consumers "
                "first, or pass --force.[/]"
            )
            raise typer.Exit(1)
        topics = [topic] if topic else list(described.topics)
        if not topics:
            console.print(
                f"[red]Share group {group} has consumed no topic yet; name one with --topic.[/]"
            )
            raise typer.Exit(1)
        targets: dict[tuple[str, int], int] = {}
        with LowLevelClient(
            cluster_addresses(data, bootstrap), retries=10, **client_tls()
        ) as client:
            for t in topics:
                count = len(admin.describe_topic(t).partitions)
                targets.update(
                    _targets(client, t, list(range(count)), to_offset, to_earliest, to_latest, None)
                )
        return admin.reset_share_group_offsets(group, targets, force=force)

    done = _call(data, bootstrap, reset)
    if json_out:
        rows = [{"topic": t, "partition": p, "start_offset": o} for (t, p), o in done.items()]
        print(json.dumps({"group": group, "offsets": rows}, indent=2))
        return
    table = Table(title=f"share group {group}: start offsets are now")
    for col in ("topic", "partition", "start offset"):
        table.add_column(col)
    for (t, p), offset in done.items():
        table.add_row(t, str(p), str(offset))
    console.print(table)


@app.command()
def delete(
    group: GroupArg,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Forget a share group; each partition's leader drops its state. Refused while it
    has members."""
    done = _call(data, bootstrap, lambda a: a.delete_share_group(group))
    console.print(
        f"Deleted share group {group} (metadata version {done.metadata_version}).",
        highlight=False,
    )
