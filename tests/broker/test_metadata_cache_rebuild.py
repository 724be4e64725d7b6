"""Issue 20, the broker's metadata cache: a flipped bit anywhere in it (header, body, CRC
trailer), or a file that cannot be read, is set aside with one WARNING naming it and
removed; ``load`` never raises, so the broker starts and waits for the controller's copy,
and the next version it applies is cached afresh."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from raftmq.broker.metadata_cache import CACHE_FILE, MetadataCache
from tests.broker.test_metadata_cache import states


def _written(directory: Path) -> bytes:
    state = states(3)[-1]

    async def run() -> None:
        cache = MetadataCache(directory, "test")
        cache.offer(state)
        await cache.close()

    asyncio.run(run())
    assert MetadataCache(directory, "test").load() == state
    return (directory / CACHE_FILE).read_bytes()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_flipped_bit_anywhere_in_the_cache_is_ignored_removed_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = _written(tmp_path)
    path = tmp_path / CACHE_FILE
    size = len(good)
    step = max(1, size // 40)
    positions = sorted({0, 1, 3, 8, size // 2, size - 5, size - 4, size - 1, *range(0, size, step)})
    for position in positions:
        raw = bytearray(good)
        raw[position] ^= 1 << (position % 8)
        path.write_bytes(bytes(raw))
        caplog.clear()
        cache = MetadataCache(tmp_path, "test")
        with caplog.at_level(logging.WARNING):
            assert cache.load() is None, position
        said = _warnings(caplog)
        assert len(said) == 1, said
        assert str(path) in said[0] and "removed it" in said[0] and "controller" in said[0]
        assert not path.exists()
        assert cache.written_version == 0  # the controller's first version is cached anew
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert MetadataCache(tmp_path, "test").load() is None
        assert _warnings(caplog) == []  # gone: the next start is silent


def test_a_cache_that_cannot_be_read_does_not_stop_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / CACHE_FILE).mkdir()  # EISDIR on read, and it cannot be unlinked either
    with caplog.at_level(logging.WARNING):
        assert MetadataCache(tmp_path, "test").load() is None
    said = _warnings(caplog)
    assert len(said) == 1 and "cannot be read" in said[0] and "remove it by hand" in said[0]


def test_after_a_damaged_cache_the_next_version_is_cached_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = _written(tmp_path)
    path = tmp_path / CACHE_FILE
    path.write_bytes(good[:10] + bytes([good[10] ^ 0x10]) + good[11:])
    newest = states(4)[-1]

    async def run() -> None:
        cache = MetadataCache(tmp_path, "test")
        assert cache.load() is None
        cache.offer(newest)
        await cache.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert MetadataCache(tmp_path, "test").load() == newest
