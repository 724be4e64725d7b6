"""Linearizable reads without writing to the log (the read index, thesis §6.4).

A read that arrives at the leader is served at the leader's commit index *at arrival*,
but only after a quorum has answered a heartbeat sent after the arrival: that proves no
newer leader existed at that moment, so no write committed before the read began can be
missing from that index.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Request:
    src: int
    index: int
    acks: set[int] = field(default_factory=set)


class ReadIndexQueue:
    """Reads awaiting confirmation, in arrival order, keyed by the caller's context."""

    def __init__(self) -> None:
        self._pending: OrderedDict[bytes, _Request] = OrderedDict()
        self.waiting: list[tuple[int, bytes]] = []
        """Reads that arrived before this leader committed an entry of its term."""

    def clear(self) -> None:
        self._pending.clear()
        self.waiting.clear()

    def add(self, src: int, ctx: bytes, index: int) -> None:
        if ctx in self._pending:
            return  # a duplicated request: the first one will answer
        self._pending[ctx] = _Request(src, index)

    def last_context(self) -> bytes:
        """The context heartbeats carry: an ack of it confirms every earlier request."""
        return next(reversed(self._pending)) if self._pending else b""

    def ack(
        self, node: int, ctx: bytes, voters: frozenset[int], quorum: int
    ) -> list[tuple[int, bytes, int]]:
        """Record ``node``'s ack; return (src, ctx, index) of every read now confirmed."""
        req = self._pending.get(ctx)
        if req is None or node not in voters:
            return []
        req.acks.add(node)
        if len(req.acks) < quorum:
            return []
        released = []
        while self._pending:
            c, r = self._pending.popitem(last=False)
            released.append((r.src, c, r.index))
            if c == ctx:
                break
        return released
