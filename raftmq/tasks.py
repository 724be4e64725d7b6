"""Stopping background asyncio tasks for sure.

A loop stopped by one ``task.cancel()`` can run on: Python 3.11's ``asyncio.wait_for``
returns its inner result instead of raising when the cancellation arrives just as that
result does (CPython gh-86296, fixed in 3.12), so the loop around it never sees the
cancel, and an ``await task`` after the cancel waits forever. That hung a controller
voter's mover on stop, and with it a test, about once in fifteen runs on a loaded
machine. :func:`stop_task` cancels again until the task has ended.
"""

from __future__ import annotations

import asyncio

RECANCEL_S = 0.05
"""How long a cancelled task gets to end before it is cancelled again."""


async def stop_task(task: asyncio.Task[object] | asyncio.Future[object]) -> None:
    """Cancel ``task`` until it has ended, and wait for that. Its cancellation is not
    raised here; any other exception it ended with is."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_S)
    if not task.cancelled():
        exc = task.exception()
        if exc is not None:
            raise exc
