"""Many callers' small changes gathered into one metadata command per Raft round.

Why: a command that each caller proposed alone would cost a Raft round (and a metadata
version every broker applies) per call; thousands of transaction calls a second would
then be thousands of entries. Here one batch is proposed at a time; what arrives while
it is in its round waits and goes in the next (bounded in items and bytes, under the
metadata command's 1 MiB), and each caller gets its own item's outcome.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from raftmq.controller.quorum import ControllerError, ControllerUnavailableError

I = TypeVar("I")  # noqa: E741 (an item)
O = TypeVar("O")  # noqa: E741 (its outcome)

LINGER_MS = 5.0
"""How long a batch waits for more items when the last one carried several and went out
within :data:`BUSY_WINDOW_S` (items arrive concurrently): the rate of entries is then
bounded whatever the rate of calls, for a few ms more latency under load only; a lone
caller's item goes at once."""
BUSY_WINDOW_S = 0.05


@dataclass(slots=True)
class _Waiting(Generic[I, O]):
    item: I
    size_bytes: int
    done: asyncio.Future[O]


class Batcher(Generic[I, O]):
    """``propose(items)`` proposes one command for ``items`` and returns one outcome per
    item, in order; a ControllerError it raises is every item's."""

    def __init__(
        self,
        propose: Callable[[list[I]], Awaitable[Sequence[O]]],
        *,
        max_items: int,
        max_bytes: int,
        linger_ms: float = LINGER_MS,
        name: str = "batches",
    ) -> None:
        assert max_items >= 1 and max_bytes >= 1
        self._propose = propose
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.linger_s = linger_ms / 1000
        self._name = name
        self._queue: deque[_Waiting[I, O]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._last_s = float("-inf")
        self._last_size = 0
        self.batches = 0
        """Commands proposed so far (tests of the batching read it)."""

    async def submit(self, item: I, size_bytes: int) -> O:
        """``item``'s outcome once the batch holding it applied."""
        loop = asyncio.get_running_loop()
        waiting: _Waiting[I, O] = _Waiting(item, size_bytes, loop.create_future())
        self._queue.append(waiting)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name=self._name)
        return await waiting.done

    async def close(self) -> None:
        """Stop proposing; what still waits is told the controller is stopping."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail(list(self._queue), ControllerUnavailableError("the controller is stopping"))
        self._queue.clear()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            busy = self._last_size > 1 and loop.time() - self._last_s < BUSY_WINDOW_S
            await asyncio.sleep(self.linger_s if busy else 0)  # the ready handlers join
            batch: list[_Waiting[I, O]] = []
            size_bytes = 0
            while self._queue and len(batch) < self.max_items:
                nxt = self._queue[0]
                if batch and size_bytes + nxt.size_bytes > self.max_bytes:
                    break
                batch.append(self._queue.popleft())
                size_bytes += nxt.size_bytes
            self._last_s, self._last_size = loop.time(), len(batch)
            self.batches += 1
            try:
                outcomes = await self._propose([w.item for w in batch])
            except ControllerError as exc:
                self._fail(batch, exc)
                continue
            except asyncio.CancelledError:
                self._fail(batch, ControllerUnavailableError("the controller is stopping"))
                raise
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if not waiting.done.done():  # its caller may have gone (a deadline)
                    waiting.done.set_result(outcome)

    @staticmethod
    def _fail(batch: list[_Waiting[I, O]], exc: ControllerError) -> None:
        for waiting in batch:
            if not waiting.done.done():
                waiting.done.set_exception(exc)
