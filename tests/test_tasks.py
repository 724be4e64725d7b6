"""stop_task ends a task even when one cancellation is lost, as Python 3.11's
asyncio.wait_for loses one that arrives together with its inner result."""

from __future__ import annotations

import asyncio

import pytest

from raftmq.tasks import stop_task


async def test_a_task_that_loses_a_cancellation_is_still_stopped():
    lost = []

    async def loop_losing_one_cancel() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)  # what wait_for does when its result came with the cancel

    task = asyncio.get_running_loop().create_task(loop_losing_one_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_task(task), 5)
    assert lost and task.cancelled()


async def test_a_task_that_failed_raises_its_error():
    async def fail() -> None:
        raise ValueError("broken")

    task = asyncio.get_running_loop().create_task(fail())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="broken"):
        await stop_task(task)
