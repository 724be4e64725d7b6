"""A partition replica's share-partition state (raftmq.partition.share_state) kept up with
the committed log, made durable, and rebuilt at open (docs/share-groups.md, "Where the
state lives").

Every replica applies each committed SHARE_STATE entry as the commit advances, so a
follower that becomes leader has the state ready. The entries reach it through the
producer tracking's pass over committed headers (:meth:`on_entry`): one read of the log
per commit serves both. A leader that proposed an entry waits for its :class:`Outcome`
(:meth:`expect`), since apply, not the leader's guess, says what changed.

Restart: the checkpoint (``share_state.json``, CRC-framed, written atomically with fsync
every CHECKPOINT_EVERY_OPS applied operations, and when retention asks, off the event
loop) plus the SHARE_STATE entries after it, read back at open. Unlike producer state,
this state cannot be guessed: retention keeps every entry after the durable checkpoint
(:meth:`replay_floor`), and a checkpoint that is missing or damaged is rebuilt from the
whole log this replica holds (one WARNING for a damaged one).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

from raftmq.format import entry, share_ops
from raftmq.format.errors import FormatError
from raftmq.log.atomic_file import write_atomic
from raftmq.log.errors import LogError
from raftmq.partition.checkpoint_writes import CheckpointWrites
from raftmq.partition.producer_tracking import (
    UNDECODABLE,
    LogHeaders,
    committed_entries,
    read_checkpoint,
    undecodable,
)
from raftmq.partition.share_state import Outcome, ShareStates

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "share_state.json"
CHECKPOINT_EVERY_OPS = 1024
"""Applied share operations between checkpoints: a restart reads at most about this many
entries' worth of log back (plus what retention asked to keep)."""
_SHARE = int(entry.EntryType.SHARE_STATE)
ATTACHMENT_KEY = "share"
"""The key of this state in a snapshot's attachment (a JSON object shared with the
producer state, whose readers ignore keys they do not know)."""


class ShareTracking:
    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.name = name
        self.states = ShareStates()
        self.applied_index = 0
        """Every SHARE_STATE entry up to this Raft index is in :attr:`states`."""
        self._writes = CheckpointWrites(name, "share-partition state")
        self._ops_since_checkpoint = 0
        self.changes = 0
        """Operations applied since the replica opened (or a snapshot's state replaced
        them): a watcher of the state compares it instead of looking at every group."""
        self._damaged: str | None = None
        self._durable_empty = True
        """The durable checkpoint (or, with none, the empty start) holds no group."""
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}
        self.on_change: Callable[[], None] | None = None
        """Called after an applied operation that may make records acquirable (share
        long polls wake on it)."""
        self._load()

    def _load(self) -> None:
        saved, self._damaged = read_checkpoint(self.path)
        if saved is None:
            return
        try:
            states = ShareStates.from_json(saved["groups"])
            index = int(saved["index"])
        except UNDECODABLE as exc:
            self._damaged = undecodable(exc)
            return
        self.states, self.applied_index = states, index
        self._writes.loaded(index)
        self._durable_empty = not states.groups

    def open_at(self, log_: LogHeaders, commit_index: int) -> None:
        """At open: apply the SHARE_STATE entries after the checkpoint up to
        ``commit_index`` (all the log holds when there is no usable checkpoint)."""
        lo = max(self.applied_index + 1, log_.start_index)
        try:
            for data, position, f in committed_entries(log_, lo, commit_index):
                if f[3] == _SHARE:
                    start = position + entry.HEADER_SIZE
                    self.on_entry(f[5], memoryview(data)[start : start + f[14]])
                lo = f[5] + 1
        except (FormatError, LogError) as exc:
            log.warning(
                "%s: share-partition state skips entries %d-%d it could not read: %s",
                self.name,
                lo,
                commit_index,
                exc,
            )
        # Up to what was read, not to ``commit_index``: entries this log lacks (cut back
        # by a disk fault) come again from the leader, and are applied as they commit.
        self.applied_index = max(self.applied_index, lo - 1)
        damaged, self._damaged = self._damaged, None
        if damaged is not None:
            log.warning(
                "%s: the share-partition state checkpoint %s %s; rebuilt the state of %d "
                "share group(s) from the entries this replica holds; writing a fresh one",
                self.name,
                self.path,
                damaged,
                len(self.states),
            )
            self.checkpoint()

    def on_entry(self, index: int, payload: memoryview) -> None:
        """A committed SHARE_STATE entry at ``index`` (each is handed over once, in order;
        one the checkpoint covers already is skipped)."""
        if index <= self.applied_index:
            return
        op: share_ops.ShareOp | None = None
        try:
            op = share_ops.decode(payload)
        except FormatError as exc:
            # Written by a newer version, or damaged past its CRC: nothing of it applies,
            # here as on every replica of this version.
            log.warning("%s: share-state entry %d not applied: %s", self.name, index, exc)
        outcome = Outcome(applied=False) if op is None else self.states.apply(op)
        self.applied_index = index
        self._ops_since_checkpoint += 1
        self.changes += 1
        waiter = self._waiters.pop(index, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)
        if self.on_change is not None and op is not None and op.op != share_ops.Op.ACQUIRE:
            # An acquisition makes nothing acquirable; the rest may (a release, an ack
            # that makes room under the in-flight limit, a lock expiry judged by it).
            self.on_change()

    def advanced(self, applied_to: int) -> None:
        """The commit was applied up to ``applied_to`` (share entries among them included)."""
        if applied_to > self.applied_index:
            self.applied_index = applied_to
        if self._ops_since_checkpoint >= CHECKPOINT_EVERY_OPS:
            self.checkpoint()

    # --- a leader's proposals ------------------------------------------------------------------

    def expect(self, index: int) -> asyncio.Future[Outcome]:
        """The outcome of the entry this leader proposed at ``index``, once applied."""
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiters[index] = fut
        return fut

    def forget(self, index: int) -> None:
        self._waiters.pop(index, None)

    # --- snapshots -------------------------------------------------------------------------------

    def attachment(self) -> dict[str, object]:
        return {"index": self.applied_index, "groups": self.states.to_json()}

    def install(self, index: int, saved: object) -> None:
        """A snapshot at ``index`` arrived with its leader's attachment (the decoded JSON
        object): take the share state from it when it covers the skipped entries, else
        the groups of the skipped entries are lost here (a leader of an older version)."""
        try:
            share = saved.get(ATTACHMENT_KEY) if isinstance(saved, dict) else None
            if share is None:
                raise KeyError("no share state in the attachment")
            states = ShareStates.from_json(share["groups"])
            at = int(share["index"])
        except UNDECODABLE as exc:
            log.warning(
                "%s: no usable share-partition state came with the snapshot at %d (%s); "
                "the share groups of the skipped entries start again here",
                self.name,
                index,
                exc,
            )
            self.states, self.applied_index = ShareStates(), index
        else:
            if at < index:
                states = ShareStates()
                at = index
            self.states, self.applied_index = states, at
        self.changes += 1
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()
        self.checkpoint()

    # --- durability ------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Save the state durably (off the event loop when there is one); one write at a
        time: a call during one is dropped, and the next threshold or retention's next
        pass asks again."""
        if self._writes.writing:
            return
        saved = {"index": self.applied_index, "groups": self.states.to_json()}
        self._ops_since_checkpoint = 0
        empty = not saved["groups"]

        def written() -> None:
            self._durable_empty = empty

        self._writes.write(lambda: _save(self.path, saved), self.applied_index, written)

    @property
    def durable_index(self) -> int:
        return self._writes.durable_index

    def replay_floor(self) -> int:
        """The first Raft index a restart reads to rebuild this state: retention keeps it.
        A partition no share group uses holds nothing back: with the durable state and
        the current one both empty, a restart that skips the entries between reaches the
        same (empty) state."""
        if self._durable_empty and not self.states.groups:
            return self.applied_index + 1
        return self._writes.replay_floor(self.applied_index, self.checkpoint)


def _save(path: Path, saved: dict[str, object]) -> None:
    write_atomic(path, json.dumps(saved, separators=(",", ":")).encode())
