"""``raftmq broker``, ``raftmq dev`` and ``raftmq demo``: run one broker, run a local cluster
of real broker processes, and push data through it."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from raftmq import log_records, net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.ready_file import BoundAddresses
from raftmq.cli import connection
from raftmq.cli.connection import client_tls
from raftmq.cli.demo_check import RUN_HEADER, check_partition, new_run_id
from raftmq.client import ClientError, LowLevelClient
from raftmq.client.partitioner import partition_for_key
from raftmq.client.sasl import SaslSettings
from raftmq.controller import cluster_file
from raftmq.controller.cluster_file import ClusterFileError, ClusterSpec
from raftmq.controller.healing import HEAL_DELAY_MS, MOVES_PER_BROKER, MOVES_TOTAL, Limits
from raftmq.devtools.certs import LocalPki
from raftmq.devtools.dev_credentials import ADMIN, secure_cluster, store_admin
from raftmq.devtools.local_cluster import CLUSTER_FILE, LocalCluster, local_spec
from raftmq.devtools.ports import PortInUseError
from raftmq.format.records import Record, build_batch, iter_records
from raftmq.log.config import LogConfig
from raftmq.raft.host.repair import SCRUB_BYTES_PER_S
from raftmq.tls_files import SERVER


class AuthorizerChoice(StrEnum):
    """The broker's authorizer (raftmq.broker.authorization)."""

    NONE = "none"
    ACL = "acl"


class LogFormatChoice(StrEnum):
    """The broker's log format (raftmq.log_records)."""

    TEXT = "text"
    JSON = "json"


console = Console(width=None if sys.stdout.isatty() else 120)
DEFAULT_DATA = Path("./raftmq-data")
DEMO_TOPIC = "demo"
DEDICATED_CONTROLLERS = 3
"""Controller-only processes ``raftmq dev --dedicated-controllers`` runs (a quorum of 3)."""


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]{message}[/]")
    return typer.Exit(code)


def _parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise _fail(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9091)", 2)
    return host, int(port)


def _parse_peers(text: str) -> dict[int, tuple[str, int]]:
    peers = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        try:
            node, address = item.split("=", 1)
            host, port = address.rsplit(":", 1)
            peers[int(node)] = (host, int(port))
        except ValueError:
            raise _fail(
                f"--peers item {item!r} is not ID=HOST:PORT (e.g. 2=127.0.0.1:9192)", 2
            ) from None
    return peers


def broker(
    id: Annotated[int, typer.Option("--id", help="This broker's id, as in the cluster file.")],
    cluster: Annotated[
        Path,
        typer.Option(
            help="The bootstrap file (TOML): the nodes' addresses and the controller voters. "
            "Topics come from the controller."
        ),
    ],
    roles: Annotated[
        str,
        typer.Option(
            help="broker, controller, or broker,controller (combined mode). Default: "
            "combined for a controller voter, broker for any other node."
        ),
    ] = "",
    rack: Annotated[
        str, typer.Option(help="This broker's rack: no two replicas of a partition share one.")
    ] = "",
    data: Annotated[
        Path, typer.Option(help="Data folder; this broker uses DATA/broker-ID.")
    ] = DEFAULT_DATA,
    peers: Annotated[
        str,
        typer.Option(
            help="Override where Raft traffic to other brokers goes, as ID=HOST:PORT,... "
            "(the chaos harness points these at proxies)."
        ),
    ] = "",
    listen: Annotated[
        str,
        typer.Option(
            help="Bind the client gRPC service to HOST:PORT instead of the address the cluster "
            "file advertises (e.g. behind a proxy)."
        ),
    ] = "",
    metrics: Annotated[
        bool,
        typer.Option(
            help="Serve Prometheus metrics at /metrics (docs/metrics.md); --no-metrics "
            "opens no listener and counts nothing."
        ),
    ] = True,
    metrics_listen: Annotated[
        str,
        typer.Option(
            help="HOST:PORT of the /metrics listener (default: the host the cluster file "
            "advertises, a free port; ready.json and 'raftmq dev' show the one bound)."
        ),
    ] = "",
    segment_bytes: Annotated[
        int, typer.Option(min=1024, help="segment.bytes of a topic that sets none.")
    ] = 128 * 1024 * 1024,
    retention_bytes: Annotated[
        int, typer.Option(min=-1, help="retention.bytes of a topic that sets none (-1: unlimited).")
    ] = -1,
    retention_ms: Annotated[
        int, typer.Option(min=-1, help="retention.ms of a topic that sets none (-1: forever).")
    ] = 14 * 24 * 3600 * 1000,
    retention_check_ms: Annotated[
        int, typer.Option(min=100, help="How often retention runs.")
    ] = 60_000,
    leader_rebalance_ms: Annotated[
        int,
        typer.Option(
            min=0,
            help="How often a leader checks whether to hand a partition back to its "
            "preferred (first-listed) replica, once that replica is in sync (0: never).",
        ),
    ] = 5_000,
    tick_ms: Annotated[int, typer.Option(min=5, max=1000, help="Raft tick length in ms.")] = 100,
    election_ticks: Annotated[
        int, typer.Option(min=3, max=100, help="Election timeout in ticks.")
    ] = 10,
    move_bytes_per_s: Annotated[
        int,
        typer.Option(
            min=0,
            help="Cap on the bytes per second the partitions this broker leads send to "
            "the replicas moves add (learners), all together (0: no cap).",
        ),
    ] = 0,
    scrub_bytes_per_s: Annotated[
        int,
        typer.Option(
            min=0,
            help="Pace of the background re-reading of sealed segments that finds bit rot "
            "before a reader does (0: off; a read that meets damage still repairs it).",
        ),
    ] = SCRUB_BYTES_PER_S,
    durability_markers: Annotated[
        bool,
        typer.Option(
            help="Test only: after every fsync write the durable size of the segment into "
            "SEGMENT.durable, so the chaos harness can simulate a power loss."
        ),
    ] = False,
    parent_pid: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Also stop (cleanly) when the process with this id is no longer this "
            "broker's parent; 'raftmq dev' sets it, so its brokers never outlive it.",
        ),
    ] = None,
    new: Annotated[
        bool,
        typer.Option(
            "--new",
            help="This broker never held a replica (a new cluster, or a broker being added): "
            "with no data folder it starts empty without asking its peers whether it lost "
            "data. Never set it when restarting a broker whose disk was wiped or replaced: "
            "without it, such a broker's replicas rejoin safely. Ignored when the data folder "
            "exists.",
        ),
    ] = False,
    auto_create_topics: Annotated[
        bool,
        typer.Option(
            help="Create a topic that a produce names and the cluster lacks (off: such a "
            "produce is refused with UNKNOWN_TOPIC, so a misspelled name is not a new topic)."
        ),
    ] = False,
    auto_create_partitions: Annotated[
        int, typer.Option(min=1, help="Partitions of an auto-created topic.")
    ] = 1,
    auto_create_replication_factor: Annotated[
        int,
        typer.Option(
            min=0,
            help="Replication factor of an auto-created topic (0: 3, or every alive broker "
            "when fewer are alive).",
        ),
    ] = 0,
    heal_delay_ms: Annotated[
        int,
        typer.Option(
            min=0,
            help="A controller voter's: how long a broker stays fenced before its replicas "
            "are replaced on other brokers (a restart within it only catches up).",
        ),
    ] = HEAL_DELAY_MS,
    max_moves_per_broker: Annotated[
        int,
        typer.Option(
            min=1,
            help="A controller voter's: replica moves a broker takes part in at once (as the "
            "new replica's broker or the partition's leader).",
        ),
    ] = MOVES_PER_BROKER,
    max_moves: Annotated[
        int, typer.Option(min=1, help="A controller voter's: replica moves under way at once.")
    ] = MOVES_TOTAL,
    rebalance_interval_ms: Annotated[
        int,
        typer.Option(
            min=0,
            help="A controller voter's: also rebalance replicas and preferred leaders this "
            "often, as 'raftmq cluster rebalance' does (0: only when asked).",
        ),
    ] = 0,
    log_format: Annotated[
        LogFormatChoice,
        typer.Option(
            help="text: a line for a person; json: one JSON object per line, with the node, "
            "the RPC, its request id and the partition as fields (README, 'Failures stay small').",
        ),
    ] = LogFormatChoice.TEXT,
    tls_ca: Annotated[
        Path | None,
        typer.Option(
            help="TLS: the CA file that signs the certificates clients and peers present "
            "(needed with --tls-client-auth and for the Raft transport's mutual TLS)."
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="TLS: this broker's certificate (PEM), presented on the client and Raft "
            "listeners and to its peers; re-read when the file changes. Without it every "
            "listener is plaintext."
        ),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS: the key of --tls-cert (PEM).")] = None,
    tls_client_auth: Annotated[
        bool,
        typer.Option(
            help="Mutual TLS on the client listener: refuse clients without a certificate "
            "signed by --tls-ca."
        ),
    ] = False,
    raft_tls_client_auth: Annotated[
        bool,
        typer.Option(
            help="Mutual TLS on the Raft listener: brokers authenticate each other by their "
            "certificates (on by default when TLS is)."
        ),
    ] = True,
    authentication: Annotated[
        str,
        typer.Option(
            help="Who may call the client listener: a comma-separated list of mtls (the "
            "client certificate's principal), scram-sha-256 and oauthbearer (Kafka's SASL "
            "mechanisms). Empty: no authentication. Needs --tls-client-auth: brokers "
            "authenticate each other by certificate (docs/security.md).",
        ),
    ] = "",
    ssl_principal_mapping_rules: Annotated[
        str,
        typer.Option(
            help="Kafka's ssl.principal.mapping.rules: RULE:pattern/replacement/[L|U],..., "
            "DEFAULT, applied to the client certificate's subject DN (RFC 2253).",
        ),
    ] = "",
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="oauthbearer: the file of accepted bearer tokens, one 'PRINCIPAL SHA256HEX' "
            "a line (the token's SHA-256, never the token); re-read when it changes.",
        ),
    ] = None,
    connections_max_reauth_ms: Annotated[
        int,
        typer.Option(
            min=1000,
            help="scram-sha-256: how long a session lasts before the client must "
            "authenticate again (Kafka's connections.max.reauth.ms).",
        ),
    ] = 3_600_000,
    authorizer: Annotated[
        AuthorizerChoice,
        typer.Option(
            help="acl: judge every request by the ACLs in the controller's metadata ('raftmq "
            "acl'), denying what none allows (Kafka's authorizer.class.name); none: allow "
            "everything. With acl, every broker's principal must be in --super-users.",
        ),
    ] = AuthorizerChoice.NONE,
    super_users: Annotated[
        str,
        typer.Option(
            help="Principals the authorizer allows everything, separated by ';' (Kafka's "
            "super.users), e.g. 'User:admin;User:raftmq broker': the brokers' own "
            "(User: and their certificate's common name) must be among them.",
        ),
    ] = "",
    inject_host_fault_after_ms: Annotated[
        int | None,
        typer.Option(
            min=0,
            hidden=True,
            help="Test only: make the Raft host fail this long after start, as if its own "
            "loop broke, to test that the broker then exits with status 3.",
        ),
    ] = None,
) -> None:
    """Run one broker in the foreground until SIGTERM or Ctrl-C (then it hands its
    leaderships over and stops cleanly). Exits with status 3 if its Raft host fails (not one
    partition: those are quarantined and reopened), so that a supervisor restarts it."""
    from raftmq.broker.authentication import AuthenticationSettings, parse_methods
    from raftmq.broker.authorization import parse_super_users
    from raftmq.broker.auto_create import AutoCreate
    from raftmq.broker.process import run
    from raftmq.broker.server import Broker

    log_records.configure(log_format.value, node=f"broker-{id}")
    try:
        security = broker_security(tls_ca, tls_cert, tls_key, require_client_cert=tls_client_auth)
        raft_security = broker_security(
            tls_ca, tls_cert, tls_key, require_client_cert=raft_tls_client_auth
        )
        authentication_settings = AuthenticationSettings(
            parse_methods(authentication),
            ssl_principal_mapping_rules,
            token_file,
            connections_max_reauth_ms / 1000,
        )
        supers = parse_super_users(super_users)
        if (authorizer == AuthorizerChoice.ACL) != bool(supers):
            raise ValueError(
                "--authorizer acl needs --super-users naming at least the brokers' own "
                "principals (they call one another), and --super-users means nothing without "
                "--authorizer acl"
            )
        spec = cluster_file.load(cluster)
        node = Broker(
            id,
            spec,
            data,
            roles=frozenset(r.strip() for r in roles.split(",") if r.strip()) or None,
            rack=rack or None,
            raft_peers=_parse_peers(peers) or None,
            tick_seconds=tick_ms / 1000,
            election_tick=election_ticks,
            listen=_parse_address(listen) if listen else None,
            log_config=LogConfig(
                segment_bytes=segment_bytes,
                retention_bytes=retention_bytes,
                retention_ms=retention_ms,
            ),
            retention_check_seconds=retention_check_ms / 1000,
            leader_rebalance_seconds=leader_rebalance_ms / 1000,
            durability_markers=durability_markers,
            inject_host_fault_after_s=(
                None if inject_host_fault_after_ms is None else inject_host_fault_after_ms / 1000
            ),
            new_broker=new,
            auto_create=AutoCreate(auto_create_partitions, auto_create_replication_factor)
            if auto_create_topics
            else None,
            move_bytes_per_s=move_bytes_per_s,
            scrub_bytes_per_s=scrub_bytes_per_s,
            move_limits=Limits(
                heal_delay_ms=heal_delay_ms,
                moves_per_broker=max_moves_per_broker,
                moves_total=max_moves,
            ),
            rebalance_every_s=rebalance_interval_ms / 1000 or None,
            metrics=metrics,
            metrics_listen=_parse_address(metrics_listen) if metrics_listen else None,
            security=security,
            raft_security=raft_security,
            authentication=authentication_settings,
            acl_authorizer=authorizer == AuthorizerChoice.ACL,
            super_users=supers,
        )
    except (ClusterFileError, ValueError) as exc:
        raise _fail(str(exc), 2) from None
    status = asyncio.run(run(node, parent_pid=parent_pid))
    if status:
        raise typer.Exit(status)


def broker_security(
    ca: Path | None, cert: Path | None, key: Path | None, *, require_client_cert: bool
) -> net.Security:
    """A listener's TLS from the broker's flags: plaintext without a certificate, and the
    files checked at once (a wrong path is a start-up error, not a refused client later)."""
    if cert is None and key is None:
        if ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key (the broker's own)")
        return net.PLAINTEXT
    ca_file, cert_file, key_file = (None if p is None else str(p) for p in (ca, cert, key))
    security = net.Security(
        ca_file, cert_file, key_file, require_client_cert=require_client_cert and ca is not None
    )
    security.files(SERVER)  # raises TlsFileError (a ValueError) naming the bad file
    return security


# --- dev -----------------------------------------------------------------------------


def dev(
    data: Annotated[
        Path, typer.Option(help="Data folder of the local cluster (reused on restart).")
    ] = DEFAULT_DATA,
    brokers: Annotated[int, typer.Option(min=1, max=9, help="How many broker processes.")] = 3,
    dedicated_controllers: Annotated[
        bool,
        typer.Option(
            "--dedicated-controllers",
            help="Run 3 controller-only processes (nodes 1-3, the controller quorum) beside "
            "the broker-only ones (the dedicated-controller layout), instead of every broker "
            "being a controller voter too (combined mode).",
        ),
    ] = False,
    partitions: Annotated[
        int, typer.Option(min=1, max=1000, help="Partitions of the demo topic.")
    ] = 3,
    demo_records: Annotated[
        int, typer.Option(min=0, help="Records the startup demo produces and consumes (0: none).")
    ] = 3000,
    base_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65000,
            help="Broker N listens for clients on BASE+N and for Raft on BASE+100+N "
            "(0: ports the system picks). Used for a new cluster only: an existing one "
            "keeps the ports in its cluster file.",
        ),
    ] = 9090,
    log_format: Annotated[
        LogFormatChoice,
        typer.Option(help="The brokers' log format (their logs are in the data folder)."),
    ] = LogFormatChoice.TEXT,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="TLS on every listener, mutual (client certificates required), and "
            "authentication (SCRAM-SHA-256 and bearer tokens): makes a local CA, "
            "certificates and an admin user under DATA/tls (once), and writes "
            "DATA/client.toml for clients ('--config DATA/client.toml').",
        ),
    ] = False,
) -> None:
    """Start a local cluster of real broker processes, wait until every partition has a
    leader, show it producing and consuming, and stay up until Ctrl-C."""
    path = data / CLUSTER_FILE
    controllers = DEDICATED_CONTROLLERS if dedicated_controllers else 0
    demo = local_spec(
        brokers, {DEMO_TOPIC: partitions}, base_port=base_port, controllers=controllers
    )
    if path.exists():
        try:
            spec = cluster_file.load(path)
        except ClusterFileError as exc:
            raise _fail(f"{exc}. Remove {data} to start a new cluster.", 2) from None
        # dev writes voters into the file only for the dedicated layout.
        made_dedicated = bool(spec.controller_voters) and set(spec.controller_voters) < set(
            spec.brokers
        )
        if len(spec.brokers) != brokers + controllers or made_dedicated != dedicated_controllers:
            held = f"{len(spec.controller_voters)} of them controllers" if made_dedicated else ""
            raise _fail(
                f"{data} holds a cluster of {len(spec.brokers)} nodes"
                f"{f' ({held})' if held else ''}"
                f", not {brokers} broker{'s' if brokers != 1 else ''}"
                f"{f' and {controllers} controllers' if controllers else ''}. Start it with "
                "the --brokers and --dedicated-controllers it was created with, remove the "
                "folder, or pass another --data.",
                2,
            )
        # Its ports as written (clients may know them); a busy one is an error, below. The
        # demo topic is created once; on a restart the controller has it already.
        spec = ClusterSpec(spec.name, spec.brokers, demo.topics, spec.controller_voters)
        where = f"remove {data} to start a new cluster on other ports"
    else:
        spec = demo
        where = "pass another --base-port (0: any free ports)"
    try:
        protected = secure_cluster(data / TLS_FOLDER) if secure else None
        pki = protected.pki if protected else None
        credentials = protected.credentials if protected else None
        cluster = LocalCluster(
            data,
            spec,
            dedicated_controllers=dedicated_controllers,
            broker_args=[
                *("--log-format", log_format.value),
                *(protected.broker_args if protected else ()),
            ],
            **(protected.cluster_settings() if protected else {}),
        )
    except PortInUseError as exc:
        raise _fail(f"{exc.strerror}. Is another 'raftmq dev' using it? Else {where}.", 2) from None
    spec = cluster.spec
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        with Progress(console=console, transient=True) as progress:
            progress.add_task(
                "waiting for the controller, the demo topic and every partition's leader",
                total=None,
            )
            try:
                cluster.wait_for_leaders(timeout=60)
            except TimeoutError as exc:
                raise _fail(f"The cluster did not come up: {exc}") from None
        bound = cluster.wait_ready(exited_ok=True)
        table = Table(title=f"local raftmq cluster '{spec.name}' ({data})")
        for col in ("node", "roles", "client address (gRPC)", "raft address"):
            table.add_column(col, no_wrap=True)
        table.add_column("metrics (Prometheus)", no_wrap=True)
        table.add_column("log", overflow="fold")
        hosts = set(cluster.broker_ids)
        for b in spec.brokers.values():
            roles = [
                r
                for r, on in (("broker", b.id in hosts), ("controller", b.id in spec.voters))
                if on
            ]
            table.add_row(
                str(b.id),
                ",".join(roles),
                b.address,
                f"{b.host}:{b.raft_port}",
                _metrics_url(bound.get(b.id)),
                str(cluster.log_path(b.id)),
            )
        console.print(table)
        if demo_records:
            with cluster.client() as client:
                if not _demo(client, demo_records):
                    raise typer.Exit(1)
        if pki is not None and credentials is not None:
            store_admin(cluster, credentials)
            config = write_client_config(
                data / CLIENT_CONFIG, cluster.addresses, pki, credentials.scram
            )
            console.print(
                f"Cluster is up, with TLS on (mutual) and authentication (SCRAM-SHA-256 or a "
                f"bearer token; user '{ADMIN}'): clients need the settings in {config}. "
                f"Try: raftmq demo "
                f"--config {config}    (any command that connects takes --config; Python "
                "clients take ssl_cafile, ssl_certfile, ssl_keyfile, sasl_mechanism, "
                "sasl_username and sasl_password, as in that file; add users with "
                f"'raftmq user add NAME --config {config}'). Stop with Ctrl-C.",
                highlight=False,
            )
        else:
            console.print(
                f"Cluster is up. Try: raftmq demo --data {data}    Stop with Ctrl-C.",
                highlight=False,
            )
        reported: set[int] = set()
        while not stop["now"]:
            for bid in spec.brokers:
                if not cluster.alive(bid) and bid not in reported:
                    reported.add(bid)
                    console.print(f"[yellow]broker {bid} exited; see {cluster.log_path(bid)}[/]")
            time.sleep(0.2)
    finally:
        console.print("stopping brokers (leadership hand-over, flush, close)...")
        cluster.close()
        console.print("stopped.")


TLS_FOLDER = "tls"
CLIENT_CONFIG = connection.LOCAL_CONFIG


def write_client_config(
    path: Path, addresses: list[str], pki: LocalPki, sasl: SaslSettings | None = None
) -> Path:
    """The client configuration file of a secure dev cluster (raftmq.cli.connection reads
    it): its addresses, the client's TLS files, relative to the file's folder, and its
    credentials (``sasl``; it holds a password, so only its owner may read it)."""

    def rel(p: Path) -> str:
        return str(p.relative_to(path.parent))

    lines = [
        "# Written by 'raftmq dev --secure': use it with --config on any command.",
        f'bootstrap = "{",".join(addresses)}"',
        f'ssl_cafile = "{rel(pki.ca.cert_file)}"',
        f'ssl_certfile = "{rel(pki.client.cert_file)}"',
        f'ssl_keyfile = "{rel(pki.client.key_file)}"',
        *(f"{key} = {json.dumps(value)}" for key, value in (sasl or {}).items()),
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


# --- demo ----------------------------------------------------------------------------


def _metrics_url(bound: BoundAddresses | None) -> str:
    """Where a node serves Prometheus metrics, as a URL to paste ("-": not up, or off)."""
    if bound is None or not bound.metrics:
        return "-"
    return f"http://{bound.metrics}/metrics"


def _demo(client: LowLevelClient, records: int, batch: int = 100) -> bool:
    """Produce ``records`` tagged with a fresh run id, read back the offsets the broker
    acknowledged, and check them (see raftmq.cli.demo_check); other writers' records in
    the topic are ignored. Prints a table and, when something differs, exactly what."""
    md = client.metadata([DEMO_TOPIC])
    partitions = len(md.topics[0].partitions)
    run_id = new_run_id()
    tag = ((RUN_HEADER, run_id),)
    pending: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    written: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    started = time.perf_counter()

    def send(p: int) -> None:
        if not pending[p]:
            return
        resp = client.produce(DEMO_TOPIC, p, build_batch(pending[p]), acks=pb.ACKS_ALL)
        written[p] += [(resp.base_offset + i, r.value or b"") for i, r in enumerate(pending[p])]
        pending[p] = []

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing {records:,} records (acks=all)", total=records)
        for i in range(records):
            key = f"user-{i % 97}".encode()
            p = partition_for_key(key, partitions)
            now = time.time_ns() // 1_000_000
            pending[p].append(Record(key, f"{run_id.hex()}-{i}".encode(), now, tag))
            if len(pending[p]) >= batch:
                send(p)
            progress.advance(task)
        for p in range(partitions):
            send(p)
    produce_s = time.perf_counter() - started
    started = time.perf_counter()
    checks = [
        check_partition(p, run_id, written[p], _read_range(client, p, written[p]))
        for p in range(partitions)
    ]
    consume_s = time.perf_counter() - started
    table = Table(title=f"demo run {run_id.hex()}: topic '{DEMO_TOPIC}'")
    for col in ("partition", "produced", "read back", "missing", "differing", "duplicates"):
        table.add_column(col)
    table.add_column("first offset")
    for c in checks:
        table.add_row(
            str(c.partition),
            f"{c.produced:,}",
            f"{c.read_back:,}",
            *(
                f"[red]{n:,}[/]" if n else "0"
                for n in (len(c.missing), len(c.differing), len(c.duplicates))
            ),
            str(written[c.partition][0][0]) if written[c.partition] else "-",
        )
    console.print(table)
    console.print(
        f"produced {records:,} records in {produce_s:.2f} s, read them back in {consume_s:.2f} s"
        " (records of other writers in the topic are ignored)"
    )
    if all(c.ok for c in checks):
        console.print("[green]Every record came back exactly as written, in order.[/]")
        return True
    console.print("[red]What was read back differs from what was written:[/]")
    for c in checks:
        for line in c.problems():
            console.print(f"[red]  {line}[/]", highlight=False)
    return False


def _read_range(client: LowLevelClient, p: int, written: list[tuple[int, bytes]]) -> list[Record]:
    """Every record from the first acknowledged offset of ``written`` to its last."""
    if not written:
        return []
    offset, last = written[0][0], written[-1][0]
    out: list[Record] = []
    while offset <= last:
        resp = client.fetch(DEMO_TOPIC, p, offset, max_wait_ms=1000)
        out += [r for r in iter_records(resp.entries) if offset <= r.offset <= last]
        if not resp.entries or resp.next_offset <= offset:
            break  # nothing more committed: what is left is reported missing
        offset = resp.next_offset
    return out


RunningClusterData = Annotated[
    Path, typer.Option("--data", help="Data folder of a running 'raftmq dev' cluster.")
]
BootstrapAddresses = Annotated[
    str,
    typer.Option(
        "--bootstrap", help="Broker addresses host:port,... instead of --data's cluster file."
    ),
]


def cluster_addresses(data: Path, bootstrap: str) -> list[str]:
    """The brokers to ask: ``--bootstrap`` if given, else those of ``--config``'s file,
    else those of ``--data``'s cluster file (exits 2 with what to do when there is none)."""
    if bootstrap:
        return [a.strip() for a in bootstrap.split(",") if a.strip()]
    if connection.current().bootstrap:
        return connection.current().bootstrap  # --config's
    path = data / CLUSTER_FILE
    if not path.exists():
        raise _fail(
            f"No cluster file at {path}. Start a local cluster first with 'raftmq dev' "
            "(or 'make dev'), or pass --bootstrap host:port.",
            2,
        )
    return [b.address for b in cluster_file.load(path).brokers.values()]


def demo(
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
    records: Annotated[int, typer.Option(min=1, max=10_000_000, help="How many records.")] = 3000,
) -> None:
    """Produce records to the running cluster with acks=all, consume them back, and check
    they are exactly what was written, in order. Each run tags its records with its own
    id and checks only those, so demos and other writers can share the topic. Exits 1 if
    anything is off, saying which partition and offset."""
    addresses = cluster_addresses(data, bootstrap)
    with LowLevelClient(addresses, **client_tls()) as client:
        try:
            ok = _demo(client, records)
        except ClientError as exc:
            raise _fail(f"The cluster refused the demo: {exc} ({exc.label}).") from None
    if not ok:
        raise typer.Exit(1)


__all__ = [
    "BootstrapAddresses",
    "RunningClusterData",
    "broker",
    "cluster_addresses",
    "demo",
    "dev",
]
