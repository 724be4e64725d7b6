"""``raftmq user ...``: SCRAM-SHA-256 users in the controller's metadata (docs/security.md),
as Kafka's ``kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[...]' --entity-type
users`` does: add (or change the password of) a user, list them, delete one.

The password is turned into a salt, StoredKey and ServerKey here (raftmq.scram), so it
never leaves this process; without ``--password`` it is asked for, twice, unechoed.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from raftmq import scram
from raftmq.cli.cluster_cmd import DEFAULT_DATA, BootstrapAddresses, RunningClusterData, console
from raftmq.cli.topic_cmd import JsonFlag, _call

app = typer.Typer(help="SCRAM-SHA-256 users: add (or change a password), list, delete.")
NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The user (principal User:NAME).")]


@app.command()
def add(
    name: NameArg,
    password: Annotated[
        str | None,
        typer.Option(help="The password (without it: asked for, unechoed)."),
    ] = None,
    iterations: Annotated[
        int,
        typer.Option(
            min=scram.MIN_ITERATIONS,
            max=scram.MAX_ITERATIONS,
            help="PBKDF2 iterations of the stored credential.",
        ),
    ] = scram.DEFAULT_ITERATIONS,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Store NAME's SCRAM-SHA-256 credential (replacing any): clients then log in with
    sasl_mechanism SCRAM-SHA-256, sasl_username NAME and the password."""
    if password is None:
        password = typer.prompt(f"Password for {name}", hide_input=True, confirmation_prompt=True)
    done = _call(
        data,
        bootstrap,
        lambda a: a.upsert_user_scram_credential(name, password, iterations=iterations),
    )
    console.print(
        f"Stored SCRAM-SHA-256 credentials for {name} ({iterations} iterations, metadata "
        f"version {done.metadata_version}).",
        highlight=False,
    )


@app.command("list")
def list_users(
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Every user with SCRAM credentials: mechanism and iterations (never a key)."""
    answer = _call(data, bootstrap, lambda a: a.describe_user_scram_credentials())
    rows = [(u.name, c.mechanism, c.iterations) for u in answer.results for c in u.credentials]
    if json_out:
        print(
            json.dumps(
                [{"name": n, "mechanism": m, "iterations": i} for n, m, i in rows],
            )
        )
        return
    if not rows:
        console.print("No SCRAM users.")
        return
    table = Table(title="SCRAM users")
    for col in ("user", "mechanism", "iterations"):
        table.add_column(col)
    for n, m, i in rows:
        table.add_row(n, m, str(i))
    console.print(table)


@app.command()
def delete(
    name: NameArg,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Delete NAME's SCRAM credentials: new logins fail at once; a session already open
    on a broker lasts until it expires (--connections-max-reauth-ms)."""
    _call(data, bootstrap, lambda a: a.delete_user_scram_credential(name))
    console.print(f"Deleted the SCRAM credentials of {name}.", highlight=False)
