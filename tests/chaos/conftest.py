"""Fixtures for the toxiproxy tests: the server process and upstream helpers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest
from toxiproxy import Toxiproxy

from chaos.toxiproxy.launcher import RunningToxiproxy, start_toxiproxy
from tests.chaos.helpers import SOCKET_TIMEOUT, Sink, Upstream, echo_handler, pattern


@pytest.fixture(scope="session")
def toxiproxy_server() -> Iterator[RunningToxiproxy]:
    # Always the Python implementation: these tests exist to check it.
    server = start_toxiproxy("127.0.0.1", use_binary=False, log_level="warn")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api_url(toxiproxy_server: RunningToxiproxy) -> str:
    return toxiproxy_server.api_url


@pytest.fixture
def client(toxiproxy_server: RunningToxiproxy) -> Iterator[Toxiproxy]:
    tp = Toxiproxy()
    tp.update_api_consumer(toxiproxy_server.host, toxiproxy_server.port)
    yield tp
    tp.reset()
    tp.destroy_all()


@pytest.fixture
def echo() -> Iterator[Upstream]:
    server = Upstream(echo_handler)
    yield server
    server.close()


@pytest.fixture
def sender() -> Iterator[Callable[[int], Upstream]]:
    """S(n): writes n pattern bytes on connect and keeps the connection open."""
    servers: list[Upstream] = []

    def make(n: int) -> Upstream:
        def handle(conn: socket.socket) -> None:
            conn.sendall(pattern(n))
            time.sleep(SOCKET_TIMEOUT)
            conn.close()

        server = Upstream(handle)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def bye() -> Iterator[Upstream]:
    """C: writes b"bye" and closes."""

    def handle(conn: socket.socket) -> None:
        conn.sendall(b"bye")
        conn.close()

    server = Upstream(handle)
    yield server
    server.close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink()
    yield s
    s.server.close()
