"""A broker's membership in the cluster as the controller sees it: it registers each
incarnation (a boot counter kept in its data folder) and heartbeats, registering again when
the controller forgot it; the controller fences a broker whose heartbeats stop.

Why an incarnation, not just the id: the controller tells a restarted broker from a late
message of its former self, and the registration's answer, the broker epoch, stamps
everything the broker says afterwards (KRaft's broker epoch).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from raftmq.broker.controller_link import ControllerLink, LinkRefusal
from raftmq.log.atomic_file import read_atomic, write_atomic

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
"""How often a broker heartbeats to the controller (fenced after its session timeout)."""
INCARNATION_FILE = "incarnation"


def next_incarnation(data_dir: Path) -> int:
    """A boot counter kept in the data folder: higher with every start of this process
    (the controller tells a restarted broker from a late message of its former self)."""
    path = data_dir / INCARNATION_FILE
    raw = read_atomic(path)
    # Start time in ms unless the counter is ahead: a wiped data folder (its counter
    # lost) must still register above the incarnation the controller holds.
    incarnation = max((int(raw) if raw else 0) + 1, time.time_ns() // 1_000_000)
    write_atomic(path, str(incarnation).encode())
    return incarnation


class Registration:
    def __init__(
        self,
        broker_id: int,
        link: ControllerLink,
        advertised: tuple[str, int],
        rack: str | None,
        stopping: Callable[[], bool],
        metadata_version: Callable[[], int],
    ) -> None:
        self.id = broker_id
        self.link = link
        self.advertised = advertised
        self.rack = rack
        self._stopping = stopping
        self._metadata_version = metadata_version
        self.incarnation = 0
        """Set by :func:`next_incarnation` as the broker starts."""
        self.epoch = 0
        """The controller's answer to the last registration (0: not registered yet)."""
        self.fenced = False

    async def register(self, raft_address: tuple[str, int]) -> None:
        """Register this incarnation, retried until the controller takes it."""
        self._raft_address = raft_address
        while not self._stopping():
            try:
                self.epoch = await self.link.register(
                    self.id, self.advertised, raft_address, self.rack, self.incarnation
                )
                return
            except LinkRefusal as exc:
                log.error("broker %d: the controller refused its registration: %s", self.id, exc)
                await asyncio.sleep(5 * HEARTBEAT_SECONDS)

    async def heartbeat_loop(self) -> None:
        """Heartbeat every HEARTBEAT_SECONDS (after :meth:`register`); register again when
        the controller refuses a heartbeat (it no longer knows this incarnation)."""
        while not self._stopping():
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                fenced = await self.link.heartbeat(
                    self.id, self.incarnation, self._metadata_version()
                )
            except LinkRefusal as exc:
                log.warning("broker %d: heartbeat refused (%s); registering again", self.id, exc)
                await self.register(self._raft_address)
                continue
            if fenced != self.fenced:
                log.info("broker %d is %s", self.id, "fenced" if fenced else "unfenced")
                self.fenced = fenced
