"""The broker's on-disk copy of its newest metadata (raftmq.broker.metadata_cache)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from raftmq.broker.metadata_cache import CACHE_FILE, MetadataCache, without_lost_topics
from raftmq.controller.commands import CreateTopic
from raftmq.controller.model import MetadataState
from tests.controller.machine import Driver


def states(count: int) -> list[MetadataState]:
    """``count`` successive states of one cluster, each with one more topic."""
    driver = Driver()
    for b in (1, 2, 3):
        driver.register(b)
    out = []
    for i in range(count):
        driver(CreateTopic(f"t{i}", 1, 3, {}, ()))
        out.append(driver.machine.state)
    return out


def test_a_burst_of_versions_costs_one_write_and_the_newest_is_read_back(
    tmp_path: Path,
) -> None:
    burst = states(20)

    async def run() -> MetadataCache:
        cache = MetadataCache(tmp_path, "test", min_interval_s=30.0)
        cache.start()
        cache.offer(burst[0])
        await asyncio.sleep(0.2)  # the first is written at once
        for state in burst[1:]:
            cache.offer(state)
        await cache.close()  # the rest: one write of the newest
        return cache

    cache = asyncio.run(run())
    assert cache.writes == 2
    loaded = MetadataCache(tmp_path, "test").load()
    assert loaded == burst[-1]


def test_an_older_version_never_replaces_a_newer_one(tmp_path: Path) -> None:
    old, new = states(2)

    async def run() -> None:
        cache = MetadataCache(tmp_path, "test")
        cache.offer(new)
        cache.offer(old)
        await cache.close()

    asyncio.run(run())
    assert MetadataCache(tmp_path, "test").load() == new


def test_a_damaged_or_foreign_cache_is_ignored(tmp_path: Path) -> None:
    (state,) = states(1)

    async def run() -> None:
        cache = MetadataCache(tmp_path, "test")
        cache.offer(state)
        await cache.close()

    asyncio.run(run())
    assert MetadataCache(tmp_path, "another-cluster").load() is None
    path = tmp_path / CACHE_FILE
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert MetadataCache(tmp_path, "test").load() is None
    assert MetadataCache(tmp_path / "missing", "test").load() is None


def test_a_state_above_the_bound_is_not_cached(tmp_path: Path) -> None:
    small, big = states(2)

    async def run() -> None:
        cache = MetadataCache(tmp_path, "test")
        cache.offer(small)
        await cache.close()
        cache = MetadataCache(tmp_path, "test", max_bytes=10)
        cache.offer(big)
        await cache.close()

    asyncio.run(run())
    # Not the older copy either: a restart from it would reopen what is gone since.
    assert MetadataCache(tmp_path, "test").load() is None


def test_topics_hosted_here_but_gone_from_the_disk_are_left_out() -> None:
    """t0 and t1 have a replica on every broker; only t0's is still on disk."""
    (state,) = states(2)[-1:]
    kept = without_lost_topics(state, 1, lambda topic, p: topic == "t0")
    assert set(kept.topics) == {"t0"}
    assert kept.version == state.version and kept.brokers == state.brokers
    # A broker hosting nothing of them keeps them all (Metadata answers for them).
    assert without_lost_topics(state, 9, lambda topic, p: False) == state
