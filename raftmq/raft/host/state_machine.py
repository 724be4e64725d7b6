"""A replicated state machine on the Raft host: a group whose committed entries are
commands, applied in index order to an application object (the controller's metadata),
with snapshots, proposals that resolve with the apply result, linearizable reads and
bounded watchers. The host's "second tenant", next to partition groups.

Commands travel as ``METADATA`` entries of the one entry format every group shares
(docs/raft.md, "Message offsets and Raft"): they carry no records, so the offsets the core
stamps stay 0 and are never shown here. NOOP and CONFIG entries advance the applied index
without reaching the machine.

Durability: the group's log fsyncs every round (EVERY_BATCH) and never loses entries to
retention; the only cut is :meth:`RaftHost.compact` ``through`` the latest snapshot, which
is written atomically with its CRC (``raftmq.log.atomic_file``) *before* the cut. A restart
restores that snapshot and re-applies only the log after it (the host redoes a cut a crash
interrupted: see :class:`~raftmq.raft.host.host.SnapshotStore`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.log.atomic_file import read_atomic, write_atomic
from raftmq.log.config import MIB, FlushPolicy, LogConfig
from raftmq.raft.errors import (
    GroupDamagedError,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalDroppedError,
    RaftError,
    ReadIndexError,
)
from raftmq.raft.host.host import DurableFn, RaftHost
from raftmq.raft.membership import Membership
from raftmq.raft.messages import SnapshotMeta
from raftmq.raft.ready import Role, SoftState

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "rsm-snapshot"
"""In the group's directory: the latest snapshot, metadata then the machine's bytes."""
SNAPSHOT_EVERY_ENTRIES = 10_000
"""Default: take a snapshot (and cut the log) after this many applied entries..."""
SNAPSHOT_EVERY_BYTES = 16 * MIB
"""...or this many bytes of applied entries, whichever comes first."""
CATCH_UP_ENTRIES = 1_000
"""Default: entries kept in the log below a snapshot (etcd keeps 5,000), so a follower a
little behind catches up by entries rather than by the whole snapshot."""
MAX_COMMAND_BYTES = 1 * MIB
"""Default bound of one command; larger ones are refused before they are proposed."""
MAX_SNAPSHOT_BYTES = 16 * MIB
"""A snapshot travels to a follower as one message: the TCP transport queues at most 32
MiB per peer and frames at most 64 MiB. A larger snapshot is not taken (logged): the log
is kept whole, so followers still catch up by entries."""
WATCH_MAX_PENDING = 4096
"""Default bound of events queued for one watcher before it is dropped."""
READ_ATTEMPT_S = 1.0
"""How long one read-index request may go unanswered before it is asked again."""
SEGMENT_BYTES = 4 * MIB
"""Segment size of a state machine's log (small logs: commands, cut at snapshots)."""


def state_machine_log_config(
    *, max_command_bytes: int = MAX_COMMAND_BYTES, segment_bytes: int = SEGMENT_BYTES
) -> LogConfig:
    """The settings a replicated state machine's log runs with; also what
    :meth:`RaftHost.repair_closed_group` opens it with when it cannot open."""
    return LogConfig(
        segment_bytes=segment_bytes,
        retention_ms=-1,  # only snapshots cut this log (RaftHost.compact through)
        retention_bytes=-1,
        max_message_bytes=max_command_bytes + entry.HEADER_SIZE,
        flush_policy=FlushPolicy.EVERY_BATCH,
        preallocate_bytes=4 * MIB,
    )


_SNAP_HEAD = struct.Struct(">4sqqqI")  # magic, index, term, next offset, membership length
_SNAP_MAGIC = b"RSM1"

T = TypeVar("T")


class StateMachine(Protocol):
    """What a replicated state machine runs: deterministic, single-threaded (the host's
    loop), never reading clocks or randomness while applying (the proposer stamps them
    into commands)."""

    def apply(self, index: int, command: bytes) -> bytes:
        """Apply one committed command; the result goes back to its proposer. Must never
        raise for a bad command (answer with a result saying so): an exception here is a
        bug, and quarantines the group on this node."""
        ...

    def snapshot(self) -> bytes:
        """The whole state, as bytes that :meth:`restore` accepts."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a snapshot's (b"" never comes: before the first
        snapshot the machine starts as constructed)."""
        ...


M = TypeVar("M", bound=StateMachine)


class CommandTooLargeError(ValueError):
    """A command over the group's bound; nothing was proposed."""


class WatcherDroppedError(RaftError):
    """The watcher fell more than its bound behind and was dropped: take a fresh copy
    (:meth:`ReplicatedStateMachine.local_read`) and watch again."""


@dataclasses.dataclass(frozen=True, slots=True)
class Applied:
    """One command applied here, with the result its proposer got."""

    index: int
    command: bytes
    result: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Restored:
    """The machine was replaced by a snapshot taken at ``index`` (this follower was too
    far behind): a watcher's copy must be rebuilt from the machine."""

    index: int


Event = Applied | Restored


class Watcher:
    """Every applied command and snapshot restore, in order, from the applied index at
    the time it was created (``start_index``). Bounded: when ``max_pending`` events wait
    unread, the watcher is dropped (further events are not queued) and :meth:`get`
    raises WatcherDroppedError once the queued ones are read."""

    def __init__(
        self, group: str, start_index: int, watchers: set[Watcher], max_pending: int
    ) -> None:
        self.start_index = start_index
        self._group = group
        self._watchers = watchers
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._max_pending = max_pending
        self.dropped = False

    def _offer(self, event: Event) -> None:
        if self.dropped:
            return
        if self._queue.qsize() >= self._max_pending:
            self.dropped = True
            self._watchers.discard(self)
            log.warning(
                "group %s: a watcher fell %d events behind and was dropped",
                self._group,
                self._max_pending,
            )
            return
        self._queue.put_nowait(event)

    async def get(self) -> Event:
        """The next event; raises WatcherDroppedError once a dropped watcher is drained."""
        if self.dropped and self._queue.empty():
            raise WatcherDroppedError(
                f"group {self._group}: the watcher fell {self._max_pending} events behind"
            )
        return await self._queue.get()

    def close(self) -> None:
        self._watchers.discard(self)


def encode_snapshot(meta: SnapshotMeta, data: bytes) -> bytes:
    mem = meta.membership.encode()
    return (
        _SNAP_HEAD.pack(_SNAP_MAGIC, meta.index, meta.term, meta.next_offset, len(mem)) + mem + data
    )


def decode_snapshot(payload: bytes) -> tuple[SnapshotMeta, bytes]:
    magic, index, term, next_offset, mlen = _SNAP_HEAD.unpack_from(payload)
    if magic != _SNAP_MAGIC:
        raise ValueError(f"snapshot magic {magic!r} unknown")
    mem_end = _SNAP_HEAD.size + mlen
    membership = Membership.decode(payload[_SNAP_HEAD.size : mem_end])
    return SnapshotMeta(index, term, next_offset, membership), payload[mem_end:]


class ReplicatedStateMachine(Generic[M]):
    """Runs ``machine`` as Raft group ``name`` on ``host``: opens (or restores) the group
    at once, in ``directory``. Everything runs on the host's event loop.

    Proposals resolve with the machine's result on the leader; reads are linearizable
    (:meth:`linearizable_read`) or local and possibly stale (:meth:`local_read`)."""

    def __init__(
        self,
        host: RaftHost,
        name: str,
        directory: str | Path,
        membership: Membership,
        machine: M,
        *,
        snapshot_every_entries: int = SNAPSHOT_EVERY_ENTRIES,
        snapshot_every_bytes: int = SNAPSHOT_EVERY_BYTES,
        catch_up_entries: int = CATCH_UP_ENTRIES,
        max_command_bytes: int = MAX_COMMAND_BYTES,
        max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
        on_soft_state: Callable[[SoftState], None] | None = None,
        on_durable: DurableFn | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        priority: bool = False,
    ) -> None:
        """``on_durable`` (tests only) observes the log's fsyncs: see :attr:`Log.on_durable`.
        ``priority``: the group's rounds run apart from the host's other groups
        (:meth:`RaftHost.open_group`).

        Opening the group may raise GroupDamagedError (:meth:`RaftHost.open_group`): mend
        it with :meth:`RaftHost.repair_closed_group`, the log settings
        :func:`state_machine_log_config` gives, then construct this again."""
        if snapshot_every_entries < 1 or snapshot_every_bytes < 1:
            raise ValueError("snapshot thresholds must be at least 1")
        if catch_up_entries < 0:
            raise ValueError("catch_up_entries must be at least 0")
        if not 1 <= max_command_bytes <= entry.MAX_PAYLOAD:
            raise ValueError(f"max_command_bytes must be from 1 to {entry.MAX_PAYLOAD}")
        self.name = name
        self.machine = machine
        self.directory = Path(directory)
        self.snapshot_every_entries = snapshot_every_entries
        self.snapshot_every_bytes = snapshot_every_bytes
        self.catch_up_entries = catch_up_entries
        self.max_command_bytes = max_command_bytes
        self.max_snapshot_bytes = max_snapshot_bytes
        self._host = host
        self._on_soft_state = on_soft_state
        self._applied = 0
        self._applied_changed = asyncio.Event()
        self._since_entries = 0
        self._since_bytes = 0
        self._snapshot_due = False
        self._too_large_logged = False
        # index -> (term proposed in, our future, the host's future)
        self._proposals: dict[int, tuple[int, asyncio.Future[bytes], asyncio.Future[int]]] = {}
        self._watchers: set[Watcher] = set()
        self._snapshot: tuple[SnapshotMeta, bytes] | None = None
        self.directory.mkdir(parents=True, exist_ok=True)
        self._tainted = False  # apply raised: rebuild before applying again
        kept = self._load_snapshot()
        # Before the first snapshot, the state to rebuild from after a failed apply.
        self._initial = machine.snapshot() if kept is None else b""
        if kept is not None:
            machine.restore(kept[1])
            self._snapshot = kept
            self._applied = kept[0].index
        self._group = host.open_group(
            name,
            self.directory,
            membership,
            log_config=state_machine_log_config(
                max_command_bytes=max_command_bytes, segment_bytes=segment_bytes
            ),
            apply=self._apply,
            on_soft_state=self._soft_state,
            replay=True,
            on_durable=on_durable,
            snapshots=self,
            priority=priority,
        )
        start = self._group.log_reader.start_index
        if start - 1 != self._applied:
            raise ValueError(
                f"group {name}: its log starts at {start} but its snapshot "
                f"{self.directory / SNAPSHOT_FILE} is at {self._applied} (or missing): the "
                "entries between are lost; delete the group's directory (keep the "
                "state store beside it) to resynchronise it from its peers"
            )

    # --- state ----------------------------------------------------------------------------

    @property
    def applied_index(self) -> int:
        """The index of the last entry applied to the machine here."""
        return self._applied

    @property
    def snapshot_index(self) -> int:
        """The index of the latest durable snapshot (0 before the first)."""
        return self._snapshot[0].index if self._snapshot is not None else 0

    @property
    def is_leader(self) -> bool:
        return self._group.is_leader

    @property
    def leader(self) -> int:
        """The leader this node knows of (0 when none)."""
        return self._group.leader

    # --- proposals ------------------------------------------------------------------------

    async def propose(self, command: bytes) -> bytes:
        """Replicate ``command`` and return what the machine's ``apply`` returned for it
        here, once it committed and was applied on this node (the leader).

        Raises CommandTooLargeError, NotLeaderError (with the leader hint),
        ProposalDroppedError (not applied: a leadership transfer, or another leader's
        entry took its place) or GroupFailedError before anything is appended, and
        OutcomeUnknownError when this node lost leadership (or stopped) before the entry
        applied here: it may still commit."""
        if len(command) > self.max_command_bytes:
            raise CommandTooLargeError(
                f"a command of {len(command)} bytes exceeds the bound of "
                f"{self.max_command_bytes} bytes of group {self.name}"
            )
        proposed = self._host.propose(self.name, entry.encode(command, type=EntryType.METADATA))
        ours: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        index = proposed.index
        self._proposals[index] = (self._group.term, ours, proposed.done)
        proposed.done.add_done_callback(lambda done: self._host_answered(index, done))
        try:
            return await ours
        finally:
            if self._proposals.get(index, (0, None))[1] is ours:
                del self._proposals[index]

    def _host_answered(self, index: int, done: asyncio.Future[int]) -> None:
        """The host's outcome: a success was already answered by :meth:`_apply` (the
        host resolves after applying); a failure is passed on. Taken here even when no
        one waits any more (a caller that timed out): it is then nobody's error, and
        asyncio would log it as one never retrieved."""
        exc = None if done.cancelled() else done.exception()
        waiting = self._proposals.get(index)
        if waiting is None or waiting[2] is not done or waiting[1].done() or done.cancelled():
            return  # answered, or a later proposal now holds this index
        if exc is not None:
            waiting[1].set_exception(exc)
        else:  # applied, yet not by us: only a snapshot install can have skipped it
            waiting[1].set_exception(
                OutcomeUnknownError(f"entry {index} was covered by a snapshot before applying")
            )

    def _soft_state(self, soft: SoftState) -> None:
        if soft.role != Role.LEADER and self._proposals:
            # After this round's applies (which answer what committed), anything still
            # waiting was appended by a leader that is no more: it may yet commit.
            asyncio.get_running_loop().call_soon(self._leadership_lost, soft.leader)
        if self._on_soft_state is not None:
            self._on_soft_state(soft)

    def _leadership_lost(self, leader: int) -> None:
        if self._group.is_leader:
            return  # leading again already
        for index, (_, ours, done) in list(self._proposals.items()):
            if ours.done():
                continue
            if done.done() and not done.cancelled() and done.exception() is not None:
                ours.set_exception(done.exception())  # type: ignore[arg-type]
            else:
                ours.set_exception(
                    OutcomeUnknownError(
                        f"group {self.name}: leadership moved (to {leader or 'unknown'}) "
                        f"before entry {index} applied here; it may still commit"
                    )
                )

    # --- applying -------------------------------------------------------------------------

    def _apply(self, buf: bytes, applied_to: int) -> None:
        """Committed entries from the host, in order. Entries at or below what the
        machine holds are skipped: after a quarantined group is reopened the core
        re-hands entries from its log start, which is at or below our applied index.

        An exception from the machine quarantines the group here (a bug: ``apply`` must
        answer a bad command, not raise); the machine may be half-changed, so when the
        reopened group hands entries again it is first rebuilt from the snapshot."""
        if self._tainted:
            self._rebuild()
        for h in entry.iter_headers(buf, verify=False):
            if h.index <= self._applied:
                continue
            assert h.index == self._applied + 1, (
                f"group {self.name}: applied {self._applied}, got {h.index}"
            )
            self._since_entries += 1
            self._since_bytes += h.size
            if h.type != EntryType.METADATA:
                self._applied = h.index
                continue  # NOOP, CONFIG: Raft's own
            command = bytes(entry.payload_of(buf, h))
            try:
                result = self.machine.apply(h.index, command)
            except BaseException:
                self._tainted = True
                raise
            self._applied = h.index
            waiting = self._proposals.get(h.index)
            if waiting is not None and not waiting[1].done():
                if waiting[0] == h.term:
                    waiting[1].set_result(result)
                else:
                    waiting[1].set_exception(
                        ProposalDroppedError(
                            f"entry {h.index} of term {waiting[0]} was replaced after a "
                            "leader change"
                        )
                    )
            if self._watchers:
                event = Applied(h.index, command, result)
                for watcher in list(self._watchers):
                    watcher._offer(event)
        assert self._applied >= applied_to, (self._applied, applied_to)
        self._wake_readers()
        if not self._snapshot_due and (
            self._since_entries >= self.snapshot_every_entries
            or self._since_bytes >= self.snapshot_every_bytes
        ):
            # Not now: the core counts these entries applied only once this round ends,
            # and the log may be cut only up to what it counts.
            self._snapshot_due = True
            asyncio.get_running_loop().call_soon(self._snapshot_when_due)

    def _rebuild(self) -> None:
        """Restore the machine from the latest snapshot (or as it was opened), where the
        reopened group's core starts applying again."""
        meta, data = self._snapshot if self._snapshot is not None else (None, self._initial)
        index = meta.index if meta is not None else 0
        assert index == self._group.log_reader.start_index - 1, "the log starts at the snapshot"
        self.machine.restore(data)
        self._applied = index
        self._tainted = False
        log.warning("group %s: machine rebuilt from the snapshot at %d", self.name, index)
        for watcher in list(self._watchers):
            watcher._offer(Restored(index))
        self._wake_readers()

    def _wake_readers(self) -> None:
        self._applied_changed.set()
        self._applied_changed = asyncio.Event()

    async def wait_applied(self, index: int) -> None:
        """Return once this node applied ``index`` (or a snapshot past it): for callers
        that hold an index (a read point, a version seen elsewhere). No timeout: wrap it."""
        while self._applied < index:
            await self._applied_changed.wait()

    # --- snapshots --------------------------------------------------------------------------

    def _snapshot_when_due(self) -> None:
        self._snapshot_due = False
        if self._group.failure is not None:
            return  # quarantined: the next apply after its reopen asks again
        try:
            self.take_snapshot()
        except Exception:
            log.exception("group %s: snapshot at %d failed", self.name, self._applied)

    def take_snapshot(self) -> int:
        """Snapshot the machine at the applied index now, durably, and cut the log below
        it. Returns the snapshot's index (the previous one if this one was too large)."""
        index = self._applied
        if index == self.snapshot_index or self._tainted:
            return self.snapshot_index  # nothing new, or a machine half-changed by a raise
        data = self.machine.snapshot()
        if len(data) > self.max_snapshot_bytes:
            if not self._too_large_logged:
                self._too_large_logged = True
                log.error(
                    "group %s: a snapshot of %d bytes exceeds %d: none is taken and the log "
                    "is kept whole (followers catch up by entries)",
                    self.name,
                    len(data),
                    self.max_snapshot_bytes,
                )
            self._since_entries = self._since_bytes = 0
            return self.snapshot_index
        meta = self._host.snapshot_point(self.name, index)
        self._save_snapshot(meta, data)
        self._since_entries = self._since_bytes = 0
        # Keep the last entries below it: a follower a little behind (the usual case just
        # after a commit) then catches up by entries, not by the whole snapshot.
        through = index - self.catch_up_entries
        if through >= self._group.log_reader.start_index:
            self._host.compact(self.name, through=through)
        log.info(
            "group %s: snapshot at %d (%d bytes); the log starts at %d",
            self.name,
            index,
            len(data),
            self._group.log_reader.start_index,
        )
        return index

    def _save_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        write_atomic(self.directory / SNAPSHOT_FILE, encode_snapshot(meta, data))
        self._snapshot = (meta, data)

    def _load_snapshot(self) -> tuple[SnapshotMeta, bytes] | None:
        path = self.directory / SNAPSHOT_FILE
        payload = read_atomic(path)
        if payload is None:
            if path.exists():
                # Not a range a peer's entries can mend: the state the log extends is lost.
                raise GroupDamagedError(
                    self.name,
                    f"snapshot {path} is torn or corrupt (CRC mismatch); delete the group's "
                    "directory (keep the state store beside it) to resynchronise it from "
                    "its peers",
                )
            return None
        return decode_snapshot(payload)

    # SnapshotStore, for the host

    def latest(self) -> tuple[SnapshotMeta, bytes] | None:
        return self._snapshot

    def install(self, meta: SnapshotMeta, data: bytes) -> None:
        """A leader's snapshot: this node was too far behind. Saved before the host cuts
        the log to it; the machine is replaced and watchers told."""
        self._save_snapshot(meta, data)
        if meta.index <= self._applied:
            # Only after a reopen from disk (the core's commit restarts below what the
            # machine holds): the machine is already past it, and the entries after
            # the snapshot that it holds are skipped when the core hands them again.
            return
        self._tainted = True  # until restored: a restore that raises leaves it half-done
        self.machine.restore(data)
        self._tainted = False
        self._applied = meta.index
        self._since_entries = self._since_bytes = 0
        for index, (_, ours, _) in list(self._proposals.items()):
            if index <= meta.index and not ours.done():
                ours.set_exception(
                    OutcomeUnknownError(f"entry {index} was covered by a snapshot before applying")
                )
        for watcher in list(self._watchers):
            watcher._offer(Restored(meta.index))
        self._wake_readers()

    # --- reads ------------------------------------------------------------------------------

    async def linearizable_read(self, fn: Callable[[M], T], *, timeout_s: float = 5.0) -> T:
        """Run ``fn`` on the machine once it reflects every command committed before this
        call (on any node). Asks the leader for its commit index, which it confirms with a
        quorum round (read index), then waits until this node applied that far.

        Raises NotLeaderError when no leader is known and ReadIndexError when none
        confirmed a read point, both after retrying until ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while True:
            try:
                read = self._host.read_index(self.name)
                remaining_s = deadline_s - loop.time()
                index = await asyncio.wait_for(read, max(0.0, min(READ_ATTEMPT_S, remaining_s)))
                break
            except (NotLeaderError, ReadIndexError, TimeoutError) as exc:
                if loop.time() >= deadline_s:
                    if isinstance(exc, TimeoutError):
                        raise ReadIndexError(
                            f"group {self.name}: no leader confirmed a read point within "
                            f"{timeout_s} s (no quorum?)"
                        ) from None
                    raise
                if not isinstance(exc, TimeoutError):
                    await asyncio.sleep(0.02)  # an election is under way
        try:
            await asyncio.wait_for(self.wait_applied(index), max(0.0, deadline_s - loop.time()))
        except TimeoutError:
            raise ReadIndexError(
                f"group {self.name}: applied {self._applied} of read point {index} within "
                f"{timeout_s} s"
            ) from None
        return fn(self.machine)

    def local_read(self, fn: Callable[[M], T]) -> tuple[int, T]:
        """``fn`` on the machine as applied here, maybe stale, with the applied index."""
        return self._applied, fn(self.machine)

    def watch(self, *, max_pending: int = WATCH_MAX_PENDING) -> Watcher:
        """Be told of every event after the applied index now (``start_index``). Take the
        matching copy with :meth:`local_read` in the same step (no await between)."""
        watcher = Watcher(self.name, self._applied, self._watchers, max_pending)
        self._watchers.add(watcher)
        return watcher
