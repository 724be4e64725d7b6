"""Ports for servers that run in other processes and must be named before they start.

A server in this process binds port 0 and reads back what it got (``asyncio.start_server``
and ``socket.getsockname``); nothing here is needed for it. A multi-process cluster without
a controller cannot do that: the cluster file must name every broker's client (gRPC) and
Raft address before any broker runs, and a broker restarts on the same addresses. Picking a
"free" port, closing it and letting the broker bind it later is a race that loses whenever
another process gets the port in between (``test_three_nodes_over_real_tcp`` failed with
"address already in use" that way).

So the launcher RESERVES each port: it binds a socket with ``SO_REUSEPORT`` (and not
``SO_REUSEADDR``) to 127.0.0.1 and keeps it, bound but not listening, for the cluster's
lifetime. On Linux (checked by tests/devtools/test_ports.py):

- no ``bind(port 0)`` and no outgoing connection elsewhere is ever given a reserved port;
- a bind without ``SO_REUSEPORT`` (plain or ``SO_REUSEADDR``) to it fails, so another program
  cannot take it, even while the broker is down between a kill and a restart;
- a listener of the same user that sets ``SO_REUSEPORT`` binds it, and every connection
  reaches that listener (a socket that does not listen receives none). gRPC servers set it
  by default (``grpc.so_reuseport``); the Raft listener asks for it (``reuse_port=True``).

Why reservation rather than handing the child a listening socket by fd (``pass_fds`` and
``asyncio.start_server(sock=...)``): gRPC Python cannot adopt a socket, so the client port
needs a reservation anyway, and one mechanism for both listeners is simpler to reason about.
The cost: two processes of the same user that both set ``SO_REUSEPORT`` share a port
silently, so "is this port free?" for an EXPLICIT port (``raftmq dev`` on a fixed base port)
is asked first with a bind that does not set it: that fails on any listener or reservation,
and is answered with a sentence saying which port and what to do (:class:`PortInUseError`).

Servers we do not build (nats-server and other Go programs, pysyncobj) set ``SO_REUSEADDR``
and never ``SO_REUSEPORT``. For them :attr:`Reuse.ADDR` holds the port with ``SO_REUSEADDR``
instead: a bind without it fails, no port-0 bind or outgoing connection gets it, a
``SO_REUSEADDR`` listener binds it and gets every connection, and a second listener fails
while the first listens. What it cannot stop is another ``SO_REUSEADDR`` bind while nobody
listens, which is why brokers, which can, use :attr:`Reuse.PORT`.
"""

from __future__ import annotations

import contextlib
import enum
import socket

LOCALHOST = "127.0.0.1"


class Reuse(enum.Enum):
    """The socket option the server that will bind a reserved port sets."""

    PORT = socket.SO_REUSEPORT  # our brokers (gRPC's default, the Raft listener)
    ADDR = socket.SO_REUSEADDR  # servers that set only SO_REUSEADDR (Go's default)


class PortInUseError(OSError):
    """An explicit port is taken by another process; the message says which and for what."""


def _probe_exclusive(host: str, port: int) -> None:
    """Raise OSError if anything else holds ``port``: a listener (with or without
    ``SO_REUSEPORT``) or another reservation. ``SO_REUSEADDR`` makes connections of an
    earlier run still in TIME_WAIT no obstacle, as they are none to a listener."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def reserve(
    port: int = 0, *, host: str = LOCALHOST, what: str = "", reuse: Reuse = Reuse.PORT
) -> socket.socket:
    """A bound, non-listening socket holding ``port`` (0: one the kernel picks) for a
    server that sets ``reuse``. The caller keeps it open as long as the port must stay
    ours. An explicit port that another process holds raises :class:`PortInUseError`;
    ``what`` names its use in the message (e.g. "broker 2's Raft address")."""
    try:
        if port and reuse is Reuse.PORT:
            # Between this probe and the bind below only a process binding this very port
            # explicitly could slip in: the kernel never hands a bound port out for port 0.
            _probe_exclusive(host, port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, reuse.value, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        if not port:
            raise
        raise PortInUseError(
            exc.errno,
            f"port {port} on {host}{f' ({what})' if what else ''} is in use by another "
            f"process: stop that process, or choose other ports",
        ) from None
    return sock


class PortReservations:
    """Ports held together for one cluster's lifetime; :meth:`close` releases them all."""

    def __init__(self, host: str = LOCALHOST, reuse: Reuse = Reuse.PORT) -> None:
        self.host = host
        self.reuse = reuse
        self._socks: dict[int, socket.socket] = {}

    def take(self, port: int = 0, *, what: str = "") -> int:
        """Reserve ``port`` (0: any) and return it; a port already held here is returned
        as is."""
        if port and port in self._socks:
            return port
        sock = reserve(port, host=self.host, what=what, reuse=self.reuse)
        got = int(sock.getsockname()[1])
        self._socks[got] = sock
        return got

    def __contains__(self, port: object) -> bool:
        return port in self._socks

    @property
    def ports(self) -> list[int]:
        return sorted(self._socks)

    def close(self) -> None:
        for sock in self._socks.values():
            with contextlib.suppress(OSError):
                sock.close()
        self._socks.clear()

    def __enter__(self) -> PortReservations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
