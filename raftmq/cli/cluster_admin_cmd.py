"""``raftmq cluster status`` and ``raftmq cluster rebalance``: the cluster's health and
replica moves through the controller's admin API (admin.proto's ClusterStatus and
RebalanceCluster). Any broker will do as a bootstrap address.

Long work (a rebalance, a drain) shows its progress by polling ClusterStatus until no
move is left; Ctrl-C or ``--no-wait`` only stops the watching: the controller carries on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.cli.cluster_cmd import DEFAULT_DATA, BootstrapAddresses, RunningClusterData, console
from raftmq.cli.topic_cmd import JsonFlag, _call, _ids, _json

app = typer.Typer(help="The cluster: status (brokers, controller, health, moves) and rebalance.")

POLL_S = 1.0
NoWait = Annotated[
    bool, typer.Option("--no-wait", help="Return once asked; do not show progress until done.")
]


def _state(state: int) -> str:
    return apb.BrokerState.Name(state).removeprefix("BROKER_STATE_").lower()


def _parts(refs: list[apb.PartitionRef]) -> str:
    return ", ".join(f"{r.topic}/{r.partition}" for r in refs) or "none"


def status_tables(answer: apb.ClusterStatusResponse) -> list[Table | str]:
    c = answer.cluster
    loads = {x.broker_id: x for x in answer.loads}
    brokers = Table(
        title=f"cluster {c.cluster}: controller leader {c.controller_leader_id or 'none'}, "
        f"voters {_ids(c.controller_voters)} (metadata version {c.metadata_version})"
    )
    for col in ("broker", "address", "rack", "state", "replicas", "preferred leaders"):
        brokers.add_column(col)
    for b in c.brokers:
        load = loads.get(b.id)
        brokers.add_row(
            str(b.id),
            f"{b.host}:{b.port}",
            b.rack or "-",
            _state(b.state),
            str(load.replicas if load else 0),
            str(load.preferred_leaders if load else 0),
        )
    out: list[Table | str] = [brokers]
    out.append(f"Under-replicated partitions: {_parts(list(answer.under_replicated))}")
    out.append(f"Leaderless partitions: {_parts(list(answer.leaderless))}")
    if answer.moves:
        moves = Table(title="moves in progress")
        for col in ("partition", "learner", "replacing"):
            moves.add_column(col)
        for m in answer.moves:
            moves.add_row(f"{m.topic}/{m.partition}", str(m.learner), str(m.replacing or "-"))
        out.append(moves)
    else:
        out.append("Moves in progress: none")
    if answer.rebalance_requested:
        out.append("A rebalance is under way.")
    out.extend(f"[yellow]Cannot move: {s}[/]" for s in answer.stuck)
    return out


@app.command()
def status(
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Brokers with their state and load, the controller's leader and voters,
    under-replicated and leaderless partitions, and replica moves in progress."""
    answer = _call(data, bootstrap, lambda a: a.cluster_status())
    if json_out:
        _json(answer)
        return
    for item in status_tables(answer):
        console.print(item, highlight=False)


def wait_until(
    data: Path,
    bootstrap: str,
    done: Callable[[apb.ClusterStatusResponse], bool],
    progress: Callable[[apb.ClusterStatusResponse], str],
) -> apb.ClusterStatusResponse:
    """Polls ClusterStatus until ``done``, showing ``progress`` whenever it changes."""
    shown = ""
    with console.status("waiting for the controller") as spinner:
        while True:
            answer = _call(data, bootstrap, lambda a: a.cluster_status())
            line = progress(answer)
            if line != shown:
                spinner.update(line)
                shown = line
            if done(answer):
                return answer
            time.sleep(POLL_S)


@app.command()
def rebalance(
    no_wait: NoWait = False,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Even out replicas and preferred leaders over the alive brokers (e.g. after adding a
    broker): the controller moves replicas in rounds, within its move limits, each one
    copied to its new broker before the old one leaves. Shows the planned moves, then the
    progress until no move is left."""
    planned = _call(data, bootstrap, lambda a: a.rebalance_cluster())
    if json_out:
        _json(planned)
    else:
        console.print(
            f"Rebalance asked (metadata version {planned.metadata_version}): "
            f"{len(planned.moves)} replica moves and {len(planned.leader_changes)} "
            "preferred-leader changes planned.",
            highlight=False,
        )
        if planned.moves:
            table = Table(title="planned moves")
            for col in ("partition", "from", "to"):
                table.add_column(col)
            for m in planned.moves:
                table.add_row(f"{m.topic}/{m.partition}", str(m.replacing), str(m.learner))
            console.print(table)
    if no_wait:
        return

    def progress(s: apb.ClusterStatusResponse) -> str:
        return f"{len(s.moves)} moves in progress"

    wait_until(data, bootstrap, lambda s: not s.rebalance_requested and not s.moves, progress)
    if not json_out:
        console.print("The cluster is balanced.")
