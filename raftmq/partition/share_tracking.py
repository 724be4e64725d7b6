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
import time
from collections.abc import Callable
from pathlib import Path

from raftmq.format import entry, share_ops
from raftmq.format.errors import FormatError
from raftmq.log.atomic_file import read_atomic, write_atomic
from raftmq.log.errors import LogError
from raftmq.partition.producer_tracking import READ_CHUNK_BYTES, LogHeaders
from raftmq.partition.share_state import Outcome, ShareStates

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "share_state.json"
CHECKPOINT_EVERY_OPS = 1024
"""Applied share operations between checkpoints: a restart reads at most about this many
entries' worth of log back (plus what retention asked to keep)."""
RETENTION_CHECKPOINT_EVERY_S = 1.0
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
        self.durable_index = 0
        self._checkpointed_index = 0
        self._ops_since_checkpoint = 0
        self._retention_asked_s = 0.0
        self._writing = False
        self._damaged: str | None = None
        self._durable_empty = True
        """The durable checkpoint (or, with none, the empty start) holds no group."""
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}
        self.on_change: Callable[[], None] | None = None
        """Called after every applied operation (long polls wake on releases and acks)."""
        self._load()

    def _load(self) -> None:
        try:
            payload = read_atomic(self.path)
        except OSError as exc:
            self._damaged = f"cannot be read ({exc.strerror or exc})"
            return
        if payload is None:
            if self.path.exists():
                self._damaged = "fails its CRC (damaged on disk)"
            return
        try:
            saved = json.loads(payload)
            states = ShareStates.from_json(saved["groups"])
            index = int(saved["index"])
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            self._damaged = f"does not decode ({type(exc).__name__}: {exc})"
            return
        self.states, self.applied_index = states, index
        self._checkpointed_index = self.durable_index = index
        self._durable_empty = not states.groups

    def open_at(self, log_: LogHeaders, commit_index: int) -> None:
        """At open: apply the SHARE_STATE entries after the checkpoint up to
        ``commit_index`` (all the log holds when there is no usable checkpoint)."""
        lo = max(self.applied_index + 1, log_.start_index)
        try:
            while lo <= commit_index:
                result = log_.read_by_index(lo, READ_CHUNK_BYTES, commit_index + 1)
                data = result.data  # type: ignore[attr-defined]
                if not data:
                    break
                for position, f in entry.iter_fields(data, verify=False):
                    if f[3] == _SHARE:
                        start = position + entry.HEADER_SIZE
                        self.on_entry(f[5], memoryview(data)[start : start + f[14]])
                lo = result.next_index  # type: ignore[attr-defined]
        except (FormatError, LogError) as exc:
            log.warning(
                "%s: share-partition state skips entries %d-%d it could not read: %s",
                self.name,
                lo,
                commit_index,
                exc,
            )
        self.applied_index = max(self.applied_index, commit_index)
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
        try:
            outcome = self.states.apply(share_ops.decode(payload))
        except FormatError as exc:
            # Written by a newer version, or damaged past its CRC: nothing of it applies,
            # here as on every replica of this version.
            log.warning("%s: share-state entry %d not applied: %s", self.name, index, exc)
            outcome = Outcome(applied=False)
        self.applied_index = index
        self._ops_since_checkpoint += 1
        waiter = self._waiters.pop(index, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)
        if self.on_change is not None:
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
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
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
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()
        self._checkpointed_index = -CHECKPOINT_EVERY_OPS
        self.checkpoint()

    # --- durability ------------------------------------------------------------------------------

    def checkpoint(self) -> None:
        if self._writing:
            return
        saved = {"index": self.applied_index, "groups": self.states.to_json()}
        index = self.applied_index
        self._ops_since_checkpoint = 0
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            _save(self.path, saved)
            self._checkpointed_index = self.durable_index = index
            self._durable_empty = not saved["groups"]
            return
        self._writing = True
        self._checkpointed_index = index

        def done(fut: asyncio.Future[None]) -> None:
            self._writing = False
            exc = fut.exception()
            if exc is not None:
                log.warning("%s: share state checkpoint not written: %s", self.name, exc)
                return
            if index > self.durable_index:
                self.durable_index = index
                self._durable_empty = not saved["groups"]

        loop.run_in_executor(None, _save, self.path, saved).add_done_callback(done)

    def replay_floor(self) -> int:
        """The first Raft index a restart reads to rebuild this state: retention keeps it.
        When the checkpoint is behind, a new one is written (at most once a second).
        A partition no share group uses holds nothing back: with the durable state and
        the current one both empty, a restart that skips the entries between reaches the
        same (empty) state."""
        if self._durable_empty and not self.states.groups:
            return self.applied_index + 1
        if self.applied_index > self.durable_index:
            now_s = time.monotonic()
            if now_s - self._retention_asked_s >= RETENTION_CHECKPOINT_EVERY_S:
                self._retention_asked_s = now_s
                self.checkpoint()
        return self.durable_index + 1


def _save(path: Path, saved: dict[str, object]) -> None:
    write_atomic(path, json.dumps(saved, separators=(",", ":")).encode())
