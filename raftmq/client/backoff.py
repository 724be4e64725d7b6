"""How long a client waits before trying again: exponential from a base, capped, with
jitter (50-150 %) so that clients failed by the same event do not come back in step.
The one rule for every retry loop of the clients (producer, fetcher, group link, the
low-level client)."""

from __future__ import annotations

import asyncio
import random

RETRY_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


def backoff_s(attempt: int, base_s: float = RETRY_BACKOFF_S, max_s: float = MAX_BACKOFF_S) -> float:
    """The wait before retry number ``attempt`` (0 for the first retry)."""
    assert attempt >= 0 and base_s >= 0 and max_s >= 0
    return min(max_s, base_s * 2 ** min(attempt, 20)) * (0.5 + random.random())


async def backoff(attempt: int, base_s: float = RETRY_BACKOFF_S) -> None:
    await asyncio.sleep(backoff_s(attempt, base_s))
