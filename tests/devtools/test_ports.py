"""The port reservation of raftmq.devtools.ports, checked against this kernel: what the
local cluster launcher relies on to hand brokers ports nobody else can take meanwhile."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from raftmq.devtools.ports import PortInUseError, PortReservations, Reuse, reserve


def _bind(port: int, *options: int) -> socket.socket:
    sock = socket.socket()
    try:
        for option in options:
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


@pytest.mark.parametrize("options", [(), (socket.SO_REUSEADDR,)])
def test_a_reserved_port_cannot_be_taken_by_a_bind_without_reuseport(options):
    with reserve() as held:
        port = held.getsockname()[1]
        with pytest.raises(OSError) as exc:
            _bind(port, *options).close()
        assert exc.value.errno == errno.EADDRINUSE


def test_port_0_is_never_given_a_reserved_port():
    with PortReservations() as ports:
        held = {ports.take() for _ in range(20)}
        for _ in range(2000):
            with _bind(0) as other:
                assert other.getsockname()[1] not in held


def test_no_outgoing_connection_is_given_a_reserved_port():
    with PortReservations() as ports, _bind(0) as server:
        held = {ports.take() for _ in range(20)}
        server.listen(64)
        for _ in range(500):
            with socket.create_connection(server.getsockname(), timeout=5) as client:
                assert client.getsockname()[1] not in held
                # Reset rather than close: no TIME_WAIT left behind per connection.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            server.accept()[0].close()


def test_a_reuseport_listener_binds_a_reserved_port_and_gets_its_connections():
    with reserve() as held:
        port = held.getsockname()[1]
        with _bind(port, socket.SO_REUSEADDR, socket.SO_REUSEPORT) as listener:
            listener.listen(8)
            listener.settimeout(5)
            for _ in range(20):  # none may land on the reservation, which does not listen
                with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                    conn, _ = listener.accept()
                    with conn:
                        client.sendall(b"ping")
                        assert conn.recv(4) == b"ping"
        # The listener closed: the port is still ours, and the next one binds it again.
        with _bind(port, socket.SO_REUSEPORT) as again:
            again.listen(1)


def test_an_explicit_port_in_use_is_refused_with_a_sentence():
    with _bind(0) as other:
        other.listen(1)
        port = other.getsockname()[1]
        with PortReservations() as ports, pytest.raises(PortInUseError) as exc:
            ports.take(port, what="broker 2's Raft address")
    assert f"port {port} on 127.0.0.1 (broker 2's Raft address) is in use" in str(exc.value)


def test_an_explicit_port_held_by_another_reservation_is_refused():
    """Two reservations both set SO_REUSEPORT and could share the port: the explicit one
    must see the first and refuse, or two local clusters would split its connections."""
    with PortReservations() as first:
        port = first.take()
        assert port in first
        with PortReservations() as second, pytest.raises(PortInUseError):
            second.take(port)
        assert first.take(port) == port  # held here already: no second reservation


def test_close_releases_every_reservation():
    ports = PortReservations()
    ports.take()
    ports.take()
    socks = list(ports._socks.values())
    ports.close()
    assert ports.ports == [] and all(s.fileno() == -1 for s in socks)


def test_a_reuseaddr_reservation_serves_servers_that_set_only_reuseaddr():
    """Go servers (nats-server) set SO_REUSEADDR and never SO_REUSEPORT."""
    with reserve(reuse=Reuse.ADDR) as held:
        port = held.getsockname()[1]
        for options in [(), (socket.SO_REUSEPORT,)]:
            with pytest.raises(OSError):
                _bind(port, *options).close()
        with _bind(port, socket.SO_REUSEADDR) as listener:
            listener.listen(8)
            listener.settimeout(5)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                listener.accept()[0].close()
            with pytest.raises(OSError):  # two servers never share it
                _bind(port, socket.SO_REUSEADDR).listen(1)
