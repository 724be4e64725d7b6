"""A broker process: the Raft driver for every partition replica it hosts, the TCP listener
for Raft traffic, and the gRPC server for clients. This module wires the parts and runs
their lifecycle; each part lives in its own module: the request layer (routing.py) behind
the gRPC services (service.py and the others, over rpc.py), metadata reconciliation
(reconciler.py), retention (retention.py), leadership (leadership.py), registration and
heartbeats (registration.py), the leader reports and replica-set moves (leader_reports.py,
membership_driver.py).

Shutdown is graceful on SIGTERM/SIGINT: leadership moves to another live replica first,
then clients are refused, then the logs are flushed and closed. A SIGKILL needs nothing:
the logs recover their tails and Raft catches the replica up.

Failures stay small: an error in one partition's log quarantines that replica alone (the
Raft host reopens it from disk with backoff, and Metadata says it failed and why). If the
Raft host itself fails, the broker cannot serve anything: it exits with status 3
(crash-only; raftmq.broker.process) so that a supervisor restarts it, instead of living on
as a zombie.
grpc.health.v1 says SERVING only while the host runs and the broker is not stopping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from raftmq import net
from raftmq.broker.admin_redirect import AdminRedirect, add_admin_redirect
from raftmq.broker.admin_service import AdminService, add_admin_service
from raftmq.broker.authentication import (
    SCRAM,
    AuthenticationSettings,
    listener_authenticator,
)
from raftmq.broker.authorization import AclAuthorizer
from raftmq.broker.auto_create import AutoCreate, TopicCreator
from raftmq.broker.client_quotas import ClientQuotas
from raftmq.broker.controller_link import ControllerLink
from raftmq.broker.controller_service import ControllerService, add_controller_service
from raftmq.broker.delay_mover import DELAY_CONFIG, DelayMovers, Sender
from raftmq.broker.groups_service import GroupsService, add_groups_redirect, add_groups_service
from raftmq.broker.guard import Guard
from raftmq.broker.history_probe import mark_wiped_voter
from raftmq.broker.leader_reports import LeaderReports
from raftmq.broker.leadership import Leadership
from raftmq.broker.membership_driver import MembershipDriver
from raftmq.broker.metadata_cache import MetadataCache, without_lost_topics
from raftmq.broker.metrics import BrokerMetrics
from raftmq.broker.open_files import connection_cap, open_files_note
from raftmq.broker.quota_metrics import QuotaCollector
from raftmq.broker.ready_file import BoundAddresses
from raftmq.broker.reconciler import Reconciler
from raftmq.broker.registration import Registration, next_incarnation
from raftmq.broker.retention import Retention
from raftmq.broker.routing import MAX_FETCH_BYTES, Router
from raftmq.broker.rpc import guard_server
from raftmq.broker.scram_service import ScramService, add_scram_service
from raftmq.broker.service import BrokerService, add_to_server
from raftmq.broker.share_control import ShareControl
from raftmq.broker.share_dead_letters import DeadLetterWriter
from raftmq.broker.share_groups_service import (
    ShareGroupsService,
    add_share_groups_redirect,
    add_share_groups_service,
)
from raftmq.broker.share_service import SharePartitionsService, add_share_service
from raftmq.broker.transactions_service import (
    TransactionsService,
    add_transactions_redirect,
    add_transactions_service,
)
from raftmq.controller.cluster_file import ClusterSpec
from raftmq.controller.healing import DEFAULT_LIMITS, Limits
from raftmq.controller.model import MetadataState
from raftmq.controller.mover import Mover
from raftmq.controller.quorum import ControllerQuorum
from raftmq.format.delay import LEVELS
from raftmq.log.config import LogConfig
from raftmq.log.durability_markers import durability_marker_writer
from raftmq.partition.replica import PartitionReplica
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.repair import SCRUB_BYTES_PER_S
from raftmq.raft.host.tcp import TcpTransport
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

HEALTH_SERVICES = ("", "raftmq.v1.Broker")
"""grpc.health.v1 service names a broker reports: the whole server, and the Broker API."""

GRPC_MESSAGE_LIMIT = MAX_FETCH_BYTES + (1 << 20)

BROKER = "broker"
CONTROLLER = "controller"
ROLES = frozenset({BROKER, CONTROLLER})


class Broker:
    def __init__(
        self,
        broker_id: int,
        bootstrap: ClusterSpec,
        data_dir: Path,
        *,
        roles: frozenset[str] | None = None,
        rack: str | None = None,
        raft_peers: dict[int, tuple[str, int]] | None = None,
        log_config: LogConfig | None = None,
        tick_seconds: float = 0.1,
        election_tick: int = 10,
        listen: tuple[str, int] | None = None,
        retention_check_seconds: float = 60.0,
        leader_rebalance_seconds: float = 5.0,
        durability_markers: bool = False,
        inject_host_fault_after_s: float | None = None,
        new_broker: bool = False,
        auto_create: AutoCreate | None = None,
        move_bytes_per_s: int = 0,
        scrub_bytes_per_s: int = SCRUB_BYTES_PER_S,
        move_limits: Limits = DEFAULT_LIMITS,
        rebalance_every_s: float | None = None,
        metrics: bool = True,
        metrics_listen: tuple[str, int] | None = None,
        security: net.Security = net.PLAINTEXT,
        raft_security: net.Security = net.PLAINTEXT,
        authentication: AuthenticationSettings | None = None,
        acl_authorizer: bool = False,
        super_users: frozenset[str] = frozenset(),
    ) -> None:
        """``bootstrap`` names the nodes (id, client and Raft addresses) and the controller
        voters, KRaft's ``controller.quorum.voters``; topics come from the controller only.
        ``roles``: BROKER (hosts partition replicas), CONTROLLER (a voter of the metadata
        group), or both (combined mode, the default for a voter; BROKER for the others).
        ``new_broker``: the operator's word that this broker never held a replica (a new
        cluster, or a broker being added), so a missing data folder needs no probe of its
        peers for a past: a broker that merely starts after its peers elected leaders must
        not pass for one whose disk was replaced, which would keep its replicas from voting
        until a leader catches them up. Ignored when the data folder exists.
        ``move_bytes_per_s`` caps what the partitions this broker leads send to learners,
        the replicas a move adds, all together (0: no cap).
        ``scrub_bytes_per_s`` paces the background re-reading of sealed segments that
        finds bit rot before a reader does (0: no scrubbing; reads still find and repair).
        ``listen`` binds the client service elsewhere than the address the bootstrap file
        advertises (clients of a chaos test reach it through a proxy).
        ``log_config`` holds the broker-wide defaults; a topic's config overrides them.
        ``leader_rebalance_seconds`` paces :meth:`Leadership.restore_preferred_leaders`
        (0: never).
        ``durability_markers`` is for tests only: see :func:`durability_marker_writer`.
        ``inject_host_fault_after_s`` is for tests only: the Raft host fails that long after
        start, as if its own loop broke (see :meth:`RaftHost.inject_host_fault`).
        ``auto_create``: create a topic a produce names if the metadata does not (None:
        refuse it, the default; see :mod:`raftmq.broker.auto_create`).
        ``move_limits``: the controller mover's heal delay and move limits (a voter's);
        ``rebalance_every_s``: its rebalance timer (None: rebalance only when asked).
        ``metrics``: serve Prometheus metrics at ``/metrics`` on ``metrics_listen`` (None:
        the advertised host, a port the kernel picks; the bound address is in
        :attr:`bound`), and count what they report (off: nothing is counted).
        ``security``: TLS of the client listener (mutual with ``require_client_cert``) and of
        this broker's own calls to its peers' client services; ``raft_security``: of the
        Raft transport, listener and dials (docs/security.md).
        ``authentication``: who may call the client listener (raftmq.broker.authentication;
        None: anyone, as without authentication).
        ``acl_authorizer``: judge every client-service call by the metadata's ACLs, all
        allowed to ``super_users`` (the brokers' own principals must be among them;
        :mod:`raftmq.broker.authorization`)."""
        if broker_id not in bootstrap.brokers:
            raise ValueError(
                f"broker id {broker_id} is not in the cluster file "
                f"(ids: {sorted(bootstrap.brokers)})"
            )
        if bootstrap.topics:
            raise ValueError(
                "the cluster file lists topics; topics now live in the controller: remove "
                "its [[topics]] and create them with 'raftmq topic create' or the admin API"
            )
        voters = bootstrap.voters
        is_voter = broker_id in voters
        roles = roles if roles is not None else (ROLES if is_voter else frozenset({BROKER}))
        if not roles or not roles <= ROLES:
            raise ValueError(f"roles must be broker, controller or both, not {sorted(roles)}")
        if (CONTROLLER in roles) != is_voter:
            raise ValueError(
                f"node {broker_id} {'is' if is_voter else 'is not'} a controller voter in the "
                f"cluster file (voters: {sorted(voters)}), so its roles must "
                f"{'' if is_voter else 'not '}include controller"
            )
        self.id = broker_id
        self.roles = roles
        self.bootstrap = bootstrap
        self.metadata_version = 0
        self.data_dir = data_dir / f"broker-{broker_id}"
        probe_for_a_past = not self.data_dir.exists() and len(bootstrap.brokers) > 1
        """No data folder: ask the peers, once, whether this broker lost one (see
        :meth:`Reconciler._mark_replaced_replicas`), unless the operator said it is new."""
        if probe_for_a_past and new_broker:
            probe_for_a_past = False
            log.info("broker %d: new (--new): its peers are not asked for a past", broker_id)
        self._probe_metadata_past = probe_for_a_past and is_voter and len(voters) > 1
        """Likewise for the metadata group, before it opens (:func:`mark_wiped_voter`)."""
        self.metadata_cache = MetadataCache(self.data_dir, bootstrap.name)
        me = bootstrap.brokers[broker_id]
        self.raft_peers = dict(raft_peers or {})
        peers = {
            b.id: self.raft_peers.get(b.id, (b.host, b.raft_port))
            for b in bootstrap.brokers.values()
            if b.id != broker_id
        }
        self.transport = TcpTransport(
            broker_id,
            (me.host, me.raft_port),
            peers,
            cluster=bootstrap.name,
            security=raft_security,
        )
        self.security = security
        self.authentication = authentication or AuthenticationSettings()
        self.authentication.check(mutual_tls=security.require_client_cert)
        self.host = RaftHost(
            broker_id,
            self.transport,
            tick_s=tick_seconds,
            election_tick=election_tick,
            seed=broker_id,
            learner_bytes_per_s=move_bytes_per_s,
            scrub_bytes_per_s=scrub_bytes_per_s,
        )
        self.voter_addresses = {v: bootstrap.brokers[v].address for v in sorted(voters)}
        self.quorum: ControllerQuorum | None = None
        self.move_limits = move_limits
        self.rebalance_every_s = rebalance_every_s
        self.mover: Mover | None = None
        self.link = ControllerLink(self.voter_addresses, security=security)
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self.leader_reports = LeaderReports(
            broker_id,
            self.link.report_leader,
            self.replicas,
            lambda: self.metadata,
            lambda: self.host.soft_state_changes,
        )
        self.topic_creator = (
            TopicCreator(auto_create, self.link.create_topic, lambda: self.metadata)
            if auto_create is not None
            else None
        )
        self.delay_creator = TopicCreator(
            AutoCreate(partitions=LEVELS),
            lambda name, count, factor: self.link.create_topic(name, count, factor, DELAY_CONFIG),
            lambda: self.metadata,
        )
        self.moves = MembershipDriver(
            self.host,
            self.replicas,
            report=self.link.promote_replica,
            leave=lambda topic, p, why: self.reconciler.leave_replica(topic, p, why),
            alive=self.transport.peer_alive,
            newest_version=lambda: self.link.controller_version,
        )
        """Has the groups this broker leads follow the metadata's replica sets."""
        self.stopping = False
        self.leadership = Leadership(
            broker_id,
            self.host,
            self.replicas,
            lambda: self.metadata,
            self.transport.peer_alive,
            lambda: self.stopping,
            leader_rebalance_seconds,
        )
        self.reconciler = Reconciler(
            broker_id,
            self.data_dir,
            self.host,
            self.transport,
            self.replicas,
            self.moves,
            cluster_name=bootstrap.name,
            log_config=log_config or LogConfig(),
            static_peers=set(self.raft_peers),
            bootstrap_addresses={b.id: b.address for b in bootstrap.brokers.values()},
            probe_for_a_past=probe_for_a_past,
            durability_markers=durability_markers,
            stopping=lambda: self.stopping,
            epoch=lambda: self.registration.epoch,
            prefer=self.leadership.prefer,
            track=self._track,
            security=security,
        )
        self.unopened = self.reconciler.unopened
        self.delay_movers = DelayMovers(
            self.replicas, lambda: self.metadata, lambda: self.stopping, security
        )
        self._dead_letter_sender = Sender(
            lambda: self.metadata, self.replicas, security, delayed=False
        )
        self.share_control = ShareControl(
            self.replicas,
            lambda: self.metadata,
            lambda: self.stopping,
            extra=[DeadLetterWriter(self._dead_letter_sender)],
        )
        self.retention = Retention(
            broker_id,
            self.data_dir,
            self.host,
            self.replicas,
            lambda: self.metadata,
            self.reconciler.delete_replica,
            lambda: self.stopping,
            retention_check_seconds,
            floor=lambda r: self.delay_movers.retention_index(r.topic, r.partition),
        )
        self.listen = listen or (me.host, me.port)
        self.quotas = ClientQuotas(lambda: self.metadata)
        self.metrics = BrokerMetrics(self, metrics_listen or (me.host, 0)) if metrics else None
        if self.metrics is not None:
            self.metrics.registry.register(QuotaCollector(self.quotas))
        self.durability_markers = durability_markers
        self.inject_host_fault_after_s = inject_host_fault_after_s
        self.health = health.aio.HealthServicer()
        self.registration: Registration = Registration(
            broker_id,
            self.link,
            (me.host, me.port),
            rack,
            lambda: self.stopping,
            lambda: self.metadata_version,
        )
        self._delay_task: asyncio.Task[None] | None = None
        self._share_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._retention_task: asyncio.Task[None] | None = None
        self._rebalance_task: asyncio.Task[None] | None = None
        self._report_task: asyncio.Task[None] | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._moves_task: asyncio.Task[None] | None = None
        self._reopen_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._prefer_tasks: set[asyncio.Task[None]] = set()
        self._server: grpc.aio.Server | None = None
        self._admin: AdminService | None = None
        self._transactions: TransactionsService | None = None
        self.bound: BoundAddresses | None = None
        self.authorizer = (
            AclAuthorizer(lambda: self.metadata, super_users, auto_create=auto_create is not None)
            if acl_authorizer
            else None
        )

    @property
    def metadata(self) -> MetadataState:
        """The newest metadata this broker applied (empty until the first arrives)."""
        return self.reconciler.metadata

    @property
    def open_files_note(self) -> str:
        return self.reconciler.open_files_note

    async def start(self) -> None:
        """Open the controller's metadata group (a voter), serve clients, then, in the
        background, register with the controller and follow its metadata: the partition
        replicas open as the metadata names them (:meth:`Reconciler.reconcile`)."""
        # Before any log opens: the cap decides how many segment files stay open.
        # Replicas open later, as the metadata names them (checked again then).
        known = self.reconciler.topic_ids.count_on_disk()
        note, too_low = open_files_note(known)
        self.reconciler.open_files_note, self.reconciler.said_too_few_files = note, too_low
        log.log(logging.WARNING if too_low else logging.INFO, "broker %d: %s", self.id, note)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.registration.incarnation = next_incarnation(self.data_dir)
        if CONTROLLER in self.roles:
            if self._probe_metadata_past:
                await mark_wiped_voter(self.voter_addresses, self.id, self.data_dir, self.security)
            self.quorum = await ControllerQuorum.open(
                self.host,
                self.data_dir,
                self.voter_addresses,
                self.bootstrap.name,
                on_durable=durability_marker_writer() if self.durability_markers else None,
            )
        await self.host.start()
        if self.quorum is not None:
            self.quorum.start()
            self.mover = Mover(
                self.quorum, self.move_limits, rebalance_every_s=self.rebalance_every_s
            )
            self.mover.start()
            campaign = self.leadership.campaign_for_metadata(self.quorum)
            self._track(asyncio.get_running_loop().create_task(campaign))
        metrics = self.metrics
        self._server = net.aio_server(
            max_message_bytes=GRPC_MESSAGE_LIMIT,
            interceptors=[metrics.interceptor] if metrics is not None else [],
            max_connections=connection_cap(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
        )
        scram_service = None
        if SCRAM in self.authentication.methods:
            scram_service = ScramService(
                lambda: self.metadata.scram_users,
                session_lifetime_s=self.authentication.session_lifetime_s,
            )
        self.authenticator = listener_authenticator(self.authentication, scram_service)
        guard = Guard(authenticator=self.authenticator, authorizer=self.authorizer)
        guard_server(self._server, guard)
        if scram_service is not None:
            add_scram_service(scram_service, self._server)
        router = Router(
            self,
            lambda count: self.link.allocate_producer_ids(self.id, count),
            lambda topic, p, force: self.reconciler.rebuild_replica(topic, p, force=force),
            traffic=metrics.traffic if metrics is not None else None,
        )
        each = None if self.authorizer is None else guard.authorize_each("Produce")
        add_to_server(BrokerService(router, self.quotas, each), self._server)
        add_share_service(SharePartitionsService(router, self), self._server)
        if self.quorum is not None:
            add_controller_service(
                ControllerService(self.quorum, self.voter_addresses), self._server
            )
            self._admin = AdminService(
                self.quorum, self.voter_addresses, self.move_limits, security=self.security
            )
            add_admin_service(self._admin, self._server)
            add_groups_service(GroupsService(self.quorum, self.voter_addresses), self._server)
            add_share_groups_service(
                ShareGroupsService(self.quorum, self.voter_addresses), self._server
            )
            self._transactions = TransactionsService(
                self.quorum, self.voter_addresses, security=self.security
            )
            add_transactions_service(self._transactions, self._server)
            self._transactions.start()
        else:
            link = self.link
            redirect = AdminRedirect(self.id, self.voter_addresses, lambda: link.leader_address)
            add_admin_redirect(redirect, self._server)
            add_groups_redirect(redirect, self._server)
            add_share_groups_redirect(redirect, self._server)
            add_transactions_redirect(redirect, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        client_port = net.add_port(
            self._server, f"{self.listen[0]}:{self.listen[1]}", security=self.security
        )
        await self._server.start()
        # What was bound, not what was asked for: the launcher waits on this (ready_file).
        me = self.bootstrap.brokers[self.id]
        self.bound = BoundAddresses(
            os.getpid(),
            f"{self.listen[0]}:{client_port}",
            f"{me.host}:{self.transport.port}",
            metrics.start() if metrics is not None else "",
        )
        for service in HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        loop = asyncio.get_running_loop()
        self._watch_task = loop.create_task(self._not_serving_once_the_host_fails())
        if self.inject_host_fault_after_s is not None:
            fault = RuntimeError("injected host fault (--inject-host-fault-after-ms, tests only)")
            loop.call_later(self.inject_host_fault_after_s, self.host.inject_host_fault, fault)
        self._retention_task = loop.create_task(self.retention.run())
        if BROKER in self.roles:
            self._delay_task = loop.create_task(self.delay_movers.run())
            self._share_task = loop.create_task(self.share_control.run())
            self._follow_task = loop.create_task(self._join_and_follow())
            self._report_task = loop.create_task(self.leader_reports.run())
            self._moves_task = loop.create_task(self.moves.run())
            self._reopen_task = loop.create_task(self.reconciler.reopen_failed_replicas())
            if self.leadership.rebalance_seconds > 0:
                self._rebalance_task = loop.create_task(self.leadership.restore_preferred_leaders())
        elif self.quorum is not None:
            self._follow_task = loop.create_task(self._follow_own_copy())
        log.info(
            "broker %d (%s) serving clients on %s, raft on %s",
            self.id,
            " and ".join(sorted(self.roles)),
            self.bound.client,
            self.bound.raft,
        )

    async def _not_serving_once_the_host_fails(self) -> None:
        await self.host.wait_failed()
        await self.health.enter_graceful_shutdown()  # NOT_SERVING, and it stays so

    # --- following the controller ---------------------------------------------------------

    async def _join_and_follow(self) -> None:
        """Register (retried until the controller answers), heartbeat, and apply every
        metadata version the controller publishes. The last one applied before a restart
        is applied first, from the disk, without waiting for the controller
        (:mod:`raftmq.broker.metadata_cache`); the watch resumes after it."""
        cached = self.metadata_cache.load()
        if cached is not None:
            cached = without_lost_topics(
                cached, self.id, lambda topic, p: (self.data_dir / f"{topic}-{p}").exists()
            )
            log.info("broker %d: applying its cached metadata version %d", self.id, cached.version)
            try:
                await self.reconciler.reconcile(cached)
                self.metadata_version = cached.version
            except Exception:  # the controller's copy will do: wait for it
                log.exception("broker %d: applying its cached metadata failed", self.id)
        self.metadata_cache.start()
        registration = self.registration
        await registration.register((self.bootstrap.brokers[self.id].host, self.transport.port))
        log.info(
            "broker %d registered with the controller (incarnation %d, epoch %d)",
            self.id,
            registration.incarnation,
            registration.epoch,
        )
        self._heartbeat_task = asyncio.get_running_loop().create_task(registration.heartbeat_loop())
        if self.quorum is not None:
            updates = self.quorum.watch(self.metadata_version)
        else:
            updates = self.link.watch(self.metadata_version)
        async for version, state in updates:
            if self.stopping:
                return
            try:
                await self.reconciler.reconcile(state)
            except Exception:  # one bad version must not stop the broker following
                log.exception("broker %d: applying metadata version %d failed", self.id, version)
            self.metadata_version = version
            self.metadata_cache.offer(state)

    async def _follow_own_copy(self) -> None:
        """A controller-only node hosts no replica, but answers Metadata as any node does
        (a client may bootstrap from it): from the copy its voter applied."""
        assert self.quorum is not None
        async for version, state in self.quorum.watch(self.metadata_version):
            self.reconciler.metadata = state
            self.metadata_version = version

    def _track(self, task: asyncio.Task[None]) -> None:
        """Keep a short-lived task until it ends (stop cancels what still runs)."""
        self._prefer_tasks.add(task)
        task.add_done_callback(self._prefer_tasks.discard)

    async def stop(self, *, graceful: bool = True, transfer_wait: float = 3.0) -> None:
        await self.health.enter_graceful_shutdown()
        if graceful:
            await self.leadership.hand_over(transfer_wait, self.quorum)
        self.stopping = True
        tasks = (
            self._retention_task,
            self._rebalance_task,
            self._report_task,
            self._watch_task,
            self._follow_task,
            self._moves_task,
            self._reopen_task,
            self._heartbeat_task,
            self._delay_task,
            self._share_task,
            *self._prefer_tasks,
        )
        for task in tasks:
            if task is not None:
                await stop_task(task)
        if self.topic_creator is not None:
            await self.topic_creator.close()
        await self.delay_creator.close()
        await self._dead_letter_sender.close()
        if self._admin is not None:
            await self._admin.live.close()
        if self._transactions is not None:
            await self._transactions.close()
        if self._server is not None:
            await self._server.stop(grace=1.0 if graceful else 0)
        if self.metrics is not None:
            await self.metrics.stop()
        if self.mover is not None:
            await self.mover.stop()
        if self.quorum is not None:
            await self.quorum.stop()
        await self.metadata_cache.close()
        await self.link.close()
        await self.host.stop()
