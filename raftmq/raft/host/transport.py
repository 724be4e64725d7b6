"""How Raft messages travel between processes: the interface the driver speaks, and an
in-memory implementation for tests of the driver.

The driver never waits on a send: Raft tolerates lost messages, so a transport with a full
queue or no connection drops and says so (``on_unreachable``), and the core falls back to
probing. ``urgent`` messages (heartbeats, votes, responses) go ahead of bulk appends so a
slow bulk transfer never delays a heartbeat into an election.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from raftmq.raft.messages import Message

QuiesceNotice = tuple[int, int, int, int, int]
"""(src, dst, term, commit, last_index): a leader's word that a group went idle."""


@dataclass(frozen=True, slots=True)
class RepairRequest:
    """Driver-level, not Raft: "send me your stored entries [lo, hi)", to replace a
    corrupt range of ours (raftmq/log/repair.py). Answered with one RepairReply."""

    src: int
    dst: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class RepairReply:
    """Whole entries from ``lo`` as stored, up to a size bound: ``hi`` is the index after
    the last one sent. ``error`` (then no entries) when this replica cannot serve them."""

    src: int
    dst: int
    lo: int
    hi: int
    entries: bytes = b""
    error: str = ""


@dataclass(frozen=True, slots=True)
class AuditRequest:
    """Driver-level replica audit: "the CRC32C of my stored entries [lo, hi) is ``crc``";
    a follower compares its own copy and answers with one AuditReply."""

    src: int
    dst: int
    lo: int
    hi: int
    crc: int


@dataclass(frozen=True, slots=True)
class AuditReply:
    """The follower's CRC32C of entries [lo, hi); ``differs`` when it is not the
    leader's (the follower then repairs its copy and says so in its log)."""

    src: int
    dst: int
    lo: int
    hi: int
    crc: int
    differs: bool


Outgoing = Message | QuiesceNotice | RepairRequest | RepairReply | AuditRequest | AuditReply


class Handler(Protocol):
    def on_messages(self, peer: int, batch: Sequence[tuple[str, Outgoing]]) -> None: ...

    def on_peer_state(self, peer: int, alive: bool) -> None: ...

    def on_unreachable(self, peer: int) -> None: ...


class Transport(Protocol):
    node_id: int

    def set_handler(self, handler: Handler) -> None: ...

    def send(self, peer: int, group: str, message: Outgoing, *, urgent: bool) -> None: ...

    def peer_alive(self, peer: int) -> bool: ...

    def flush(self) -> None:
        """Hand what ``send`` queued to the network now, before the caller blocks."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class MemoryNetwork:
    """Transports of several drivers in one event loop, delivering on the next loop turn.

    ``cut(a, b)`` drops traffic both ways, as a partition would; ``drop``, when set, is
    asked about each message (source, destination, message) and drops those it answers
    True for, as a lossy link would (tests lose chosen messages with it).
    """

    def __init__(self) -> None:
        self.nodes: dict[int, MemoryTransport] = {}
        self.cuts: set[frozenset[int]] = set()
        self.drop: Callable[[int, int, Outgoing], bool] | None = None

    def transport(self, node_id: int) -> MemoryTransport:
        t = MemoryTransport(node_id, self)
        self.nodes[node_id] = t
        return t

    def cut(self, a: int, b: int) -> None:
        self.cuts.add(frozenset((a, b)))
        for x, y in ((a, b), (b, a)):
            node = self.nodes.get(x)
            if node is not None and node.handler is not None:
                node.handler.on_peer_state(y, False)

    def heal(self) -> None:
        cuts, self.cuts = self.cuts, set()
        for pair in cuts:
            a, b = tuple(pair)
            for x, y in ((a, b), (b, a)):
                node = self.nodes.get(x)
                if node is not None and node.handler is not None:
                    node.handler.on_peer_state(y, True)

    def connected(self, a: int, b: int) -> bool:
        return frozenset((a, b)) not in self.cuts and b in self.nodes and a in self.nodes


class MemoryTransport:
    def __init__(self, node_id: int, network: MemoryNetwork) -> None:
        self.node_id = node_id
        self.network = network
        self.handler: Handler | None = None
        self._pending: dict[int, list[tuple[str, Outgoing]]] = {}
        self._scheduled = False

    def set_handler(self, handler: Handler) -> None:
        self.handler = handler

    def send(self, peer: int, group: str, message: Outgoing, *, urgent: bool) -> None:
        self._pending.setdefault(peer, []).append((group, message))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for peer, batch in pending.items():
            dst = self.network.nodes.get(peer)
            if dst is None or dst.handler is None or not self.network.connected(self.node_id, peer):
                if self.handler is not None:
                    self.handler.on_unreachable(peer)
                continue
            drop = self.network.drop
            if drop is not None:
                batch = [(g, m) for g, m in batch if not drop(self.node_id, peer, m)]
            dst.handler.on_messages(self.node_id, batch)

    def peer_alive(self, peer: int) -> bool:
        return self.network.connected(self.node_id, peer)

    def flush(self) -> None:
        return None  # delivery is a loop callback: nothing blocks it for long

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.network.nodes.pop(self.node_id, None)
