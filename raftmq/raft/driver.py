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
import logging
import os
import secrets
import struct
import time
import zlib
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crc32c import crc32c

from raftmq.log.atomic_file import read_atomic, write_atomic
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import CorruptEntryError, LogError
from raftmq.log.log import Log
from raftmq.log.repair import (
    Damage,
    RepairRefusedError,
    closed_segments,
    damage_in,
    find_damage,
    patch,
    stored_crc,
    whole_segment,
)
from raftmq.raft import hardstate
from raftmq.raft.config import Config
from raftmq.raft.core import RaftCore, starts_rejoining
from raftmq.raft.errors import NotLeaderError, OutcomeUnknownError, ProposalDroppedError
from raftmq.raft.hardstate import HardState
from raftmq.raft.membership import ConfigHistory, Membership
from raftmq.raft.messages import Message, MsgType, SnapshotMeta
from raftmq.raft.ready import Ready, Role, SoftState, write_to_storage
from raftmq.raft.transport import (
    AuditReply,
    AuditRequest,
    Outgoing,
    RepairReply,
    RepairRequest,
    Transport,
)

log = logging.getLogger(__name__)

HARD_STATE_FILE = "raft-hardstate"
COMMIT_HINT_FILE = "raft-commit"
SNAPSHOT_META_FILE = "raft-snapshot"
"""Metadata of the log's start point (index, term, next offset, membership), saved
atomically whenever the log loses a prefix, so a restart knows the membership there."""
PROMISED_SUFFIX = ".raft-promised"
"""Beside (not inside) a group's directory, ``<dir>.raft-promised`` records that this
replica once saved a term: if the directory is later lost or replaced, the replica knows
it may have voted and acknowledged, and rejoins (docs/raft.md, "Rejoining after disk
loss") instead of passing for a new member."""
COMMIT_HINT_SECONDS = 1.0
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
INLINE_FSYNC_AFTER_IDLE = 0.0005
"""Seconds the ready loop must have waited for work before it fsyncs a lone group itself."""
REPAIR_CHUNK_BYTES = 1 << 20
"""Entries per RepairReply, at most (one entry more if a single one is larger)."""
REPAIR_REPLY_TIMEOUT_S = 10.0
SCRUB_BYTES_PER_S = 1 << 20
"""Default pace of the background scrubber that re-reads sealed segments and checks
their CRCs (bit rot is found before a client or follower needs the range); 0 is off."""
SCRUB_PASS_PAUSE_S = 10.0
QUIESCE_AFTER_TICKS = 3
"""Idle ticks a leader waits (after followers have the commit) before quiescing."""

ApplyFn = Callable[[bytes, int], None]
SnapshotFn = Callable[[SnapshotMeta, bytes], None]
SnapshotDataFn = Callable[[], bytes]
_SNAP_META = struct.Struct(">qqq")
_HINT_HEAD = struct.Struct(">II")  # payload length, CRC32C of the payload: a torn write fails


def _save_snapshot_meta(path: Path, snap: SnapshotMeta) -> None:
    mem = snap.membership.encode()
    write_atomic(path, _SNAP_META.pack(snap.index, snap.term, snap.next_offset) + mem)


def _load_snapshot_meta(path: Path) -> SnapshotMeta | None:
    raw = read_atomic(path)
    if raw is None or len(raw) < _SNAP_META.size:
        return None
    index, term, next_offset = _SNAP_META.unpack_from(raw)
    return SnapshotMeta(index, term, next_offset, Membership.decode(raw[_SNAP_META.size :]))


def _encode_commit_hint(history: ConfigHistory) -> bytes:
    payload = history.encode()
    return _HINT_HEAD.pack(len(payload), crc32c(payload)) + payload


def _read_commit_hint(path: Path) -> ConfigHistory | None:
    """The saved hint, or None when it is missing, torn or malformed (all mean: no hint)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < _HINT_HEAD.size:
        return None
    size, crc = _HINT_HEAD.unpack_from(raw)
    payload = raw[_HINT_HEAD.size : _HINT_HEAD.size + size]
    if len(payload) != size or crc32c(payload) != crc:
        return None
    try:
        return ConfigHistory.decode(payload)
    except ValueError:
        return None


def _promised_path(directory: Path) -> Path:
    return directory.parent / (directory.name + PROMISED_SUFFIX)


def _record_promised(directory: Path) -> None:
    """Durably create the PROMISED_SUFFIX record, once per group and replica. Written
    after the first hard state with a term, not before: a crash in between leaves a
    replica whose hard state says what it promised, while the other order could leave
    a brand-new replica that believes it lost its disk and never votes."""
    write_atomic(_promised_path(directory), b"")


SoftStateFn = Callable[[SoftState], None]


class RaftGroup:
    """One group on this node: its core, its log, and what the driver tracks for it."""

    def __init__(
        self,
        name: str,
        core: RaftCore,
        log_: Log,
        directory: Path,
        *,
        sync: bool,
        apply: ApplyFn | None,
        on_soft_state: SoftStateFn | None,
        on_snapshot: SnapshotFn | None = None,
        snapshot_data: SnapshotDataFn | None = None,
    ) -> None:
        self.name = name
        self.on_snapshot = on_snapshot
        self.snapshot_data = snapshot_data
        self.core = core
        self.log = log_
        self.directory = directory
        self.sync = sync
        self.apply = apply
        self.on_soft_state = on_soft_state
        self.saved_hard = HardState()
        # index -> (term, future, resolve once durable locally instead of once committed)
        self.waiters: dict[int, tuple[int, asyncio.Future[int], bool]] = {}
        self.hinted_commit = 0
        self.hint_due = 0.0
        self.hint_fd: int | None = None
        self.quiesced = False
        self.idle_ticks = 0
        self.last_seen = (0, 0)  # (last index, commit) at the previous tick
        self.in_round = False
        self.promised = False  # the PROMISED_SUFFIX record exists

    @property
    def is_leader(self) -> bool:
        return self.core.role == Role.LEADER

    @property
    def leader(self) -> int:
        return self.core.lead


class RaftHost:
    """The driver of every group on one node."""

    def __init__(
        self,
        node_id: int,
        transport: Transport,
        *,
        tick_seconds: float = 0.1,
        election_tick: int = 10,
        heartbeat_tick: int = 1,
        fsync_threads: int = 4,
        max_append_bytes: int = 1 << 20,
        seed: int = 0,
        scrub_bytes_per_s: int = SCRUB_BYTES_PER_S,
    ) -> None:
        self.node_id = node_id
        self.scrub_bytes_per_s = scrub_bytes_per_s
        self.scrubbed_bytes = 0
        self.audited_ranges = 0
        self.transport = transport
        self.tick_seconds = tick_seconds
        self._core_cfg = Config(
            id=node_id,
            election_tick=election_tick,
            heartbeat_tick=heartbeat_tick,
            max_append_bytes=max_append_bytes,
            seed=seed,
        )
        self.groups: dict[str, RaftGroup] = {}
        self._dirty: set[RaftGroup] = set()
        self._wake = asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=fsync_threads, thread_name_prefix="fsync")
        self._pool_size = fsync_threads
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.rounds = 0
        self.fsyncs = 0
        self.failed: BaseException | None = None
        self._repairs: dict[str, asyncio.Task[None]] = {}
        self._repair_replies: dict[tuple[str, int, int], asyncio.Future[RepairReply]] = {}
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
        snapshot_data: SnapshotDataFn | None = None,
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
        """
        if name in self.groups:
            raise ValueError(f"group {name!r} is already open on node {self.node_id}")
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        config = log_config or LogConfig()
        sync = config.flush_policy is FlushPolicy.EVERY_BATCH
        # An INTERVAL group acknowledges once the write is done, so its writes go straight
        # to the kernel: the page cache survives a crash of this process (as Kafka counts
        # on), bytes kept back by write-behind would not. EVERY_BATCH groups acknowledge
        # after the round's flush, which writes them out first anyway.
        log_ = Log.open(
            path,
            dataclasses.replace(
                config,
                flush_policy=FlushPolicy.INTERVAL,
                write_behind_bytes=config.write_behind_bytes if sync else 0,
            ),
        )
        if not log_.recovery.clean:
            log.warning("group %s on node %d: log recovery %s", name, self.node_id, log_.recovery)
        saved = _load_snapshot_meta(path / SNAPSHOT_META_FILE)
        if saved is not None and saved.index == log_.start_index - 1:
            membership = saved.membership  # CONFIG entries below the start are gone
        hs = hardstate.load(path / HARD_STATE_FILE)
        commit = hs.commit
        hint = None if replay else _read_commit_hint(path / COMMIT_HINT_FILE)
        if hint is not None:
            commit = max(commit, hint.through)
        promised = _promised_path(path).exists()
        rejoining = starts_rejoining(hs, log_.last_index, commit, promised=promised)
        if rejoining and not hs.rejoining:
            log.warning(
                "group %s on node %d: this replica lost state it had acknowledged (%s); it "
                "rejoins: no votes until it holds the leader's log again",
                name,
                self.node_id,
                "no hard state"
                if hs.term == 0
                else f"log ends at {log_.last_index}, below its commit {commit}",
            )
        # Never trust a commit index beyond the durable log (a torn tail may have been cut):
        # entries at or below a once-known commit that are still present are the committed
        # ones, because a log only ever loses a suffix.
        commit = max(min(commit, log_.last_index), log_.start_index - 1)
        hs = HardState(hs.term, hs.vote, commit, hs.rejoining)
        history = None
        if hint is not None:
            try:
                history = hint.for_log(log_.start_index - 1, log_.last_index, membership)
            except ValueError as exc:
                log.warning(
                    "group %s on node %d: %s; reading the whole log for CONFIG entries",
                    name,
                    self.node_id,
                    exc,
                )
        applied = None if replay else commit
        # Each group draws its own election timeouts: with one seed per node, every group
        # of a node campaigned on the same tick, so thousands of groups started together
        # split their votes in lockstep forever and all leaders landed on one node.
        cfg = dataclasses.replace(
            self._core_cfg,
            seed=self._core_cfg.seed * 1_000_003 + zlib.crc32(name.encode()),
            apply_entries=replay,
        )
        core = RaftCore(
            cfg,
            log_,
            hard_state=hs,
            membership=membership,
            history=history,
            applied=applied,
            rejoining=rejoining,
            incarnation=secrets.randbits(62) + 1,  # this life of the replica, never reused
        )
        group = RaftGroup(
            name,
            core,
            log_,
            path,
            sync=sync,
            apply=apply,
            on_soft_state=on_soft_state,
            on_snapshot=on_snapshot,
            snapshot_data=snapshot_data,
        )
        group.saved_hard = hs
        if hs.term > 0 and not promised:
            _record_promised(path)  # a replica from before the record existed
            promised = True
        group.promised = promised
        group.hinted_commit = commit if not replay else -1
        self.groups[name] = group
        self._mark(group)
        return group

    def _mark(self, group: RaftGroup) -> None:
        self._dirty.add(group)
        self._wake.set()

    def _unquiesce(self, group: RaftGroup) -> None:
        if group.quiesced:
            group.quiesced = False
            group.idle_ticks = 0

    # --- public requests ----------------------------------------------------------------

    def propose(
        self, name: str, entry_bytes: bytes, *, durable_locally: bool = False
    ) -> asyncio.Future[int]:
        """Propose an encoded entry; the future gives its index once committed and applied
        here (or, with ``durable_locally``, once this leader's own write of it is durable),
        or fails with NotLeaderError / ProposalDroppedError."""
        group = self._group_for_proposal(name)
        index = group.core.propose(entry_bytes)  # raises NotLeaderError with the leader hint
        return self._wait_for(group, index, durable_locally=durable_locally)

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
        group = self.groups[name]
        self._unquiesce(group)
        return group

    def _wait_for(
        self, group: RaftGroup, index: int, *, durable_locally: bool
    ) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        group.waiters[index] = (group.core.term, fut, durable_locally)
        self._mark(group)
        return fut

    def compact(self, name: str) -> int:
        """Apply the log's retention, never past what this node applied, and record the
        new start point. Returns how many segments were deleted.

        A follower that later needs entries below the start gets a snapshot (for a
        partition: just the start point, since its state is the log itself)."""
        group = self.groups[name]
        deleted = group.log.apply_retention(max_index=group.core.log.applied + 1)
        if deleted:
            _save_snapshot_meta(group.directory / SNAPSHOT_META_FILE, group.core.snapshot_meta())
        return deleted

    def campaign(self, name: str) -> None:
        group = self.groups[name]
        self._unquiesce(group)
        group.core.campaign()
        self._mark(group)

    def transfer_leadership(self, name: str, to: int) -> None:
        group = self.groups[name]
        self._unquiesce(group)
        group.core.transfer_leadership(to)
        self._mark(group)

    # --- transport handler --------------------------------------------------------------

    def on_messages(self, peer: int, batch: Sequence[tuple[str, Outgoing]]) -> None:
        for name, m in batch:
            group = self.groups.get(name)
            if group is None:
                continue  # a group this node does not host (yet): Raft treats it as loss
            if isinstance(m, tuple):
                self._on_quiesce(group, m)
                continue
            if isinstance(m, (RepairRequest, RepairReply, AuditRequest, AuditReply)):
                self._on_repair_message(group, m)
                continue
            if group.quiesced and m.type in _LATE_RESPONSES:
                # Answers to the heartbeat before the quiesce notice: they wake the group
                # only if they make work (a follower turned out to be behind), or the two
                # sides would wake each other forever.
                group.core.step(m)
                if group.core.has_ready():
                    self._unquiesce(group)
                    self._mark(group)
                self._take_damage(group)
                continue
            self._unquiesce(group)
            group.core.step(m)
            self._mark(group)
            self._take_damage(group)

    # --- self-repair of corrupt entries (raftmq/log/repair.py) --------------------------

    def request_repair(self, name: str, damages: list[Damage] | None = None) -> None:
        """A read of this group's log found a corrupt entry: restore the damaged range of
        every closed segment (or just ``damages``) from a replica, in the background, one
        repair of a group at a time."""
        group = self.groups.get(name)
        running = self._repairs.get(name)
        if group is None or self._stopping or (running is not None and not running.done()):
            return
        task = asyncio.get_running_loop().create_task(
            self._guarded(self._repair(group, damages), f"repair of group {name}")
        )
        self._repairs[name] = task

    def repairing(self, name: str) -> bool:
        """Whether a repair of this group's log is under way (for replica status)."""
        task = self._repairs.get(name)
        return task is not None and not task.done()

    def _take_damage(self, group: RaftGroup) -> None:
        if group.core.damage is not None:
            log.error(
                "group %s on node %d: %s (while reading for a follower)",
                group.name,
                self.node_id,
                group.core.damage,
            )
            group.core.damage = None
            self.request_repair(group.name)

    async def _guarded(self, work: Coroutine[object, object, None], what: str) -> None:
        """Background repair work fails alone and loudly: never the node with it."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %d: %s failed", self.node_id, what)

    async def _repair(self, group: RaftGroup, damages: list[Damage] | None) -> None:
        loop = asyncio.get_running_loop()
        if damages is None:
            damages = await loop.run_in_executor(self._pool, find_damage, group.log)
            if not damages:
                log.warning(
                    "group %s on node %d: no sealed segment is damaged; a corrupt entry in "
                    "the active segment is cut when the log next opens, and the replica "
                    "then rejoins from the leader",
                    group.name,
                    self.node_id,
                )
        for damage in damages:
            sources = sorted(
                group.core.membership.members - {self.node_id},
                key=lambda n: (n != group.core.lead, n),
            )
            for peer in sources:
                try:
                    data = await self._fetch_range(
                        group, peer, damage.first_index, damage.end_index
                    )
                    done = await loop.run_in_executor(self._pool, patch, group.log, damage, data)
                except RepairRefusedError as exc:
                    log.error(
                        "group %s on node %d: repair refused: %s", group.name, self.node_id, exc
                    )
                    break
                except (TimeoutError, LogError) as exc:
                    log.warning(
                        "group %s on node %d: node %d cannot supply entries %d..%d: %s",
                        group.name,
                        self.node_id,
                        peer,
                        damage.first_index,
                        damage.end_index - 1,
                        exc,
                    )
                    continue
                log.warning(
                    "group %s on node %d: repaired entries %d..%d of segment %s (%s): %d "
                    "bytes replaced at byte %d, from node %d",
                    group.name,
                    self.node_id,
                    damage.first_index,
                    damage.end_index - 1,
                    damage.segment,
                    damage.reason,
                    done.replaced_bytes,
                    done.at,
                    peer,
                )
                break
            else:
                log.error(
                    "group %s on node %d: no replica could supply entries %d..%d to repair "
                    "segment %s; it stays unreadable from byte %d",
                    group.name,
                    self.node_id,
                    damage.first_index,
                    damage.end_index - 1,
                    damage.segment,
                    damage.position,
                )

    async def _scrub_loop(self) -> None:
        """Re-check every sealed segment's CRCs, one segment at a time, pausing after each
        for as long as reading it may take at ``scrub_bytes_per_s``; start a repair when
        one is damaged. Reads use their own file descriptors in a worker thread, so the
        scrub takes no lock of the log and no time of the event loop."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            for group in list(self.groups.values()):
                for seg, after in closed_segments(group.log):
                    if self._stopping or group.name not in self.groups:
                        break
                    try:
                        damage = await loop.run_in_executor(None, damage_in, seg, after)
                    except OSError:
                        continue  # deleted by retention meanwhile
                    self.scrubbed_bytes += seg.size
                    if damage is None and group.is_leader:
                        await self._audit(group, seg.first_index, after.first_index)
                    if damage is not None:
                        log.error(
                            "group %s on node %d: the scrubber found segment %s damaged "
                            "from byte %d (%s)",
                            group.name,
                            self.node_id,
                            damage.segment,
                            damage.position,
                            damage.reason,
                        )
                        self.request_repair(group.name)
                    await asyncio.sleep(seg.size / self.scrub_bytes_per_s)
            await asyncio.sleep(SCRUB_PASS_PAUSE_S)

    async def _fetch_range(self, group: RaftGroup, peer: int, lo: int, hi: int) -> bytes:
        """Entries [lo, hi) as ``peer`` stores them, in bounded replies."""
        parts: list[bytes] = []
        while lo < hi:
            key = (group.name, peer, lo)
            fut = asyncio.get_running_loop().create_future()
            self._repair_replies[key] = fut
            try:
                self.transport.send(
                    peer, group.name, RepairRequest(self.node_id, peer, lo, hi), urgent=False
                )
                self.transport.flush()
                reply = await asyncio.wait_for(fut, REPAIR_REPLY_TIMEOUT_S)
            finally:
                self._repair_replies.pop(key, None)
            if reply.error:
                raise LogError(reply.error)
            if not reply.entries or not lo < reply.hi <= hi:
                raise LogError(
                    f"node {peer} answered entries {lo}..{reply.hi - 1}, "
                    f"not a part of {lo}..{hi - 1}"
                )
            parts.append(reply.entries)
            lo = reply.hi
        return b"".join(parts)

    async def _audit(self, group: RaftGroup, lo: int, hi: int) -> None:
        """Replica audit of one sealed range, as leader: ask every follower that holds it
        to compare its copy's CRC32C with ours (entries are byte-identical on every
        replica, so any difference is damage, or a bug)."""
        core = group.core
        if hi - 1 > core.log.committed:
            return
        loop = asyncio.get_running_loop()
        try:
            crc = await loop.run_in_executor(None, stored_crc, group.log, lo, hi)
        except LogError:
            return  # our own copy is unreadable: the scrub or a read starts its repair
        for peer, pr in core.progress.items():
            if peer != self.node_id and pr.match >= hi - 1:
                self.transport.send(
                    peer, group.name, AuditRequest(self.node_id, peer, lo, hi, crc), urgent=False
                )
        self.audited_ranges += 1

    async def _answer_audit(self, group: RaftGroup, m: AuditRequest) -> None:
        log_ = group.log
        if m.lo < log_.start_index or m.hi - 1 > group.core.log.committed:
            return  # compacted here, or not known committed yet: nothing to compare
        loop = asyncio.get_running_loop()
        try:
            crc = await loop.run_in_executor(None, stored_crc, log_, m.lo, m.hi)
        except LogError:
            crc = -1  # unreadable here: a damaged copy
        differs = crc != m.crc
        self.transport.send(
            m.src,
            group.name,
            AuditReply(self.node_id, m.src, m.lo, m.hi, crc, differs),
            urgent=False,
        )
        if not differs:
            return
        damages = await loop.run_in_executor(self._pool, find_damage, group.log)
        if damages:
            self.request_repair(group.name, damages)
            return
        whole = whole_segment(log_, m.lo, m.hi)
        log.error(
            "group %s on node %d: replica audit: entries %d..%d differ from node %d's copy "
            "although every CRC checks out; %s",
            group.name,
            self.node_id,
            m.lo,
            m.hi - 1,
            m.src,
            "replacing the segment's bytes" if whole else "no segment here has those bounds",
        )
        if whole is not None:
            self.request_repair(group.name, [whole])

    def _on_repair_message(
        self, group: RaftGroup, m: RepairRequest | RepairReply | AuditRequest | AuditReply
    ) -> None:
        if isinstance(m, AuditRequest):
            asyncio.get_running_loop().create_task(
                self._guarded(self._answer_audit(group, m), f"audit of group {group.name}")
            )
            return
        if isinstance(m, AuditReply):
            if m.differs:
                log.warning(
                    "group %s on node %d: replica audit: node %d's copy of entries %d..%d "
                    "differs from ours; it repairs it",
                    group.name,
                    self.node_id,
                    m.src,
                    m.lo,
                    m.hi - 1,
                )
            return
        if isinstance(m, RepairReply):
            fut = self._repair_replies.get((group.name, m.src, m.lo))
            if fut is not None and not fut.done():
                fut.set_result(m)
            return
        try:
            # Reads check the CRC of whatever they return: a damaged copy here is refused,
            # never passed on.
            got = group.log.read_by_index(m.lo, REPAIR_CHUNK_BYTES, m.hi)
            reply = RepairReply(self.node_id, m.src, m.lo, got.next_index, got.data)
        except LogError as exc:
            reply = RepairReply(self.node_id, m.src, m.lo, m.lo, error=str(exc))
            if isinstance(exc, CorruptEntryError):
                self.request_repair(group.name)
        self.transport.send(m.src, group.name, reply, urgent=False)
        self.transport.flush()

    def _on_quiesce(self, group: RaftGroup, notice: tuple[int, int, int, int, int]) -> None:
        src, _, term, commit, last = notice
        core = group.core
        if (
            core.term == term
            and core.lead == src
            and core.log.last_index == last
            and core.log.committed == commit
        ):
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

    async def start(self) -> None:
        await self.transport.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._tick_loop()), loop.create_task(self._ready_loop())]
        if self.scrub_bytes_per_s > 0:
            self._tasks.append(loop.create_task(self._guarded(self._scrub_loop(), "scrubber")))

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in self._repairs.values():
            task.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.transport.close()
        self._fail_waiters("the node is shutting down")
        for group in self.groups.values():
            self._write_commit_hint(group)
            if group.hint_fd is not None:
                os.close(group.hint_fd)
                group.hint_fd = None
            group.log.close()
        self._pool.shutdown(wait=True)

    async def _tick_loop(self) -> None:
        next_at = time.monotonic()
        while not self._stopping:
            next_at += self.tick_seconds
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            for group in self.groups.values():
                if group.quiesced or self._maybe_quiesce(group):
                    continue
                group.core.tick()
                if group.core.has_ready():
                    self._mark(group)
                if not group.sync:
                    group.log.flush_if_due()  # INTERVAL logs: cheap check, fsync when due
            now = time.monotonic()
            for group in self.groups.values():
                if 0 <= group.hinted_commit < group.core.log.committed and now >= group.hint_due:
                    group.hint_due = now + COMMIT_HINT_SECONDS
                    self._write_commit_hint(group)

    def _maybe_quiesce(self, group: RaftGroup) -> bool:
        """Quiesce an idle, fully replicated leader's group; True when it did.

        Runs before the tick and only when nothing of the group is unsent or in a round, so
        the notice is the last thing on the wire: a heartbeat sent after it would wake the
        follower again and leave it waiting for heartbeats that never come.
        """
        core = group.core
        if core.role != Role.LEADER or group.waiters or group.in_round or core.has_ready():
            group.idle_ticks = 0
            return False
        seen = (core.log.last_index, core.log.committed)
        if seen != group.last_seen or seen[0] != seen[1]:
            group.last_seen = seen
            group.idle_ticks = 0
            return False
        if any(pr.match != seen[0] for pr in core.progress.values()):
            group.idle_ticks = 0
            return False
        group.idle_ticks += 1
        if group.idle_ticks <= QUIESCE_AFTER_TICKS:
            return False
        group.quiesced = True
        for peer in core.progress:
            if peer != self.node_id:
                notice = (self.node_id, peer, core.term, seen[1], seen[0])
                self.transport.send(peer, group.name, notice, urgent=True)
        return True

    def _fail(self, exc: BaseException) -> None:
        """A node that cannot read or persist its log must not acknowledge anything more:
        stop it loudly and fail every waiting proposal."""
        log.error("node %d: Raft driver stopped: %r", self.node_id, exc)
        self.failed = exc
        self._stopping = True
        self._fail_waiters(f"node stopped: {exc!r}")

    def _fail_waiters(self, why: str) -> None:
        """Every pending proposal's outcome is unknown once this node stops: another leader
        may still commit it."""
        for group in self.groups.values():
            for _, fut, _ in group.waiters.values():
                if not fut.done():
                    fut.set_exception(OutcomeUnknownError(why))
            group.waiters.clear()

    async def _ready_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            waited = time.perf_counter()
            await self._wake.wait()
            idle = time.perf_counter() - waited >= INLINE_FSYNC_AFTER_IDLE
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            round_: list[tuple[RaftGroup, Ready]] = []
            try:
                for group in dirty:
                    if group.core.has_ready():
                        rd = group.core.ready()
                        group.in_round = True
                        self._send(group, rd.send_now)
                        round_.append((group, rd))
            except Exception as exc:
                self._fail(exc)
                raise
            if not round_:
                continue
            self.rounds += 1
            try:
                self.transport.flush()  # the leaders' appends leave before we block on disk
                for group, rd in round_:
                    write_to_storage(group.log, rd)
                need = [(group, rd) for group, rd in round_ if rd.must_sync()]
                if len(need) == 1 and idle:
                    # Low load (the loop was idle, one group to make durable): fsync here.
                    # Handing it to a thread and back costs two wake-ups, measured at ~0.4
                    # ms per round on a busy 2-core machine, more than the fsync. Under load
                    # the thread wins: the loop prepares the next round meanwhile.
                    self._persist(*need[0])
                elif need:
                    # Under load or for several groups: in the pool, in parallel (the file
                    # system shares journal commits between concurrent fsyncs), at most one
                    # job per pool thread.
                    jobs = self._pool_size
                    await asyncio.gather(
                        *(
                            loop.run_in_executor(self._pool, self._persist_all, need[k::jobs])
                            for k in range(min(jobs, len(need)))
                        )
                    )
            except Exception as exc:
                self._fail(exc)
                raise
            for group, rd in round_:
                self._finish(group, rd)
            self.transport.flush()

    def _persist_all(self, work: list[tuple[RaftGroup, Ready]]) -> None:
        for group, rd in work:
            self._persist(group, rd)

    def _persist(self, group: RaftGroup, rd: Ready) -> None:
        """Make this Ready's entries and term/vote durable (in the fsync pool, or on the
        loop when it is the round's only one)."""
        if rd.snapshot is not None:
            # The log already restarted at the snapshot point (write_to_storage); the
            # membership there must survive a restart before we acknowledge.
            _save_snapshot_meta(group.directory / SNAPSHOT_META_FILE, rd.snapshot)
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
            # it is re-learned from the leader.
            hardstate.save(group.directory / HARD_STATE_FILE, hs)
            group.saved_hard = hs
            self.fsyncs += 1
            if hs.term > 0 and not group.promised:
                _record_promised(group.directory)
                group.promised = True

    def _finish(self, group: RaftGroup, rd: Ready) -> None:
        self._send(group, rd.messages)
        if rd.soft_state is not None and group.on_soft_state is not None:
            group.on_soft_state(rd.soft_state)
        if rd.snapshot is not None:
            self._install_snapshot(group, rd.snapshot, rd.snapshot_data)
        if rd.snapshot is None and rd.applied_to and group.apply is not None:
            group.apply(rd.committed_entries, rd.applied_to)
        if rd.entries and group.waiters:
            self._resolve(group, rd.last_index, local_only=True)
        if rd.applied_to:
            self._resolve(group, rd.applied_to)
        group.core.advance(rd)
        group.in_round = False
        if rd.soft_state is not None and rd.soft_state.role != Role.LEADER:
            self._fail_unowned(group)
        self._mark(group)

    def _install_snapshot(self, group: RaftGroup, snap: SnapshotMeta, data: bytes) -> None:
        log.info(
            "group %s on node %d: installed snapshot at %d", group.name, self.node_id, snap.index
        )
        if group.on_snapshot is not None:
            group.on_snapshot(snap, data)

    def _write_commit_hint(self, group: RaftGroup) -> None:
        """Save the commit point with the configurations committed up to it (the core's
        :meth:`~RaftCore.config_history`), so a restart neither re-applies what was applied
        nor reads the whole log for CONFIG entries.

        Overwritten in place, without fsync: rewriting the file (truncate + write) makes
        ext4 flush it, which stalled the event loop for tens of ms. A torn write fails its
        CRC and only costs the next restart the longer way."""
        if group.hinted_commit < 0:
            return
        history = group.core.config_history()
        if history is None or history.through <= group.hinted_commit:
            return
        if group.hint_fd is None:
            group.hint_fd = os.open(
                group.directory / COMMIT_HINT_FILE, os.O_RDWR | os.O_CREAT, 0o644
            )
        os.pwrite(group.hint_fd, _encode_commit_hint(history), 0)
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
                if group.snapshot_data is not None:
                    m.data = group.snapshot_data()
                self.transport.send(m.dst, group.name, m, urgent=False)
                group.core.report_snapshot(m.dst, ok=True)
                continue
            self.transport.send(m.dst, group.name, m, urgent=m.type in _URGENT)
