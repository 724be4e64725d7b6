"""Upstream servers and socket helpers shared by the toxiproxy tests.

Everything binds to 127.0.0.1 only.  Upstream servers are plain threaded
sockets so that they share nothing with the asyncio code under test.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

SOCKET_TIMEOUT = 5.0


class Upstream:
    """A threaded TCP server on 127.0.0.1 running ``handler`` per connection."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.handler = handler
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            conn.settimeout(SOCKET_TIMEOUT)
            self.accepted += 1
            self._conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.handler(conn)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()


def echo_handler(conn: socket.socket) -> None:
    conn.settimeout(None)
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.close()


def pattern(n: int) -> bytes:
    """Deterministic, non-repeating-looking payload so truncation is visible."""
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


class Sink:
    """Counts bytes received per connection and records EOF."""

    def __init__(self) -> None:
        self.received = 0
        self.eof = threading.Event()
        self.server = Upstream(self._handle)
        self.address = self.server.address

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        try:
            while data := conn.recv(65536):
                self.received += len(data)
        except OSError:
            pass
        self.eof.set()
        conn.close()


def connect(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT)
    sock.settimeout(SOCKET_TIMEOUT)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"EOF after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def rtt_ms(sock: socket.socket) -> float:
    """One 64-byte round trip through an echo upstream, in milliseconds."""
    payload = pattern(64)
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, 64) == payload
    return (time.monotonic() - start) * 1000


def wait_closed(sock: socket.socket, within: float) -> bytes | None:
    """Read until EOF or reset; returns the payload seen, None on timeout."""
    sock.settimeout(within)
    data = bytearray()
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return bytes(data)


def refused(listen: str) -> bool:
    host, port = listen.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(SOCKET_TIMEOUT)
        return sock.connect_ex((host, int(port))) != 0
