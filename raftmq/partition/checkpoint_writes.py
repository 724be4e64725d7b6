"""Writing a partition's derived-state checkpoints (producer state, share-partition state):
one write at a time, off the event loop when there is one, and what the last finished
write covers, which retention must keep the log after (a restart replays from there).

Shared by raftmq.partition.producer_tracking and raftmq.partition.share_tracking, which
differ in what they save, not in how it is made durable."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

RETENTION_CHECKPOINT_EVERY_S = 1.0
"""How often at most retention asks for a checkpoint so it may delete past the last one."""


class CheckpointWrites:
    def __init__(self, name: str, what: str) -> None:
        self.name = name
        self.what = what
        self.durable_index = 0
        """The index the checkpoint file on disk covers: a restart rebuilds the state from
        it and the entries after it, so retention must keep those."""
        self.started_index = 0
        """The index the last write started covers (thresholds count from it)."""
        self.writing = False
        self._retention_asked_s = 0.0

    def loaded(self, index: int) -> None:
        self.started_index = self.durable_index = index

    def write(self, save: Callable[[], None], index: int, written: Callable[[], None]) -> None:
        """Run ``save`` (a checkpoint covering ``index``) now without an event loop, else
        in a thread; ``written`` once it is durable. The caller checks :attr:`writing`
        first (one write at a time; a later call finds the next threshold)."""
        assert not self.writing
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            save()
            written()
            self.started_index = self.durable_index = index
            return
        self.writing = True
        self.started_index = index

        def done(fut: asyncio.Future[None]) -> None:
            self.writing = False
            exc = fut.exception()
            if exc is not None:
                log.warning("%s: %s checkpoint not written: %s", self.name, self.what, exc)
                return
            self.durable_index = index
            written()

        loop.run_in_executor(None, save).add_done_callback(done)

    def replay_floor(self, applied_index: int, checkpoint: Callable[[], None]) -> int:
        """The first Raft index a restart replays: the one after the durable checkpoint.
        When that is behind what was applied, ``checkpoint`` is asked for a newer one (at
        most once a second), so retention can go on at its next pass."""
        if applied_index > self.durable_index:
            now_s = time.monotonic()
            if now_s - self._retention_asked_s >= RETENTION_CHECKPOINT_EVERY_S:
                self._retention_asked_s = now_s
                checkpoint()
        return self.durable_index + 1
