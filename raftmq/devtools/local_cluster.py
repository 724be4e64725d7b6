"""A cluster of real broker processes on this machine, for ``raftmq dev``, integration tests
and the chaos harness: start, SIGKILL, SIGSTOP, restart on the same data and addresses
(reserved for the cluster's lifetime: raftmq.devtools.ports), wait for leaders.

Two layouts, as KRaft has: combined (the default: every node is a broker and a controller
voter) and dedicated (``local_spec(..., controllers=N)``: nodes 1..N are controller-only
voters, the others broker-only). The bootstrap file names the nodes and voters only. The
spec's topics are created through the admin API once the brokers registered
(:meth:`LocalCluster.create_topics`), with their replica lists as given (round-robin over
the broker nodes, from :func:`local_spec`), so tests know who leads what. A broker can join
a running cluster (:meth:`LocalCluster.add_broker`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from raftmq.broker import ready_file
from raftmq.broker.ready_file import BoundAddresses
from raftmq.client import AdminClient, ClientError, LowLevelClient
from raftmq.client.connections import SecuritySettings
from raftmq.client.sasl import SaslSettings
from raftmq.controller import cluster_file
from raftmq.controller.cluster_file import BrokerSpec, ClusterSpec, TopicSpec
from raftmq.controller.placement import round_robin
from raftmq.devtools.certs import LocalPki, principal
from raftmq.devtools.ports import PortReservations

CLUSTER_FILE = "cluster.toml"


def local_spec(
    brokers: int,
    topics: dict[str, int],
    *,
    replication: int = 3,
    base_port: int = 0,
    name: str = "raftmq-dev",
    controllers: int = 0,
) -> ClusterSpec:
    """Nodes on 127.0.0.1 and topics with replicas placed round-robin over the brokers.
    Node ``i`` gets client port ``base_port + i`` and Raft port ``base_port + 100 + i``, or
    with no ``base_port`` ports 0, which :class:`LocalCluster` replaces with reserved ones.

    ``controllers`` > 0: the dedicated layout, nodes 1..``controllers`` controller-only
    voters and ``brokers`` broker-only nodes after them (the voters are named in the file);
    0: combined, every node both."""
    specs = {i: _node(i, base_port) for i in range(1, controllers + brokers + 1)}
    ids = sorted(specs)[controllers:]
    factor = min(replication, brokers)
    out = {}
    for topic, partitions in topics.items():
        replicas = round_robin(ids, partitions, factor)
        out[topic] = TopicSpec(topic, replicas)
    voters = tuple(range(1, controllers + 1))
    return ClusterSpec(name, specs, out, voters)


def _node(node_id: int, base_port: int) -> BrokerSpec:
    return BrokerSpec(
        node_id,
        "127.0.0.1",
        base_port + node_id if base_port else 0,
        base_port + 100 + node_id if base_port else 0,
    )


def tls_broker_args(pki: LocalPki | None, *, client_auth: bool = False) -> list[str]:
    """A broker's command-line flags for TLS with ``pki``'s broker certificate (none for
    plaintext): mutual TLS on the Raft transport, and on the client listener with
    ``client_auth``."""
    if pki is None:
        return []
    return [
        "--tls-ca",
        str(pki.ca.cert_file),
        "--tls-cert",
        str(pki.broker.cert_file),
        "--tls-key",
        str(pki.broker.key_file),
        "--tls-client-auth" if client_auth else "--no-tls-client-auth",
    ]


def acl_broker_args(pki: LocalPki | None, operators: Sequence[str] = ()) -> list[str]:
    """A secure cluster's authorization flags: the ACL authorizer on, with the brokers'
    certificate principal (they call one another with it) and the operators as super
    users (by default the client certificate's principal: a cluster that authenticates
    by certificate alone); other principals get what ACLs allow them. None for a
    plaintext cluster (every caller is anonymous there)."""
    if pki is None:
        return []
    users = ";".join((principal(pki.broker), *(operators or (principal(pki.client),))))
    return ["--authorizer", "acl", "--super-users", users]


def reserve_spec_ports(spec: ClusterSpec, ports: PortReservations) -> ClusterSpec:
    """``spec`` with every broker port reserved in ``ports``: a port 0 becomes one the
    kernel picked, an explicit one is taken as given (:class:`PortInUseError`, naming the
    broker and the port, if another process holds it)."""
    brokers = {
        b.id: BrokerSpec(
            b.id,
            b.host,
            ports.take(b.port, what=f"broker {b.id}'s client address"),
            ports.take(b.raft_port, what=f"broker {b.id}'s Raft address"),
        )
        for b in spec.brokers.values()
    }
    return ClusterSpec(spec.name, brokers, spec.topics, spec.controller_voters)


class LocalCluster:
    def __init__(
        self,
        data: Path,
        spec: ClusterSpec,
        *,
        broker_args: list[str] | None = None,
        per_broker_args: dict[int, list[str]] | None = None,
        nofile: int | tuple[int, int] | None = None,
        ports: PortReservations | None = None,
        dedicated_controllers: bool = False,
        pki: LocalPki | None = None,
        client_auth: bool = False,
        client_credentials: SaslSettings | None = None,
    ) -> None:
        """``dedicated_controllers``: the spec's voters run as controller-only processes
        (``--roles controller``), the other nodes as brokers (see :func:`local_spec`).
        ``per_broker_args`` adds arguments to one broker's command line (chaos passes
        ``--peers`` and ``--listen`` to route traffic through proxies). ``nofile`` starts
        the brokers with that open-file limit, soft and hard (so they cannot raise it), as
        on a host whose default is low; a pair (soft, hard) sets a soft limit under a higher
        hard one, as most shells start with (a broker raises it at start).

        The ports the brokers bind stay reserved until :meth:`close` (why and how:
        raftmq.devtools.ports), so a restarted broker finds its addresses free. Without
        ``ports`` every port of ``spec`` is reserved here (ports 0 replaced by real ones in
        :attr:`spec` and the cluster file); a caller that binds brokers elsewhere (chaos:
        ``--listen``) passes the reservations it made, and the cluster closes them.

        ``pki``: TLS on every listener with these certificates (raftmq.devtools.certs),
        mutual on the Raft transport, and on the client listener too with ``client_auth``;
        the cluster's own clients (:meth:`client`, :meth:`admin`) present the client
        certificate (:attr:`client_tls`). ``client_credentials``: the ``sasl_`` settings
        those clients authenticate with, when the brokers run with ``--authentication``."""
        if ports is None:
            ports = PortReservations()
            try:
                spec = reserve_spec_ports(spec, ports)
            except OSError:
                ports.close()
                raise
        if dedicated_controllers and not set(spec.controller_voters) < set(spec.brokers):
            raise ValueError(
                "dedicated controllers need the voters named in the spec and broker nodes "
                "beside them: local_spec(brokers, topics, controllers=N)"
            )
        self.dedicated_controllers = dedicated_controllers
        self.ports = ports
        self.data = data
        self.spec = spec
        self.pki = pki
        self.client_credentials = SaslSettings(**(client_credentials or {}))
        self.broker_args = [*(broker_args or []), *tls_broker_args(pki, client_auth=client_auth)]
        self.per_broker_args = per_broker_args or {}
        self.nofile = nofile
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        # Brokers with no folder yet are new: their first start says so (``--new``), so
        # one that starts after its peers elected leaders is not taken for a broker whose
        # disk was replaced. Later starts (after a wipe, say) leave the question to it.
        self._new = {bid for bid in spec.brokers if not (data / f"broker-{bid}").exists()}
        self.topics_created = False
        data.mkdir(parents=True, exist_ok=True)
        self.cluster_path = data / CLUSTER_FILE
        self._cluster_files: dict[int, Path] = {}  # a broker added later: its own file
        self.cluster_path.write_text(cluster_file.dump(spec))

    @property
    def broker_ids(self) -> list[int]:
        """The nodes that host partitions (every node unless the controllers are
        dedicated)."""
        voters = set(self.spec.voters) if self.dedicated_controllers else set()
        return [bid for bid in self.spec.brokers if bid not in voters]

    @property
    def addresses(self) -> list[str]:
        """Client addresses of the nodes that answer Metadata for partitions (brokers)."""
        return [self.spec.brokers[bid].address for bid in self.broker_ids]

    @property
    def controller_addresses(self) -> list[str]:
        """Client addresses of the controller voters (they serve the admin API)."""
        return [self.spec.brokers[v].address for v in self.spec.voters]

    def add_broker(self) -> int:
        """Start a broker that was not in the cluster at its start, with the next free id
        and new reserved ports, as an operator adds a machine: its first start says
        ``--new``. Its own cluster file names only the controller voters and itself: all
        it needs, since the other brokers' addresses come with the metadata, and they
        learn its Raft address the same way once it registers. Returns its id."""
        new_id = max(self.spec.brokers) + 1
        node = BrokerSpec(
            new_id,
            "127.0.0.1",
            self.ports.take(0, what=f"broker {new_id}'s client address"),
            self.ports.take(0, what=f"broker {new_id}'s Raft address"),
        )
        voters = self.spec.voters
        own = ClusterSpec(
            self.spec.name,
            {**{v: self.spec.brokers[v] for v in voters}, new_id: node},
            controller_voters=voters,
        )
        self._cluster_files[new_id] = self.data / f"cluster-{new_id}.toml"
        self._cluster_files[new_id].write_text(cluster_file.dump(own))
        self.spec = ClusterSpec(
            self.spec.name, {**self.spec.brokers, new_id: node}, self.spec.topics, voters
        )
        self._new.add(new_id)
        self.start(new_id)
        return new_id

    def log_path(self, broker_id: int) -> Path:
        return self.data / f"broker-{broker_id}.log"

    def start(
        self,
        broker_id: int | None = None,
        *,
        open_files_limit: int | tuple[int, int] | None = None,
    ) -> None:
        """Start one broker (or every one not running). ``open_files_limit`` (default: the
        cluster's ``nofile``) starts it with that RLIMIT_NOFILE, soft and hard or a pair
        (soft, hard), as a host with a low limit would (the chaos harness's
        ``fd-pressure`` fault)."""
        if open_files_limit is None:
            open_files_limit = self.nofile
        for bid in [broker_id] if broker_id else list(self.spec.brokers):
            if bid in self.procs and self.procs[bid].poll() is None:
                continue
            cmd = [
                sys.executable,
                "-m",
                "raftmq.cli.main",
                "broker",
                "--id",
                str(bid),
                "--cluster",
                str(self._cluster_files.get(bid, self.cluster_path)),
                "--data",
                str(self.data),
                # Brokers run in their own session, so a Ctrl-C reaches only this process,
                # which stops them in order; they stop by themselves if it dies.
                "--parent-pid",
                str(os.getpid()),
                *self.broker_args,
            ]
            if self.dedicated_controllers and bid in self.spec.voters:
                cmd += ["--roles", "controller"]
            cmd += self.per_broker_args.get(bid, [])
            if bid in self._new:
                cmd.append("--new")
                self._new.discard(bid)
            if open_files_limit is not None:
                # prlimit(1) (util-linux) rather than a preexec_fn: forking a process that
                # runs gRPC threads to call setrlimit in the child is not safe.
                soft, hard = (
                    open_files_limit
                    if isinstance(open_files_limit, tuple)
                    else (open_files_limit, open_files_limit)
                )
                cmd = ["prlimit", f"--nofile={soft}:{hard}", "--", *cmd]
            # A ready file present after this start is this run's (see wait_ready).
            (self.data / f"broker-{bid}" / ready_file.READY_FILE).unlink(missing_ok=True)
            with open(self.log_path(bid), "ab") as logfile:
                self.procs[bid] = subprocess.Popen(
                    cmd,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def signal(self, broker_id: int, sig: signal.Signals) -> None:
        proc = self.procs.get(broker_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def kill(self, broker_id: int) -> None:
        """SIGKILL: no hand-over, no flush. Resumes a paused process first."""
        proc = self.procs.pop(broker_id, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)

    def stop(self, broker_id: int | None = None, timeout: float = 15.0) -> None:
        """SIGTERM (graceful hand-over and flush), then SIGKILL after ``timeout``."""
        ids = [broker_id] if broker_id else list(self.procs)
        for bid in ids:
            self.signal(bid, signal.SIGCONT)
            self.signal(bid, signal.SIGTERM)
        for bid in ids:
            proc = self.procs.pop(bid, None)
            if proc is None:
                continue
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def alive(self, broker_id: int) -> bool:
        proc = self.procs.get(broker_id)
        return proc is not None and proc.poll() is None

    def wait_ready(
        self, broker_id: int | None = None, timeout: float = 60.0, *, exited_ok: bool = False
    ) -> dict[int, BoundAddresses]:
        """Block until the broker (or every started one) reports the addresses it bound
        (:mod:`raftmq.broker.ready_file`). A broker that exits first raises at once, with
        where its log is, unless ``exited_ok`` (then it is left out of the answer)."""
        ids = [broker_id] if broker_id else list(self.procs)
        deadline = time.monotonic() + timeout
        out: dict[int, BoundAddresses] = {}
        exited: set[int] = set()
        while True:
            for bid in ids:
                if bid in out or bid in exited:
                    continue
                bound = ready_file.read(self.data / f"broker-{bid}")
                if bound is not None:
                    out[bid] = bound
                    continue
                proc = self.procs.get(bid)
                if proc is None or proc.poll() is not None:
                    if exited_ok:
                        exited.add(bid)
                        continue
                    status = "not started" if proc is None else f"status {proc.returncode}"
                    raise RuntimeError(
                        f"broker {bid} exited ({status}) before it was listening; "
                        f"see {self.log_path(bid)}"
                    )
            if len(out) + len(exited) == len(ids):
                return out
            if time.monotonic() > deadline:
                late = sorted(set(ids) - set(out) - exited)
                raise TimeoutError(
                    f"brokers {late} did not report their addresses within {timeout:.0f} s; "
                    f"see {self.data}/broker-*.log"
                )
            time.sleep(0.02)

    @property
    def client_tls(self) -> SecuritySettings:
        """The TLS settings of a client of this cluster, and its credentials when the
        cluster authenticates, as keyword arguments of every client (none for a plaintext
        cluster without authentication)."""
        settings = SecuritySettings(**self.client_credentials)
        if self.pki is not None:
            settings["ssl_cafile"] = str(self.pki.ca.cert_file)
            settings["ssl_certfile"] = str(self.pki.client.cert_file)
            settings["ssl_keyfile"] = str(self.pki.client.key_file)
        return settings

    def admin(self) -> AdminClient:
        """A client of the controller's admin API, served by the voters."""
        return AdminClient(self.controller_addresses, **self.client_tls)

    def create_topics(self, timeout: float = 60.0) -> None:
        """Once per cluster: wait until the controller has a leader and every broker
        registered, then create the spec's topics with their replica lists. A topic that
        exists already (a cluster restarted on its data) is taken as it is: the spec is
        updated to the controller's replica lists."""
        if self.topics_created:
            return
        deadline = time.monotonic() + timeout
        wanted = set(self.broker_ids)
        with self.admin() as admin:
            while True:
                try:
                    brokers = {b.id for b in admin.describe_cluster().brokers}
                except ClientError:
                    brokers = set()
                if wanted <= brokers:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"brokers {sorted(wanted - brokers)} did not register with the "
                        f"controller within {timeout:.0f} s; see {self.data}/broker-*.log"
                    )
                time.sleep(0.05)
            topics = dict(self.spec.topics)
            for name, topic in self.spec.topics.items():
                try:
                    admin.create_topic(
                        name, topic.partitions, len(topic.replicas[0]), assignment=topic.replicas
                    )
                except ClientError as exc:
                    if exc.label != "TOPIC_ALREADY_EXISTS":
                        raise
                    described = admin.describe_topic(name)
                    topics[name] = TopicSpec(
                        name, tuple(tuple(p.replicas) for p in described.partitions)
                    )
        self.spec = ClusterSpec(
            self.spec.name, self.spec.brokers, topics, self.spec.controller_voters
        )
        self.topics_created = True

    def client(self) -> LowLevelClient:
        return LowLevelClient(self.addresses, **self.client_tls)

    def wait_for_leaders(
        self, timeout: float = 30.0, among: set[int] | None = None, *, preferred: bool = False
    ) -> dict:
        """Block until every partition reports a leader (optionally one of ``among``; with
        ``preferred``, its first-listed replica, where leader rebalancing puts it once that
        replica is in sync: then no hand-back will move it later)."""
        self.wait_ready(timeout=timeout, exited_ok=True)
        self.create_topics(timeout=timeout)
        wanted = {(t.name, p) for t in self.spec.topics.values() for p in range(t.partitions)}
        first = {
            (t.name, p): replicas[0]
            for t in self.spec.topics.values()
            for p, replicas in enumerate(t.replicas)
        }
        deadline = time.monotonic() + timeout
        with LowLevelClient(self.addresses, retries=1, **self.client_tls) as client:
            while True:
                leaders = client.refresh_leaders(timeout=1.0)
                good = {
                    k
                    for k, v in leaders.items()
                    if (among is None or v.broker_id in among)
                    and (not preferred or v.broker_id == first[k])
                }
                if wanted <= good:
                    return leaders
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"partitions without {'their preferred' if preferred else 'a'} leader"
                        f" after {timeout:.0f} s: "
                        f"{sorted(wanted - good)}; see {self.data}/broker-*.log"
                    )
                time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=10)
        for bid in list(self.procs):
            self.kill(bid)
        self.ports.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
