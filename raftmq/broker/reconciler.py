"""Metadata reconciliation: a broker's replicas made what each metadata version says. It
learns its peers' Raft addresses, deletes the replicas of deleted topics and those moved
away, and opens the replicas assigned here; one that cannot open is repaired from its
peers, resynchronised from its leader, or recorded as failed and retried with backoff; an
operator's (or its own) rebuild starts one over from the leader.

Every step is per replica (docs/driver.md, "Failure isolation in the broker's control
loop"): one replica that cannot be deleted, opened or reconfigured is logged and recorded
with its reason, and every other change of the version still applies. Opening and deleting
for one version hold one lock, so a retry, a repair or a rebuild never races the next
version's reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from raftmq import net
from raftmq.broker.history_probe import partitions_with_history
from raftmq.broker.layout import same_layout
from raftmq.broker.listings import ReplicaListings
from raftmq.broker.membership_driver import MembershipDriver
from raftmq.broker.open_files import open_files_note
from raftmq.broker.topic_ids import TopicIdMarkers
from raftmq.broker.topic_settings import (
    ReplicaSettings,
    expired,
    log_config_for,
    reported_leader,
)
from raftmq.broker.unopened import RebuildRefused, UnopenedReplicas
from raftmq.controller.metadata import broker_addresses
from raftmq.controller.model import MetadataState, Partition, Topic
from raftmq.log.config import LogConfig
from raftmq.log.durability_markers import durability_marker_writer
from raftmq.partition.replica import PartitionReplica, group_name
from raftmq.raft.errors import GroupDamagedError
from raftmq.raft.host.group_storage import forget_group, record_promised
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.tcp import TcpTransport

log = logging.getLogger(__name__)

OPEN_SLICE_SECONDS = 0.05
"""Opening replicas yields the event loop after this long: each open writes and fsyncs a few
files on it, so a topic of 1,000 partitions held ticks, heartbeats and RPCs back for 5-10 s
(CreateTopic answered that late, and the controller fenced its own live broker;
benchmarks/controller_bench.py). The price: the groups already open tick in between, so
every partition had a leader ~20% later in one comparison on a loaded machine."""
OPEN_PAUSE_SHARE = 0.25
"""After each slice of opening, the loop is left to everything else for this share of the
slice's length (a real pause, not one turn of the loop): a slice outlasts its 50 ms when
one open's fsyncs are slow, and with one turn between slices a busy disk left the rest
of the broker a few turns a second: heartbeats to the controller missed its session
timeout (every broker fenced during a 1,000-partition creation), the Raft transport
called its peers dead, and controller reads timed out."""
OPEN_RETRY_CHECK_S = 0.5
"""How often the broker looks for failed replicas whose backoff has passed."""
FULL_PASS_EVERY_S = 5.0
"""A version that only moves leaderships skips the pass over every partition
(:func:`raftmq.broker.layout.same_layout`), but one comes at least this often when
versions keep arriving: it retries what failed (a delete, say) with the next version."""


class Reconciler:
    """Holds the metadata version the broker last applied (:attr:`metadata`) and makes the
    broker's replicas (:attr:`replicas`, :attr:`unopened`) follow it."""

    def __init__(
        self,
        broker_id: int,
        data_dir: Path,
        host: RaftHost,
        transport: TcpTransport,
        replicas: dict[tuple[str, int], PartitionReplica],
        moves: MembershipDriver,
        *,
        cluster_name: str,
        log_config: LogConfig,
        static_peers: Collection[int],
        bootstrap_addresses: Mapping[int, str],
        probe_for_a_past: bool,
        durability_markers: bool,
        stopping: Callable[[], bool],
        epoch: Callable[[], int],
        prefer: Callable[[PartitionReplica], None],
        track: Callable[[asyncio.Task[None]], None],
        security: net.Security = net.PLAINTEXT,
    ) -> None:
        """``static_peers``: the brokers whose Raft address was given at start (the
        metadata's is not learnt for them); ``bootstrap_addresses``: the client addresses
        of the bootstrap file's nodes, asked with the metadata's for a past
        (``probe_for_a_past``: the data folder was missing, see
        :meth:`_mark_replaced_replicas`); ``prefer``: what the preferred leader's head
        start needs as each replica opens, before the next (raftmq.broker.leadership);
        ``track``: keeps a background task
        until it ends (the broker cancels what still runs when it stops); ``security``:
        how to reach the peers' client services."""
        self.id = broker_id
        self.data_dir = data_dir
        self.security = security
        self.host = host
        self.transport = transport
        self.replicas = replicas
        self.moves = moves
        self.log_config = log_config
        self.raft_peers = static_peers
        self._bootstrap_addresses = bootstrap_addresses
        self._probe_for_a_past = probe_for_a_past
        """No data folder: ask the peers, once, whether this broker lost one (see
        :meth:`_mark_replaced_replicas`), unless the operator said it is new."""
        self.durability_markers = durability_markers
        self._stopping = stopping
        self._epoch = epoch
        self._prefer = prefer
        self._track = track
        self.metadata = MetadataState(cluster_name)
        """The newest metadata this broker applied (empty until the first arrives)."""
        self.topic_ids = TopicIdMarkers(data_dir)
        self.listings = ReplicaListings(data_dir)
        self.unopened = UnopenedReplicas()
        """The replicas the metadata assigns here that are not in :attr:`replicas`: opening,
        repairing, or failed to open (why; retried with backoff)."""
        self._reconcile_lock = asyncio.Lock()
        """Held while replicas open or are deleted for a metadata version, so that a retry
        of a failed one never races the next version's reconcile."""
        self._full_pass: tuple[MetadataState, float, int] | None = None
        """The last version that took the full pass, when (monotonic s), and the earliest
        ``delete_after_ms`` of a partition listed here (a deadline passing changes what
        is wanted without a new version)."""
        self.settings = ReplicaSettings(log_config)
        self.open_files_note = ""
        self.said_too_few_files = False

    def replica_dir(self, topic: str, partition: int) -> Path:
        """Where this broker keeps its replica of ``topic``/``partition``."""
        return self.data_dir / f"{topic}-{partition}"

    async def reconcile(self, state: MetadataState) -> None:
        """Make the local replicas what ``state`` says: learn peers' Raft addresses, delete
        the replicas of deleted topics, open the replicas this broker hosts.

        Every step is per replica (docs/driver.md, "Failure isolation in the broker's
        control loop"): one that cannot be deleted, opened or reconfigured is logged and
        recorded with its reason (an unopened one in :attr:`unopened`, retried with
        backoff), and every other change of the version still applies."""
        async with self._reconcile_lock:
            await self._reconcile_locked(state)

    async def _reconcile_locked(self, state: MetadataState) -> None:
        now_ms = time.time_ns() // 1_000_000
        if self._full_pass is not None:
            before, at_s, expiry_ms = self._full_pass
            if (
                time.monotonic() - at_s < FULL_PASS_EVERY_S
                and now_ms < expiry_ms
                and same_layout(before, state)
            ):
                self.metadata = state  # only leaderships moved: routing takes them
                self._follow_moves(state)
                return
        for b in state.brokers.values():
            if b.id != self.id and b.id not in self.raft_peers:
                try:
                    self.transport.add_peer(b.id, (b.raft_host, b.raft_port))
                except Exception:
                    log.exception(
                        "broker %d: learning broker %d's Raft address failed", self.id, b.id
                    )
        await self.delete_gone_replicas(state)
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
            older = {(t.name, p) for t, p, _ in opening if t.topic_id < self._epoch()}
            if older:
                try:
                    await self._mark_replaced_replicas(older, state)
                except Exception:  # the replicas open as new ones: no worse than no probe
                    log.exception("broker %d: asking its peers for a past failed", self.id)
        self.metadata = state  # before opening: Metadata answers for what opens
        if opening:
            self._check_open_files(len(self.replicas) + len(opening))
            try:  # one write for all; each open below checks its own again
                self.listings.raise_to(
                    (self.replica_dir(t.name, p) for t, p, _ in opening), state.version
                )
            except Exception:
                log.exception("broker %d: recording the replicas' listings failed", self.id)
        opened = await self._open_replicas(opening, state.version)
        self._after_opening(opened, state)
        expiry_ms = min(
            (part.delete_after_ms for _, _, part in wanted if part.delete_after_ms is not None),
            default=1 << 62,
        )
        self._full_pass = (state, time.monotonic(), expiry_ms)

    def _after_opening(self, opened: list[PartitionReplica], state: MetadataState) -> None:
        """What follows the opening of replicas for metadata ``state``: settings, the
        preferred leaders' campaigns, and the replica sets the moves driver follows."""
        self.settings.apply(self.replicas, state)  # altered configs, decommissions
        if opened:
            log.info("broker %d: opened %d replicas", self.id, len(opened))
        self._follow_moves(state)

    def _follow_moves(self, state: MetadataState) -> None:
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
        slice_start = time.monotonic()
        for topic, p, part in opening:
            if self._stopping():
                break
            if not self.unopened.may_open((topic.name, p)):
                continue
            replica = await self._open_replica(topic, p, part, version)
            if replica is not None:
                opened.append(replica)
            took_s = time.monotonic() - slice_start
            if took_s >= OPEN_SLICE_SECONDS:
                await asyncio.sleep(took_s * OPEN_PAUSE_SHARE)
                slice_start = time.monotonic()
        return opened

    async def _open_replica(
        self, topic: Topic, p: int, part: Partition, version: int
    ) -> PartitionReplica | None:
        """Open this broker's replica of ``topic``/``p``; None when it cannot open (it is
        then recorded as failed, or as repairing, with why)."""
        key = (topic.name, p)
        directory = self.replica_dir(topic.name, p)
        try:
            directory.parent.mkdir(parents=True, exist_ok=True)
            self.topic_ids.write(directory, topic.topic_id)
            self.listings.raise_to([directory], version)
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
        try:
            self._prefer(replica)
        except Exception:  # its election timers decide instead
            log.exception("broker %d: preferring a leader for %s/%d failed", self.id, *key)
        before = self.unopened.get(key)
        if before is not None and before.failures:  # the first try of each is counted only
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
        leader, _ = reported_leader(self.metadata, topic, partition)
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
        topic = self.metadata.topics.get(key[0])
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
            state = self.metadata
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

    async def reopen_failed_replicas(self) -> None:
        """Try again, as their backoff passes, the replicas that failed to open."""
        while not self._stopping():
            await asyncio.sleep(OPEN_RETRY_CHECK_S)
            if not self.unopened.due():
                continue
            try:
                async with self._reconcile_lock:
                    state = self.metadata
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
        state = self.metadata
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
        directory = self.replica_dir(topic, partition)
        async with self._reconcile_lock:
            name = group_name(topic, partition)
            self.replicas.pop(key, None)
            if name in self.host.groups or name in self.host.quarantined:
                await self.host.close_group(name, discard=True)
            deleted = await asyncio.to_thread(_delete_tree, directory)
            # A replica that loses its log must not pass for a new one (docs/raft.md,
            # "Rejoining after disk loss"); a single replica has nobody to wait for.
            forget_group(directory, promised=len(part.replicas) > 1)
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

    def _check_open_files(self, replicas: int) -> None:
        """Before more logs open: say once if the open-file limit is too low for them."""
        self.open_files_note, too_low = open_files_note(replicas)
        if too_low and not self.said_too_few_files:
            self.said_too_few_files = True
            log.warning("broker %d: %s", self.id, self.open_files_note)

    def _log_config(self, topic: Topic) -> LogConfig:
        return log_config_for(self.log_config, topic)

    async def delete_gone_replicas(self, state: MetadataState) -> None:
        """Delete each local replica whose topic id the metadata no longer holds (when:
        :meth:`TopicIdMarkers.gone`), and each of a live topic that moved away from here."""
        for name, partition, directory in self.topic_ids.gone(state):
            try:
                await self.delete_replica(name, partition, directory)
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

    async def _delete_if_moved_away(
        self, state: MetadataState, topic: Topic, p: int, directory: Path
    ) -> None:
        """A replica of a live topic that the metadata lists on this broker no more (a
        move took it elsewhere) is deleted: at once when it is not open, else once its
        group can do without it (:class:`MembershipDriver` decides; a leader hands its
        leadership over first). Never on a copy of the metadata older than the one that
        opened it here (raftmq.broker.listings)."""
        if p >= len(topic.partitions):
            return
        part = topic.partitions[p]
        if self.id in part.replicas or self.id in part.learners:
            return
        listed_at = self.listings.listed_at(directory) or topic.topic_id
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
        await self.delete_replica(topic.name, p, directory, why)

    async def leave_replica(self, topic: str, partition: int, why: str) -> None:
        """The replica moved away and its group can do without it: delete it, unless the
        metadata lists it here again meanwhile."""
        state = self.moves.state
        found = state.topics.get(topic) if state is not None else None
        if found is not None and partition < len(found.partitions):
            listed = found.partitions[partition]
            if self.id in listed.replicas or self.id in listed.learners:
                return
        await self.delete_replica(topic, partition, self.replica_dir(topic, partition), why)

    async def delete_replica(
        self, topic: str, partition: int, directory: Path, why: str = "topic gone"
    ) -> None:
        replica = self.replicas.pop((topic, partition), None)
        self.unopened.opened((topic, partition))
        if replica is not None:
            await self.host.close_group(group_name(topic, partition), discard=True)
        # Off the loop, which it yields: deleting a topic of 1,000 partitions in line held
        # it (ticks, heartbeats, the DeleteTopic answer) for ~12 s (controller_bench.py).
        await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
        forget_group(directory)
        self.topic_ids.remove(directory)
        self.listings.forget(directory)
        log.info("broker %d: deleted its replica of %s/%d (%s)", self.id, topic, partition, why)

    async def _mark_replaced_replicas(
        self, hosted: set[tuple[str, int]], state: MetadataState
    ) -> None:
        """No data directory: a new broker, or one whose disk was replaced. The partitions
        its peers (in the bootstrap file or the metadata ``state``) know a past for are
        marked as once promised, so their replicas rejoin (no votes until caught up)
        instead of passing for new ones (:mod:`raftmq.broker.history_probe`)."""
        seen, answered = await partitions_with_history(
            {**self._bootstrap_addresses, **broker_addresses(state)},
            self.id,
            hosted,
            self.security,
        )
        if not answered:
            # Nobody could say, so assume the past: a replica that passed for new would vote
            # at once and could help a peer that missed committed entries win an election.
            # Rejoining costs only the wait for a leader that has the log (a replica with
            # no peer has nothing to wait for: it starts empty).
            seen = {
                (t, p)
                for t, p in hosted
                if t in state.topics and len(state.topics[t].partitions[p].replicas) > 1
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


def _record_promised_all(data_dir: Path, replicas: set[tuple[str, int]]) -> None:
    record_promised(*(data_dir / f"{topic}-{p}" for topic, p in sorted(replicas)))


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
