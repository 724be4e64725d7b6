"""The controller quorum as a running service: the metadata group (:data:`GROUP`) opened as a
replicated state machine over :class:`MetadataStateMachine` on a Raft host, with a fixed
voter set (KRaft's ``controller.quorum.voters``), typed methods for every command,
broker heartbeats and fencing, reads, and a coalescing watch.

Heartbeats are kept in the leader's memory, not written as entries: one entry per beat
would bump the metadata version (and wake every watcher) every few seconds per broker
for no change a reader cares about. KRaft does the same. What the log records is the
decision drawn from them: ``FenceBroker`` when a broker stayed silent longer than the
session timeout, ``UnfenceBroker`` when it beats again.

A new leader knows no heartbeat history, so it counts every broker as seen when it took
over: nobody is fenced before this node has led for a whole session timeout.

Everything runs on the host's event loop. The wall clock is read only here, by the
proposer, and stamped into commands; applying never reads it (docs/controller.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from raftmq.controller import commands as c
from raftmq.controller.errors import RefusalCode
from raftmq.controller.model import MetadataState
from raftmq.controller.state_machine import MetadataStateMachine
from raftmq.log.atomic_file import fsync_dir
from raftmq.raft.errors import (
    GroupDamagedError,
    GroupFailedError,
    GroupRepairError,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalDroppedError,
    ReadIndexError,
)
from raftmq.raft.host.group_storage import record_promised
from raftmq.raft.host.host import DurableFn, GroupStatus, RaftHost
from raftmq.raft.host.state_machine import (
    MAX_COMMAND_BYTES,
    SEGMENT_BYTES,
    CommandTooLargeError,
    ReplicatedStateMachine,
    state_machine_log_config,
)
from raftmq.raft.membership import Membership
from raftmq.raft.ready import Role, SoftState
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

GROUP = "__cluster_metadata"
"""The metadata group's name on every controller voter's host (Kafka's topic name)."""
SESSION_TIMEOUT_S = 6.0
"""A broker silent this long is fenced (Kafka's broker.session.timeout.ms is 9 s)."""
PROPOSE_TIMEOUT_S = 10.0
"""How long a command may take to commit before its outcome is reported unknown."""
READ_TIMEOUT_S = 5.0
REPORTS_PER_ENTRY = 1000
"""Leader reports in one entry at most (a few hundred bytes each, far below the
command size limit)."""
REPAIR_RETRY_FIRST_S = 1.0
"""A metadata log no voter could mend yet is tried again after this long, doubling..."""
REPAIR_RETRY_MAX_S = 30.0
"""...up to this (its peers may still be starting, or down)."""
METADATA_SEGMENT_BYTES_ENV = "RAFTMQ_TEST_METADATA_SEGMENT_BYTES"
"""Tests only: the metadata log's segment size in bytes when set (its default, 4 MiB, is
more than a test's few commands fill, and damage in a *sealed* segment needs some)."""

R = TypeVar("R", bound=c.Result)


class ControllerError(Exception):
    """Base of what the quorum raises; the api floor maps each to an ErrorCode."""


class ControllerRefusal(ControllerError):
    """The state machine refused the command: nothing changed. ``code`` says which kind of
    mistake, the message what to do."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NotControllerError(ControllerError):
    """This voter does not lead the quorum; ``leader`` does (0 when none is known yet)."""

    def __init__(self, leader: int, message: str) -> None:
        super().__init__(message)
        self.leader = leader


class ControllerUnavailableError(ControllerError):
    """No leader, or no quorum confirmed the request: nothing was done; retry later."""


class OutcomeUnknown(ControllerError):
    """The command was proposed but leadership moved (or it took too long) before it
    applied here: it may still commit. Read the metadata before retrying."""


def _stopping_error() -> ControllerUnavailableError:
    return ControllerUnavailableError("the controller is stopping; retry with another voter")


def _set_aside(node_id: int, group_dir: Path, why: str) -> None:
    """Move a metadata group's directory that cannot open aside (``<dir>.damaged-<ms>``,
    for an operator to inspect or restore) and record that this voter promised, so the
    fresh one rejoins rather than passing for a new voter."""
    aside = group_dir.with_name(f"{group_dir.name}.damaged-{time.time_ns() // 1_000_000}")
    group_dir.rename(aside)
    fsync_dir(group_dir.parent)
    record_promised(group_dir)
    log.error(
        "controller %d: its metadata group cannot open (%s); its directory is kept as %s "
        "and it resynchronises from the other voters: it rejoins empty and votes again "
        "only once it holds the leader's metadata",
        node_id,
        why,
        aside,
    )


class ControllerQuorum:
    """One voter of the controller quorum: the metadata group on ``host``, in
    ``directory``. Call :meth:`start` once the host runs (it starts the fencing loop),
    :meth:`stop` before stopping the host."""

    def __init__(
        self,
        host: RaftHost,
        directory: str | Path,
        voters: Iterable[int],
        cluster_name: str,
        *,
        session_timeout_s: float = SESSION_TIMEOUT_S,
        propose_timeout_s: float = PROPOSE_TIMEOUT_S,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        monotonic_s: Callable[[], float] = time.monotonic,
        on_durable: DurableFn | None = None,
        **rsm_options: int,
    ) -> None:
        self.voters = frozenset(voters)
        if host.node_id not in self.voters:
            raise ValueError(f"node {host.node_id} is not one of the voters {sorted(self.voters)}")
        if session_timeout_s <= 0:
            raise ValueError("session_timeout_s must be positive")
        self.node_id = host.node_id
        self._host = host
        self.session_timeout_s = session_timeout_s
        self.propose_timeout_s = propose_timeout_s
        self._clock_ms = clock_ms
        self._monotonic_s = monotonic_s
        self._led_since: float | None = None
        self._last_seen: dict[int, tuple[int, float]] = {}  # broker -> (incarnation, when)
        self._fencing: set[int] = set()  # fence proposals in flight
        self._rejoin_at: dict[int, int] = {}  # fenced broker -> version to catch up to
        self._fence_task: asyncio.Task[None] | None = None
        self._timers: list[Callable[[], Awaitable[None]]] = []
        self._reports: list[tuple[c.ReportLeader, asyncio.Future[c.Refused | None]]] = []
        """Leader reports waiting for the next batch (:meth:`report_leader`)."""
        self._reporter: asyncio.Task[None] | None = None
        self.rsm: ReplicatedStateMachine[MetadataStateMachine] = ReplicatedStateMachine(
            host,
            GROUP,
            Path(directory) / GROUP,
            Membership(self.voters),
            MetadataStateMachine(cluster_name),
            on_soft_state=self._soft_state,
            on_durable=on_durable,
            # Ahead of the partitions' rounds: every broker depends on this group, and its
            # reads timed out behind a large topic's elections (RaftHost.open_group).
            priority=True,
            **rsm_options,
        )

    @classmethod
    async def open(
        cls,
        host: RaftHost,
        directory: str | Path,
        voters: Iterable[int],
        cluster_name: str,
        **options: Any,
    ) -> ControllerQuorum:
        """Construct the quorum's voter (arguments as for the constructor), mending a
        metadata log that cannot open from the other voters first.

        Why: a bit flipped in a sealed segment of this voter's metadata log, in an entry
        the group reads at open, made the constructor raise, and the broker crash-looped
        on it although the other voters hold the same bytes. Here GroupDamagedError starts
        :meth:`RaftHost.repair_closed_group` with the other voters as peers (it starts the
        host's transport if needed: the broker opens this group before the host runs),
        then the group is opened again. While no voter can supply a range (they may be
        starting too), it tries again with backoff, logging why each time.

        Damage no peer's entries can mend (GroupDamagedError without ranges: a corrupt
        state machine snapshot the log extends) is met as the error's own advice says, by
        resynchronising: the group's directory is moved aside (kept, not deleted), its
        promise recorded in the state store, and the voter opens empty and *rejoins*: no
        vote until the leader has sent it the metadata again. Only with other voters to
        send it, and once; otherwise the error is raised."""
        voters = frozenset(voters)
        env_segment = os.environ.get(METADATA_SEGMENT_BYTES_ENV)
        if env_segment and "segment_bytes" not in options:
            options["segment_bytes"] = int(env_segment)
        log_config = state_machine_log_config(
            max_command_bytes=int(options.get("max_command_bytes", MAX_COMMAND_BYTES)),
            segment_bytes=int(options.get("segment_bytes", SEGMENT_BYTES)),
        )
        peers = sorted(voters - {host.node_id})
        retry_s = REPAIR_RETRY_FIRST_S
        set_aside = False
        while True:
            try:
                return cls(host, directory, voters, cluster_name, **options)
            except GroupDamagedError as exc:
                if not exc.damages:
                    if set_aside or not peers:
                        raise
                    _set_aside(host.node_id, Path(directory) / GROUP, exc.reason)
                    set_aside = True
                    continue
                log.error(
                    "controller %d: its metadata log cannot open (%s); repairing it from voters %s",
                    host.node_id,
                    exc.reason,
                    peers,
                )
            try:
                what = await host.repair_closed_group(
                    GROUP, Path(directory) / GROUP, peers, log_config
                )
            except GroupRepairError as exc:
                log.error(
                    "controller %d: %s; trying again in %.0f s",
                    host.node_id,
                    exc,
                    retry_s,
                )
                await asyncio.sleep(retry_s)
                retry_s = min(REPAIR_RETRY_MAX_S, retry_s * 2)
                continue
            log.warning("controller %d: %s; opening its metadata group", host.node_id, what)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._fence_task is None:
            self._fence_task = asyncio.get_running_loop().create_task(
                self._fence_loop(), name=f"controller-{self.node_id}-fencing"
            )

    async def stop(self) -> None:
        for task in (self._fence_task, self._reporter):
            if task is not None:
                await stop_task(task)
        self._fence_task = self._reporter = None
        reports, self._reports = self._reports, []
        for _, refused in reports:
            if not refused.done():
                refused.set_exception(_stopping_error())

    def on_tick(self, check: Callable[[], Awaitable[None]]) -> None:
        """Run ``check`` on the fencing timer, after its pause check, so other sessions
        kept in the leader's memory (consumer group members) expire by the same clock and
        the same rules: none before this node led for their timeout, none for a pause of
        this process (:attr:`led_since` restarts then)."""
        self._timers.append(check)

    @property
    def led_since(self) -> float | None:
        """On the leader, when (``monotonic_s``) its count of silences starts: when it
        took over, or when it woke from a pause; None on a follower. A session last heard
        before it counts as heard then."""
        return self._led_since

    def monotonic_s(self) -> float:
        return self._monotonic_s()

    def now_ms(self) -> int:
        """This voter's clock, the one it stamps commands with (fences, decommissions):
        whoever compares with those stamps (healing's heal delay) reads this one."""
        return self._clock_ms()

    @property
    def is_leader(self) -> bool:
        return self.rsm.is_leader

    @property
    def leader(self) -> int:
        """The quorum's leader as this voter knows it (0 when none)."""
        return self.rsm.leader

    def raft_status(self) -> GroupStatus:
        """This voter's member of the metadata group (term, log end, rejoining)."""
        return self._host.status(GROUP)

    def _soft_state(self, soft: SoftState) -> None:
        if soft.role == Role.LEADER:
            if self._led_since is None:
                self._led_since = self._monotonic_s()
                self._last_seen.clear()  # a former term's history is not ours to trust
                self._rejoin_at.clear()
        else:
            self._led_since = None
            self._last_seen.clear()
            self._rejoin_at.clear()

    # --- proposals ----------------------------------------------------------------------

    async def propose(self, command: c.Command, expect: type[R]) -> R:
        """Any command whose result is an ``expect`` (the group coordinator's); errors as
        for every command."""
        return await self._propose(command, expect)

    async def _propose(self, command: c.Command, expect: type[R]) -> R:
        """Propose ``command``; its result if accepted, else ControllerRefusal,
        NotControllerError, ControllerUnavailableError or OutcomeUnknown."""
        try:
            raw = await asyncio.wait_for(
                self.rsm.propose(c.encode(command)), self.propose_timeout_s
            )
        except NotLeaderError as exc:
            raise self._not_controller(exc.leader) from None
        except CommandTooLargeError as exc:  # the service bounds every field: our bug
            raise ControllerRefusal(RefusalCode.MALFORMED_COMMAND, str(exc)) from None
        except (ProposalDroppedError, GroupFailedError) as exc:
            raise ControllerUnavailableError(
                f"controller {self.node_id} could not take the command ({exc}); retry"
            ) from None
        except OutcomeUnknownError as exc:
            raise OutcomeUnknown(
                f"{exc}; read the metadata to see whether it applied before retrying"
            ) from None
        except TimeoutError:
            raise OutcomeUnknown(
                f"the command did not commit within {self.propose_timeout_s} s (no quorum?); "
                "it may still: read the metadata before retrying"
            ) from None
        result = c.decode_result(raw)
        if isinstance(result, c.Refused):
            raise ControllerRefusal(result.code, result.message)
        assert isinstance(result, expect), (command, result)
        return result

    def _not_controller(self, leader: int) -> ControllerError:
        if leader == 0 or leader == self.node_id:
            return ControllerUnavailableError(
                "the controller quorum has no leader now (an election, or no quorum); retry"
            )
        return NotControllerError(
            leader, f"controller {self.node_id} does not lead the quorum; {leader} does"
        )

    def require_leader(self) -> None:
        """NotControllerError (or ControllerUnavailableError) unless this voter leads."""
        if not self.rsm.is_leader:
            raise self._not_controller(self.rsm.leader)

    async def register_broker(
        self,
        broker_id: int,
        host: str,
        port: int,
        raft_host: str,
        raft_port: int,
        rack: str | None,
        incarnation: int,
    ) -> c.BrokerRegistered:
        result = await self._propose(
            c.RegisterBroker(
                broker_id, host, port, raft_host, raft_port, rack, incarnation, self._clock_ms()
            ),
            c.BrokerRegistered,
        )
        self._last_seen[broker_id] = (incarnation, self._monotonic_s())
        return result

    async def heartbeat(
        self, broker_id: int, incarnation: int, metadata_version: int
    ) -> tuple[bool, int]:
        """Record a beat in the leader's memory; returns (fenced, the leader's metadata
        version). ``metadata_version`` is the newest version the broker applied. A fenced
        broker of the registered incarnation is unfenced (one entry) once it caught up
        with the version the leader held at its first beat since the fence: a broker back
        from a partition must know the metadata of its absence before it takes work."""
        self.require_leader()
        state = self.rsm.machine.state
        broker = state.brokers.get(broker_id)
        if broker is None:
            raise ControllerRefusal(
                RefusalCode.UNKNOWN_BROKER,
                f"broker {broker_id} has not registered; register before heartbeating",
            )
        if broker.incarnation != incarnation:
            raise ControllerRefusal(
                RefusalCode.STALE_BROKER_INCARNATION,
                f"broker {broker_id} is registered as incarnation {broker.incarnation}, not "
                f"{incarnation}; a restarted broker registers again",
            )
        self._last_seen[broker_id] = (incarnation, self._monotonic_s())
        if not broker.fenced:
            self._rejoin_at.pop(broker_id, None)
            return False, state.version
        target = self._rejoin_at.setdefault(broker_id, state.version)
        if metadata_version < target:
            return True, state.version
        await self._propose(c.UnfenceBroker(broker_id, incarnation), c.Done)
        self._rejoin_at.pop(broker_id, None)
        log.info("broker %d heartbeats again, caught up to %d: unfenced", broker_id, target)
        return False, self.rsm.machine.version

    async def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
        assignment: Iterable[Iterable[int]] = (),
    ) -> c.TopicCreated:
        return await self._propose(
            c.CreateTopic(
                name,
                partitions,
                replication_factor,
                dict(config or {}),
                tuple(tuple(r) for r in assignment),
                placement=c.PLACEMENT_RULES,
            ),
            c.TopicCreated,
        )

    async def delete_topic(self, name: str) -> c.Done:
        return await self._propose(c.DeleteTopic(name), c.Done)

    async def alter_config(
        self, name: str, updates: Mapping[str, str], removals: Iterable[str] = ()
    ) -> c.Done:
        return await self._propose(c.AlterTopicConfig(name, dict(updates), tuple(removals)), c.Done)

    async def add_partitions(self, name: str, count: int) -> c.PartitionsAdded:
        return await self._propose(
            c.AddPartitions(name, count, placement=c.PLACEMENT_RULES), c.PartitionsAdded
        )

    async def decommission(self, name: str, partitions: Iterable[int]) -> c.Done:
        return await self._propose(
            c.DecommissionPartitions(name, tuple(partitions), self._clock_ms()), c.Done
        )

    async def drain_broker(self, broker_id: int) -> c.Done:
        return await self._propose(c.DrainBroker(broker_id), c.Done)

    async def request_rebalance(self, requested: bool = True) -> c.Done:
        return await self._propose(c.RequestRebalance(requested), c.Done)

    async def propose_change(self, command: c.Command) -> c.Done:
        """Any command whose result is a plain Done (the mover's moves, give-ups,
        reorders); ControllerRefusal and the other errors as for every command."""
        return await self._propose(command, c.Done)

    async def allocate_producer_ids(self, broker_id: int, count: int) -> c.ProducerIdsAllocated:
        return await self._propose(c.AllocateProducerIds(broker_id, count), c.ProducerIdsAllocated)

    async def report_leader(self, name: str, partition: int, leader: int, term: int) -> c.Done:
        """Record a partition's leader in the next batch of reports (one
        :class:`~raftmq.controller.commands.ReportLeaders` entry for the reports that
        arrive while the one before is in its Raft round). ControllerRefusal with this
        report's own refusal, or the quorum's error for the whole batch.

        Why batched: each report was an entry of its own, so the elections of a large
        topic's creation made as many metadata versions, each applied by every voter
        and followed by every broker, whose cost grows with the cluster's size."""
        self.require_leader()
        loop = asyncio.get_running_loop()
        refused: asyncio.Future[c.Refused | None] = loop.create_future()
        self._reports.append((c.ReportLeader(name, partition, leader, term), refused))
        if self._reporter is None or self._reporter.done():
            self._reporter = loop.create_task(self._report_batches(), name="leader-reports")
        refusal = await refused
        if refusal is not None:
            raise ControllerRefusal(refusal.code, refusal.message)
        return c.Done()

    async def _report_batches(self) -> None:
        """Propose one batch of reports at a time while reports wait."""
        while self._reports:
            await asyncio.sleep(0)  # the report handlers ready to run join this batch
            batch = self._reports[:REPORTS_PER_ENTRY]
            del self._reports[:REPORTS_PER_ENTRY]
            command = c.ReportLeaders(tuple(report for report, _ in batch))
            try:
                applied = await self._propose(command, c.LeadersReported)
            except (ControllerError, asyncio.CancelledError) as exc:
                error = exc if isinstance(exc, ControllerError) else _stopping_error()
                for _, refused in batch:
                    if not refused.done():
                        refused.set_exception(error)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, refused), refusal in zip(batch, applied.refusals, strict=True):
                if not refused.done():  # its caller may have gone (a deadline)
                    refused.set_result(refusal)

    async def add_replica(
        self, name: str, partition: int, broker_id: int, *, replacing: int | None = None
    ) -> c.Done:
        return await self._propose(
            c.AddReplica(name, partition, broker_id, replacing=replacing), c.Done
        )

    async def promote_replica(self, name: str, partition: int, broker_id: int) -> c.Done:
        return await self._propose(c.PromoteReplica(name, partition, broker_id), c.Done)

    async def remove_replica(self, name: str, partition: int, broker_id: int) -> c.Done:
        return await self._propose(c.RemoveReplica(name, partition, broker_id), c.Done)

    async def reorder_replicas(self, name: str, partition: int, replicas: Iterable[int]) -> c.Done:
        return await self._propose(c.ReorderReplicas(name, partition, tuple(replicas)), c.Done)

    # --- fencing ------------------------------------------------------------------------

    async def _fence_loop(self) -> None:
        period_s = min(1.0, self.session_timeout_s / 4)
        last_s = self._monotonic_s()
        while True:
            await asyncio.sleep(period_s)
            now_s = self._monotonic_s()
            if now_s - last_s > self.session_timeout_s / 2 and self._led_since is not None:
                # This process stood still (SIGSTOP, a frozen VM, a swap storm): the silence
                # it measures is its own, not the brokers'. Count them as seen now, as a new
                # leader does, instead of fencing every broker on waking.
                log.warning(
                    "controller %d: paused for %.1f s; fencing restarts its count",
                    self.node_id,
                    now_s - last_s,
                )
                self._led_since = now_s
                self._last_seen.clear()
            last_s = now_s
            try:
                await self._fence_silent()
            except ControllerError as exc:  # leadership moved; the next leader decides
                log.info("controller %d: fencing deferred: %s", self.node_id, exc)
            for check in self._timers:
                try:
                    await check()
                except ControllerError as exc:
                    log.info("controller %d: session expiry deferred: %s", self.node_id, exc)

    def silent_brokers(self) -> list[int]:
        """Unfenced brokers this leader has not heard from for a session timeout; none
        before it has led that long (it has no history of the beats before)."""
        led_since = self._led_since
        now = self._monotonic_s()
        if led_since is None or not self.rsm.is_leader:
            return []
        if now - led_since < self.session_timeout_s:
            return []
        silent = []
        for broker_id, broker in sorted(self.rsm.machine.state.brokers.items()):
            if broker.fenced or broker_id in self._fencing:
                continue
            incarnation, seen = self._last_seen.get(broker_id, (broker.incarnation, led_since))
            if incarnation != broker.incarnation:
                seen = led_since  # beats from an older incarnation do not count
            if now - seen > self.session_timeout_s:
                silent.append(broker_id)
        return silent

    async def _fence_silent(self) -> None:
        for broker_id in self.silent_brokers():
            self._fencing.add(broker_id)
            try:
                log.warning(
                    "controller %d: broker %d sent no heartbeat for %.1f s: fencing it",
                    self.node_id,
                    broker_id,
                    self.session_timeout_s,
                )
                await self._propose(c.FenceBroker(broker_id, self._clock_ms()), c.Done)
            except ControllerRefusal as exc:  # it went away meanwhile
                log.info("controller %d: fencing %d refused: %s", self.node_id, broker_id, exc)
            finally:
                self._fencing.discard(broker_id)

    # --- reads --------------------------------------------------------------------------

    def applied_all_committed(self) -> bool:
        """On the leader: it committed an entry of its term and applied every committed
        entry, so its local state is as current as a read index would make it (short of
        a deposition it has not noticed yet, which check-quorum bounds)."""
        status = self._host.status(GROUP)
        return (
            status.role == Role.LEADER
            and not status.config_pending
            and self.rsm.applied_index >= status.commit
        )

    def local_state(self) -> tuple[int, MetadataState]:
        """(version, state) as this voter applied it, maybe stale; on the leader, right
        after a command of its own returned, it holds that command (and maybe later ones)."""
        state = self.rsm.machine.state
        return state.version, state

    async def metadata(self, *, linearizable: bool = True) -> tuple[int, MetadataState]:
        """(version, state): current as of this call when ``linearizable`` (a quorum
        confirms it: raises ControllerUnavailableError without one), else this voter's
        copy, maybe stale."""
        if not linearizable:
            return self.local_state()
        try:
            state = await self.rsm.linearizable_read(lambda m: m.state, timeout_s=READ_TIMEOUT_S)
        except (NotLeaderError, ReadIndexError) as exc:
            raise ControllerUnavailableError(
                f"controller {self.node_id} could not confirm a current read: {exc}"
            ) from None
        return state.version, state

    async def watch(self, from_version: int = 0) -> AsyncIterator[tuple[int, MetadataState]]:
        """Every newer metadata state this voter applies, as (version, state), from the
        first one above ``from_version``: bursts coalesce into the newest state (metadata
        is small and each state is complete, so a consumer never needs the ones between),
        versions only grow, and a consumer that reconnects with the last version it got
        misses nothing. Runs until the consumer stops iterating."""
        last = from_version
        while True:
            state = self.rsm.machine.state
            if state.version > last:
                last = state.version
                yield last, state
                continue
            # Wakes on every applied entry or snapshot restore; a NOOP or a config entry
            # moves the applied index without a new state, hence the loop.
            await self.rsm.wait_applied(self.rsm.applied_index + 1)
