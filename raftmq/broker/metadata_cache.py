"""A broker's copy of the newest metadata it applied, kept on its disk.

Why: without it a restarted broker knows no topic until the controller quorum answers, so
a broker that comes back while the quorum is down (every voter restarting, a dedicated
controller tier lost) serves nothing, though its replicas and their peers are all there.
With it the broker applies its last known metadata at once: it opens its replicas (their
Raft groups elect among themselves, the controller is not needed for that), answers
Metadata and serves clients, then resumes the controller's watch from that version, as a
reconnect does, and misses nothing (each state is whole; versions only grow).

A cached state is one the controller committed, only maybe old: exactly what a broker
that lost its link to the controller holds in memory. Deletions stay safe with it: a
replica is deleted only for a topic id at or below the state's version
(``Broker._delete_gone_replicas``). One thing an old copy must not do is bring back a
topic deleted after it was written (the broker deleted its replicas, then died before the
cache caught up): :func:`without_lost_topics` leaves out the topics this broker hosts but
holds no replica of on disk.

Writes are coalesced: :meth:`MetadataCache.offer` keeps only the newest state, and one
writer task writes it (atomically, fsynced, off the event loop) at most once per
``min_interval_s``, and at most :data:`MAX_WRITE_SHARE` of the time (a write that took
long waits that much longer before the next), so a burst of versions costs one write.
Bounded: one file, one pending state; a state above ``max_bytes`` encoded is not cached
(said once in the log).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from raftmq.controller.model import MetadataState
from raftmq.controller.state_machine import SnapshotError, decode_snapshot, encode_snapshot
from raftmq.log.atomic_file import read_atomic, write_atomic
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

CACHE_FILE = "metadata.cache"
MIN_WRITE_INTERVAL_S = 0.5
"""At most one write per this interval; the newest state offered meanwhile is the next."""
MAX_WRITE_SHARE = 0.1
"""Writes take at most this share of the time: encoding the metadata of 10,000 partitions
takes about a second of CPU, and while their leaders were reported (a version every few
hundred milliseconds) the cache writes alone kept a broker busy for minutes."""
MAX_CACHE_BYTES = 64 << 20
"""A larger encoded state is not cached (a cluster this big restarts from the controller)."""


class MetadataCache:
    def __init__(
        self,
        directory: Path,
        cluster_name: str,
        *,
        min_interval_s: float = MIN_WRITE_INTERVAL_S,
        max_bytes: int = MAX_CACHE_BYTES,
    ) -> None:
        self.path = directory / CACHE_FILE
        self.cluster_name = cluster_name
        self.min_interval_s = min_interval_s
        self.max_bytes = max_bytes
        self.written_version = 0
        self.writes = 0
        self._pending: MetadataState | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._said_too_big = False

    def load(self) -> MetadataState | None:
        """The cached state, or None when there is none, it is damaged, or it belongs to
        another cluster (a data folder reused under a new name).

        Never raises: the cache only saves waiting for the controller, so a copy that fails
        its CRC, cannot be read or does not decode is set aside with one WARNING that says
        so and removed (a later start must not trip on it again, and the next version
        applied is cached afresh); the broker then waits for the controller's copy."""
        try:
            raw = read_atomic(self.path)
        except OSError as exc:
            self._set_aside(f"cannot be read ({exc.strerror or exc})")
            return None
        if raw is None:
            if self.path.exists():
                self._set_aside("fails its CRC (damaged on disk)")
            return None
        try:
            state = decode_snapshot(raw)
        except SnapshotError as exc:
            self._set_aside(f"does not decode ({exc})")
            return None
        except Exception as exc:  # a payload that passed its CRC yet breaks the decoder
            self._set_aside(f"does not decode ({type(exc).__name__}: {exc})")
            return None
        if state.cluster_name != self.cluster_name:
            log.warning(
                "ignoring the metadata cache %s: it is cluster %r's, not %r's",
                self.path,
                state.cluster_name,
                self.cluster_name,
            )
            return None
        self.written_version = state.version
        return state

    def _set_aside(self, problem: str) -> None:
        try:
            self.path.unlink(missing_ok=True)
            removed = "removed it"
        except OSError as exc:
            removed = f"could not remove it ({exc.strerror or exc}): remove it by hand"
        log.warning(
            "the metadata cache %s %s: ignored it and %s; this broker waits for the "
            "controller's copy of the metadata before it opens its replicas",
            self.path,
            problem,
            removed,
        )

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write_loop())

    def offer(self, state: MetadataState) -> None:
        """Cache ``state`` soon (replacing any older one not yet written)."""
        if state.version > self.written_version and (
            self._pending is None or state.version > self._pending.version
        ):
            self._pending = state
            self._wake.set()

    async def close(self) -> None:
        """Stop the writer, then write what is pending: a clean stop keeps the newest."""
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)
        await self._write_pending()

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            started_s = loop.time()
            await self._write_pending()
            took_s = loop.time() - started_s
            await asyncio.sleep(max(self.min_interval_s, took_s / MAX_WRITE_SHARE))

    async def _write_pending(self) -> None:
        self._wake.clear()
        state, self._pending = self._pending, None
        if state is None or state.version <= self.written_version:
            return
        try:
            await asyncio.to_thread(self._write, state)
        except OSError as exc:  # an optimisation lost, not the broker: the old copy stays
            log.warning("could not cache metadata version %d: %s", state.version, exc)

    def _write(self, state: MetadataState) -> None:
        data = encode_snapshot(state)
        if len(data) > self.max_bytes:
            if not self._said_too_big:
                self._said_too_big = True
                log.warning(
                    "metadata version %d is %d bytes encoded, above the cache's %d: not cached "
                    "(a restart waits for the controller)",
                    state.version,
                    len(data),
                    self.max_bytes,
                )
            self.path.unlink(missing_ok=True)  # an older copy must not pass for the newest
            return
        write_atomic(self.path, data)
        self.written_version = state.version
        self.writes += 1


def without_lost_topics(
    state: MetadataState, broker_id: int, on_disk: Callable[[str, int], bool]
) -> MetadataState:
    """``state`` less the topics that name this broker as a replica of some partition but
    of which ``on_disk(topic, partition)`` finds none here. A replica's directory exists
    from the moment the broker applies the version naming it, before that version is
    cached, so such a topic was deleted since. Opened from the cache, its replicas would
    start empty: a topic of one replica per partition would elect itself and take writes
    for a deleted topic until the controller answers. The watch brings back anything
    left out wrongly."""
    lost = [
        name
        for name, topic in state.topics.items()
        if (
            hosted := [
                p
                for p, part in enumerate(topic.partitions)
                if broker_id in part.replicas or broker_id in part.learners
            ]
        )
        and not any(on_disk(name, p) for p in hosted)
    ]
    if not lost:
        return state
    log.info("the cached metadata's topics %s were deleted here since: left out", lost)
    return dataclasses.replace(
        state, topics={n: t for n, t in state.topics.items() if n not in lost}
    )
