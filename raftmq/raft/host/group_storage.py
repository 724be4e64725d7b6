"""A Raft group's durable state, opened and written in one place: its log (in the group's
directory) and, in the state store its directory's folder shares with the other groups
there (state_store.py, ``raft-state.wal``), its hard state (term, vote, commit, the
rejoining flag), promise record, snapshot meta and commit hint.

The host (host.py) decides *when* each is written (persist before send); this module only
knows *how* and *where*. Data directories of earlier versions kept these in files of their
own (``LEGACY_*`` below); the first open of such a group moves them into the store
(:func:`_migrate`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import struct
import zlib
from pathlib import Path

from raftmq.format.errors import FormatError
from raftmq.log.atomic_file import read_atomic, read_in_place, write_atomic
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import LogError
from raftmq.log.log import Log
from raftmq.log.repair import find_damage
from raftmq.log.segment import LOG_SUFFIX
from raftmq.raft.config import Config
from raftmq.raft.core import RaftCore, starts_rejoining
from raftmq.raft.errors import GroupDamagedError
from raftmq.raft.hardstate import HardState
from raftmq.raft.host import state_store
from raftmq.raft.host.state_store import Kind, StateStore
from raftmq.raft.membership import ConfigHistory, Membership
from raftmq.raft.messages import SnapshotMeta
from raftmq.raft.ready import Ready, write_to_storage

log = logging.getLogger("raftmq.raft.host.host")  # the host's log: one stream per node

LEGACY_HARD_STATE_FILE = "raft-hardstate"
LEGACY_COMMIT_HINT_FILE = "raft-commit"
LEGACY_SNAPSHOT_META_FILE = "raft-snapshot"
LEGACY_PROMISED_SUFFIX = ".raft-promised"
"""The files of the layout before the state store: in a group's directory, and (the
promise record) beside it as ``<dir>.raft-promised``. Read once, moved into the store."""

_MAGIC_V1 = b"RHS1"  # term, vote, commit (read only: files written before rejoining existed)
_MAGIC = b"RHS2"  # term, vote, commit, flags
_BODY_V1 = struct.Struct(">4sqqq")
_BODY = struct.Struct(">4sqqqB")
_FLAG_REJOINING = 0x01
_SNAP_META = struct.Struct(">qqq")


class HardStateCorruptError(Exception):
    """The hard-state file exists but is not a complete record: refuse to guess a vote."""


def encode_hard_state(hs: HardState) -> bytes:
    """The body: the file holds it framed by ``write_atomic`` (its CRC after it)."""
    flags = _FLAG_REJOINING if hs.rejoining else 0
    return _BODY.pack(_MAGIC, hs.term, hs.vote, hs.commit, flags)


def decode_hard_state(body: bytes) -> HardState:
    """A body whose CRC already checked out (``read_atomic``): RHS2, or RHS1 from before the
    rejoining flag existed."""
    layout = _BODY if len(body) == _BODY.size else _BODY_V1
    if len(body) != layout.size:
        raise HardStateCorruptError(f"hard state body has {len(body)} bytes, expected {_BODY.size}")
    magic, term, vote, commit, *flags = layout.unpack(body)
    if magic != (_MAGIC if layout is _BODY else _MAGIC_V1):
        raise HardStateCorruptError(f"hard state magic {magic!r} unknown")
    return HardState(term, vote, commit, bool(flags and flags[0] & _FLAG_REJOINING))


def save_hard_state(path: str | os.PathLike[str], hs: HardState) -> None:
    """Write a hard state file of the legacy layout (tests build old data dirs with it)."""
    write_atomic(Path(path), encode_hard_state(hs))


def load_hard_state(path: str | os.PathLike[str]) -> HardState:
    """A legacy hard state file, or the zero state when there is none. A torn or corrupt
    file raises: a node must not guess its vote."""
    path = Path(path)
    body = read_atomic(path)
    if body is None:
        if not path.exists():
            return HardState()
        raise HardStateCorruptError(f"hard state file {path} is torn or corrupt (CRC mismatch)")
    return decode_hard_state(body)


def encode_snapshot_meta(snap: SnapshotMeta) -> bytes:
    return _SNAP_META.pack(snap.index, snap.term, snap.next_offset) + snap.membership.encode()


def decode_snapshot_meta(raw: bytes | None) -> SnapshotMeta | None:
    if raw is None or len(raw) < _SNAP_META.size:
        return None
    index, term, next_offset = _SNAP_META.unpack_from(raw)
    return SnapshotMeta(index, term, next_offset, Membership.decode(raw[_SNAP_META.size :]))


def save_snapshot_meta(store: StateStore, directory: Path, snap: SnapshotMeta) -> None:
    """Record the log's start point (in memory: durable with the store's next sync)."""
    store.put(directory.name, Kind.META, encode_snapshot_meta(snap))


def save_commit_hint(store: StateStore, directory: Path, history: ConfigHistory) -> None:
    """Record the commit hint; never fsynced for its own sake (see RaftHost's writer)."""
    store.put(directory.name, Kind.HINT, history.encode())


def decode_commit_hint(payload: bytes | None) -> ConfigHistory | None:
    """The saved hint, or None when it is missing or malformed (both mean: no hint)."""
    if payload is None:
        return None
    try:
        return ConfigHistory.decode(payload)
    except ValueError:
        return None


def hard_state_of(store: StateStore, directory: Path) -> HardState | None:
    """The group's saved hard state; None when it has none, or when it cannot be trusted
    (the store is suspect for it: see state_store's docstring)."""
    state = store.group(directory.name)
    if state.hard is None or state.suspect:
        return None
    try:
        return decode_hard_state(state.hard)
    except HardStateCorruptError:
        return None


def save_hard_state_in(store: StateStore, directory: Path, hs: HardState) -> None:
    """Record the hard state (in memory: durable with the store's next sync)."""
    store.put(directory.name, Kind.HARD, encode_hard_state(hs))


def record_promised(*directories: Path) -> None:
    """Durably record, for each group directory, that its replica once promised (voted or
    acknowledged): if the directory is later lost or replaced, the replica rejoins
    (docs/raft.md, "Rejoining after disk loss") instead of passing for a new member. In
    the store of each directory's folder, which lives beside the directories."""
    by_folder: dict[Path, list[Path]] = {}
    for directory in directories:
        by_folder.setdefault(directory.parent, []).append(directory)
    for folder, dirs in by_folder.items():
        store = state_store.acquire(folder)
        try:
            for directory in dirs:
                store.put(directory.name, Kind.PROMISED)
            store.sync()
        finally:
            state_store.release(store)


def forget_group(directory: Path, *, promised: bool = False) -> None:
    """Drop every record of the group in ``directory`` (its replica is deleted: a later
    one of the same name starts new), or, with ``promised``, all but the promise (the
    replica is rebuilt empty and must rejoin). Durable with the store's next sync (the
    host's upkeep syncs within a tick), at once with ``promised``."""
    store = state_store.acquire(directory.parent)
    try:
        store.forget(directory.name)
        if promised:
            store.put(directory.name, Kind.PROMISED)
            store.sync()
    finally:
        state_store.release(store)


def _holds_log(path: Path) -> bool:
    """Whether ``path`` is a directory holding at least one segment file."""
    try:
        return any(entry_.name.endswith(LOG_SUFFIX) for entry_ in os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return False


@dataclasses.dataclass(slots=True)
class _Legacy:
    """What a group directory of the layout before the store held, moved into the store."""

    files: list[Path]
    hard_state_unreadable: bool = False


def _migrate(store: StateStore, path: Path) -> _Legacy:
    """Move a legacy layout's files of the group in ``path`` into ``store`` (in memory; the
    caller syncs the store, then removes ``files``). A store that already holds the group
    wins: the files are then what a crash after an earlier migration left behind.

    A legacy hard state that cannot be read is not moved; ``hard_state_unreadable`` tells
    the open to take the rejoin path (which writes a new one) as it would have."""
    hard, meta, hint, promised = (
        path / LEGACY_HARD_STATE_FILE,
        path / LEGACY_SNAPSHOT_META_FILE,
        path / LEGACY_COMMIT_HINT_FILE,
        path.parent / (path.name + LEGACY_PROMISED_SUFFIX),
    )
    files = [p for p in (hard, meta, hint, promised) if p.exists()]
    legacy = _Legacy(files)
    if not files or not store.group(path.name).empty:
        return legacy
    if promised in files:
        store.put(path.name, Kind.PROMISED)
    if hard in files:
        try:
            save_hard_state_in(store, path, load_hard_state(hard))
        except HardStateCorruptError:
            legacy.hard_state_unreadable = True
    raw_meta = read_atomic(meta)
    if decode_snapshot_meta(raw_meta) is not None:
        store.put(path.name, Kind.META, raw_meta or b"")
    raw_hint = read_in_place(hint)
    if decode_commit_hint(raw_hint) is not None:
        store.put(path.name, Kind.HINT, raw_hint or b"")
    log.info("group directory %s: its state files move into %s", path, store.path)
    return legacy


def cut_back_to_rejoin(log_: Log, index: int, store: StateStore) -> None:
    """Cut a closed group's log from ``index`` on and make the replica *rejoin*: for a
    damaged range no peer's bytes can patch in place (the segment file shrank or grew, so
    the replacement has another size), while a peer holds it.

    The cut may remove entries this replica acknowledged, as a cut-back disk does; the
    rejoining flag, saved *before* the cut, keeps it from voting or campaigning until a
    leader has brought it up to date again (docs/raft.md, "Rejoining after disk loss").
    A crash between the two leaves a rejoining replica with the damaged log, which the
    next open and repair cut again. A corrupt hard state is left as it is: the open then
    rejoins anyway (:func:`_hard_state_or_rejoin`)."""
    path = log_.directory
    hs = hard_state_of(store, path)
    if hs is not None:
        save_hard_state_in(store, path, dataclasses.replace(hs, rejoining=True))
    store.put(path.name, Kind.PROMISED)
    store.sync()
    log_.truncate_suffix(index)
    log_.flush()


def driven_log_config(config: LogConfig) -> LogConfig:
    """The settings a group's log runs with for a group configured with ``config``: the
    driver does the fsyncs itself (off the event loop), hence the INTERVAL log.

    An INTERVAL group acknowledges once the write is done, so its writes go straight to
    the kernel: the page cache survives a crash of this process (as Kafka counts on),
    bytes kept back by write-behind would not. EVERY_BATCH groups acknowledge after the
    round's flush, which writes them out first anyway."""
    sync = config.flush_policy is FlushPolicy.EVERY_BATCH
    return dataclasses.replace(
        config,
        flush_policy=FlushPolicy.INTERVAL,
        write_behind_bytes=config.write_behind_bytes if sync else 0,
    )


def load_group(
    name: str,
    path: Path,
    membership: Membership,
    config: LogConfig,
    replay: bool,
    *,
    node_id: int,
    core_cfg: Config,
    store: StateStore,
    snapshot: tuple[SnapshotMeta, bytes] | None = None,
) -> tuple[RaftCore, Log, HardState, bool]:
    """Open a group's log and state from ``path`` and ``store`` (the state store of its
    folder): at start (``RaftHost.open_group``) and when a quarantined group is reopened
    (``RaftHost._reopen``), the same way. The last value says whether the directory held
    no log before (a new group, or a lost directory): its entries are not durable yet,
    which the host makes them before the group first promises (``RaftHost._persist``).

    ``snapshot`` is a state machine's latest durable snapshot (``SnapshotStore.latest``):
    the log is first made to start right after it (see :func:`cut_to_snapshot`)."""
    had_log = _holds_log(path)
    legacy = _migrate(store, path)
    log_ = Log.open(path, driven_log_config(config))
    try:
        changed = bool(legacy.files)
        if snapshot is not None:
            changed |= cut_to_snapshot(name, path, log_, snapshot[0], node_id=node_id, store=store)
        try:
            core, hs, wrote = _load_core(
                name,
                path,
                log_,
                membership,
                replay,
                node_id=node_id,
                core_cfg=core_cfg,
                store=store,
                had_log=had_log,
                legacy_unreadable=legacy.hard_state_unreadable,
            )
        except (FormatError, LogError) as exc:
            raise damage_at_open(name, log_, exc) from exc
        if changed or wrote:
            store.sync()
        for old in legacy.files:
            old.unlink(missing_ok=True)
    except BaseException:
        log_.abandon()  # nothing was written: give its descriptors back at once
        raise
    return core, log_, hs, not had_log


def damage_at_open(name: str, log_: Log, exc: Exception) -> Exception:
    """What to raise for an entry read at open that failed its checks (the group's own
    reads here, or its state machine's as it opens on top: a partition reads the entry
    at the commit index for its high watermark): GroupDamagedError
    naming every damaged sealed range (a peer holds them byte for byte), or ``exc`` itself
    when no sealed segment is damaged (then it is not damage a peer's bytes can mend, and
    the caller sees the real error). Recovery at ``Log.open`` already cut a damaged tail of
    the active segment, so only sealed segments can hold what the read tripped on."""
    damages = find_damage(log_)
    if not damages:
        return exc
    ranges = ", ".join(
        f"entries {d.first_index}..{d.end_index - 1} of segment {d.segment} ({d.reason})"
        for d in damages
    )
    return GroupDamagedError(
        name,
        f"a read at open failed ({exc}); damaged: {ranges}; repair them from a replica "
        "(RaftHost.repair_closed_group), then open the group again",
        damages,
    )


def cut_to_snapshot(
    name: str, path: Path, log_: Log, snap: SnapshotMeta, *, node_id: int, store: StateStore
) -> bool:
    """Make the log start right after a state machine's snapshot: the entries kept below
    it for followers a little behind go, and a cut that a crash (or an error) interrupted
    is completed (the snapshot is saved before the log is cut).

    The log still holding the snapshot's entry with its term: the prefix up to it goes
    (the entries after it extend that state). Otherwise the snapshot came from a leader
    and the log's tail is not of its history: the log restarts empty after it, as it
    would have at install (``write_to_storage``). True when it saved a new snapshot meta."""
    start = log_.start_index
    if snap.index < start - 1:
        raise ValueError(
            f"group {name}: the log starts at {start}, after the state machine's snapshot "
            f"at {snap.index}: the entries between are lost (delete the group's directory, "
            "keeping the state store beside it, to resynchronise it from its peers)"
        )
    if snap.index > start - 1:
        if snap.index <= log_.last_index and log_.term_at(snap.index) == snap.term:
            log_.truncate_prefix(snap.index + 1)
        else:
            write_to_storage(log_, Ready(snapshot=snap))
            log_.flush()
        log.info(
            "group %s on node %d: the log now starts after the state machine's snapshot at %d",
            name,
            node_id,
            snap.index,
        )
    if decode_snapshot_meta(store.group(path.name).meta) == snap:
        return False
    save_snapshot_meta(store, path, snap)
    return True


def _hard_state_or_rejoin(
    name: str, path: Path, log_: Log, store: StateStore, *, node_id: int, unreadable: str | None
) -> tuple[HardState, bool]:
    """The saved hard state; when it cannot be read (``unreadable`` says why: a legacy
    file that is torn or corrupt, a record the damaged store may have lost), the state of
    a replica that lost its votes: (state, True).

    Why this is safe. The replica must not guess its vote, and does not: it takes the last
    term in its log (every entry it holds was appended in a term it knew, so it knew at
    least that one; 0 for an empty log), no vote, and the *rejoining* flag (docs/raft.md,
    "Rejoining after disk loss"). It may have voted in a higher term T before; a rejoining
    core grants no vote and no pre-vote (``_handle_vote_request``) and never campaigns, not
    even on TimeoutNow (``campaign``; ``_become_leader`` asserts it). Learning a higher
    term does not end that: ``_reset``/``become_follower`` keep the flag, which only an
    append from the current leader addressed to this life of the replica and reaching its
    ``rejoin_to`` clears, so the replica votes again only in terms at or above a leader it
    followed, with its log, exactly the case the rejoin argument covers (the term T it
    forgot has its leader, or is over, by then). Its log is intact, so that takes one
    round trip. The flag is in the record written here, so a crash mid-rejoin keeps it."""
    state = store.group(path.name)
    if unreadable is None and state.hard is not None:
        try:
            return decode_hard_state(state.hard), False
        except HardStateCorruptError as exc:
            unreadable = str(exc)
    if unreadable is None:
        return HardState(), False
    term = log_.term_at(log_.last_index) if log_.last_index >= log_.start_index - 1 else 0
    log.warning(
        "group %s on node %d: its hard state cannot be read (%s); it opens with term %d (its "
        "log's last), no vote, and rejoins: it neither votes nor campaigns until a leader "
        "has brought it up to date (the hard state is written again)",
        name,
        node_id,
        unreadable,
        term,
    )
    return HardState(term, 0, 0, rejoining=True), True


def _rebuild_snapshot_meta(
    name: str,
    log_: Log,
    path: Path,
    store: StateStore,
    saved: SnapshotMeta | None,
    hint: ConfigHistory | None,
    *,
    node_id: int,
) -> Membership:
    """The configuration at the start of a log that starts above 1 when its snapshot meta
    is unreadable (or names another index: a crash between a prefix cut and its save).

    The CONFIG entries below the start are gone, so the configuration there cannot come
    from the log, and the one the caller passes (today's) may be wrong: guessing would
    let this replica count votes and acks of the wrong members. The commit hint holds the
    committed configurations from an earlier start on; when it reaches the start (its
    ``through`` at or above it: no CONFIG entry it lacks lies below the start), it names
    the one in force there, and the meta is rebuilt from it with the term and offset the
    log's start checkpoint keeps. Otherwise the group does not open."""
    start = log_.start_index - 1
    at_start = hint.as_of(start) if hint is not None and hint.through >= start else None
    if at_start is None:
        what = "unreadable" if saved is None else f"at index {saved.index}"
        raise GroupDamagedError(
            name,
            f"its snapshot meta (in {store.path}) is {what} while the log starts after index "
            f"{start}, and no commit hint names the configuration there; delete the "
            "group's directory (keep the state store beside it) to resynchronise it from "
            "its peers",
        )
    rebuilt = SnapshotMeta(start, log_.term_at(start), log_.start_offset, at_start)
    save_snapshot_meta(store, path, rebuilt)
    log.warning(
        "group %s on node %d: its snapshot meta was %s; rebuilt from the commit hint: the "
        "log starts after index %d, term %d, with voters %s and learners %s",
        name,
        node_id,
        "unreadable" if saved is None else f"at index {saved.index}",
        start,
        rebuilt.term,
        sorted(at_start.voters),
        sorted(at_start.learners),
    )
    return at_start


def _directory_lost(
    name: str, path: Path, store: StateStore, *, node_id: int, had_log: bool
) -> bool:
    """When the group's directory held no log although the store says the replica
    promised (its directory was deleted, wiped or replaced while the store beside it
    stayed), make the store say what such a replica knows: the term and vote it saved
    (kept: knowing more of its past is only safer), no commit, no snapshot meta, no hint
    (they described the lost log), and the rejoining flag. True when it did."""
    state = store.group(path.name)
    saved = hard_state_of(store, path)
    if had_log or not (state.promised or (saved is not None and saved.term > 0)):
        return False
    term, vote = (saved.term, saved.vote) if saved is not None else (0, 0)
    store.forget(path.name)
    store.put(path.name, Kind.PROMISED)
    save_hard_state_in(store, path, HardState(term, vote, 0, rejoining=True))
    log.warning(
        "group %s on node %d: its directory %s holds no log, but the state store says this "
        "replica voted or acknowledged (term %d): it lost its directory, and rejoins: no "
        "votes until it holds the leader's log again",
        name,
        node_id,
        path,
        term,
    )
    return True


def _load_core(
    name: str,
    path: Path,
    log_: Log,
    membership: Membership,
    replay: bool,
    *,
    node_id: int,
    core_cfg: Config,
    store: StateStore,
    had_log: bool,
    legacy_unreadable: bool,
) -> tuple[RaftCore, HardState, bool]:
    """The core of a group whose log is open; also whether it wrote records the store
    must make durable before the group runs (a rejoin it found, a rebuilt meta)."""
    if not log_.recovery.clean:
        log.warning("group %s on node %d: log recovery %s", name, node_id, log_.recovery)
    wrote = _directory_lost(name, path, store, node_id=node_id, had_log=had_log)
    state = store.group(path.name)
    hint = None if replay else decode_commit_hint(state.hint)
    saved = decode_snapshot_meta(state.meta)
    if saved is not None and saved.index == log_.start_index - 1:
        membership = saved.membership  # CONFIG entries below the start are gone
    elif saved is None and log_.start_index == 1 and log_.last_index == 0:
        # A new group keeps the configuration it starts from: a restart starts from the
        # same one whatever its caller passes then (a partition's replica set changes
        # with moves; the log's CONFIG entries say how), so the saved configuration
        # history still matches and snapshots of early indexes name the right members.
        save_snapshot_meta(store, path, SnapshotMeta(0, 0, 0, membership))
    elif log_.start_index > 1:
        membership = _rebuild_snapshot_meta(name, log_, path, store, saved, hint, node_id=node_id)
        wrote = True
    elif hint is not None and (at_zero := hint.as_of(0)) is not None:
        # A log that starts at 1 replays every CONFIG entry; only the configuration it
        # was created with (the meta at 0) is missing, and the hint still names it.
        membership = at_zero
        save_snapshot_meta(store, path, SnapshotMeta(0, 0, 0, membership))
    else:
        log.warning(
            "group %s on node %d: its snapshot meta (in %s) is missing or unreadable; the "
            "log starts at 1 and its CONFIG entries are replayed on top of the "
            "configuration given now (%s), which holds wherever a CONFIG entry has since "
            "replaced the one it was created with",
            name,
            node_id,
            store.path,
            sorted(membership.members),
        )
    unreadable = None
    if legacy_unreadable:
        unreadable = f"its file {path / LEGACY_HARD_STATE_FILE} is torn or corrupt"
    elif state.suspect and had_log:
        unreadable = f"the state store is damaged: {store.damaged}"
    hs, lost_hard_state = _hard_state_or_rejoin(
        name, path, log_, store, node_id=node_id, unreadable=unreadable
    )
    commit = hs.commit
    if hint is not None:
        commit = max(commit, hint.through)
    promised = state.promised or hs.term > 0
    rejoining = starts_rejoining(hs, log_.last_index, commit, promised=promised)
    if rejoining and not hs.rejoining:
        log.warning(
            "group %s on node %d: this replica lost state it had acknowledged (%s); it "
            "rejoins: no votes until it holds the leader's log again",
            name,
            node_id,
            "no hard state"
            if hs.term == 0
            else f"log ends at {log_.last_index}, below its commit {commit}",
        )
    if lost_hard_state:
        # Written now, not at the first Ready: a crash before it must not leave the
        # unreadable state to be read again as something else. The flag keeps the rejoin
        # going; the promise record keeps it if the directory goes too.
        save_hard_state_in(store, path, hs)
        store.put(path.name, Kind.PROMISED)
        wrote = True
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
                node_id,
                exc,
            )
    applied = None if replay else commit
    # Each group draws its own election timeouts: with one seed per node, every group
    # of a node campaigned on the same tick, so thousands of groups started together
    # split their votes in lockstep forever and all leaders landed on one node.
    cfg = dataclasses.replace(
        core_cfg,
        seed=core_cfg.seed * 1_000_003 + zlib.crc32(name.encode()),
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
    return core, hs, wrote
