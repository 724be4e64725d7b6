"""Data-path semantics and clean-up, with the server running in this process.

Running in-process lets these tests look at internal state (open connection
counts) that the HTTP API does not expose; the server still runs on its own
event loop thread and is reached over loopback sockets only.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import requests

from chaos.toxiproxy.server import ToxiproxyServer
from tests.chaos.helpers import Upstream, connect, pattern, recv_exactly, rtt_ms, wait_closed

pytestmark = [pytest.mark.timeout(30), pytest.mark.serial]  # latency bounds in ms

T = TypeVar("T")


class InProcess:
    """A ToxiproxyServer on a private event loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = ToxiproxyServer(seed=1)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start("127.0.0.1", 0))
        self.api = f"http://127.0.0.1:{self.server.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(5)

    def connections(self, name: str) -> int:
        async def count() -> int:
            return self.server.registry.get(name).connection_count

        return self.call(count())

    def create(self, name: str, upstream: str) -> str:
        body = {"name": name, "upstream": upstream, "listen": "127.0.0.1:0"}
        response = requests.post(f"{self.api}/proxies", json=body, timeout=5)
        assert response.status_code == 201
        return response.json()["listen"]

    def toxic(self, proxy: str, **body: object) -> None:
        response = requests.post(f"{self.api}/proxies/{proxy}/toxics", json=body, timeout=5)
        assert response.status_code == 200, response.text

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def inproc() -> Iterator[InProcess]:
    server = InProcess()
    yield server
    server.close()


def _eventually(predicate: Callable[[], bool], within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_disable_and_delete_release_connections(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    inproc.toxic("p", type="latency", attributes={"latency": 1000})
    socks = [connect(listen) for _ in range(3)]
    for sock in socks:
        sock.sendall(b"held in the latency toxic")
    assert _eventually(lambda: inproc.connections("p") == 3)
    requests.post(f"{inproc.api}/proxies/p", json={"enabled": False}, timeout=5)
    assert inproc.connections("p") == 0
    for sock in socks:
        assert wait_closed(sock, 1.0) == b""
        sock.close()
    requests.post(f"{inproc.api}/proxies/p", json={"enabled": True}, timeout=5)
    with connect(listen) as sock:
        sock.sendall(b"x")
        assert _eventually(lambda: inproc.connections("p") == 1)
        assert requests.delete(f"{inproc.api}/proxies/p", timeout=5).status_code == 204
        assert wait_closed(sock, 1.0) == b""


def test_connections_are_forgotten_after_a_normal_close(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    for _ in range(5):
        with connect(listen) as sock:
            assert rtt_ms(sock) < 100
    assert _eventually(lambda: inproc.connections("p") == 0)


def test_latency_is_pipelined_not_cumulative(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    inproc.toxic("p", type="latency", attributes={"latency": 300})
    with connect(listen) as sock:
        start = time.monotonic()
        for i in range(10):
            sock.sendall(pattern(100 + i))
            time.sleep(0.02)
        received = recv_exactly(sock, sum(100 + i for i in range(10)))
        elapsed = time.monotonic() - start
    assert received == b"".join(pattern(100 + i) for i in range(10))
    # Ten chunks 20 ms apart: about 0.2 + 0.3 s, far below 10 x 0.3 s.
    assert 0.45 <= elapsed <= 1.2


def test_toxic_churn_keeps_bytes_exact(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    # A permanent cap (about 0.5 s for the payload) so the churn overlaps the transfer.
    inproc.toxic("p", name="cap", type="bandwidth", attributes={"rate": 1000})
    payload = os.urandom(512 * 1024)
    stop = threading.Event()
    churned: list[str] = []
    errors: list[BaseException] = []

    def churn() -> None:
        kinds = [
            {"type": "latency", "attributes": {"latency": 5, "jitter": 5}},
            {"type": "slicer", "attributes": {"average_size": 500, "size_variation": 100}},
            {"type": "bandwidth", "attributes": {"rate": 5000}},
            {"type": "noop"},
        ]
        try:
            i = 0
            while not stop.is_set():
                name = f"t{i}"
                stream = "upstream" if i % 2 else "downstream"
                inproc.toxic("p", name=name, stream=stream, **kinds[i % len(kinds)])
                time.sleep(0.01)
                deleted = requests.delete(f"{inproc.api}/proxies/p/toxics/{name}", timeout=5)
                assert deleted.status_code == 204
                churned.append(name)
                i += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        with connect(listen) as sock:
            start = time.monotonic()
            writer = threading.Thread(target=sock.sendall, args=(payload,))
            writer.start()
            assert recv_exactly(sock, len(payload)) == payload
            elapsed = time.monotonic() - start
            writer.join()
    finally:
        stop.set()
        churner.join(5)
    assert errors == []
    # 524 288 bytes at 1 000 000 B/s: the cap must hold while others churn.
    assert 0.45 <= elapsed <= 1.5
    assert len(churned) >= 5


def test_bandwidth_zero_stalls_until_removed(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    inproc.toxic("p", type="bandwidth", attributes={"rate": 0})
    with connect(listen) as sock:
        sock.sendall(b"stalled")
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        requests.delete(f"{inproc.api}/proxies/p/toxics/bandwidth_downstream", timeout=5)
        sock.settimeout(1.0)
        assert recv_exactly(sock, 7) == b"stalled"


def test_limit_data_counter_survives_update(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    inproc.toxic("p", type="limit_data", attributes={"bytes": 10})
    with connect(listen) as sock:
        sock.sendall(b"123456")
        assert recv_exactly(sock, 6) == b"123456"
        requests.post(
            f"{inproc.api}/proxies/p/toxics/limit_data_downstream",
            json={"attributes": {"bytes": 8}},
            timeout=5,
        )
        sock.sendall(b"abcdef")
        assert wait_closed(sock, 1.0) == b"ab"


def test_reset_peer_added_to_live_connection_sends_rst(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    with connect(listen) as sock:
        assert rtt_ms(sock) < 100
        inproc.toxic("p", type="reset_peer", stream="upstream", attributes={"timeout": 0})
        sock.sendall(b"boom")
        sock.settimeout(1.0)
        with pytest.raises(ConnectionResetError):
            sock.recv(10)


def test_reset_closes_connections_held_by_timeout(inproc: InProcess, echo: Upstream) -> None:
    listen = inproc.create("p", echo.address)
    inproc.toxic("p", type="timeout", attributes={"timeout": 0})
    with connect(listen) as sock:
        sock.sendall(b"dropped")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert requests.post(f"{inproc.api}/reset", timeout=5).status_code == 204
        assert wait_closed(sock, 1.0) == b""


def test_slow_close_upstream_delays_server_side_close(inproc: InProcess) -> None:
    closed_at: list[float] = []

    def handler(conn: socket.socket) -> None:
        while conn.recv(100):
            pass
        closed_at.append(time.monotonic())

    upstream = Upstream(handler)
    try:
        listen = inproc.create("p", upstream.address)
        inproc.toxic("p", type="slow_close", stream="upstream", attributes={"delay": 400})
        sock = connect(listen)
        time.sleep(0.05)
        start = time.monotonic()
        sock.close()
        assert _eventually(lambda: bool(closed_at), within=2.0)
        assert 0.35 <= closed_at[0] - start <= 1.0
    finally:
        upstream.close()
