"""``raftmq quota ...``: client quotas, Kafka's model (docs/quotas.md), through the admin
API's AlterClientQuotas and DescribeClientQuotas: what ``kafka-configs --entity-type
users/clients --alter --add-config producer_byte_rate=...`` does for Kafka.

An entity is a user (``--user NAME``, or ``--user-default`` for every user without one of
its own), a client id (``--client-id ID`` or ``--client-default``), or both.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from raftmq.cli.cluster_cmd import DEFAULT_DATA, BootstrapAddresses, RunningClusterData, console
from raftmq.cli.topic_cmd import JsonFlag, _call, _json
from raftmq.controller.quotas import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    KEYS,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    entity_text,
)

app = typer.Typer(help="Client quotas per user and client id: set, list, delete (Kafka's quotas).")

PRINCIPAL_PREFIX = "User:"

User = Annotated[
    str,
    typer.Option(
        "--user",
        help="The user: the NAME of its principal User:NAME (User:NAME is taken too); "
        "ANONYMOUS for clients that do not authenticate.",
    ),
]
UserDefault = Annotated[
    bool, typer.Option("--user-default", help="Every user with no quota entity of its own.")
]
ClientId = Annotated[
    str, typer.Option("--client-id", help="The client id (a client's client_id setting).")
]
ClientDefault = Annotated[
    bool,
    typer.Option("--client-default", help="Every client id with no quota entity of its own."),
]


def _entity(user: str, user_default: bool, client_id: str, client_default: bool) -> tuple[str, str]:
    """(user, client id) as the admin API takes them; exits 2 on a contradiction."""
    if (user and user_default) or (client_id and client_default):
        console.print("[red]Give a name or the default, not both (--user or --user-default).[/]")
        raise typer.Exit(2)
    user = DEFAULT if user_default else user.removeprefix(PRINCIPAL_PREFIX)
    client_id = DEFAULT if client_default else client_id
    if not user and not client_id:
        console.print(
            "[red]Name the entity: --user NAME or --user-default, and/or --client-id ID or "
            "--client-default.[/]"
        )
        raise typer.Exit(2)
    return user, client_id


@app.command("set")
def set_quota(
    user: User = "",
    user_default: UserDefault = False,
    client_id: ClientId = "",
    client_default: ClientDefault = False,
    producer_byte_rate: Annotated[
        int | None,
        typer.Option(help="Bytes a second the entity may produce to each broker."),
    ] = None,
    consumer_byte_rate: Annotated[
        int | None,
        typer.Option(help="Bytes a second the entity may fetch from each broker."),
    ] = None,
    request_percentage: Annotated[
        int | None,
        typer.Option(help="Percent (1-100) of each broker's request-handling time."),
    ] = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Set quotas of an entity (the others it has stay). Over a quota, a broker answers
    with throttle_time_ms and holds the entity's further calls that long; no data is
    refused."""
    entity = _entity(user, user_default, client_id, client_default)
    values = {
        key: value
        for key, value in (
            (PRODUCER_BYTE_RATE, producer_byte_rate),
            (CONSUMER_BYTE_RATE, consumer_byte_rate),
            (REQUEST_PERCENTAGE, request_percentage),
        )
        if value is not None
    }
    if not values:
        console.print(
            "[red]Give at least one of --producer-byte-rate, --consumer-byte-rate, "
            "--request-percentage.[/]"
        )
        raise typer.Exit(2)
    answer = _call(data, bootstrap, lambda a: a.alter_client_quotas(*entity, set_values=values))
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    console.print(
        f"Set {shown} for {entity_text(*entity)} (metadata version {answer.metadata_version}).",
        highlight=False,
    )


@app.command("delete")
def delete_quota(
    user: User = "",
    user_default: UserDefault = False,
    client_id: ClientId = "",
    client_default: ClientDefault = False,
    producer_byte_rate: Annotated[
        bool, typer.Option("--producer-byte-rate", help="Remove this one.")
    ] = False,
    consumer_byte_rate: Annotated[
        bool, typer.Option("--consumer-byte-rate", help="Remove this one.")
    ] = False,
    request_percentage: Annotated[
        bool, typer.Option("--request-percentage", help="Remove this one.")
    ] = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Remove quotas of an entity: those named, or without any named all of them (the
    entity goes)."""
    entity = _entity(user, user_default, client_id, client_default)
    named = [
        key
        for key, chosen in (
            (PRODUCER_BYTE_RATE, producer_byte_rate),
            (CONSUMER_BYTE_RATE, consumer_byte_rate),
            (REQUEST_PERCENTAGE, request_percentage),
        )
        if chosen
    ]
    keys = named or list(KEYS)
    answer = _call(data, bootstrap, lambda a: a.alter_client_quotas(*entity, remove=keys))
    console.print(
        f"Removed {', '.join(named) if named else 'every quota'} of {entity_text(*entity)} "
        f"(metadata version {answer.metadata_version}).",
        highlight=False,
    )


@app.command("list")
def list_quotas(
    user: User = "",
    client_id: ClientId = "",
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Every quota entity and its values (only those naming --user or --client-id exactly,
    when given; <default> names the default entities)."""
    answer = _call(
        data,
        bootstrap,
        lambda a: a.describe_client_quotas(user.removeprefix(PRINCIPAL_PREFIX), client_id),
    )
    if json_out:
        _json(answer)
        return
    if not answer.quotas:
        console.print("No client quotas.")
        return
    table = Table(title="client quotas")
    for col in ("user", "client id", "producer_byte_rate", "consumer_byte_rate", "request_%"):
        table.add_column(col)
    for q in answer.quotas:
        values = q.values
        table.add_row(
            q.entity.user or "-",
            q.entity.client_id or "-",
            *(str(values[k]) if k in values else "-" for k in KEYS),
        )
    console.print(table)
