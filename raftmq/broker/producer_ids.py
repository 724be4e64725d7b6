"""Producer ids for idempotent producers (broker.proto InitProducerId), handed out by any
broker from a block it took from the controller (controller.proto AllocateProducerIds).

Blocks, not one id per call: a block is one metadata entry, so a thousand producers
starting cost one Raft round, not a thousand. An id is never reused, even when a broker
restarts with part of its block unused (the rest is skipped: 2^63 ids last for ever).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

BLOCK_SIZE = 1000
ALLOCATE_TIMEOUT_S = 10.0
"""How long an InitProducerId waits for the controller before answering a retriable
refusal (the link itself retries until a controller leader answers)."""


class ProducerIdBlocks:
    def __init__(self, allocate: Callable[[int], Awaitable[tuple[int, int]]]) -> None:
        """``allocate(count)``: a new block from the controller, as (first id, count)."""
        self._allocate = allocate
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        """The next unused id; raises TimeoutError when no controller answered in time."""
        async with self._lock:
            if self._next >= self._end:
                first, count = await asyncio.wait_for(
                    self._allocate(BLOCK_SIZE), ALLOCATE_TIMEOUT_S
                )
                assert count > 0, count
                self._next, self._end = first, first + count
            producer_id = self._next
            self._next += 1
            return producer_id
