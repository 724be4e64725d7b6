"""``raftmq chaos run``: a fault-injection test of a real cluster, with a verdict."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(help="Fault-injection tests against a local cluster.", no_args_is_help=True)
console = Console(width=None if sys.stdout.isatty() else 120)

CHAOS_EXTRA = ("toxiproxy", "matplotlib")
"""What the ``raftmq[chaos]`` extra installs (pyproject.toml). Checked before a run starts:
matplotlib is imported only to draw the report, after the whole run, too late to say so."""


def missing_extra() -> list[str]:
    """The modules of the chaos extra that cannot be imported here."""
    return [name for name in CHAOS_EXTRA if importlib.util.find_spec(name) is None]


@app.command()
def run(
    nodes: Annotated[int, typer.Option(min=3, max=7, help="Broker processes.")] = 3,
    duration: Annotated[float, typer.Option(min=10, help="Seconds of faults.")] = 120,
    faults: Annotated[
        str,
        typer.Option(
            help="all (every kind below; decommission only with --nodes 4 or more), or "
            "comma-separated kinds: partition, kill, pause, latency, bandwidth, reset, "
            "hung, snapshot (a follower cut off until it must catch up from a snapshot), unsynced "
            "(power loss: SIGKILL and cut every file to its last fsynced size), corrupt (a bit "
            "flipped in a sealed segment of one replica), corrupt-config, corrupt-hardstate, "
            "corrupt-producer-state, corrupt-log-start, corrupt-index, corrupt-metadata-cache, "
            "corrupt-controller-log (a bit flipped, while its broker is down, in a CONFIG entry "
            "or the snapshot meta holding a group's first configuration, "
            "the Raft hard state, the producer-state or log-start checkpoint, an offset index, "
            "the broker's metadata cache, or the controller's metadata log on one voter), "
            "disk-loss (a node back with a wiped or "
            "cut-back data directory), fd-pressure (a node restarted with an open-file limit "
            "of 128), controller (the active controller SIGKILLed, or cut off from its peers, "
            "or from its peers and clients), decommission (first fault: a broker that is not a "
            "controller voter, or not the active controller, SIGKILLed for good; needs "
            "--nodes 4 or more, and the checker then demands every partition back at its "
            "replication factor on live brokers)."
        ),
    ] = "partition,kill,pause,latency",
    seed: Annotated[int, typer.Option(help="Makes the fault schedule reproducible.")] = 0,
    out: Annotated[
        Path, typer.Option(help="Report folder (history, faults, result, plot).")
    ] = Path("./chaos-out"),
    partitions: Annotated[int, typer.Option(min=1, max=64, help="Partitions written.")] = 3,
    producers: Annotated[int, typer.Option(min=1, max=64, help="Producer threads.")] = 4,
    clients: Annotated[
        bool,
        typer.Option(
            help="Run the real clients: Producer objects (acks=all, retrying) and Consumer "
            "objects, instead of low-level sends and readers."
        ),
    ] = False,
    consumers: Annotated[
        int, typer.Option(min=1, max=16, help="With --clients: Consumer threads.")
    ] = 3,
    group: Annotated[
        bool,
        typer.Option(
            help="The consumers form one consumer group and commit after processing; the "
            "checker holds commits to never going back or getting lost (implies --clients)."
        ),
    ] = False,
    idempotent: Annotated[
        bool,
        typer.Option(
            help="Idempotent producers; a record stored twice is then a violation "
            "(implies --clients)."
        ),
    ] = False,
    transactions: Annotated[
        bool,
        typer.Option(
            help="Add exactly-once transactions: a consume-transform-produce pipeline of "
            "transactional workers from the main topic to an output topic, transactional "
            "producers that abort a share on purpose, and read_committed and "
            "read_uncommitted readers; the checker adds Jepsen's Kafka properties (no "
            "aborted or uncommitted read, no torn transaction, no lost committed write, one "
            "output per input, offsets matching outputs, positions and polls in order)."
        ),
    ] = False,
    delayed: Annotated[
        bool,
        typer.Option(
            help="Add delayed delivery: a producer sends records due up to 8 s later "
            "(deliver_at) to a topic of their own and a consumer notes when each arrives; the "
            "checker holds every acknowledged one to arriving, never early, once with "
            "--idempotent, and late by at most a bound outside fault windows."
        ),
    ] = False,
    tags: Annotated[
        bool,
        typer.Option(
            help="Tag the clients' records and add a consumer with a tag filter on the main "
            "topic; the checker holds it to every matching record and no other (implies "
            "--clients)."
        ),
    ] = False,
    share_group: Annotated[
        bool,
        typer.Option(
            help="Add a share group: members in processes of their own accept, release, "
            "reject or ignore the records of a topic of their own, and are SIGKILLed and "
            "replaced; the checker holds every acknowledged record to being accepted once or "
            "dead-lettered, no record to two holders at once, delivery counts to growing "
            "within the limit, and committed ACCEPTs to surviving failover."
        ),
    ] = False,
    follower_reads: Annotated[
        bool,
        typer.Option(
            help="Every broker in a rack of its own; with --clients each consumer reads from "
            "the in-sync follower in one of them (client_rack)."
        ),
    ] = False,
    voters: Annotated[
        int,
        typer.Option(
            min=0,
            max=7,
            help="Controller voters: nodes 1..N, the others broker-only (0: every node).",
        ),
    ] = 0,
    heal_delay_ms: Annotated[
        int,
        typer.Option(
            min=0,
            help="With decommission: how long a fenced broker waits before its replicas move.",
        ),
    ] = 2000,
    secure: Annotated[
        bool,
        typer.Option(
            help="TLS on every listener (the Raft transport through the proxies too), mutual "
            "for the clients, as 'raftmq dev --secure' starts a cluster; every client of the "
            "run presents the client certificate."
        ),
    ] = False,
) -> None:
    """Run a workload against a proxied cluster while injecting faults, heal, read every
    replica and check that nothing acknowledged was lost, duplicated, reordered or seen
    before commit. Exits 1 on any violation."""
    missing = missing_extra()
    if missing:
        console.print(
            f"raftmq chaos needs the chaos extra, and {', '.join(missing)} is not installed: "
            "pip install 'raftmq[chaos]'",
            style="red",
            markup=False,  # [chaos] is text, not a style
            highlight=False,
        )
        raise typer.Exit(2)
    from chaos import checker
    from chaos.run import ChaosOptions
    from chaos.run import run as run_chaos

    try:
        options = ChaosOptions(
            out=out,
            nodes=nodes,
            partitions=partitions,
            duration=duration,
            faults=[f.strip() for f in faults.split(",") if f.strip()],
            seed=seed,
            producers=producers,
            clients=clients,
            consumers=consumers,
            group=group,
            idempotent=idempotent,
            follower_reads=follower_reads,
            transactions=transactions,
            delayed=delayed,
            tags=tags,
            share_group=share_group,
            voters=voters,
            heal_delay_ms=heal_delay_ms,
            secure=secure,
        )
    except ValueError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    result = run_chaos(options, say=lambda line: console.print(line, highlight=False))
    console.print(checker.format_table(result))
    console.print(f"report: {out}/result.json, history.jsonl, faults.json, timeline.png")
    if not result.valid:
        console.print("[red]Violations found (see above).[/]")
        raise typer.Exit(1)
    console.print("[green]No violation: every promise held.[/]")
