"""Runs many Raft groups in one asyncio process: the only place where the pure core meets
time, disks and the network.

One loop handles every group's Ready in rounds. A round (1) sends what may overtake the
disk (the leader's appends), (2) writes every group's entries, (3) makes them durable with
fsyncs that run in a thread pool, one per log file, in parallel - so all groups that became
ready during the previous round share one round of fsyncs (group commit across groups),
(4) saves term and vote where they changed, and only then (5) sends votes and append acks,
applies committed entries and advances the cores.

Idle groups are *quiesced*: when a leader's group is fully replicated and has nothing in
flight it tells its followers and every member stops ticking it. Any message, proposal, or
change in a peer's liveness (the transport pings each pair of processes) wakes it again, so
a quiesced follower never waits on a dead leader. Thousands of idle groups then cost a few
pings per second per pair of processes instead of thousands of heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import secrets
import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from raftmq.format import entry
from raftmq.format.tag_filter import TagFilter
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.filtered_reads import FilteredRead
from raftmq.log.log import Log, ReadResult
from raftmq.raft.config import Config
from raftmq.raft.core import RaftCore
from raftmq.raft.errors import (
    GroupDamagedError,
    GroupFailedError,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalDroppedError,
    ReadIndexError,
)
from raftmq.raft.hardstate import HardState
from raftmq.raft.host import state_store
from raftmq.raft.host.byte_rate import ByteRate
from raftmq.raft.host.group_storage import (
    damage_at_open,
    driven_log_config,
    load_group,
    save_commit_hint,
    save_hard_state_in,
    save_snapshot_meta,
)
from raftmq.raft.host.repair import SCRUB_BYTES_PER_S, SelfRepair
from raftmq.raft.host.state_store import StateStore
from raftmq.raft.host.stats import HostStats
from raftmq.raft.host.transport import (
    AuditReply,
    AuditRequest,
    Outgoing,
    RepairReply,
    RepairRequest,
    Transport,
)
from raftmq.raft.membership import Membership
from raftmq.raft.messages import Message, MsgType, SnapshotMeta
from raftmq.raft.progress import ProgressState
from raftmq.raft.ready import Ready, Role, SoftState, write_to_storage
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

COMMIT_HINT_S = 1.0
"""How often a group whose state is its log records its commit point (unsynced)."""
_URGENT = frozenset(
    {
        MsgType.HEARTBEAT,
        MsgType.HEARTBEAT_RESP,
        MsgType.VOTE,
        MsgType.VOTE_RESP,
        MsgType.PRE_VOTE,
        MsgType.PRE_VOTE_RESP,
        MsgType.APP_RESP,
        MsgType.TIMEOUT_NOW,
        MsgType.READ_INDEX,
        MsgType.READ_INDEX_RESP,
    }
)
_LATE_RESPONSES = frozenset({MsgType.HEARTBEAT_RESP, MsgType.APP_RESP})
INLINE_FSYNC_AFTER_IDLE_S = 0.0005
"""Seconds the ready loop must have waited for work before it fsyncs a lone group itself
(it also does when the round before made nothing durable: see ``_ready_loop``)."""
QUIESCE_AFTER_TICKS = 3
"""Idle ticks a leader waits (after followers have the commit) before quiescing."""
RETRY_FIRST_S = 1.0
"""A quarantined group is reopened from disk after this long, then after twice as long..."""
RETRY_MAX_S = 60.0
"""...up to this; a group that stays healthy this long starts again at RETRY_FIRST_S."""
MAX_REASON_CHARS = 300
"""A failure reason is echoed in Metadata and status tables: long paths are cut."""
_READ_CTX = struct.Struct(">qqq")  # node id, this process's nonce, sequence
DEAD_PEER_PROBE_S = 3.0
"""How often a quiesced leader sends a heartbeat to each follower the transport reported
dead when the group quiesced (instead of one every tick, or none)."""

ApplyFn = Callable[[bytes, int], None]
SnapshotFn = Callable[[SnapshotMeta, bytes], None]
AttachmentFn = Callable[[], bytes]
"""A group whose state is its log (a partition) gives the bytes a snapshot it sends
carries beside the start point: derived state the entries below the start point built and
the follower cannot rebuild without them (a partition's producer state)."""
SoftStateFn = Callable[[SoftState], None]
DurableFn = Callable[[str, int], None]


class LogReads(Protocol):
    """What a caller above the host may do with a group's log: read it. A partition's
    state *is* its log, so fetches read it in place rather than through a copy; writes,
    truncation, retention and flushes stay the host's (they must follow the core)."""

    @property
    def start_index(self) -> int: ...

    @property
    def start_offset(self) -> int: ...

    @property
    def next_offset(self) -> int:
        """The offset after the last entry written (not necessarily durable)."""
        ...

    def read(
        self, offset: int, max_bytes: int, *, upper_offset: int | None = None
    ) -> ReadResult: ...

    def read_filtered(
        self, offset: int, max_bytes: int, flt: TagFilter, *, upper_offset: int | None = None
    ) -> FilteredRead: ...

    def read_by_index(self, lo: int, max_bytes: int, hi: int | None = None) -> ReadResult: ...

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None: ...

    @property
    def size_bytes(self) -> int:
        """The bytes of the log's segments (a broker's metrics report it per partition)."""
        ...


class SnapshotStore(Protocol):
    """The state of a group whose state is *not* its log (a replicated state machine,
    ``raftmq/raft/host/state_machine.py``): its snapshots, which the host needs at three
    moments. A partition has none (its log is its state; its snapshot is a start point).

    The store's latest snapshot is never below the log's start point (``index >=
    start_index - 1``), and exactly at it when the group opens: the store saves a
    snapshot durably *before* the log is cut to it or below it (by :meth:`RaftHost.compact`
    with ``through``, or by a received snapshot), and the host redoes the cut when it opens
    the group (entries kept below a snapshot for followers a little behind go then, and a
    cut a crash interrupted is completed). Any other order could leave a log starting
    after the state it would be applied to."""

    def latest(self) -> tuple[SnapshotMeta, bytes] | None:
        """The latest durable snapshot (metadata and bytes), or None before the first.
        Read when the group opens (to redo an interrupted cut) and when a follower needs
        entries below the log's start (its bytes travel in the SNAP message)."""
        ...

    def install(self, meta: SnapshotMeta, data: bytes) -> None:
        """A snapshot received from the leader: save it durably and restore the state from
        it. Called before the log restarts at ``meta.index + 1`` (and before the ack)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class Proposed:
    """What :meth:`RaftHost.propose` assigned, at the moment the leader appended: all a
    partition needs to answer its producer, so it never peeks at the core's log.

    The core stamps offsets into entries as it appends them (docs/raft.md, "Message offsets
    and Raft"), so they are known here, before the entries commit; they are the producer's
    answer only once ``done`` resolves."""

    index: int
    """The Raft index of the proposal's last entry."""
    base_offset: int
    """The offset of the proposal's first record."""
    last_offset: int
    """The offset of its last record (``base_offset - 1`` when it holds no records)."""
    done: asyncio.Future[int]
    """Resolves with ``index`` once committed and applied here (or, proposed with
    ``durable_locally``, once this leader's own write is durable); fails with
    NotLeaderError, ProposalDroppedError or OutcomeUnknownError."""


class RaftGroup:
    """One group on this node: its core, its log, and what the driver tracks for it."""

    def __init__(
        self,
        name: str,
        core: RaftCore,
        log_: Log,
        directory: Path,
        store: StateStore,
        *,
        sync: bool,
        apply: ApplyFn | None,
        on_soft_state: SoftStateFn | None,
        on_snapshot: SnapshotFn | None = None,
        snapshots: SnapshotStore | None = None,
        snapshot_attachment: AttachmentFn | None = None,
    ) -> None:
        self.name = name
        self.on_snapshot = on_snapshot
        self.snapshots = snapshots
        self.snapshot_attachment = snapshot_attachment
        self.core = core
        self.log = log_
        self.directory = directory
        self.store = store
        """The state store of the directory's folder: hard state, snapshot meta, hint."""
        self.new_directory = False
        """The directory held no log when the group opened: its entry (and its first
        segment's) must be made durable before the store first records a promise of it."""
        self.sync = sync
        self.apply = apply
        self.on_soft_state = on_soft_state
        self.saved_hard = HardState()
        # index -> (term, future, resolve once durable locally instead of once committed)
        self.waiters: dict[int, tuple[int, asyncio.Future[int], bool]] = {}
        # read-index context -> the caller waiting for its read point
        self.reads: dict[bytes, asyncio.Future[int]] = {}
        self.hinted_commit = 0
        self.hint_due_s = 0.0
        self.quiesced = False
        # Followers the transport called dead when this (leader's) group quiesced: they
        # get a heartbeat every DEAD_PEER_PROBE_S while it stays quiesced.
        self.probe_peers: tuple[int, ...] = ()
        self.idle_ticks = 0
        self.last_seen = (0, 0)  # (last index, commit) at the previous tick
        self.in_round = False
        # Failure isolation: why this group is quarantined (None while it runs), when it is
        # next reopened, and what it was opened with (a reopen reads the disk like a restart).
        self.failure: str | None = None
        self.retry_s = RETRY_FIRST_S
        self.recovered_at_s = -math.inf
        self.opened_with: tuple[Membership, LogConfig, bool] | None = None
        self.leader_commit = 0
        """The highest commit a leader's append has told this follower: beyond its log end,
        it is catching up."""
        self.parked_config: LogConfig | None = None
        """New settings that arrived during a round (see :meth:`RaftHost.reconfigure_log`)."""
        self.priority = False
        """Its rounds run in the host's priority lane (see :meth:`RaftHost.open_group`)."""

    @property
    def is_leader(self) -> bool:
        return self.failure is None and self.core.role == Role.LEADER

    @property
    def leader(self) -> int:
        """The leader this member knows of; 0 when none, or when it is quarantined (it no
        longer hears from the group, so what it knew may be stale)."""
        return 0 if self.failure is not None else self.core.lead

    # The narrow face for the partition layer: what it needs of the core, read here so
    # that nothing outside raftmq/raft touches the core itself.

    @property
    def term(self) -> int:
        """The current term of this member."""
        return self.core.term

    @property
    def commit_index(self) -> int:
        """The highest Raft index this member knows committed."""
        return self.core.log.committed

    @property
    def last_index(self) -> int:
        """The Raft index of this member's last entry (written, not necessarily durable)."""
        return self.core.log.last_index

    @property
    def next_offset(self) -> int:
        """The message offset the next appended entry starts at (the core stamps offsets
        into entries as it appends them: docs/raft.md)."""
        return self.core.log.next_offset

    @property
    def log_reader(self) -> LogReads:
        """This member's log, for reading only (the object changes when a quarantined
        group is reopened: ask again rather than keep it)."""
        return self.log

    def damage_of(self, exc: Exception) -> Exception:
        """What its state machine raises for an entry it read at open that failed its
        checks: GroupDamagedError naming the damaged sealed ranges (the broker repairs them
        from a peer, as for the group's own reads at open), or ``exc`` itself."""
        return damage_at_open(self.name, self.log, exc)


@dataclasses.dataclass(frozen=True, slots=True)
class PeerProgress:
    """A copy of what a leader knows of one follower."""

    match: int
    state: ProgressState
    learner: bool = False
    """A replica being added: it copies the log but does not vote (nor count as in sync)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GroupStatus:
    """A snapshot of one group on this node, for health reports: callers read this
    instead of the core's own fields."""

    leader: int
    term: int
    commit: int
    last_index: int
    role: Role
    failed: str | None
    """Why this node's member is quarantined, or None while it runs."""
    leader_commit: int
    """On a follower: the highest commit its leader has told it (0 if none yet)."""
    followers: dict[int, PeerProgress]
    """On a leader: a copy of each follower's progress (empty otherwise)."""
    rejoining: bool = False
    """This member lost entries or votes it had acknowledged and gives no vote until a
    leader has brought it up to date (docs/raft.md, "Rejoining after disk loss")."""
    repairing: bool = False
    """A corrupt range of this member's log is being restored from a replica."""
    membership: Membership | None = None
    """The configuration in force on this member (the latest in its log, committed or
    not): who votes and who only learns."""
    config_pending: bool = False
    """On a leader: a configuration change is appended but not committed yet (or this
    term's first entry has not committed), so a new one would be refused."""


@dataclasses.dataclass(eq=False)
class _Lane:
    """Groups whose Readies are handled in rounds together, by one ready loop with its
    own fsync threads (see :meth:`RaftHost.open_group`'s ``priority``)."""

    pool: ThreadPoolExecutor
    pool_size: int
    dirty: set[RaftGroup] = dataclasses.field(default_factory=set)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


def _reason(what: str, exc: BaseException) -> str:
    text = f"{what} failed: {type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


class RaftHost(SelfRepair):
    """The driver of every group on one node."""

    def __init__(
        self,
        node_id: int,
        transport: Transport,
        *,
        tick_s: float = 0.1,
        election_tick: int = 10,
        heartbeat_tick: int = 1,
        fsync_threads: int = 4,
        max_append_bytes: int = 1 << 20,
        seed: int = 0,
        scrub_bytes_per_s: int = SCRUB_BYTES_PER_S,
        learner_bytes_per_s: int = 0,
    ) -> None:
        """``learner_bytes_per_s`` caps the entries this node's leaders send to learners
        (replica moves), all groups together (0: no cap): see :mod:`byte_rate`."""
        self.node_id = node_id
        self._learner_rate = ByteRate(learner_bytes_per_s) if learner_bytes_per_s > 0 else None
        self.scrub_bytes_per_s = scrub_bytes_per_s
        self.scrubbed_bytes = 0
        self.audited_ranges = 0
        self.transport = transport
        self.tick_s = tick_s
        self._core_cfg = Config(
            id=node_id,
            election_tick=election_tick,
            heartbeat_tick=heartbeat_tick,
            max_append_bytes=max_append_bytes,
            seed=seed,
        )
        self.groups: dict[str, RaftGroup] = {}
        """The groups that run. A quarantined group moves to ``quarantined`` until it is
        reopened, so ticks, messages and peer events pass it by."""
        self.quarantined: dict[str, RaftGroup] = {}
        self._ticking: dict[str, RaftGroup] = {}
        """The groups the tick loop visits: every group in ``groups`` that is not
        quiesced, and some that just quiesced or left (the loop drops those as it meets
        them). Why not ``groups`` itself: with 10,000 replicas, visiting each quiesced
        group ten times a second took a tenth of a core of an idle broker."""
        self.soft_state_changes = 0
        """How many times any group's role or leader changed (as its rounds deliver them):
        a watcher that scans every group for leadership (raftmq.broker.leader_reports)
        skips its scan while this stands still."""
        self._hint_due: dict[str, RaftGroup] = {}
        """Groups whose commit may have passed their last commit hint: every group marked
        since, until the tick loop finds its hint current (the same reason)."""
        self._recoveries: dict[str, asyncio.Task[None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=fsync_threads, thread_name_prefix="fsync")
        self._lanes = (
            _Lane(self._pool, fsync_threads),
            _Lane(ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync-priority"), 1),
        )
        """The bulk lane, then the priority lane (groups opened with ``priority``)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.rounds = 0
        self.fsyncs = 0
        self.stats = HostStats()
        self.failed: BaseException | None = None
        self._failed_event = asyncio.Event()
        self._injected_fault: BaseException | None = None
        self._repairs: dict[str, asyncio.Task[None]] = {}
        self._repair_replies: dict[tuple[str, int, int], asyncio.Future[RepairReply]] = {}
        self._stores: dict[Path, StateStore] = {}
        """The state store of each folder a group was opened in (shared: state_store.acquire)."""
        self._store_upkeep: asyncio.Future[None] | None = None
        self._closed_repairs: set[str] = set()
        """Groups not open here whose log :meth:`repair_closed_group` is mending: their
        RepairReplies reach it, nothing else of theirs is processed."""
        self._transport_started = False
        self._read_nonce = secrets.randbits(63)
        self._read_seq = itertools.count()
        transport.set_handler(self)

    # --- groups -------------------------------------------------------------------------

    def open_group(
        self,
        name: str,
        directory: str | Path,
        membership: Membership,
        *,
        log_config: LogConfig | None = None,
        apply: ApplyFn | None = None,
        on_soft_state: SoftStateFn | None = None,
        replay: bool = True,
        on_snapshot: SnapshotFn | None = None,
        snapshots: SnapshotStore | None = None,
        on_durable: DurableFn | None = None,
        priority: bool = False,
        snapshot_attachment: AttachmentFn | None = None,
    ) -> RaftGroup:
        """Open (or create) a group whose log and hard state live in ``directory``.

        The log's flush policy decides when this node acknowledges: EVERY_BATCH fsyncs each
        round before acks go out (acks=all is durable on a majority); INTERVAL acknowledges
        after the write and fsyncs on the interval (replicated in memory, as Kafka does).
        The driver does the fsyncs itself, off the event loop, hence the INTERVAL log.

        ``replay=False`` is for groups whose state *is* the log (partitions): on restart they
        resume applying at the last known commit point instead of re-reading the whole log
        through ``apply``. That point comes from a small unsynced file written about once a
        second; it may be stale (then a little is re-applied) but never ahead of the commit.
        Their ``apply`` gets no bytes (``b""``), only the index the commit reached: reading
        committed entries back from the log would be a copy of every entry for nothing.

        ``snapshots`` is for groups whose state is not their log (a replicated state
        machine, opened with ``replay=True``): see :class:`SnapshotStore`. ``on_snapshot``
        is told of a received snapshot after the log restarted at it, with the bytes it
        carried: the store's, or for a group without one those its leader's
        ``snapshot_attachment`` gave when it sent the snapshot.

        ``on_durable`` (tests only) observes the log's fsyncs: see :attr:`Log.on_durable`.

        ``priority`` runs the group's Readies in a lane of their own, with its own ready
        loop and fsync thread, for a group the node's other groups depend on (the
        controller's metadata group). Why: a round waits for every fsync of its groups
        before any of them sends its acks, so while a topic's creation made a thousand
        partition groups vote and save their terms, each round took seconds, and every
        hop of the metadata group's read index (a heartbeat, its answer, the read's
        answer) waited a whole round on its node: controller reads timed out after 5 s.

        Raises GroupDamagedError when an entry it reads at open (a CONFIG entry it
        replays, the entries around the commit hint or a snapshot's cut) is damaged in a
        sealed segment: the group is not open; :meth:`repair_closed_group` mends it from
        a peer, then call this again. A torn or corrupt hard state does not stop it: the
        group opens *rejoining* (group_storage's ``_hard_state_or_rejoin`` says why
        that is safe).
        """
        if name in self.groups or name in self.quarantined:
            raise ValueError(f"group {name!r} is already open on node {self.node_id}")
        if name in self._closed_repairs:
            raise ValueError(f"group {name!r} is being repaired on node {self.node_id}")
        path = Path(directory)
        config = log_config or LogConfig()
        store = self._store_of(path)
        core, log_, hs, new_directory = load_group(
            name,
            path,
            membership,
            config,
            replay,
            node_id=self.node_id,
            core_cfg=self._core_cfg,
            store=store,
            snapshot=snapshots.latest() if snapshots is not None else None,
        )
        log_.on_durable = on_durable
        group = RaftGroup(
            name,
            core,
            log_,
            path,
            store,
            sync=config.flush_policy is FlushPolicy.EVERY_BATCH,
            apply=apply,
            on_soft_state=on_soft_state,
            on_snapshot=on_snapshot,
            snapshots=snapshots,
            snapshot_attachment=snapshot_attachment,
        )
        group.opened_with = (membership, config, replay)
        group.new_directory = new_directory
        group.priority = priority
        self._attach(group, hs)
        return group

    def _store_of(self, directory: Path) -> StateStore:
        """The state store of the folder ``directory`` is in, held until :meth:`stop`."""
        folder = directory.parent
        store = self._stores.get(folder)
        if store is None:
            store = self._stores[folder] = state_store.acquire(folder)
        return store

    def _attach(self, group: RaftGroup, hs: HardState) -> None:
        """Let a freshly loaded group run: its saved state is ``hs``."""
        replay = group.opened_with is None or group.opened_with[2]
        group.saved_hard = hs
        group.hinted_commit = hs.commit if not replay else -1
        self.groups[group.name] = group
        self._ticking[group.name] = group
        self._mark(group)
        if self._tasks:
            self._announce_open(group)

    def _announce_open(self, group: RaftGroup) -> None:
        """A group opened while the host runs (reopened, repaired, rebuilt, moved here):
        tell its members, so that a quiesced leader wakes and finds out what this member
        holds now. Its peers' connections are up, so no reconnection wakes them, and a
        member that lost its state (rejoining) never campaigns: it would wait for a
        heartbeat that an idle leader never sends. A quiesce notice of term 0 is this
        announcement (:meth:`_on_quiesce`); an older peer ignores it."""
        for peer in sorted(group.core.membership.members - {self.node_id}):
            self.transport.send(peer, group.name, (self.node_id, peer, 0, 0, 0), urgent=True)

    def reconfigure_log(self, name: str, config: LogConfig) -> None:
        """Run group ``name`` with new log settings from now on (a topic's config was
        altered), without reopening it: the log takes them in place and a reopen after
        quarantine uses them too. Between rounds only: a round decides from ``sync``
        whether its entries need an fsync before their acks, so a change arriving during
        one is parked until it ends."""
        group = self.groups.get(name) or self.quarantined[name]
        if group.opened_with is not None:
            membership, _, replay = group.opened_with
            group.opened_with = (membership, config, replay)
        if group.in_round:
            group.parked_config = config
        else:
            self._take_config(group, config)

    def _take_config(self, group: RaftGroup, config: LogConfig) -> None:
        group.parked_config = None
        if group.failure is not None:
            return  # its log is closed; the reopen reads opened_with
        sync = config.flush_policy is FlushPolicy.EVERY_BATCH
        group.log.reconfigure(driven_log_config(config))
        if sync and not group.sync:
            # Acks promise durability from now on, also for entries an INTERVAL round
            # wrote (and acknowledged as written) before: make those durable first. Rare
            # (an operator's alter), so on the loop.
            group.log.flush()
        group.sync = sync

    async def close_group(self, name: str, *, discard: bool = False) -> bool:
        """Stop running group ``name`` and close its files; False if it is not open here.
        Its pending proposals and reads fail; a leader hands the group away first.

        ``discard``: its replica is being deleted (the caller removes the directory and
        its state records afterwards), so nothing is flushed or written: a flush and a
        terms checkpoint per replica cost a large topic's deletion thousands of fsyncs,
        for files about to go."""
        group = self.groups.pop(name, None)
        if group is None:
            group = self.quarantined.pop(name, None)
            recovery = self._recoveries.pop(name, None)
            if recovery is not None:
                recovery.cancel()
            if group is None:
                return False
        self._lane(group).dirty.discard(group)
        with contextlib.suppress(Exception):
            self._hand_away(group)
        self._fail_group_waiters(group, "the replica was closed")
        while group.in_round:  # its write or fsync may still run in the pool
            await asyncio.sleep(0.01)
        self._close_group(group, clean=group.failure is None and not discard)
        return True

    def _close_group(self, group: RaftGroup, *, clean: bool) -> None:
        """Close a group's files: on stop ``clean`` (the commit hint saved, the log flushed);
        when quarantined, without a flush or a write (see :meth:`Log.abandon`)."""
        if clean:
            self._write_commit_hint(group)
            group.log.close()
        else:
            group.log.abandon()

    def _lane(self, group: RaftGroup) -> _Lane:
        """The lane whose ready loop runs ``group``'s rounds."""
        return self._lanes[group.priority]

    def _mark(self, group: RaftGroup) -> None:
        self._hint_due[group.name] = group
        lane = self._lane(group)
        lane.dirty.add(group)
        lane.wake.set()

    def _wake_all(self) -> None:
        for lane in self._lanes:
            lane.wake.set()

    def _unquiesce(self, group: RaftGroup) -> None:
        if group.quiesced:
            group.quiesced = False
            self._ticking[group.name] = group
            group.probe_peers = ()
            group.idle_ticks = 0

    # --- public requests ----------------------------------------------------------------

    def propose(self, name: str, entry_bytes: bytes, *, durable_locally: bool = False) -> Proposed:
        """Propose encoded entries (one or more, appended together in one term or not at
        all): returns the index and offsets they were given and a future of the outcome
        (:class:`Proposed`). Raises NotLeaderError (with the leader hint),
        ProposalDroppedError or GroupFailedError when nothing was appended."""
        group = self._group_for_proposal(name)
        view = group.core.log
        base_offset = view.next_offset
        index = group.core.propose(entry_bytes)
        next_offset = view.next_offset
        assert next_offset >= base_offset and index == view.last_index, (
            f"group {name}: a proposal moved the offsets from {base_offset} to {next_offset} "
            f"and got index {index} with {view.last_index} the last"
        )
        done = self._wait_for(group, index, durable_locally=durable_locally)
        self.stats.proposed(done)
        return Proposed(index, base_offset, next_offset - 1, done)

    def propose_membership(self, name: str, membership: Membership) -> asyncio.Future[int]:
        """Propose a configuration change (one voter at a time); the future gives the CONFIG
        entry's index once committed and applied here. The new configuration is in force
        on each node as soon as it appends the entry."""
        group = self._group_for_proposal(name)
        index = group.core.propose_membership(membership)
        return self._wait_for(group, index, durable_locally=False)

    def _group_for_proposal(self, name: str) -> RaftGroup:
        if self.failed is not None:
            raise ProposalDroppedError(f"node {self.node_id} stopped: {self.failed!r}")
        group = self._live(name)
        self._unquiesce(group)
        return group

    def _live(self, name: str) -> RaftGroup:
        """The running group ``name``; GroupFailedError while it is quarantined."""
        group = self.groups.get(name)
        if group is None:
            failed = self.quarantined.get(name)
            if failed is not None and failed.failure is not None:
                raise GroupFailedError(name, failed.failure)
            raise KeyError(f"group {name!r} is not open on node {self.node_id}")
        return group

    def status(self, name: str) -> GroupStatus:
        """Where group ``name`` stands on this node (a copy: safe to keep)."""
        group = self.groups.get(name) or self.quarantined[name]
        core = group.core
        leading = group.is_leader
        return GroupStatus(
            leader=group.leader,
            term=core.term,
            commit=core.log.committed,
            last_index=group.log.last_index,
            role=core.role if group.failure is None else Role.FOLLOWER,
            failed=group.failure,
            leader_commit=group.leader_commit,
            followers={
                peer: PeerProgress(pr.match, pr.state, pr.is_learner)
                for peer, pr in core.progress.items()
                if peer != self.node_id
            }
            if leading
            else {},
            rejoining=core.rejoining,
            repairing=self.repairing(name),
            membership=core.membership,
            config_pending=core.config_change_pending(),
        )

    def _wait_for(
        self, group: RaftGroup, index: int, *, durable_locally: bool
    ) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        group.waiters[index] = (group.core.term, fut, durable_locally)
        self._mark(group)
        return fut

    def compact(
        self, name: str, *, through: int | None = None, keep_from: int | None = None
    ) -> int:
        """Apply the log's retention, never past what this node applied nor (``keep_from``)
        past the segment holding that index, and record the new start point. Returns how
        many segments were deleted.

        With ``through`` (a state machine's snapshot, saved durably first: see
        :class:`SnapshotStore`), cut the log exactly after that index instead, which must
        be applied here; retention does not run.

        A follower that later needs entries below the start gets a snapshot (for a
        partition: just the start point, since its state is the log itself)."""
        group = self.groups.get(name)
        if group is None:
            return 0  # quarantined: retention runs again once it is reopened
        log_ = group.log
        if through is not None:
            applied = group.core.log.applied
            if not log_.start_index - 1 <= through <= applied:
                raise ValueError(
                    f"group {name}: cannot cut the log after {through}: it starts at "
                    f"{log_.start_index} and {applied} is applied"
                )
        try:
            if through is None:
                keep = group.core.log.applied + 1
                deleted = log_.apply_retention(
                    max_index=keep if keep_from is None else min(keep, keep_from)
                )
            else:
                before = len(log_.segments())
                log_.truncate_prefix(through + 1)
                deleted = before - len(log_.segments())
            if deleted or through is not None:
                save_snapshot_meta(group.store, group.directory, group.core.snapshot_meta())
                group.store.sync()
        except Exception as exc:
            self._quarantine(group, "retention", exc)
            return 0
        return deleted

    def snapshot_point(self, name: str, index: int) -> SnapshotMeta:
        """Where a state machine's snapshot taken at ``index`` (applied here) sits: the
        term and next offset there and the committed configuration in force, which a
        restart or a follower installing it needs."""
        group = self._live(name)
        core = group.core
        if not group.log.start_index - 1 <= index <= core.log.applied:
            raise ValueError(
                f"group {name}: no snapshot point at {index}: the log starts at "
                f"{group.log.start_index} and {core.log.applied} is applied"
            )
        if index == group.log.start_index - 1:
            return core.snapshot_meta()
        header = entry.parse_header(group.log.read_by_index(index, 1).data)
        assert header.index == index, (header.index, index)
        return SnapshotMeta(index, header.term, header.next_offset, core.membership_at(index))

    def read_index(self, name: str) -> asyncio.Future[int]:
        """A linearizable read point of group ``name``: the future gives the leader's
        commit index at the time of the call, once a quorum confirmed that leader still
        leads (Raft thesis 6.4). Serve the read once this node applied that far.

        Works on followers too (the core asks the leader). Raises NotLeaderError when no
        leader is known; the future fails with ReadIndexError when the request is lost
        (leadership moved, the group failed, the node stopped). A request the leader
        never answers (it lost its quorum) leaves the future pending: wait with a
        timeout, then ask again."""
        if self.failed is not None:
            raise ReadIndexError(f"node {self.node_id} stopped: {self.failed!r}")
        group = self._live(name)
        self._unquiesce(group)
        # Unique among every node's outstanding requests, across restarts: the leader
        # treats a known context as a duplicate and answers only the first.
        ctx = _READ_CTX.pack(self.node_id, self._read_nonce, next(self._read_seq))
        group.core.read_index(ctx)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        group.reads[ctx] = fut
        fut.add_done_callback(lambda _: group.reads.pop(ctx, None))
        self._mark(group)
        return fut

    def campaign(self, name: str) -> None:
        group = self._live(name)
        self._unquiesce(group)
        group.core.campaign()
        self._mark(group)

    def delay_election(self, name: str, seconds: float) -> None:
        """Let group ``name``'s first election here wait ``seconds`` longer, unless a
        leader or candidate is heard first (:meth:`RaftCore.delay_election`)."""
        group = self._live(name)
        group.core.delay_election(math.ceil(seconds / self.tick_s))

    def end_election_delay(self, name: str) -> None:
        """Undo :meth:`delay_election` for group ``name`` (:meth:`RaftCore.end_election_delay`)."""
        self._live(name).core.end_election_delay()

    def transfer_leadership(self, name: str, to: int) -> None:
        group = self._live(name)
        self._unquiesce(group)
        group.core.transfer_leadership(to)
        self._mark(group)

    # --- transport handler --------------------------------------------------------------

    def on_messages(self, peer: int, batch: Sequence[tuple[str, Outgoing]]) -> None:
        for name, m in batch:
            group = self.groups.get(name)
            if group is None:
                if isinstance(m, RepairReply) and name in self._closed_repairs:
                    self._take_repair_reply(name, m)  # for repair_closed_group
                # A group this node does not host (yet), or one it quarantined or is
                # repairing closed: Raft treats it as loss.
                continue
            if isinstance(m, (RepairRequest, RepairReply, AuditRequest, AuditReply)):
                self._on_repair_message(group, m)
                continue
            try:
                if isinstance(m, tuple):
                    self._on_quiesce(group, m)
                    continue
                if m.type == MsgType.APP and m.commit > group.leader_commit:
                    group.leader_commit = m.commit
                if group.quiesced and m.type in _LATE_RESPONSES:
                    # Answers to the heartbeat before the quiesce notice: they wake the group
                    # only if they make work (a follower turned out to be behind), or the two
                    # sides would wake each other forever.
                    # A probed follower's answer means it is back: wake to catch it up.
                    group.core.step(m)
                    if group.core.has_ready() or m.src in group.probe_peers:
                        self._unquiesce(group)
                        self._mark(group)
                    self._take_damage(group)
                    continue
                self._unquiesce(group)
                group.core.step(m)
                self._mark(group)
                self._take_damage(group)
            except Exception as exc:
                self._quarantine(group, "step", exc)

    def _on_quiesce(self, group: RaftGroup, notice: tuple[int, int, int, int, int]) -> None:
        src, _, term, commit, last = notice
        core = group.core
        if term == 0:  # a member announcing that it (re)opened: see _announce_open
            self._unquiesce(group)
            group.core.ask_again(src)  # a vote request it dropped before it opened
            self._mark(group)
            return
        if core.term == term and core.lead == src and core.log.last_index == last:
            if core.log.committed < commit:
                # The heartbeats that carried the last commit here were lost: the notice
                # says it too. The leader quiesces only once this log matches its own up
                # to ``last`` (same term, same leader since), so the commit holds here as
                # a heartbeat's would; without it this replica went on ticking, or quiet,
                # with committed entries unapplied (a follower's high watermark stayed
                # behind its leader's until the next write).
                core.step(Message(MsgType.HEARTBEAT, src, self.node_id, term, commit=commit))
                self._mark(group)
            if core.log.committed == commit:
                group.quiesced = True

    def on_peer_state(self, peer: int, alive: bool) -> None:
        # A peer died, was cut off, or came back: every group it shares must tick again so
        # elections and catch-up can happen.
        for group in self.groups.values():
            if peer in group.core.membership.members:
                self._unquiesce(group)

    def on_unreachable(self, peer: int) -> None:
        for group in self.groups.values():
            if group.is_leader and peer in group.core.progress:
                group.core.report_unreachable(peer)

    # --- the loops ----------------------------------------------------------------------

    async def _ensure_transport(self) -> None:
        """Start the transport once: :meth:`repair_closed_group` may need it before
        :meth:`start` (a broker mends a group that cannot open before it serves)."""
        if not self._transport_started:
            self._transport_started = True
            await self.transport.start()

    async def start(self) -> None:
        await self._ensure_transport()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._tick_loop()),
            *(loop.create_task(self._ready_loop(lane)) for lane in self._lanes),
        ]
        if self.scrub_bytes_per_s > 0:
            self._tasks.append(loop.create_task(self._guarded(self._scrub_loop(), "scrubber")))
        for task in self._tasks:
            task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A loop that ends by an error (not one group's: those are caught and quarantine
        that group) leaves the host unable to go on."""
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

    async def wait_failed(self) -> BaseException:
        """Return once the host itself failed (never for one group's failure), with why."""
        await self._failed_event.wait()
        assert self.failed is not None
        return self.failed

    def inject_host_fault(self, exc: BaseException) -> None:
        """Test only (``raftmq broker --inject-host-fault-after-ms``): make the ready loop
        fail with ``exc`` at its next round, as a host-level fault would."""
        self._injected_fault = exc
        self._wake_all()

    async def stop(self) -> None:
        self._stopping = True
        self._wake_all()
        for task in self._repairs.values():
            task.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            # A loop that ended by an error already failed the host (_loop_ended).
            with contextlib.suppress(Exception):
                await stop_task(task)
        for task in self._recoveries.values():
            task.cancel()
        await self.transport.close()
        self._fail_waiters("the node is shutting down")
        for group in self.groups.values():
            self._close_group(group, clean=True)
        for group in self.quarantined.values():
            with contextlib.suppress(Exception):
                self._close_group(group, clean=False)
        for lane in self._lanes:
            lane.pool.shutdown(wait=True)
        stores, self._stores = self._stores, {}
        for store in stores.values():
            with contextlib.suppress(state_store.StateStoreError):  # the host failed already
                state_store.release(store)

    async def _tick_loop(self) -> None:
        """Tick every group each ``tick_s``; ticks the loop missed are dropped, not made up.

        Why: after the loop was held up (a burst of opens, a flood of messages), ticks
        made up back to back ran every group's election and heartbeat timers out while
        the heartbeats that would have reset them still sat unread in the sockets; under
        the load of a 10,000-partition creation, followers then campaigned against live
        leaders and leaders stepped down for want of answers, each election adding to the
        load. Dropping late ticks, as Go's ticker does for etcd, keeps Raft's timeouts in
        the loop's own time, and a tick that comes late leaves the loop half a tick for
        the I/O it held back before the next."""
        next_tick_s = time.monotonic()
        probe_at_s = next_tick_s + DEAD_PEER_PROBE_S
        while not self._stopping:
            next_tick_s = max(next_tick_s + self.tick_s, time.monotonic() + self.tick_s / 2)
            await asyncio.sleep(max(0.0, next_tick_s - time.monotonic()))
            if next_tick_s >= probe_at_s:
                probe_at_s = next_tick_s + DEAD_PEER_PROBE_S
                self._probe_dead_peers()
            groups = self.groups
            for name, group in list(self._ticking.items()):
                try:
                    if groups.get(name) is not group or group.quiesced:
                        del self._ticking[name]  # gone, failed, reopened anew, or quiesced
                        continue
                    if self._maybe_quiesce(group):
                        del self._ticking[name]
                        continue
                    if group.in_round and group.idle_ticks and group.core.role == Role.LEADER:
                        # An idle leader whose last tick's heartbeats are still in the
                        # round: more would only queue behind them.
                        continue
                    group.core.tick()
                    if group.core.has_ready():
                        self._mark(group)
                    if not group.sync:
                        group.log.flush_if_due()  # INTERVAL logs: cheap check, fsync when due
                except Exception as exc:
                    self._quarantine(group, "tick or interval flush", exc)
            now_s = time.monotonic()
            for name, group in list(self._hint_due.items()):
                if groups.get(name) is not group or not (
                    0 <= group.hinted_commit < group.core.log.committed
                ):
                    del self._hint_due[name]  # gone, or its hint is current
                    continue
                if now_s >= group.hint_due_s:
                    group.hint_due_s = now_s + COMMIT_HINT_S
                    try:
                        self._write_commit_hint(group)
                    except Exception as exc:
                        self._quarantine(group, "commit hint write", exc)
            self._keep_stores()

    def _keep_stores(self) -> None:
        """Write (and fsync, and rewrite when grown) what the state stores hold unsynced
        (commit hints, deleted groups' tombstones), in the pool, one job at a time: their
        records are never waited for, yet must reach the disk within a tick or so."""
        if self._store_upkeep is not None and not self._store_upkeep.done():
            return
        stores = [store for store in self._stores.values() if store.pending]
        if stores:
            loop = asyncio.get_running_loop()
            self._store_upkeep = loop.run_in_executor(self._pool, self._sync_stores, stores)
            self._store_upkeep.add_done_callback(self._store_upkept)

    @staticmethod
    def _sync_stores(stores: list[StateStore]) -> None:
        for store in stores:
            store.sync()

    def _store_upkept(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            self._fail(done.exception())  # type: ignore[arg-type]

    def _maybe_quiesce(self, group: RaftGroup) -> bool:
        """Quiesce an idle leader's group, fully replicated on every follower the transport
        considers alive; True when it did.

        Followers the transport reports dead do not hold the group awake (they did, and a
        broker's death kept every group it shared ticking on the survivors for as long as
        it stayed down); they are probed at a low rate instead (``_probe_dead_peers``), and
        the transport's word that one is back wakes the group to catch it up. A leader
        whose live voters are not a quorum never quiesces: ticking, its check-quorum steps
        it down.

        Runs before the tick and quiesces only when nothing of the group is unsent or in a
        round, so the notice is the last thing on the wire: a heartbeat sent after it would
        wake the follower again and leave it waiting for heartbeats that never come. A
        round in progress does not count as activity, though: what is idle is told by its
        log, its commit and its followers' progress. It did count, and on a loaded broker,
        where a round outlasts a tick, the round carrying each tick's heartbeats was still
        running at the next tick: thousands of idle leaders never quiesced, and their
        heartbeats kept the broker loaded (a 10,000-partition creation).
        """
        core = group.core
        if core.role != Role.LEADER or group.waiters:
            group.idle_ticks = 0
            return False
        seen = (core.log.last_index, core.log.committed)
        if seen != group.last_seen or seen[0] != seen[1]:
            group.last_seen = seen
            group.idle_ticks = 0
            return False
        alive = self.transport.peer_alive
        dead = tuple(peer for peer in core.progress if peer != self.node_id and not alive(peer))
        if any(pr.match != seen[0] for peer, pr in core.progress.items() if peer not in dead):
            group.idle_ticks = 0
            return False
        if dead:
            voters = core.membership.voters
            if sum(1 for v in voters if v not in dead) < core.membership.quorum():
                group.idle_ticks = 0
                return False
        group.idle_ticks += 1
        if group.idle_ticks <= QUIESCE_AFTER_TICKS or group.in_round or core.has_ready():
            return False
        group.quiesced = True
        group.probe_peers = dead
        for peer in core.progress:
            if peer != self.node_id and peer not in dead:
                notice = (self.node_id, peer, core.term, seen[1], seen[0])
                self.transport.send(peer, group.name, notice, urgent=True)
        return True

    def _probe_dead_peers(self) -> None:
        """One heartbeat to each follower that was dead when its quiesced leader's group
        went quiet. Its answer (a late response) wakes the group only if the follower turns
        out to be behind; the group stays quiet otherwise."""
        for group in self.groups.values():
            if group.quiesced and group.probe_peers and group.is_leader:
                for peer in group.probe_peers:
                    hb = group.core.heartbeat_for(peer)
                    self.transport.send(peer, group.name, hb, urgent=True)

    def _fail(self, exc: BaseException) -> None:
        """The host itself cannot go on (its transport or its loops failed, not one group):
        stop it loudly and fail every waiting proposal. Its owner (the broker) watches
        :meth:`wait_failed` and exits, so a supervisor restarts it (crash-only)."""
        if self.failed is not None:
            return
        log.error(
            "node %d: Raft host stopped: %s: %s",
            self.node_id,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        self.failed = exc
        self._stopping = True
        self._wake_all()
        self._fail_waiters(f"node stopped: {exc!r}")
        self._failed_event.set()

    def _fail_waiters(self, why: str) -> None:
        """Every pending proposal's outcome is unknown once this node stops: another leader
        may still commit it."""
        for group in self.groups.values():
            self._fail_group_waiters(group, why)

    @classmethod
    def _fail_group_waiters(cls, group: RaftGroup, why: str) -> None:
        for _, fut, _ in group.waiters.values():
            if not fut.done():
                fut.set_exception(OutcomeUnknownError(why))
        group.waiters.clear()
        cls._fail_reads(group, why)

    @staticmethod
    def _fail_reads(group: RaftGroup, why: str) -> None:
        reads, group.reads = group.reads, {}
        for read in reads.values():
            if not read.done():
                read.set_exception(ReadIndexError(f"group {group.name}: read point lost: {why}"))

    # --- failure isolation --------------------------------------------------------------

    def _quarantine(self, group: RaftGroup, what: str, exc: BaseException) -> None:
        """An error inside one group (its core, log, storage, apply): stop that group alone
        and reopen it from disk later, while every other group runs on.

        It leaves ``groups``, so it is neither ticked nor stepped, and messages for it are
        dropped (loss, to its peers); a group in this round neither sends its acks nor
        applies. A leader first tells its most caught-up live follower to campaign at once,
        so the group is led again within a round trip instead of an election timeout."""
        if group.failure is not None or self.groups.get(group.name) is not group:
            return
        now_s = time.monotonic()
        if now_s - group.recovered_at_s > RETRY_MAX_S:
            group.retry_s = RETRY_FIRST_S
        else:  # failed again soon after its reopen: back off further
            group.retry_s = min(RETRY_MAX_S, group.retry_s * 2)
        group.failure = _reason(what, exc)
        log.error(
            "group %s on node %d: %s; it is quarantined (the other groups run on) and is "
            "reopened from disk in %.1f s",
            group.name,
            self.node_id,
            group.failure,
            group.retry_s,
            exc_info=exc,
        )
        del self.groups[group.name]
        self.quarantined[group.name] = group
        self._lane(group).dirty.discard(group)
        try:
            self._hand_away(group)
        except Exception as hand_exc:  # the core may be what broke: its followers will elect
            log.warning("group %s on node %d: no hand-over: %r", group.name, self.node_id, hand_exc)
        # Appends this leader sent may still commit under the next leader: outcome unknown.
        self._fail_group_waiters(group, f"replica failed: {group.failure}")
        if not self._stopping:
            task = asyncio.get_running_loop().create_task(self._recover(group))
            self._recoveries[group.name] = task

    def _hand_away(self, group: RaftGroup) -> None:
        """If ``group`` was led here, send TimeoutNow to its most caught-up live follower.

        Safe whatever that follower holds: TimeoutNow only starts an election, which the
        vote rules decide; at worst another follower wins it after an election timeout."""
        core = group.core
        if core.role != Role.LEADER:
            return
        live = [
            (pr.match, peer)
            for peer, pr in core.progress.items()
            if peer != self.node_id
            and peer in core.membership.voters
            and self.transport.peer_alive(peer)
        ]
        if not live:
            return
        to = max(live)[1]
        log.info("group %s on node %d: handing leadership to node %d", group.name, self.node_id, to)
        timeout_now = Message(MsgType.TIMEOUT_NOW, self.node_id, to, core.term)
        self.transport.send(to, group.name, timeout_now, urgent=True)
        self.transport.flush()

    async def _recover(self, group: RaftGroup) -> None:
        """Close a quarantined group's files, then reopen it from disk with exponential
        backoff until it opens (recovery re-reads and re-checks what is really there)."""
        try:
            while group.in_round:  # its write or fsync may still run in the pool
                await asyncio.sleep(0.01)
            with contextlib.suppress(Exception):
                self._close_group(group, clean=False)
            while not self._stopping:
                await asyncio.sleep(group.retry_s)
                try:
                    try:
                        self._reopen(group)
                    except GroupDamagedError as damaged:
                        if not damaged.damages:
                            raise
                        # Reopening again would read the same bytes: mend them from the
                        # group's other members first.
                        await self._repair_for_reopen(group, damaged)
                        self._reopen(group)
                    return
                except Exception as exc:
                    group.retry_s = min(RETRY_MAX_S, group.retry_s * 2)
                    group.failure = _reason("reopening from disk", exc)
                    log.error(
                        "group %s on node %d: %s; next try in %.1f s",
                        group.name,
                        self.node_id,
                        group.failure,
                        group.retry_s,
                    )
        finally:
            self._recoveries.pop(group.name, None)

    async def _repair_for_reopen(self, group: RaftGroup, damaged: GroupDamagedError) -> None:
        """Repair a quarantined group's damaged sealed segments from the members of the
        configuration it last ran with (the leader it knew first), its files closed.
        Raises GroupRepairError when none could."""
        assert group.opened_with is not None
        core = group.core
        peers = sorted(core.membership.members - {self.node_id}, key=lambda n: (n != core.lead, n))
        log.error(
            "group %s on node %d: reopening found damage; repairing it from nodes %s: %s",
            group.name,
            self.node_id,
            peers,
            damaged.reason,
        )
        what = await self._repair_closed(group.name, group.directory, peers, group.opened_with[1])
        log.warning("node %d: %s; reopening it", self.node_id, what)

    def _reopen(self, group: RaftGroup) -> None:
        assert group.opened_with is not None and group.failure is not None
        membership, config, replay = group.opened_with
        core, log_, hs, new_directory = load_group(
            group.name,
            group.directory,
            membership,
            config,
            replay,
            node_id=self.node_id,
            core_cfg=self._core_cfg,
            store=group.store,
            snapshot=group.snapshots.latest() if group.snapshots is not None else None,
        )
        group.new_directory = group.new_directory or new_directory
        log_.on_durable = group.log.on_durable
        group.core, group.log = core, log_
        group.sync = config.flush_policy is FlushPolicy.EVERY_BATCH  # maybe altered since
        group.waiters.clear()
        group.quiesced = False
        self._ticking[group.name] = group
        group.probe_peers = ()
        group.idle_ticks = 0
        group.last_seen = (0, 0)
        group.leader_commit = 0
        log.info(
            "group %s on node %d: reopened from disk (it had failed: %s); it rejoins its group",
            group.name,
            self.node_id,
            group.failure,
        )
        group.failure = None
        group.recovered_at_s = time.monotonic()
        del self.quarantined[group.name]
        self._attach(group, hs)

    # --- the ready loop -----------------------------------------------------------------

    async def _ready_loop(self, lane: _Lane) -> None:
        """Rounds of every dirty group's Ready in ``lane``. An error in one group's part of a round
        quarantines that group (see :meth:`_quarantine`); an error anywhere else (the
        transport, the pool) ends the loop, and the host fails (:meth:`_loop_ended`)."""
        loop = asyncio.get_running_loop()
        synced_last_round = False
        while not self._stopping:
            waiting_since_s = time.perf_counter()
            await lane.wake.wait()
            if self._injected_fault is not None:
                raise self._injected_fault
            # Low load: the loop waited for this work, or the round before had nothing to
            # make durable (one request in flight: its commit round, then the next
            # request's append). Back-to-back fsync rounds are load: they use the pool.
            idle = (
                not synced_last_round
                or time.perf_counter() - waiting_since_s >= INLINE_FSYNC_AFTER_IDLE_S
            )
            lane.wake.clear()
            dirty, lane.dirty = lane.dirty, set()
            round_: list[tuple[RaftGroup, Ready]] = []
            for group in dirty:
                if group.failure is not None:
                    continue
                try:
                    if group.core.has_ready():
                        rd = group.core.ready()
                        group.in_round = True
                        round_.append((group, rd))
                        self._send(group, rd.send_now)
                except Exception as exc:
                    self._quarantine(group, "ready", exc)
            if not round_:
                continue
            self.rounds += 1
            self.transport.flush()  # the leaders' appends leave before we block on disk
            for group, rd in round_:
                if group.failure is None:
                    try:
                        if rd.snapshot is not None and group.snapshots is not None:
                            # The state first, durably: a crash after the cut below must
                            # not leave a log that starts after the state it extends.
                            group.snapshots.install(rd.snapshot, rd.snapshot_data)
                        write_to_storage(group.log, rd)
                    except Exception as exc:
                        self._quarantine(group, "write", exc)
            applied_early: set[str] = set()
            for group, rd in round_:
                if group.failure is None:
                    try:
                        if self._apply_durable(group, rd):
                            applied_early.add(group.name)
                    except Exception as exc:
                        self._quarantine(group, "apply", exc)
            need = [(group, rd) for group, rd in round_ if group.failure is None and rd.must_sync()]
            synced_last_round = bool(need)
            failed: list[tuple[RaftGroup, Exception]] = []
            persist_start_s = time.perf_counter()
            if len(need) == 1 and idle:
                # Low load (one group to make durable): fsync here. Handing it to a
                # thread and back costs two wake-ups, measured at ~0.4 ms per round on a
                # busy 2-core machine, more than the fsync. Under load the thread wins:
                # the loop prepares the next round meanwhile.
                failed = self._persist_all(need)
            elif need:
                # Under load or for several groups: in the pool, in parallel (the file
                # system shares journal commits between concurrent fsyncs), at most one
                # job per pool thread.
                jobs = lane.pool_size
                for part in await asyncio.gather(
                    *(
                        loop.run_in_executor(lane.pool, self._persist_all, need[k::jobs])
                        for k in range(min(jobs, len(need)))
                    )
                ):
                    failed += part
            if need:
                self.stats.persist.observe(time.perf_counter() - persist_start_s)
            for group, error in failed:
                # Persist before send: its acks and votes of this round are never sent.
                self._quarantine(group, "persist", error)
            for group, rd in round_:
                if group.failure is None:
                    try:
                        self._finish(group, rd, applied=group.name in applied_early)
                    except Exception as exc:
                        self._quarantine(group, "apply", exc)
                group.in_round = False
                if group.parked_config is not None:
                    self._take_config(group, group.parked_config)
            self.transport.flush()

    def _persist_all(
        self, work: list[tuple[RaftGroup, Ready]]
    ) -> list[tuple[RaftGroup, Exception]]:
        """Persist each group's Ready; returns the groups that failed, with their errors.

        The state records of all of them share one sync of their store (group commit),
        after their logs' fsyncs. A store that cannot be synced fails the host
        (StateStoreError is not one group's error: every group's state is in it)."""
        failed = []
        stores: dict[StateStore, list[RaftGroup]] = {}
        for group, rd in work:
            try:
                if self._persist(group, rd):
                    stores.setdefault(group.store, []).append(group)
            except Exception as exc:
                failed.append((group, exc))
        for store, groups in stores.items():
            new = [g for g in groups if g.new_directory and g.saved_hard.term > 0]
            store.sync(g.directory for g in new)
            self.fsyncs += 1
            for g in new:
                g.new_directory = False
        return failed

    def _persist(self, group: RaftGroup, rd: Ready) -> bool:
        """Make this Ready's entries durable and record its snapshot meta and term/vote in
        the group's state store (in the fsync pool, or on the loop when it is the round's
        only one). True when the store must be synced before the Ready's messages go out
        (:meth:`_persist_all` does, once for all groups)."""
        to_sync = False
        if rd.snapshot is not None:
            # The log already restarted at the snapshot point (write_to_storage); the
            # membership there must survive a restart before we acknowledge.
            save_snapshot_meta(group.store, group.directory, rd.snapshot)
            to_sync = True
        if rd.entries and group.sync:
            group.log.flush()
            self.fsyncs += 1
        hs = rd.hard_state
        saved = group.saved_hard
        if hs is not None and (hs.term, hs.vote, hs.rejoining) != (
            saved.term,
            saved.vote,
            saved.rejoining,
        ):
            # Term and vote must be durable before any reply that depends on them. The
            # commit index rides along but is not worth an fsync of its own: after a crash
            # it is re-learned from the leader. A hard state with a term is the replica's
            # promise record too (docs/raft.md, "Rejoining after disk loss").
            save_hard_state_in(group.store, group.directory, hs)
            group.saved_hard = hs
            to_sync = True
        return to_sync

    def _apply_durable(self, group: RaftGroup, rd: Ready) -> bool:
        """Apply this Ready's committed entries and answer their waiters now, before the
        round's fsync, when they are already durable here; True if it did.

        Why: under load every round has new entries to fsync, and a commit learned while
        one round's fsync ran was applied only after the next round's fsync, a whole disk
        flush after it was known. Committed entries need no more disk: a majority holds
        them durably, and on this node every round before this one was fsynced (rounds
        run one at a time), which ``durable_index`` checks. A follower whose commit reaches
        into this round's own entries, and any Ready that changes role or installs a
        snapshot, keep the order of :meth:`_finish`."""
        if (
            not rd.applied_to
            or rd.snapshot is not None
            or rd.soft_state is not None
            or rd.applied_to > group.log.durable_index
        ):
            return False
        if group.apply is not None:
            group.apply(rd.committed_entries, rd.applied_to)
        self._resolve(group, rd.applied_to)
        return True

    def _finish(self, group: RaftGroup, rd: Ready, *, applied: bool = False) -> None:
        # Persist before send (ready.py step 3): acks and votes in rd.messages promise that
        # this round's entries and term/vote survive a crash, so they must be on disk now.
        assert not (rd.entries and group.sync) or group.log.durable_index >= rd.last_index, (
            f"group {group.name}: sending acks for entries up to {rd.last_index} with only "
            f"{group.log.durable_index} durable"
        )
        hs, saved = rd.hard_state, group.saved_hard
        assert hs is None or (hs.term, hs.vote) == (saved.term, saved.vote), (
            f"group {group.name}: sending with term/vote {hs} not yet saved ({saved})"
        )
        # And per ack, whatever round wrote its entries: an append ack promises the sender
        # everything up to its index (fsynced with EVERY_BATCH, written with INTERVAL).
        held = group.log.durable_index if group.sync else group.log.last_index
        for m in rd.messages:
            assert m.type != MsgType.APP_RESP or m.reject or m.index <= held, (
                f"group {group.name}: acknowledging entries up to {m.index} to node {m.dst} "
                f"with only {held} {'durable' if group.sync else 'written'}"
            )
        self._send(group, rd.messages)
        if rd.soft_state is not None:
            self.soft_state_changes += 1
            if rd.soft_state.role == Role.LEADER:
                self.stats.elections_won += 1
            if group.on_soft_state is not None:
                group.on_soft_state(rd.soft_state)
        if rd.snapshot is not None:
            self._install_snapshot(group, rd.snapshot, rd.snapshot_data)
        if rd.snapshot is None and rd.applied_to and group.apply is not None and not applied:
            group.apply(rd.committed_entries, rd.applied_to)
        if rd.entries and group.waiters:
            self._resolve(group, rd.last_index, local_only=True)
        if rd.applied_to and not applied:
            self._resolve(group, rd.applied_to)
        for rs in rd.read_states:
            read = group.reads.pop(rs.context, None)
            if read is not None and not read.done():
                read.set_result(rs.index)
        if rd.soft_state is not None and group.reads:
            # The core drops read requests when leadership moves; their answers never come.
            self._fail_reads(group, f"the leader changed (now {rd.soft_state.leader or 'none'})")
        group.core.advance(rd)
        group.in_round = False
        if rd.soft_state is not None and rd.soft_state.role != Role.LEADER:
            self._fail_unowned(group)
        self._mark(group)

    def _install_snapshot(self, group: RaftGroup, snap: SnapshotMeta, data: bytes) -> None:
        self.stats.snapshots_installed += 1
        log.info(
            "group %s on node %d: installed snapshot at %d", group.name, self.node_id, snap.index
        )
        if group.on_snapshot is not None:
            group.on_snapshot(snap, data)

    def _write_commit_hint(self, group: RaftGroup) -> None:
        """Save the commit point with the configurations committed up to it (the core's
        :meth:`~RaftCore.config_history`), so a restart neither re-applies what was applied
        nor reads the whole log for CONFIG entries.

        A record in the group's state store (at most once a second per group), which the
        store writes out with its next sync (:meth:`_keep_stores`, in the pool): never
        waited for, since a stale or lost hint only costs the next restart the longer way.
        No file (or descriptor) per group: 1,000 of them once took a broker to its
        open-file limit."""
        if group.hinted_commit < 0:
            return
        history = group.core.config_history()
        if history is None or history.through <= group.hinted_commit:
            return
        save_commit_hint(group.store, group.directory, history)
        group.hinted_commit = history.through

    def _resolve(self, group: RaftGroup, upto: int, *, local_only: bool = False) -> None:
        if not group.waiters:
            return
        for index in sorted(i for i in group.waiters if i <= upto):
            term, fut, local = group.waiters[index]
            if local_only and not local:
                continue
            del group.waiters[index]
            if fut.done():
                continue
            try:
                ours = group.log.term_at(index) == term
            except Exception:
                ours = False  # compacted away: cannot prove it was ours
            if ours:
                fut.set_result(index)
            else:
                fut.set_exception(
                    ProposalDroppedError(
                        f"entry {index} of term {term} was replaced after a leader change"
                    )
                )

    def _fail_unowned(self, group: RaftGroup) -> None:
        """Proposals beyond the log end after losing leadership can never commit as ours."""
        last = group.core.log.last_index
        for index in [i for i in group.waiters if i > last]:
            _, fut, _ = group.waiters.pop(index)
            if not fut.done():
                fut.set_exception(NotLeaderError(group.core.lead))

    def _send(self, group: RaftGroup, msgs: list[Message]) -> None:
        for m in msgs:
            if m.dst == self.node_id:
                group.core.step(m)
                continue
            if m.type == MsgType.SNAP:
                # The core sends metadata only; the application's bytes ride along. The
                # transport owns delivery from here: a lost snapshot shows up as a
                # rejected append and is sent again.
                kept = group.snapshots.latest() if group.snapshots is not None else None
                if kept is not None:
                    meta, m.data = kept
                    assert m.snapshot is not None
                    if meta.index > m.snapshot.index:
                        # The log keeps entries below the snapshot (for followers a little
                        # behind): the state covers more than the follower lacks, and it
                        # then takes the entries after it as usual.
                        m.snapshot = meta
                    assert meta.index == m.snapshot.index, (
                        f"group {group.name}: the state's snapshot at {meta.index} is below "
                        f"the log start {m.snapshot.index + 1}"
                    )
                elif group.snapshot_attachment is not None:
                    m.data = group.snapshot_attachment()
                self.transport.send(m.dst, group.name, m, urgent=False)
                group.core.report_snapshot(m.dst, ok=True)
                continue
            if (
                self._learner_rate is not None
                and m.type == MsgType.APP
                and m.entries
                and m.dst in group.core.membership.learners
            ):
                wait_s = self._learner_rate.delay_s(len(m.entries), time.monotonic())
                if wait_s > 0:
                    loop = asyncio.get_running_loop()
                    loop.call_later(wait_s, self._send_late, group.name, m)
                    continue
            self.transport.send(m.dst, group.name, m, urgent=m.type in _URGENT)

    def _send_late(self, name: str, m: Message) -> None:
        """An append held back by the learner rate, unless the node stopped meanwhile."""
        if not self._stopping:
            self.transport.send(m.dst, name, m, urgent=False)
