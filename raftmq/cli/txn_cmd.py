"""``raftmq txn ...``: see and end transactions, through the controller's Transactions API
(transactions.proto) on the admin client's routing, as Kafka's ``kafka-transactions.sh``
does: list every transactional id with its state, describe one (its producer, the
partitions of its open transaction and the markers still to write), and abort a hanging
one. Reads print rich tables, or with ``--json`` JSON for scripts.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    console,
)
from raftmq.cli.topic_cmd import JsonFlag, _call, _json

app = typer.Typer(
    help="Transactions: list transactional ids, describe one, abort a hanging transaction."
)
IdArg = Annotated[str, typer.Argument(help="The producer's transactional id.")]


def _short(listed: Any) -> str:
    return " ".join(f"{tp.topic}:{','.join(map(str, tp.partitions))}" for tp in listed) or "-"


def _age(t: tpb.TransactionDescription, now_ms: int) -> str:
    return f"{(now_ms - t.started_ms) / 1000:.1f} s" if t.started_ms else "-"


@app.command("list")
def list_transactions(
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Every transactional id: its producer id and epoch, state, and how long its open
    transaction has been open."""
    answer = _call(data, bootstrap, lambda a: a.list_transactions())
    if json_out:
        _json(answer)
        return
    if not answer.transactions:
        console.print("No transactional ids.")
        return
    now_ms = int(time.time() * 1000)
    table = Table(title="transactions")
    for col in ("transactional id", "producer", "epoch", "state", "open for", "partitions"):
        table.add_column(col)
    for t in answer.transactions:
        table.add_row(
            t.transactional_id,
            str(t.producer_id),
            str(t.producer_epoch),
            t.state,
            _age(t, now_ms),
            str(sum(len(tp.partitions) for tp in t.partitions)),
        )
    console.print(table)


@app.command()
def describe(
    transactional_id: IdArg,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """One transactional id: producer, state, timeout, age of its open transaction, its
    partitions and group, and the partitions whose marker is not written yet."""
    t = _call(data, bootstrap, lambda a: a.describe_transaction(transactional_id))
    if json_out:
        _json(t)
        return
    table = Table(title=f"transaction {t.transactional_id}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    for name, value in (
        ("producer id", str(t.producer_id)),
        ("producer epoch", str(t.producer_epoch)),
        ("state", t.state),
        ("timeout", f"{t.transaction_timeout_ms} ms"),
        ("open for", _age(t, int(time.time() * 1000))),
        ("partitions", _short(t.partitions)),
        ("group", t.group_id or "-"),
        ("markers to write", _short(t.pending_markers)),
    ):
        table.add_row(name, value)
    console.print(table)


@app.command()
def abort(
    transactional_id: IdArg,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Abort the id's open transaction, as if its timeout had passed: read_committed
    readers move past it, and its producer must abort and begin again."""
    _call(data, bootstrap, lambda a: a.abort_transaction(transactional_id))
    console.print(f"Aborted the open transaction of {transactional_id}.")
