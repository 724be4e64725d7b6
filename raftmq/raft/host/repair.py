"""Self-repair of corrupt entries, the host's side (the log's side is raftmq/log/repair.py):
restore a damaged range from a replica, scrub sealed segments in the background, and
audit a committed range against the followers' copies (docs/driver.md, "Self-repair").

A mixin of :class:`~raftmq.raft.host.host.RaftHost`, split out so that the host's
module reads as the ready loop and its failure isolation; the state it shares with the
host is declared below.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from raftmq.format.errors import CorruptEntryError, FormatError
from raftmq.log.config import LogConfig
from raftmq.log.errors import LogError
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
from raftmq.raft.errors import GroupRepairError
from raftmq.raft.host.group_storage import cut_back_to_rejoin, driven_log_config
from raftmq.raft.host.state_store import StateStore
from raftmq.raft.host.stats import HostStats
from raftmq.raft.host.transport import (
    AuditReply,
    AuditRequest,
    RepairReply,
    RepairRequest,
    Transport,
)

if TYPE_CHECKING:
    from raftmq.raft.host.host import RaftGroup

log = logging.getLogger("raftmq.raft.host.host")  # the host's log: one stream per node

REPAIR_CHUNK_BYTES = 1 << 20
"""Entries per RepairReply, at most (one entry more if a single one is larger)."""
REPAIR_REPLY_TIMEOUT_S = 10.0
SCRUB_BYTES_PER_S = 1 << 20
"""Default pace of the background scrubber that re-reads sealed segments and checks
their CRCs (bit rot is found before a client or follower needs the range); 0 is off."""
SCRUB_PASS_PAUSE_S = 10.0
PEER_WAIT_S = 10.0
"""How long a repair of a closed group waits for a peer's connection before it asks the
next one (a broker that just started has none yet)."""


class RangeReleasedError(LogError):
    """A peer no longer holds the entries asked for: its log starts at ``start``, after
    them (retention or a snapshot let them go), so they are committed, and this replica
    may let its damaged copy go too instead of waiting for bytes nobody keeps."""

    def __init__(self, peer: int, start: int, message: str) -> None:
        super().__init__(f"node {peer}: {message}")
        self.peer = peer
        self.start = start


class SelfRepair:
    """Repair, scrub and audit duties of a :class:`RaftHost` (see the module's doc)."""

    node_id: int
    transport: Transport
    groups: dict[str, RaftGroup]
    scrub_bytes_per_s: int
    scrubbed_bytes: int
    audited_ranges: int
    stats: HostStats
    _pool: ThreadPoolExecutor
    _stopping: bool
    _repairs: dict[str, asyncio.Task[None]]
    _repair_replies: dict[tuple[str, int, int], asyncio.Future[RepairReply]]
    quarantined: dict[str, RaftGroup]
    _closed_repairs: set[str]

    def _unquiesce(self, group: RaftGroup) -> None:
        raise NotImplementedError  # the host's

    async def _ensure_transport(self) -> None:
        raise NotImplementedError  # the host's

    def _store_of(self, directory: Path) -> StateStore:
        raise NotImplementedError  # the host's

    # --- repair of a group that cannot open -------------------------------------------

    async def repair_closed_group(
        self,
        name: str,
        directory: str | Path,
        peers: Sequence[int],
        log_config: LogConfig | None = None,
    ) -> str:
        """Restore the damaged sealed segments of group ``name``'s log, which is *not*
        open here (``open_group`` raised GroupDamagedError), from one of ``peers``,
        byte-identical; then open the group again with ``open_group``. Returns a one-line
        account of what was repaired.

        Only the log is opened (no core, no hard state): ``Log.open`` cuts a damaged tail
        of the active segment itself, so what is left to mend is in sealed segments
        (:func:`find_damage`). Each damaged range is asked of the peers in turn
        (RepairRequest; they answer from their open group), checked and written in place
        (:func:`patch`, fsynced). Meanwhile RepairReplies for ``name`` reach this call and
        every other message for it is dropped, as for any group not open here (loss, to
        Raft). Starts the transport if the host has not started yet (a broker opens its
        groups before it serves), so it can run before :meth:`start`.

        A range a peer supplies but that cannot be patched in place (the segment file
        shrank or grew: the replacement has another size) is cut off instead, with everything
        after it, and the replica *rejoins* (:func:`cut_back_to_rejoin`): the leader
        sends the rest once it opens, and it votes only once whole again.

        Raises GroupRepairError (the group stays closed; ``reason`` says why and what to
        do) when no peer supplied a range, or when no sealed segment is damaged (what
        keeps the group closed is not entries a peer can supply).
        ValueError when the group is open here or a repair of it is under way."""
        if name in self.groups or name in self.quarantined:
            raise ValueError(f"group {name!r} is open on node {self.node_id}: not a closed group")
        if name in self._closed_repairs:
            raise ValueError(f"group {name!r} is already being repaired on node {self.node_id}")
        await self._ensure_transport()
        return await self._repair_closed(name, Path(directory), peers, log_config)

    async def _repair_closed(
        self, name: str, directory: Path, peers: Sequence[int], log_config: LogConfig | None
    ) -> str:
        """:meth:`repair_closed_group` without its checks (a quarantined group's reopen
        uses it too: it is in ``quarantined``, its files closed)."""
        self._closed_repairs.add(name)
        try:
            loop = asyncio.get_running_loop()
            config = driven_log_config(log_config or LogConfig())
            log_ = await loop.run_in_executor(self._pool, Log.open, directory, config)
            try:
                return await self._repair_closed_log(name, log_, list(peers))
            finally:
                await loop.run_in_executor(self._pool, log_.close)
        finally:
            self._closed_repairs.discard(name)

    async def _repair_closed_log(self, name: str, log_: Log, peers: list[int]) -> str:
        loop = asyncio.get_running_loop()
        damages = await loop.run_in_executor(self._pool, find_damage, log_)
        if not damages:
            raise GroupRepairError(
                name,
                "no sealed segment of its log is damaged (a damaged tail of the active "
                "segment was already cut when the log opened): what keeps it from opening "
                "is not entries a replica can supply; open it again to see the reason",
            )
        peers = [p for p in peers if p != self.node_id]
        done_lines: list[str] = []
        for damage in damages:
            what = f"entries {damage.first_index}..{damage.end_index - 1}"
            failures: list[str] = []
            for peer in peers:
                if not await self._wait_peer(peer):
                    failures.append(f"node {peer} is not reachable")
                    continue
                try:
                    data = await self._fetch_range(name, peer, damage.first_index, damage.end_index)
                    done = await loop.run_in_executor(self._pool, patch, log_, damage, data)
                except (RepairRefusedError, RangeReleasedError) as exc:
                    # The peer holds the range (its copy passed every check) but not in the
                    # shape of ours, or let it go (committed): cut ours from there on and
                    # rejoin; the leader sends the rest (from its start point, a snapshot
                    # first), and later damaged ranges go with the cut.
                    await loop.run_in_executor(
                        self._pool,
                        cut_back_to_rejoin,
                        log_,
                        damage.first_index,
                        self._store_of(log_.directory),
                    )
                    why = (
                        f"node {exc.peer} let them go: its log starts at {exc.start}"
                        if isinstance(exc, RangeReleasedError)
                        else f"they cannot be patched in place: {exc}; node {peer} holds them"
                    )
                    line = (
                        f"cut the log from entry {damage.first_index} on ({what} of segment "
                        f"{damage.segment} are damaged, and {why}); this replica rejoins: no "
                        "votes until its leader has brought it up to date"
                    )
                    log.warning("group %s on node %d: %s", name, self.node_id, line)
                    return f"group {name}: " + "; ".join([*done_lines, line])
                except (TimeoutError, LogError, FormatError) as exc:
                    failures.append(f"node {peer}: {exc or type(exc).__name__}")
                    continue
                line = (
                    f"{what} of segment {damage.segment} ({damage.reason}) from node "
                    f"{peer}: {done.replaced_bytes} bytes replaced at byte {done.at}"
                )
                log.warning("group %s on node %d: repaired %s", name, self.node_id, line)
                done_lines.append(line)
                break
            else:
                raise GroupRepairError(
                    name,
                    f"no replica supplied {what} of segment {damage.segment} "
                    f"({damage.reason}): {'; '.join(failures) or 'no peers given'}; start "
                    "a replica that holds them and try again, or delete the group's "
                    "directory (keep the state store beside it) to resynchronise it",
                )
        return f"group {name}: repaired " + "; ".join(done_lines)

    def _release_damaged_prefix(
        self, group: RaftGroup, damage: Damage, released: RangeReleasedError
    ) -> bool:
        """A damaged range of a running group that a peer let go (it starts after it):
        the entries are committed and released elsewhere, so retention may take them here
        too; the log then starts after the damaged segment. False when it cannot (the
        range is not applied here yet: left to the next repair)."""
        through = damage.end_index - 1
        if not through < released.start or through > group.core.log.applied:
            return False
        try:
            self.compact(group.name, through=through)
        except ValueError:
            return False
        log.warning(
            "group %s on node %d: entries %d..%d of segment %s are damaged (%s) and node %d "
            "let them go (its log starts at %d): this replica's log now starts at %d too",
            group.name,
            self.node_id,
            damage.first_index,
            through,
            damage.segment,
            damage.reason,
            released.peer,
            released.start,
            through + 1,
        )
        return True

    def compact(self, name: str, *, through: int | None = None) -> int:
        raise NotImplementedError  # the host's

    async def _wait_peer(self, peer: int) -> bool:
        """Whether ``peer``'s connection is up, waiting up to PEER_WAIT_S for it (the
        transport drops what is sent to a peer it is not connected to)."""
        deadline_s = time.monotonic() + PEER_WAIT_S
        while not self.transport.peer_alive(peer):
            if time.monotonic() >= deadline_s or self._stopping:
                return False
            await asyncio.sleep(0.05)
        return True

    # --- self-repair of corrupt entries (raftmq/log/repair.py) --------------------------

    def request_repair(self, name: str, found_by: str, damages: list[Damage] | None = None) -> None:
        """A read of this group's log found a corrupt entry: restore the damaged range of
        every closed segment (or just ``damages``) from a replica, in the background, one
        repair of a group at a time. ``found_by`` (a client read, the scrubber, ...) goes
        into the repair's log line, so an operator sees which check caught the damage."""
        group = self.groups.get(name)
        running = self._repairs.get(name)
        if group is None or self._stopping or (running is not None and not running.done()):
            return
        task = asyncio.get_running_loop().create_task(
            self._guarded(self._repair(group, damages, found_by), f"repair of group {name}")
        )
        self._repairs[name] = task

    def repairing(self, name: str) -> bool:
        """Whether a repair of this group's log is under way (for replica status), also
        one of a group that could not open (:meth:`repair_closed_group`)."""
        if name in self._closed_repairs:
            return True
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
            self.request_repair(group.name, "a read for a follower")

    async def _guarded(self, work: Coroutine[object, object, None], what: str) -> None:
        """Background repair work fails alone and loudly: never the node with it."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %d: %s failed", self.node_id, what)

    async def _repair(self, group: RaftGroup, damages: list[Damage] | None, found_by: str) -> None:
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
            self.stats.damage_found += 1
            sources = sorted(
                group.core.membership.members - {self.node_id},
                key=lambda n: (n != group.core.lead, n),
            )
            for peer in sources:
                try:
                    data = await self._fetch_range(
                        group.name, peer, damage.first_index, damage.end_index
                    )
                    done = await loop.run_in_executor(self._pool, patch, group.log, damage, data)
                except RepairRefusedError as exc:
                    log.error(
                        "group %s on node %d: repair refused: %s", group.name, self.node_id, exc
                    )
                    break
                except RangeReleasedError as exc:
                    if self._release_damaged_prefix(group, damage, exc):
                        break
                    continue
                except (TimeoutError, LogError, FormatError) as exc:
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
                    "bytes replaced at byte %d, from node %d (the damage was found by %s)",
                    group.name,
                    self.node_id,
                    damage.first_index,
                    damage.end_index - 1,
                    damage.segment,
                    damage.reason,
                    done.replaced_bytes,
                    done.at,
                    peer,
                    found_by,
                )
                self.stats.repaired += 1
                break
            else:
                self.stats.unrepaired += 1
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
            # The pause comes first: a starting broker catches up and serves before it
            # re-reads old segments, and damage a read finds meanwhile is repaired anyway.
            await asyncio.sleep(SCRUB_PASS_PAUSE_S)
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
                        self.request_repair(group.name, "the scrubber")
                    await asyncio.sleep(seg.size / self.scrub_bytes_per_s)

    async def _fetch_range(self, name: str, peer: int, lo: int, hi: int) -> bytes:
        """Entries [lo, hi) of group ``name`` as ``peer`` stores them, in bounded replies."""
        parts: list[bytes] = []
        while lo < hi:
            key = (name, peer, lo)
            fut = asyncio.get_running_loop().create_future()
            self._repair_replies[key] = fut
            try:
                self.transport.send(
                    peer, name, RepairRequest(self.node_id, peer, lo, hi), urgent=False
                )
                self.transport.flush()
                reply = await asyncio.wait_for(fut, REPAIR_REPLY_TIMEOUT_S)
            finally:
                self._repair_replies.pop(key, None)
            if reply.error:
                if reply.hi > reply.lo:
                    raise RangeReleasedError(peer, reply.hi, reply.error)
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
        except (LogError, FormatError):
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
        except (LogError, FormatError):
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
            self.request_repair(group.name, "a replica audit", damages)
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
            self.request_repair(group.name, "a replica audit", [whole])

    def _take_repair_reply(self, name: str, m: RepairReply) -> None:
        """Hand a RepairReply to the repair waiting for it (of an open group, or of one
        :meth:`repair_closed_group` mends); a late or unasked one is dropped."""
        fut = self._repair_replies.get((name, m.src, m.lo))
        if fut is not None and not fut.done():
            fut.set_result(m)

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
            self._take_repair_reply(group.name, m)
            return
        try:
            # Reads check the CRC of whatever they return: a damaged copy here is refused,
            # never passed on.
            got = group.log.read_by_index(m.lo, REPAIR_CHUNK_BYTES, m.hi)
            reply = RepairReply(self.node_id, m.src, m.lo, got.next_index, got.data)
        except (LogError, FormatError) as exc:
            # Below our start (retention or a snapshot let the entries go): say where we
            # start in ``hi``, so the asker knows they are committed and released here.
            start = group.log.start_index
            released_to = start if m.lo < start else m.lo
            reply = RepairReply(self.node_id, m.src, m.lo, released_to, error=str(exc))
            if isinstance(exc, CorruptEntryError):
                self.request_repair(group.name, "a peer's repair request")
        self.transport.send(m.src, group.name, reply, urgent=False)
        self.transport.flush()
