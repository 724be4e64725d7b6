"""Retention on a broker: every ``retention_check_seconds`` it deletes the old segments of
each replica it hosts (retention.ms, retention.bytes, never past what the replica applied
nor past the first batch of a transaction still open on it, so a read_committed reader
always finds where its last stable offset stands; a follower that falls behind the new
start gets a snapshot), and the whole data of each
decommissioned partition whose deadline passed.

Each pass keeps a failure to the replica that raised it (it is logged, and the pass goes on
with the next one), the rule of docs/driver.md, "Failure isolation in the broker's control
loop": :func:`compact_each` is a plain function of what it reads, so that a test can make
one replica fail and see the others still compacted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from raftmq.broker.topic_settings import expired_replicas
from raftmq.controller.model import MetadataState
from raftmq.partition.replica import group_name

log = logging.getLogger(__name__)


class _Replica(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    def retention_floor(self) -> int | None: ...


class _Host(Protocol):
    def compact(self, name: str, *, keep_from: int | None = None) -> int: ...


def compact_each(
    host: _Host,
    replicas: Iterable[_Replica],
    floor: Callable[[_Replica], int | None] | None = None,
) -> int:
    """Apply retention to each replica's log; returns how many failed (each is logged,
    and the others are compacted all the same). ``floor(replica)``: an index retention
    must also keep, if any (the delay topic's movers: raftmq.broker.delay_mover)."""
    failed = 0
    for r in list(replicas):
        try:
            keep_from = r.retention_floor()
            extra = floor(r) if floor is not None else None
            if extra is not None:
                keep_from = extra if keep_from is None else min(keep_from, extra)
            host.compact(group_name(r.topic, r.partition), keep_from=keep_from)
        except Exception:
            failed += 1
            log.exception("retention of %s/%d failed", r.topic, r.partition)
    return failed


class Retention:
    def __init__(
        self,
        broker_id: int,
        data_dir: Path,
        host: _Host,
        replicas: Mapping[tuple[str, int], _Replica],
        metadata: Callable[[], MetadataState],
        delete_replica: Callable[[str, int, Path, str], Awaitable[None]],
        stopping: Callable[[], bool],
        check_seconds: float,
        floor: Callable[[_Replica], int | None] | None = None,
    ) -> None:
        """``delete_replica(topic, partition, directory, why)``: the reconciler's (it
        closes the replica's group first when it is open)."""
        self.id = broker_id
        self.data_dir = data_dir
        self.host = host
        self.replicas = replicas
        self._metadata = metadata
        self._delete_replica = delete_replica
        self._stopping = stopping
        self.check_seconds = check_seconds
        self._floor = floor

    async def run(self) -> None:
        """Delete old segments (retention.ms, retention.bytes) of every hosted replica, never
        past what it applied; followers that fall behind the new start get a snapshot."""
        while not self._stopping():
            await asyncio.sleep(self.check_seconds)
            try:
                await self.delete_expired_replicas()
            except Exception:
                log.exception("deleting expired decommissioned replicas failed")
            compact_each(self.host, self.replicas.values(), self._floor)

    async def delete_expired_replicas(self) -> None:
        """Delete the data of each decommissioned partition whose deadline passed (the
        controller stamped it when it decommissioned the partition; it is compared with
        this broker's clock on each retention pass), open or only on disk."""
        now_ms = time.time_ns() // 1_000_000
        for name, p in expired_replicas(self._metadata(), self.id, now_ms):
            directory = self.data_dir / f"{name}-{p}"
            if (name, p) in self.replicas or directory.exists():
                try:
                    await self._delete_replica(
                        name, p, directory, "decommissioned, retention passed"
                    )
                except Exception:  # the next retention pass tries again; the others go on
                    log.exception("broker %d: deleting %s/%d failed", self.id, name, p)
