"""``raftmq broker ...``: run a broker (``raftmq broker run``, also reached as plain
``raftmq broker --id N ...``, the form scripts and the local cluster launcher use), drain
one (``raftmq broker drain ID``), and rebuild one of its replicas that no peer could
repair (``raftmq broker rebuild-replica ID TOPIC PARTITION``)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import grpc
import typer
from typer.core import TyperGroup

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.cli import cluster_cmd
from raftmq.cli.cluster_admin_cmd import JsonFlag, NoWait, wait_until
from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
    console,
)
from raftmq.cli.connection import client_tls
from raftmq.cli.status_cmd import STATE_NAMES
from raftmq.cli.topic_cmd import _call
from raftmq.client import ClientError, LowLevelClient
from raftmq.client.errors import error_of

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
    help="Brokers: run one (the default: 'raftmq broker --id N ...'), drain one, rebuild "
    "one's replica.",
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


REBUILD_TIMEOUT_S = 30.0
"""How long the broker may take to delete and reopen the replica."""


@app.command("rebuild-replica")
def rebuild_replica(
    broker_id: Annotated[int, typer.Argument(metavar="ID", help="The broker holding it.")],
    topic: Annotated[str, typer.Argument(help="The replica's topic.")],
    partition: Annotated[int, typer.Argument(help="The replica's partition.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Rebuild even when this replica leads or no other replica does: its "
            "records may then be lost for good.",
        ),
    ] = False,
    no_wait: NoWait = False,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Rebuild broker ID's replica of TOPIC/PARTITION when it failed and no peer could
    repair it in place (status shows it failed with why): its data is deleted and it
    copies the leader's log again, voting only once it holds all of it. Refused while it
    leads or no other replica leads, unless --force. Shows progress until it is in sync."""
    addresses = cluster_addresses(data, bootstrap)
    with LowLevelClient(addresses, **client_tls()) as client:
        try:
            md = client.metadata(timeout=REBUILD_TIMEOUT_S)
            address = next((f"{b.host}:{b.port}" for b in md.brokers if b.id == broker_id), None)
            if address is None:
                known = ", ".join(str(b.id) for b in md.brokers)
                console.print(f"[red]There is no broker {broker_id}; the brokers are {known}.[/]")
                raise typer.Exit(1)
            answer = client.stub(address).RebuildReplica(
                pb.RebuildReplicaRequest(topic=topic, partition=partition, force=force),
                timeout=REBUILD_TIMEOUT_S,
            )
        except (grpc.RpcError, ClientError) as exc:
            err = error_of(exc) if isinstance(exc, grpc.RpcError) else exc
            console.print(f"[red]{err} ({err.label})[/]", highlight=False)
            raise typer.Exit(1) from None
        state = STATE_NAMES.get(answer.status.state, "unknown")
        if not json_out:
            console.print(
                f"Broker {broker_id} deleted {answer.deleted_bytes} bytes of its replica of "
                f"{topic}/{partition} and reopened it ({state}).",
                highlight=False,
            )
        if not no_wait:
            state = _wait_in_sync(client, address, topic, partition, quiet=json_out)
    if json_out:
        print(
            json.dumps(
                {
                    "broker": broker_id,
                    "topic": topic,
                    "partition": partition,
                    "deleted_bytes": answer.deleted_bytes,
                    "state": state,
                }
            )
        )
    elif not no_wait:
        console.print(f"The replica of {topic}/{partition} on broker {broker_id} is in sync.")


def _wait_in_sync(
    client: LowLevelClient, address: str, topic: str, partition: int, *, quiet: bool
) -> str:
    """Poll the broker's own report on the replica until it is ok, showing it as it goes."""
    shown = ""
    with console.status("waiting for the replica to copy the leader's log") as spinner:
        while True:
            try:
                md = client.stub(address).Metadata(
                    pb.MetadataRequest(topics=[topic]), timeout=REBUILD_TIMEOUT_S
                )
                info = md.topics[0].partitions[partition]
                mine = next(s for s in info.replica_status if s.broker_id == md.broker_id)
                state, reason = STATE_NAMES.get(mine.state, "unknown"), mine.reason
            except (grpc.RpcError, IndexError, StopIteration) as exc:
                state, reason = "unknown", str(exc)
            if state == "ok":
                return state
            line = f"{state}: {reason}" if reason else state
            if line != shown and not quiet:
                spinner.update(line)
                shown = line
            time.sleep(0.5)
