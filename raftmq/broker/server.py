"""A broker process: the Raft driver for every partition replica it hosts, the TCP listener
for Raft traffic, and the gRPC server for clients.

Shutdown is graceful on SIGTERM/SIGINT: leadership moves to another live replica first,
then clients are refused, then the logs are flushed and closed. A SIGKILL needs nothing:
the logs recover their tails and Raft catches the replica up.

Failures stay small: an error in one partition's log quarantines that replica alone (the
Raft host reopens it from disk with backoff, and Metadata says it failed and why). If the
Raft host itself fails, the broker cannot serve anything: it exits with status 3
(crash-only) so that a supervisor restarts it, instead of living on as a zombie.
grpc.health.v1 says SERVING only while the host runs and the broker is not stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from raftmq import net
from raftmq.broker import ready_file
from raftmq.broker.admin_redirect import AdminRedirect, add_admin_redirect
from raftmq.broker.admin_service import AdminService, add_admin_service
from raftmq.broker.auto_create import AutoCreate, TopicCreator
from raftmq.broker.controller_link import ControllerLink, LinkRefusal
from raftmq.broker.controller_service import ControllerService, add_controller_service
from raftmq.broker.groups_service import GroupsService, add_groups_redirect, add_groups_service
from raftmq.broker.history_probe import metadata_with_history, partitions_with_history
from raftmq.broker.leader_reports import LeaderReports
from raftmq.broker.membership_driver import MembershipDriver
from raftmq.broker.metadata_cache import MetadataCache, without_lost_topics
from raftmq.broker.ready_file import BoundAddresses
from raftmq.broker.replica_passes import compact_each, hand_back, hand_back_due
from raftmq.broker.runtime import tune_gc, tune_malloc
from raftmq.broker.service import MAX_FETCH_BYTES, BrokerService, add_to_server
from raftmq.broker.topic_ids import TopicIdMarkers
from raftmq.broker.topic_settings import (
    ReplicaSettings,
    expired,
    expired_replicas,
    log_config_for,
    reported_leader,
)
from raftmq.broker.unopened import RebuildRefused, UnopenedReplicas
from raftmq.controller.cluster_file import ClusterSpec
from raftmq.controller.healing import DEFAULT_LIMITS, Limits
from raftmq.controller.leadership import HandBack
from raftmq.controller.metadata_view import ControllerMetadata
from raftmq.controller.model import MetadataState, Partition, Topic
from raftmq.controller.mover import Mover
from raftmq.controller.quorum import GROUP, ControllerQuorum
from raftmq.log.atomic_file import read_atomic, write_atomic
from raftmq.log.config import LogConfig
from raftmq.log.durability_markers import durability_marker_writer
from raftmq.log.handles import HANDLES, HANDLES_PER_REPLICA, cap_for_limit, raise_nofile_limit
from raftmq.partition.replica import PartitionReplica, group_name
from raftmq.raft.errors import GroupDamagedError, RaftError
from raftmq.raft.host.group_storage import promised_path, record_promised
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.tcp import TcpTransport
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

HOST_FAILED_EXIT = 3
"""Exit status of a broker whose Raft host failed (not one partition: the host itself)."""
HEALTH_SERVICES = ("", "raftmq.v1.Broker")
"""grpc.health.v1 service names a broker reports: the whole server, and the Broker API."""

GRPC_MESSAGE_LIMIT = MAX_FETCH_BYTES + (1 << 20)

PREFER_WINDOW_SECONDS = 10.0
"""How long after it opens a preferred replica may still start an election for its group."""
OPEN_SLICE_SECONDS = 0.05
"""Opening replicas yields the event loop after this long: each open writes and fsyncs a few
files on it, so a topic of 1,000 partitions held ticks, heartbeats and RPCs back for 5-10 s
(CreateTopic answered that late, and the controller fenced its own live broker;
benchmarks/controller_bench.py). The price: the groups already open tick in between, so
every partition had a leader ~20% later in one comparison on a loaded machine."""
HEARTBEAT_SECONDS = 1.0
"""How often a broker heartbeats to the controller (fenced after its session timeout)."""
BROKER = "broker"
CONTROLLER = "controller"
ROLES = frozenset({BROKER, CONTROLLER})
LISTED_SUFFIX = ".listed-at"
"""Beside each replica's directory, the newest metadata version that opened it (one listing
this broker for it; never lowered, though a restarted broker may first get an older copy):
a copy of the metadata older than that (a lagging voter's, after a restart) never deletes
the replica as moved away; only a newer one that lists it no more does."""
INCARNATION_FILE = "incarnation"
OPEN_RETRY_CHECK_S = 0.5
"""How often the broker looks for failed replicas whose backoff has passed."""


def open_files_note(replicas: int) -> tuple[str, bool]:
    """Raise this process's open-file limit to the hard limit, cap the segment handles by
    it, and say so in one line; True beside it when the cap is too low for ``replicas``
    logs (the line then says what to do)."""
    soft, hard = raise_nofile_limit()
    cap = cap_for_limit(soft)
    HANDLES.set_cap(cap)
    hard_text = "unlimited" if hard < 0 else str(hard)
    note = f"open files: limit {soft} (hard {hard_text}), segment handle cap {cap}"
    if cap < HANDLES_PER_REPLICA * replicas:
        return (
            f"{note}: TOO LOW for {replicas} replicas (under {HANDLES_PER_REPLICA} per "
            "replica): segment files will be reopened constantly; raise the hard limit "
            "(ulimit -Hn, LimitNOFILE=) or host fewer partitions here"
        ), True
    return f"{note}, enough for {replicas} replicas", False


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
        move_limits: Limits = DEFAULT_LIMITS,
        rebalance_every_s: float | None = None,
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
        ``listen`` binds the client service elsewhere than the address the bootstrap file
        advertises (clients of a chaos test reach it through a proxy).
        ``log_config`` holds the broker-wide defaults; a topic's config overrides them.
        ``leader_rebalance_seconds`` paces :meth:`_restore_preferred_leaders` (0: never).
        ``durability_markers`` is for tests only: see :func:`durability_marker_writer`.
        ``inject_host_fault_after_s`` is for tests only: the Raft host fails that long after
        start, as if its own loop broke (see :meth:`RaftHost.inject_host_fault`).
        ``auto_create``: create a topic a produce names if the metadata does not (None:
        refuse it, the default; see :mod:`raftmq.broker.auto_create`).
        ``move_limits``: the controller mover's heal delay and move limits (a voter's);
        ``rebalance_every_s``: its rebalance timer (None: rebalance only when asked)."""
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
        self.rack = rack
        self.bootstrap = bootstrap
        self.spec = ControllerMetadata(MetadataState(bootstrap.name))
        """The newest metadata this broker applied (empty until the first arrives)."""
        self.metadata_version = 0
        self.data_dir = data_dir / f"broker-{broker_id}"
        self.topic_ids = TopicIdMarkers(self.data_dir)
        self._probe_for_a_past = not self.data_dir.exists() and len(bootstrap.brokers) > 1
        """No data folder: ask the peers, once, whether this broker lost one (see
        :meth:`_mark_replaced_replicas`), unless the operator said it is new."""
        if self._probe_for_a_past and new_broker:
            self._probe_for_a_past = False
            log.info("broker %d: new (--new): its peers are not asked for a past", broker_id)
        self._probe_metadata_past = self._probe_for_a_past and is_voter and len(voters) > 1
        """Likewise for the metadata group, before it opens (:meth:`_mark_wiped_voter`)."""
        self.metadata_cache = MetadataCache(self.data_dir, bootstrap.name)
        me = bootstrap.brokers[broker_id]
        self.advertised = (me.host, me.port)
        self.raft_peers = dict(raft_peers or {})
        peers = {
            b.id: self.raft_peers.get(b.id, (b.host, b.raft_port))
            for b in bootstrap.brokers.values()
            if b.id != broker_id
        }
        self.transport = TcpTransport(
            broker_id, (me.host, me.raft_port), peers, cluster=bootstrap.name
        )
        self.host = RaftHost(
            broker_id,
            self.transport,
            tick_s=tick_seconds,
            election_tick=election_tick,
            seed=broker_id,
            learner_bytes_per_s=move_bytes_per_s,
        )
        self.voter_addresses = {v: bootstrap.brokers[v].address for v in sorted(voters)}
        self.quorum: ControllerQuorum | None = None
        self.move_limits = move_limits
        self.rebalance_every_s = rebalance_every_s
        self.mover: Mover | None = None
        self.link = ControllerLink(self.voter_addresses)
        self.log_config = log_config or LogConfig()
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self.unopened = UnopenedReplicas()
        """The replicas the metadata assigns here that are not in :attr:`replicas`: opening,
        repairing, or failed to open (why; retried with backoff)."""
        self._reconcile_lock = asyncio.Lock()
        """Held while replicas open or are deleted for a metadata version, so that a retry
        of a failed one never races the next version's reconcile."""
        self.settings = ReplicaSettings(self.log_config)
        self.leader_reports = LeaderReports(
            broker_id, self.link.report_leader, self.replicas, lambda: self.spec.state
        )
        self.topic_creator = (
            TopicCreator(auto_create, self.link.create_topic, lambda: self.spec.state)
            if auto_create is not None
            else None
        )
        self.moves = MembershipDriver(
            self.host,
            self.replicas,
            report=self.link.promote_replica,
            leave=self._leave_replica,
            alive=self.transport.peer_alive,
            newest_version=lambda: self.link.controller_version,
        )
        """Has the groups this broker leads follow the metadata's replica sets."""
        self.stopping = False
        self.listen = listen or (me.host, me.port)
        self.retention_check_seconds = retention_check_seconds
        self.leader_rebalance_seconds = leader_rebalance_seconds
        self.durability_markers = durability_markers
        self.inject_host_fault_after_s = inject_host_fault_after_s
        self.health = health.aio.HealthServicer()
        self.incarnation = 0
        self.epoch = 0
        self.fenced = False
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
        self.open_files_note = ""
        self._said_too_few_files = False
        self.bound: BoundAddresses | None = None

    async def start(self) -> None:
        """Open the controller's metadata group (a voter), serve clients, then, in the
        background, register with the controller and follow its metadata: the partition
        replicas open as the metadata names them (:meth:`_reconcile`)."""
        # Before any log opens: the cap decides how many segment files stay open.
        # Replicas open later, as the metadata names them (checked again then).
        known = self.topic_ids.count_on_disk()
        self.open_files_note, too_low = open_files_note(known)
        self._said_too_few_files = too_low
        log.log(
            logging.WARNING if too_low else logging.INFO,
            "broker %d: %s",
            self.id,
            self.open_files_note,
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.incarnation = self._next_incarnation()
        if CONTROLLER in self.roles:
            if self._probe_metadata_past:
                await self._mark_wiped_voter()
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
            self._track(asyncio.get_running_loop().create_task(self._campaign_for_metadata()))
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT),
                ("grpc.max_send_message_length", GRPC_MESSAGE_LIMIT),
            ]
        )
        add_to_server(BrokerService(self), self._server)
        if self.quorum is not None:
            add_controller_service(
                ControllerService(self.quorum, self.voter_addresses), self._server
            )
            self._admin = AdminService(self.quorum, self.voter_addresses, self.move_limits)
            add_admin_service(self._admin, self._server)
            add_groups_service(GroupsService(self.quorum, self.voter_addresses), self._server)
        else:
            link = self.link
            redirect = AdminRedirect(self.id, self.voter_addresses, lambda: link.leader_address)
            add_admin_redirect(redirect, self._server)
            add_groups_redirect(redirect, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        client_port = net.add_port(self._server, f"{self.listen[0]}:{self.listen[1]}")
        await self._server.start()
        # What was bound, not what was asked for: the launcher waits on this (ready_file).
        me = self.bootstrap.brokers[self.id]
        self.bound = BoundAddresses(
            os.getpid(), f"{self.listen[0]}:{client_port}", f"{me.host}:{self.transport.port}"
        )
        for service in HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        loop = asyncio.get_running_loop()
        self._watch_task = loop.create_task(self._not_serving_once_the_host_fails())
        if self.inject_host_fault_after_s is not None:
            fault = RuntimeError("injected host fault (--inject-host-fault-after-ms, tests only)")
            loop.call_later(self.inject_host_fault_after_s, self.host.inject_host_fault, fault)
        self._retention_task = loop.create_task(self._retention_loop())
        if BROKER in self.roles:
            self._follow_task = loop.create_task(self._join_and_follow())
            self._report_task = loop.create_task(self.leader_reports.run())
            self._moves_task = loop.create_task(self.moves.run())
            self._reopen_task = loop.create_task(self._reopen_failed_replicas())
            if self.leader_rebalance_seconds > 0:
                self._rebalance_task = loop.create_task(self._restore_preferred_leaders())
        elif self.quorum is not None:
            self._follow_task = loop.create_task(self._follow_own_copy())
        log.info(
            "broker %d (%s) serving clients on %s, raft on %s",
            self.id,
            " and ".join(sorted(self.roles)),
            self.bound.client,
            self.bound.raft,
        )

    def _next_incarnation(self) -> int:
        """A boot counter kept in the data folder: higher with every start of this process
        (the controller tells a restarted broker from a late message of its former self)."""
        path = self.data_dir / INCARNATION_FILE
        raw = read_atomic(path)
        # Start time in ms unless the counter is ahead: a wiped data folder (its counter
        # lost) must still register above the incarnation the controller holds.
        incarnation = max((int(raw) if raw else 0) + 1, time.time_ns() // 1_000_000)
        write_atomic(path, str(incarnation).encode())
        return incarnation

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
                await self._reconcile(cached)
                self.metadata_version = cached.version
            except Exception:  # the controller's copy will do: wait for it
                log.exception("broker %d: applying its cached metadata failed", self.id)
        self.metadata_cache.start()
        await self._register()
        log.info(
            "broker %d registered with the controller (incarnation %d, epoch %d)",
            self.id,
            self.incarnation,
            self.epoch,
        )
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())
        if self.quorum is not None:
            updates = self.quorum.watch(self.metadata_version)
        else:
            updates = self.link.watch(self.metadata_version)
        async for version, state in updates:
            if self.stopping:
                return
            try:
                await self._reconcile(state)
            except Exception:  # one bad version must not stop the broker following
                log.exception("broker %d: applying metadata version %d failed", self.id, version)
            self.metadata_version = version
            self.metadata_cache.offer(state)

    async def _follow_own_copy(self) -> None:
        """A controller-only node hosts no replica, but answers Metadata as any node does
        (a client may bootstrap from it): from the copy its voter applied."""
        assert self.quorum is not None
        async for version, state in self.quorum.watch(self.metadata_version):
            self.spec = ControllerMetadata(state)
            self.metadata_version = version

    async def _register(self) -> None:
        """Register this incarnation, retried until the controller takes it."""
        raft_address = (self.bootstrap.brokers[self.id].host, self.transport.port)
        while not self.stopping:
            try:
                self.epoch = await self.link.register(
                    self.id, self.advertised, raft_address, self.rack, self.incarnation
                )
                return
            except LinkRefusal as exc:
                log.error("broker %d: the controller refused its registration: %s", self.id, exc)
                await asyncio.sleep(5 * HEARTBEAT_SECONDS)

    async def _heartbeat_loop(self) -> None:
        while not self.stopping:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                fenced = await self.link.heartbeat(self.id, self.incarnation, self.metadata_version)
            except LinkRefusal as exc:
                log.warning("broker %d: heartbeat refused (%s); registering again", self.id, exc)
                await self._register()
                continue
            if fenced != self.fenced:
                log.info("broker %d is %s", self.id, "fenced" if fenced else "unfenced")
                self.fenced = fenced

    async def _reconcile(self, state: MetadataState) -> None:
        """Make the local replicas what ``state`` says: learn peers' Raft addresses, delete
        the replicas of deleted topics, open the replicas this broker hosts.

        Every step is per replica (docs/driver.md, "Failure isolation in the broker's
        control loop"): one that cannot be deleted, opened or reconfigured is logged and
        recorded with its reason (an unopened one in :attr:`unopened`, retried with
        backoff), and every other change of the version still applies."""
        async with self._reconcile_lock:
            await self._reconcile_locked(state)

    async def _reconcile_locked(self, state: MetadataState) -> None:
        view = ControllerMetadata(state)
        for b in state.brokers.values():
            if b.id != self.id and b.id not in self.raft_peers:
                try:
                    self.transport.add_peer(b.id, (b.raft_host, b.raft_port))
                except Exception:
                    log.exception(
                        "broker %d: learning broker %d's Raft address failed", self.id, b.id
                    )
        await self._delete_gone_replicas(state)
        now_ms = time.time_ns() // 1_000_000
        wanted = [
            (topic, p, part)
            for _, topic in sorted(state.topics.items())
            for p, part in enumerate(topic.partitions)
            if (self.id in part.replicas or self.id in part.learners) and not expired(part, now_ms)
        ]
        self.unopened.keep_only({(t.name, p) for t, p, _ in wanted})
        opening = [(t, p, r) for t, p, r in wanted if (t.name, p) not in self.replicas]
        for t, p, _ in opening:
            if (t.name, p) not in self.unopened:
                self.unopened.opening((t.name, p))
        if opening and self._probe_for_a_past:
            # Topics created before this process registered may have had a replica here
            # on a disk since lost; ones created later are new to every broker.
            self._probe_for_a_past = False
            older = {(t.name, p) for t, p, _ in opening if t.topic_id < self.epoch}
            if older:
                try:
                    await self._mark_replaced_replicas(older, view)
                except Exception:  # the replicas open as new ones: no worse than no probe
                    log.exception("broker %d: asking its peers for a past failed", self.id)
        self.spec = view  # before opening: Metadata answers for what opens
        if opening:
            self._check_open_files(len(self.replicas) + len(opening))
        opened = await self._open_replicas(opening, state.version)
        self._after_opening(opened, state)

    def _after_opening(self, opened: list[PartitionReplica], state: MetadataState) -> None:
        """What follows the opening of replicas for metadata ``state``: settings, the
        preferred leaders' campaigns, and the replica sets the moves driver follows."""
        self.settings.apply(self.replicas, state)  # altered configs, decommissions
        if opened:
            log.info("broker %d: opened %d replicas", self.id, len(opened))
            self._track(
                asyncio.get_running_loop().create_task(self._campaign_where_preferred(opened))
            )
        try:
            self.moves.update(state)
        except Exception:  # its loop looks again at the next version
            log.exception(
                "broker %d: following metadata version %d's moves failed", self.id, state.version
            )

    async def _open_replicas(
        self, opening: list[tuple[Topic, int, Partition]], version: int
    ) -> list[PartitionReplica]:
        """Open each of ``opening`` that may be tried now; returns those that opened. One
        that fails is recorded in :attr:`unopened` and the others still open."""
        opened = []
        slice_end = time.monotonic() + OPEN_SLICE_SECONDS
        for topic, p, part in opening:
            if self.stopping:
                break
            if not self.unopened.may_open((topic.name, p)):
                continue
            replica = await self._open_replica(topic, p, part, version)
            if replica is not None:
                opened.append(replica)
            if time.monotonic() >= slice_end:
                await asyncio.sleep(0)
                slice_end = time.monotonic() + OPEN_SLICE_SECONDS
        return opened

    async def _open_replica(
        self, topic: Topic, p: int, part: Partition, version: int
    ) -> PartitionReplica | None:
        """Open this broker's replica of ``topic``/``p``; None when it cannot open (it is
        then recorded as failed, or as repairing, with why)."""
        key = (topic.name, p)
        directory = self.data_dir / f"{topic.name}-{p}"
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            self.topic_ids.write(directory, topic.topic_id)
            listed_at = read_atomic(_listed_path(directory))
            if not listed_at or int(listed_at) < version:
                write_atomic(_listed_path(directory), str(version).encode())
            replica = PartitionReplica(
                self.host,
                topic.name,
                p,
                directory,
                list(part.replicas),
                self._log_config(topic),
                learners=list(part.learners),
                # Set as each log opens: no fsync of this run may go unreported.
                on_durable=durability_marker_writer() if self.durability_markers else None,
            )
        except GroupDamagedError as exc:
            if exc.damages and len(part.replicas + part.learners) > 1:
                await self._close_half_open(key)
                self._start_repair(key, directory, list(part.replicas + part.learners), exc)
            elif not exc.damages and self._led_elsewhere(topic.name, p):
                await self._close_half_open(key)
                self._start_resync(key, exc)
            else:
                await self._open_failed(key, part, exc)
            return None
        except Exception as exc:
            await self._open_failed(key, part, exc)
            return None
        self.replicas[key] = replica
        if key in self.unopened:
            log.info("broker %d: its replica of %s/%d opened", self.id, *key)
        self.unopened.opened(key)
        return replica

    async def _close_half_open(self, key: tuple[str, int]) -> None:
        """A replica whose open failed after its group opened: close that group again, so
        that the next try starts clean."""
        name = group_name(*key)
        if name in self.host.groups or name in self.host.quarantined:
            with contextlib.suppress(Exception):
                await self.host.close_group(name)

    def _start_repair(
        self, key: tuple[str, int], directory: Path, members: list[int], exc: GroupDamagedError
    ) -> None:
        """What the replica reads at open is damaged in a range its peers hold: fetch it
        from them in the background (the replica is reported as opening, repairing), then
        open it. The broker's other replicas and metadata versions go on meanwhile."""
        self.unopened.repairing(key, exc.reason)
        log.warning(
            "broker %d: its replica of %s/%d cannot open (%s); repairing it from its peers",
            self.id,
            *key,
            exc.reason,
        )
        peers = [b for b in members if b != self.id]
        self._track(
            asyncio.get_running_loop().create_task(self._repair_then_open(key, directory, peers))
        )

    def _led_elsewhere(self, topic: str, partition: int) -> bool:
        """Whether another broker leads the partition, as the metadata reports it, and is
        reachable: its log holds every committed entry, so a replica here may start over
        from it without losing any."""
        leader, _ = reported_leader(self.spec.state, topic, partition)
        return leader not in (0, self.id) and self.transport.peer_alive(leader)

    def _start_resync(self, key: tuple[str, int], exc: GroupDamagedError) -> None:
        """What the replica reads at open is damaged in a way no peer's bytes can mend (its
        snapshot meta, say) while another replica leads: start it over from that leader,
        as ``raftmq broker rebuild-replica`` does, keeping its promise record so it votes
        only once it holds the log again. The leader is checked again under the lock."""
        self.unopened.repairing(key, f"{exc.reason}; resynchronising from the leader")
        log.warning(
            "broker %d: its replica of %s/%d cannot open (%s); another replica leads, so it "
            "starts over from that leader's log",
            self.id,
            *key,
            exc.reason,
        )
        self._track(asyncio.get_running_loop().create_task(self._resync(key, exc)))

    async def _resync(self, key: tuple[str, int], exc: GroupDamagedError) -> None:
        try:
            await self.rebuild_replica(
                *key, force=False, why="because it cannot open and no peer can mend it"
            )
        except Exception as refused:  # RebuildRefused (no leader now), or the rebuild broke
            delay_s = self.unopened.failed(
                key, f"cannot open: {exc.reason}; not resynchronised: {refused}"
            )
            log.error(
                "broker %d: its replica of %s/%d was not resynchronised (%s); tried again in "
                "%.0f s",
                self.id,
                *key,
                refused,
                delay_s,
            )

    async def _repair_then_open(
        self, key: tuple[str, int], directory: Path, peers: list[int]
    ) -> None:
        name = group_name(*key)
        topic = self.spec.state.topics.get(key[0])
        config = self._log_config(topic) if topic is not None else self.log_config
        try:
            done = await self.host.repair_closed_group(name, directory, peers, config)
        except Exception as exc:  # GroupRepairError, or the repair itself broke
            delay_s = self.unopened.failed(
                key, f"cannot open, and no peer repaired it: {type(exc).__name__}: {exc}"
            )
            log.error(
                "broker %d: its replica of %s/%d was not repaired (%s); it is reported "
                "failed and tried again in %.0f s ('raftmq broker rebuild-replica' "
                "rebuilds it from the leader)",
                self.id,
                *key,
                exc,
                delay_s,
            )
            return
        log.warning("broker %d: repaired its replica of %s/%d: %s", self.id, *key, done)
        self.unopened.opening(key, "repaired; opening")
        async with self._reconcile_lock:
            state = self.spec.state
            topic = state.topics.get(key[0])
            if topic is None or key[1] >= len(topic.partitions) or key in self.replicas:
                return
            if key not in self.unopened:  # no longer assigned here meanwhile
                return
            opened = await self._open_replicas(
                [(topic, key[1], topic.partitions[key[1]])], state.version
            )
            self._after_opening(opened, state)

    async def _open_failed(self, key: tuple[str, int], part: Partition, exc: Exception) -> None:
        """Record a replica that could not open; its group, if it got as far as opening
        one, is closed again so that the next try starts clean."""
        await self._close_half_open(key)
        reason = f"cannot open: {type(exc).__name__}: {exc}"
        known = self.unopened.get(key)
        first = known is None or known.failures == 0
        delay_s = self.unopened.failed(key, reason)
        log.error(
            "broker %d: its replica of %s/%d %s; its other replicas go on, and it is tried "
            "again in %.0f s",
            self.id,
            *key,
            reason,
            delay_s,
            exc_info=exc if first else None,  # the traceback once, not on every retry
        )

    async def _reopen_failed_replicas(self) -> None:
        """Try again, as their backoff passes, the replicas that failed to open."""
        while not self.stopping:
            await asyncio.sleep(OPEN_RETRY_CHECK_S)
            if not self.unopened.due():
                continue
            try:
                async with self._reconcile_lock:
                    state = self.spec.state
                    due = [
                        (topic, p, topic.partitions[p])
                        for name, p in self.unopened.due()
                        if (topic := state.topics.get(name)) is not None
                        and p < len(topic.partitions)
                        and (name, p) not in self.replicas
                    ]
                    opened = await self._open_replicas(due, state.version)
                    if opened:
                        self._after_opening(opened, state)
            except Exception:  # the next pass tries again
                log.exception("broker %d: reopening its failed replicas failed", self.id)

    async def rebuild_replica(
        self, topic: str, partition: int, *, force: bool, why: str = "on an operator's request"
    ) -> int:
        """An operator's repair of this broker's replica of ``topic``/``partition`` that no
        peer could repair in place: close it, delete its data, and open it empty as a
        replica whose disk was replaced (its promise record kept: it gives no vote until
        the leader has copied it the whole log). Returns the bytes deleted.

        Refused (:class:`RebuildRefused`) when the metadata does not assign it here, and,
        unless ``force``, while it leads or no other replica is known to lead: its data may
        then be the only copy of acknowledged records."""
        state = self.spec.state
        found = state.topics.get(topic)
        part = found.partitions[partition] if found and partition < len(found.partitions) else None
        if found is None or part is None or self.id not in part.replicas + part.learners:
            raise RebuildRefused(
                "not-hosted",
                f"broker {self.id} hosts no replica of {topic}/{partition}"
                + (f"; its replicas are on brokers {list(part.replicas)}" if part else ""),
            )
        key = (topic, partition)
        replica = self.replicas.get(key)
        leader = replica.leader_id if replica is not None else 0
        leader = leader or reported_leader(state, topic, partition)[0]
        if not force and (leader in (0, self.id) or len(part.replicas) < 2):
            why = (
                "it leads the partition"
                if leader == self.id
                else "no other replica holds the partition"
                if len(part.replicas) < 2
                else "no other replica is known to lead the partition"
            )
            raise RebuildRefused(
                "unsafe",
                f"broker {self.id} will not rebuild its replica of {topic}/{partition}: {why}, "
                "so its data may be the only copy of acknowledged records; wait until "
                "another replica leads, or rebuild with --force to accept losing them",
            )
        directory = self.data_dir / f"{topic}-{partition}"
        async with self._reconcile_lock:
            name = group_name(topic, partition)
            self.replicas.pop(key, None)
            if name in self.host.groups or name in self.host.quarantined:
                await self.host.close_group(name)
            deleted = await asyncio.to_thread(_delete_tree, directory)
            if len(part.replicas) > 1:
                # A replica that loses its log must not pass for a new one (docs/raft.md,
                # "Rejoining after disk loss"); a single replica has nobody to wait for.
                record_promised(directory)
            else:
                promised_path(directory).unlink(missing_ok=True)
            self.unopened.opened(key)
            self.unopened.opening(key, "rebuilding: opening empty")
            log.warning(
                "broker %d: rebuilding its replica of %s/%d %s%s: %d bytes deleted; it "
                "copies the leader's log again",
                self.id,
                topic,
                partition,
                why,
                " (forced)" if force else "",
                deleted,
            )
            opened = await self._open_replicas([(found, partition, part)], state.version)
            self._after_opening(opened, state)
        return deleted

    def _track(self, task: asyncio.Task[None]) -> None:
        """Keep a short-lived task until it ends (stop cancels what still runs)."""
        self._prefer_tasks.add(task)
        task.add_done_callback(self._prefer_tasks.discard)

    def _check_open_files(self, replicas: int) -> None:
        """Before more logs open: say once if the open-file limit is too low for them."""
        self.open_files_note, too_low = open_files_note(replicas)
        if too_low and not self._said_too_few_files:
            self._said_too_few_files = True
            log.warning("broker %d: %s", self.id, self.open_files_note)

    def _log_config(self, topic: Topic) -> LogConfig:
        return log_config_for(self.log_config, topic)

    async def _delete_gone_replicas(self, state: MetadataState) -> None:
        """Delete each local replica whose topic id the metadata no longer holds (when:
        :meth:`TopicIdMarkers.gone`), and each of a live topic that moved away from here."""
        for name, partition, directory in self.topic_ids.gone(state):
            try:
                await self._delete_replica(name, partition, directory)
            except Exception:  # tried again with the next version; the others go on
                log.exception(
                    "broker %d: deleting its replica of %s/%d failed", self.id, name, partition
                )
        for name, partition, directory in self.topic_ids.kept(state):
            try:
                await self._delete_if_moved_away(state, state.topics[name], partition, directory)
            except Exception:
                log.exception(
                    "broker %d: deleting its moved replica of %s/%d failed",
                    self.id,
                    name,
                    partition,
                )

    async def _delete_expired_replicas(self) -> None:
        """Delete the data of each decommissioned partition whose deadline passed (the
        controller stamped it when it decommissioned the partition; it is compared with
        this broker's clock on each retention pass), open or only on disk."""
        now_ms = time.time_ns() // 1_000_000
        for name, p in expired_replicas(self.spec.state, self.id, now_ms):
            directory = self.data_dir / f"{name}-{p}"
            if (name, p) in self.replicas or directory.exists():
                try:
                    await self._delete_replica(
                        name, p, directory, "decommissioned, retention passed"
                    )
                except Exception:  # the next retention pass tries again; the others go on
                    log.exception("broker %d: deleting %s/%d failed", self.id, name, p)

    async def _delete_if_moved_away(
        self, state: MetadataState, topic: Topic, p: int, directory: Path
    ) -> None:
        """A replica of a live topic that the metadata lists on this broker no more (a
        move took it elsewhere) is deleted: at once when it is not open, else once its
        group can do without it (:class:`MembershipDriver` decides; a leader hands its
        leadership over first). Never on a copy of the metadata older than the one that
        opened it here (see LISTED_SUFFIX)."""
        if p >= len(topic.partitions):
            return
        part = topic.partitions[p]
        if self.id in part.replicas or self.id in part.learners:
            return
        raw = read_atomic(_listed_path(directory))
        listed_at = int(raw) if raw else topic.topic_id
        if state.version < listed_at:
            return
        why = f"no longer listed: its replicas are brokers {list(part.replicas)}"
        before = self.moves.state  # the version applied before this one
        old = before.topics.get(topic.name) if before is not None else None
        if old is not None and old.topic_id == topic.topic_id and p < len(old.partitions):
            newcomers = sorted(set(part.replicas) - set(old.partitions[p].replicas))
            if newcomers:
                why = f"moved to broker {', '.join(map(str, newcomers))}"
        if (topic.name, p) in self.replicas:
            self.moves.leaving(topic.name, p, why)
            return
        await self._delete_replica(topic.name, p, directory, why)

    async def _leave_replica(self, topic: str, partition: int, why: str) -> None:
        """The replica moved away and its group can do without it: delete it, unless the
        metadata lists it here again meanwhile."""
        state = self.moves.state
        found = state.topics.get(topic) if state is not None else None
        if found is not None and partition < len(found.partitions):
            listed = found.partitions[partition]
            if self.id in listed.replicas or self.id in listed.learners:
                return
        await self._delete_replica(topic, partition, self.data_dir / f"{topic}-{partition}", why)

    async def _delete_replica(
        self, topic: str, partition: int, directory: Path, why: str = "topic gone"
    ) -> None:
        replica = self.replicas.pop((topic, partition), None)
        self.unopened.opened((topic, partition))
        if replica is not None:
            await self.host.close_group(group_name(topic, partition))
        # Off the loop, which it yields: deleting a topic of 1,000 partitions in line held
        # it (ticks, heartbeats, the DeleteTopic answer) for ~12 s (controller_bench.py).
        await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
        promised_path(directory).unlink(missing_ok=True)
        self.topic_ids.remove(directory)
        _listed_path(directory).unlink(missing_ok=True)
        log.info("broker %d: deleted its replica of %s/%d (%s)", self.id, topic, partition, why)

    async def _mark_replaced_replicas(
        self, hosted: set[tuple[str, int]], view: ControllerMetadata
    ) -> None:
        """No data directory: a new broker, or one whose disk was replaced. The partitions
        its peers (in the bootstrap file or the metadata ``view``) know a past for are
        marked as once promised, so their replicas rejoin (no votes until caught up)
        instead of passing for new ones (:mod:`raftmq.broker.history_probe`)."""
        seen, answered = await partitions_with_history((self.bootstrap, view), self.id, hosted)
        if not answered:
            # Nobody could say, so assume the past: a replica that passed for new would vote
            # at once and could help a peer that missed committed entries win an election.
            # Rejoining costs only the wait for a leader that has the log (a replica with
            # no peer has nothing to wait for: it starts empty).
            seen = {
                (t, p)
                for t, p in hosted
                if t in view.state.topics and len(view.state.topics[t].partitions[p].replicas) > 1
            }
            log.warning(
                "broker %d: no data directory, no --new, and no peer answering whether its "
                "replicas had a past: %d of them rejoin (no vote until a leader has copied "
                "them its log); if this is a new broker, restart it with --new",
                self.id,
                len(seen),
            )
            _record_promised_all(self.data_dir, seen)
            return
        if not seen:
            return
        log.warning(
            "broker %d: no data directory, but brokers %s know a past for %d of its %d "
            "replicas (a replaced or wiped disk): they rejoin, and vote again only once they "
            "hold their leader's log",
            self.id,
            ", ".join(map(str, answered)),
            len(seen),
            len(hosted),
        )
        _record_promised_all(self.data_dir, seen)

    async def _mark_wiped_voter(self) -> None:
        """No data folder on a controller voter: if the quorum has a past, this voter's
        metadata group rejoins (no vote until it holds the leader's log), as a replaced
        partition replica does (:func:`metadata_with_history`)."""
        past, answered = await metadata_with_history(self.voter_addresses, self.id)
        if not answered:
            # Nobody could say, so assume the past (as for partitions): a voter that passed
            # for new would vote at once, and with one voter that missed committed metadata
            # it could elect that one and vote acknowledged metadata (offset commits, topics)
            # away. A new cluster's voters start with --new (raftmq dev does), so they never
            # wait here for each other.
            log.warning(
                "broker %d: no data folder, no --new, and no other voter answering whether the "
                "metadata has a past: its metadata group rejoins (no vote until it holds the "
                "leader's log); if this is a new cluster, restart every voter with --new",
                self.id,
            )
            record_promised(self.data_dir / GROUP)
            return
        if not past:
            log.info(
                "broker %d: no data folder, and no other voter (answered: %s) holds metadata: "
                "a new controller voter",
                self.id,
                ", ".join(map(str, answered)) or "none",
            )
            return
        log.warning(
            "broker %d: no data folder, but voters %s hold metadata (a replaced or wiped "
            "disk): its metadata group rejoins, and votes again only once it holds the "
            "leader's log",
            self.id,
            ", ".join(map(str, answered)),
        )
        record_promised(self.data_dir / GROUP)

    async def stop(self, *, graceful: bool = True, transfer_wait: float = 3.0) -> None:
        await self.health.enter_graceful_shutdown()
        if graceful:
            await self._hand_over_leadership(transfer_wait)
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
            *self._prefer_tasks,
        )
        for task in tasks:
            if task is not None:
                await stop_task(task)
        if self.topic_creator is not None:
            await self.topic_creator.close()
        if self._admin is not None:
            await self._admin.live.close()
        if self._server is not None:
            await self._server.stop(grace=1.0 if graceful else 0)
        if self.mover is not None:
            await self.mover.stop()
        if self.quorum is not None:
            await self.quorum.stop()
        await self.metadata_cache.close()
        await self.link.close()
        await self.host.stop()

    async def _retention_loop(self) -> None:
        """Delete old segments (retention.ms, retention.bytes) of every hosted replica, never
        past what it applied; followers that fall behind the new start get a snapshot."""
        while not self.stopping:
            await asyncio.sleep(self.retention_check_seconds)
            try:
                await self._delete_expired_replicas()
            except Exception:
                log.exception("deleting expired decommissioned replicas failed")
            compact_each(self.host, self.replicas.values())

    async def _campaign_where_preferred(
        self, opened: list[PartitionReplica], within: float = PREFER_WINDOW_SECONDS
    ) -> None:
        """Campaign at once for the partitions whose replica list names this broker first
        (the preferred leader, as in Kafka), as soon as a peer of the group is reachable,
        while the group has no leader yet.

        Why: left to random election timeouts, a cluster that starts together often elects
        one broker for most partitions, and that broker's single event loop then carries
        most of the produce load while the others idle (seen as 4 of 6 leaders on one
        broker in the produce benchmark). Replica lists rotate the first broker, so this
        spreads leaders evenly. It runs for the replicas each metadata version opens. It only
        starts elections a timeout would start anyway, and pre-vote keeps it from disturbing
        a leader that is already there. A group whose preferred broker started too late, or
        came back after a failure, is handed back by its leader: see
        :meth:`_restore_preferred_leaders`."""
        pending: dict[str, tuple[Callable[[], int], list[int]]] = {
            group_name(r.topic, r.partition): (_leader_of(r), r.replicas)
            for r in opened
            if self.spec.preferred_leader(r.topic, r.partition) == self.id and len(r.replicas) > 1
        }
        await self._campaign_while_leaderless(pending, within)

    async def _campaign_while_leaderless(
        self, pending: dict[str, tuple[Callable[[], int], list[int]]], within: float
    ) -> None:
        """Campaign for each group of ``pending`` (name: its leader as known here, and its
        replicas) once one of its peers is reachable, unless it has a leader by then."""
        deadline = time.monotonic() + within
        while pending and time.monotonic() < deadline and not self.stopping:
            for name, (leader, replicas) in list(pending.items()):
                peers = [p for p in replicas if p != self.id]
                if leader():
                    del pending[name]  # someone leads (maybe us): leave it be
                elif not peers or any(self.transport.peer_alive(p) for p in peers):
                    with contextlib.suppress(RaftError):  # e.g. its replica failed meanwhile
                        self.host.campaign(name)
                    del pending[name]
            await asyncio.sleep(0.02)

    async def _campaign_for_metadata(self) -> None:
        """The first controller voter campaigns for the metadata group as soon as a peer
        is reachable, as a preferred replica does for its partition: nothing in the
        cluster works before the controller has a leader, and a long election timeout
        (seconds, with slow ticks) would otherwise delay every start by that much."""
        assert self.quorum is not None
        voters = sorted(self.quorum.voters)
        if voters[0] == self.id:
            quorum = self.quorum
            await self._campaign_while_leaderless(
                {GROUP: (lambda: quorum.leader, voters)}, PREFER_WINDOW_SECONDS
            )

    async def _restore_preferred_leaders(self) -> None:
        """Every ``leader_rebalance_seconds``, hand each group this broker leads back to its
        preferred replica (the first in its list) when that replica is reachable and in
        sync (the policy, and why: raftmq.controller.leadership). The transfer itself waits
        until the replica holds the whole log, and the group takes no proposals meanwhile
        (an election timeout at most); producers retry."""
        policy = HandBack()
        while not self.stopping:
            await asyncio.sleep(self.leader_rebalance_seconds)
            try:
                due = hand_back_due(
                    self.id,
                    self.replicas.values(),
                    self.spec.preferred_leader,
                    self.host,
                    self.transport.peer_alive,
                    policy,
                )
            except Exception:  # the policy itself: the next pass looks again
                log.exception("broker %d: choosing hand-backs failed", self.id)
                continue
            if not self.stopping:
                hand_back(self.host, due)

    async def _hand_over_leadership(self, wait: float) -> None:
        """Move each partition this broker leads, and the controller's metadata group if it
        leads that, to a live follower that is caught up, so producers (and brokers, and
        operators) see a short redirect instead of an election timeout."""
        led: list[tuple[str, Callable[[], bool]]] = [
            (group_name(r.topic, r.partition), _is_leader(r))
            for r in self.replicas.values()
            if r.is_leader
        ]
        quorum = self.quorum
        if quorum is not None and quorum.is_leader:
            led.append((GROUP, lambda: quorum.is_leader))
        for name, _ in led:
            st = self.host.status(name)
            voters = st.membership.voters if st.membership is not None else frozenset()
            # The most caught-up live voter (a learner cannot lead); the core brings it
            # fully up to date before telling it to campaign, so it need not match the log
            # at this very moment.
            candidates = sorted(
                (pr.match, peer)
                for peer, pr in st.followers.items()
                if peer in voters and self.transport.peer_alive(peer)
            )
            if candidates:
                with contextlib.suppress(Exception):
                    self.host.transfer_leadership(name, candidates[-1][1])
        deadline = time.monotonic() + wait
        while any(leads() for _, leads in led) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


PARENT_CHECK_SECONDS = 0.5
STOP_AFTER_FAILURE_S = 10.0
"""How long a broker whose host failed tries to close its files before it exits anyway."""


def _leader_of(replica: PartitionReplica) -> Callable[[], int]:
    return lambda: replica.group.leader


def _is_leader(replica: PartitionReplica) -> Callable[[], bool]:
    return lambda: replica.is_leader


def _record_promised_all(data_dir: Path, replicas: set[tuple[str, int]]) -> None:
    for topic, p in sorted(replicas):
        directory = data_dir / f"{topic}-{p}"
        directory.parent.mkdir(parents=True, exist_ok=True)
        record_promised(directory)


def _delete_tree(directory: Path) -> int:
    """Delete ``directory`` (or whatever stands at its path); returns the bytes it held."""
    if directory.is_symlink() or directory.is_file():
        size = directory.lstat().st_size
        directory.unlink()
        return size
    if not directory.exists():
        return 0
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    shutil.rmtree(directory)
    return size


def _listed_path(directory: Path) -> Path:
    return directory.parent / (directory.name + LISTED_SUFFIX)


async def run(broker: Broker, *, parent_pid: int | None = None) -> int:
    """Run until SIGTERM or SIGINT, or until process ``parent_pid`` is no longer this
    process's parent; then stop gracefully and return 0. If the Raft host fails meanwhile,
    stop at once and return HOST_FAILED_EXIT: the process must exit, not live on unable to
    serve while it still answers Metadata.

    Why the parent watch: a local cluster starts its brokers in their own session, so a
    terminal closing or a SIGKILL of ``raftmq dev`` reaches none of them, and they would
    run on, holding ports and data folders, with nobody left to stop them.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tune_malloc()
    await broker.start()
    tune_gc()
    print(f"broker {broker.id}: {broker.open_files_note}", flush=True)
    assert broker.bound is not None, "start() binds both listeners"
    ready_file.write(broker.data_dir, broker.bound)
    print(f"broker {broker.id} ready", flush=True)
    watch = None
    if parent_pid is not None:
        watch = loop.create_task(_stop_when_orphaned(broker.id, parent_pid, stop))
    host_failed = loop.create_task(broker.host.wait_failed())
    stopped = loop.create_task(stop.wait())
    await asyncio.wait({host_failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if watch is not None:
        watch.cancel()
    if host_failed.done():
        stopped.cancel()
        exc = host_failed.result()
        log.error(
            "broker %d: its Raft host failed (%s: %s), so it can serve no partition; exiting "
            "with status %d so that a supervisor restarts it",
            broker.id,
            type(exc).__name__,
            exc,
            HOST_FAILED_EXIT,
        )
        try:
            await asyncio.wait_for(broker.stop(graceful=False), STOP_AFTER_FAILURE_S)
        except Exception as stop_exc:  # crash-only: exiting matters, a clean close does not
            log.warning("broker %d: stopping after the failure: %r", broker.id, stop_exc)
        return HOST_FAILED_EXIT
    host_failed.cancel()
    await broker.stop(graceful=True)
    return 0


async def _stop_when_orphaned(broker_id: int, parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_CHECK_SECONDS)
    log.warning("broker %d: its parent (pid %d) exited; stopping", broker_id, parent_pid)
    stop.set()
