"""``raftmq broker ...``: run a broker (``raftmq broker run``, also reached as plain
``raftmq broker --id N ...``, the form scripts and the local cluster launcher use) and
drain one (``raftmq broker drain ID``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.cli import cluster_cmd
from raftmq.cli.cluster_admin_cmd import NoWait, wait_until
from raftmq.cli.cluster_cmd import DEFAULT_DATA, BootstrapAddresses, RunningClusterData, console
from raftmq.cli.topic_cmd import _call

RUN = "run"


class _RunByDefault(TyperGroup):
    """``raftmq broker --id 1 ...`` means ``raftmq broker run --id 1 ...``: running a broker
    was ``raftmq broker`` before the group had other commands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [RUN, *args]
        result: list[str] = super().parse_args(ctx, args)
        return result


app = typer.Typer(
    cls=_RunByDefault,
    no_args_is_help=True,
    help="Brokers: run one (the default: 'raftmq broker --id N ...'), drain one.",
)
app.command(RUN)(cluster_cmd.broker)


@app.command()
def drain(
    broker_id: Annotated[int, typer.Argument(metavar="ID", help="The broker to drain.")],
    no_wait: NoWait = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Move every replica off broker ID so it can leave: it takes no new replicas, and the
    controller copies each of its replicas to another broker before removing it. Refused
    when the other alive brokers are too few for a topic's replication factor. Shows the
    progress until the broker holds no replica."""
    done = _call(data, bootstrap, lambda a: a.drain_broker(broker_id))
    console.print(
        f"Broker {broker_id} is draining (metadata version {done.metadata_version}).",
        highlight=False,
    )
    if no_wait:
        return

    def held(s: apb.ClusterStatusResponse) -> int:
        return next((x.replicas for x in s.loads if x.broker_id == broker_id), 0)

    def progress(s: apb.ClusterStatusResponse) -> str:
        return f"broker {broker_id} holds {held(s)} replicas; {len(s.moves)} moves in progress"

    wait_until(data, bootstrap, lambda s: held(s) == 0, progress)
    console.print(f"Broker {broker_id} holds no replica; it may be stopped.", highlight=False)
