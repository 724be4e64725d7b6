"""Small pieces in isolation: slicing, queues, addresses, the command line."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from chaos.toxiproxy.__main__ import _normalise, build_parser
from chaos.toxiproxy.addresses import join_host_port, resolve_listen, split_host_port
from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.launcher import listening_ports, start_toxiproxy
from chaos.toxiproxy.link import ChunkQueue
from chaos.toxiproxy.toxics import KINDS, Chunk, SlicerKind, parse_attributes

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("size", "average", "variation"),
    [(2048, 64, 0), (1000, 100, 30), (5, 64, 10), (32768, 10, 9), (100, 1, 5)],
)
def test_slicer_pieces_cover_the_chunk_and_respect_the_size(
    size: int, average: int, variation: int
) -> None:
    ends = SlicerKind.split_points(size, average, variation, random.Random(7))
    starts = [0, *ends[:-1]]
    sizes = [end - start for start, end in zip(starts, ends, strict=True)]
    assert ends[-1] == size
    assert all(s > 0 for s in sizes)
    clamped = min(variation, average - 1)
    assert max(sizes) <= average + clamped
    if size > average + clamped:
        assert len(sizes) > 1


def test_slicer_with_zero_average_does_not_split() -> None:
    assert SlicerKind.split_points(100, 0, 0, random.Random()) == [100]


def test_chunk_queue_is_bounded_and_ends_with_none() -> None:
    async def scenario() -> None:
        queue = ChunkQueue(max_chunks=2, max_bytes=1000)
        await queue.put(Chunk(b"a", 0.0))
        await queue.put(Chunk(b"b", 0.0))
        blocked = asyncio.create_task(queue.put(Chunk(b"c", 0.0)))
        await asyncio.sleep(0.01)
        assert not blocked.done()  # full: the reader is pushed back
        assert await queue.get() == Chunk(b"a", 0.0)
        await asyncio.wait_for(blocked, 1)
        queue.finish()
        assert [await queue.get() for _ in range(2)] == [Chunk(b"b", 0.0), Chunk(b"c", 0.0)]
        assert await queue.get() is None

        by_bytes = ChunkQueue(max_chunks=100, max_bytes=10)
        await by_bytes.put(Chunk(b"x" * 10, 0.0))
        stuck = asyncio.create_task(by_bytes.put(Chunk(b"y", 0.0)))
        await asyncio.sleep(0.01)
        assert not stuck.done()
        by_bytes.discard()  # nobody will read: the writer must not hang
        await asyncio.wait_for(stuck, 1)

    asyncio.run(scenario())


def test_addresses() -> None:
    assert split_host_port("127.0.0.1:80") == ("127.0.0.1", 80)
    assert split_host_port("[::1]:8080") == ("::1", 8080)
    assert split_host_port(":0") == ("", 0)
    for bad in ("nope", "1.2.3.4:x", "a:b:c", "[::1]8080", "h:70000"):
        with pytest.raises(ValueError):
            split_host_port(bad)
    assert join_host_port("::1", 5) == "[::1]:5"
    assert resolve_listen("localhost:7070")[1:] == ("127.0.0.1", 7070)
    with pytest.raises(ApiError) as info:
        resolve_listen("nope")
    assert info.value.status == 500


def test_attribute_parsing() -> None:
    latency = KINDS["latency"]
    assert parse_attributes(latency, {"LATENCY": 5.0, "other": "x"}) == {"latency": 5}
    for bad in ({"latency": "5"}, {"latency": True}, {"latency": 2.5}, [1]):
        with pytest.raises(ApiError):
            parse_attributes(latency, bad)


def test_command_line_accepts_go_and_gnu_flag_forms() -> None:
    parser = build_parser()
    go = parser.parse_args(_normalise(["-host", "127.0.0.1", "-port=9999", "-config", "x"]))
    gnu = parser.parse_args(_normalise(["--host", "127.0.0.1", "--port", "9999", "--config=x"]))
    assert (go.host, go.port, go.config) == ("127.0.0.1", 9999, "x")
    assert (gnu.host, gnu.port, gnu.config) == ("127.0.0.1", 9999, "x")
    defaults = parser.parse_args([])
    assert (defaults.host, defaults.port) == ("localhost", 8474)


def test_version_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "chaos.toxiproxy", "-version"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.startswith("toxiproxy-server version 2.")


def test_launcher_with_config_file_and_clean_stop(tmp_path: Path) -> None:
    config = tmp_path / "proxies.json"
    entry = {"name": "cfg", "upstream": "127.0.0.1:1", "listen": "127.0.0.1:0"}
    config.write_text(json.dumps([entry]))
    server = start_toxiproxy(use_binary=False, config=config)
    try:
        assert server.implementation == "python"
        proxies = requests.get(server.api_url + "/proxies", timeout=5).json()
        proxy_port = int(proxies["cfg"]["listen"].rsplit(":", 1)[1])
        assert proxies["cfg"]["enabled"] is True
        # Both bound port 0; the launcher found the API among the server's listeners.
        assert listening_ports(server.process.pid) == {server.port, proxy_port}
        assert 0 not in (server.port, proxy_port)
    finally:
        code = server.stop()
    assert code == 0  # SIGTERM is a clean shutdown
    assert not server.log_path.exists()
