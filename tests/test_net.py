"""raftmq.net is the only way raftmq opens a network endpoint, and what it opens works.

The first holds by a scan of the package's own code (not a convention), so that TLS is
one module's business: a module that opened its own channel or socket would be left in
plaintext. The scan is shown to catch an injected call. The second checks the
factory's pieces against each other on 127.0.0.1 port 0: a channel reaches a port, the
channel options apply (a message above gRPC's default 4 MiB limit comes back), and the
Raft transport's listener and dial carry bytes. With TLS: a mutual-TLS port serves only
a client with a certificate, and rotated files reach the next handshake while an open
connection carries on.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from raftmq import net
from raftmq.devtools import certs
from raftmq.tls_files import SERVER, TlsFileError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raftmq"
FACTORY = PACKAGE / "net.py"
OPENERS = frozenset(
    {
        "insecure_channel",
        "secure_channel",
        "add_insecure_port",
        "add_secure_port",
        "start_server",
        "open_connection",
        "start_unix_server",
        "open_unix_connection",
        "create_server",
        "create_connection",
        "start_http_server",
        "start_wsgi_server",
    }
)
"""Calls that open a gRPC channel or port or a socket endpoint (prometheus-client's HTTP
servers among them), by the called name, whatever
it is called on (``grpc.aio.insecure_channel``, ``self._server.add_insecure_port``,
``loop.create_connection``) or imported as."""


def openers_in(source: str, where: str) -> list[str]:
    """Each call in ``source`` to one of OPENERS, as "where:line name"."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.attr
            if isinstance(func, ast.Attribute)
            else func.id
            if isinstance(func, ast.Name)
            else None
        )
        if name in OPENERS or (name == "server" and _is_grpc(func)):
            found.append(f"{where}:{node.lineno} {name}")
    return found


def _is_grpc(func: ast.expr) -> bool:
    """``grpc.server`` or ``grpc.aio.server`` (a gRPC server is made only by the factory,
    so its interceptors are the same everywhere)."""
    owner = func.value if isinstance(func, ast.Attribute) else None
    while isinstance(owner, ast.Attribute):
        owner = owner.value
    return isinstance(owner, ast.Name) and owner.id == "grpc"


def openers_outside_the_factory() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == FACTORY or "_pb2" in path.name:
            continue  # generated gRPC code only defines stubs
        found += openers_in(path.read_text(), str(path.relative_to(ROOT)))
    return found


def test_only_the_factory_opens_channels_ports_and_sockets():
    assert openers_outside_the_factory() == []


def test_the_scan_catches_an_injected_opener():
    path = PACKAGE / "client" / "lowlevel.py"
    source = path.read_text()
    assert openers_in(source, "lowlevel.py") == []
    injected = [
        "grpc.aio.insecure_channel('127.0.0.1:1')",
        "server.add_insecure_port('127.0.0.1:0')",
        "asyncio.open_connection('127.0.0.1', 1)",
        "from asyncio import start_server\nstart_server(handler, '127.0.0.1', 0)",
        "grpc.aio.server(options=[])",
    ]
    for call in injected:
        found = openers_in(f"{source}\n{call}\n", "lowlevel.py")
        assert len(found) == 1, (call, found)
    # and the factory itself is what the scan would otherwise flag
    assert openers_in(FACTORY.read_text(), "net.py")


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


def _echo_and_health_server(message_limit_bytes: int) -> tuple[grpc.aio.Server, int]:
    server = net.aio_server(max_message_bytes=message_limit_bytes)
    echo = grpc.unary_unary_rpc_method_handler(_echo)  # no (de)serializer: raw bytes
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Echo": echo}),)
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = net.add_port(server, "127.0.0.1:0")
    assert port > 0
    return server, port


async def test_a_factory_channel_talks_to_a_factory_port():
    big = b"x" * (5 << 20)  # above gRPC's default 4 MiB receive limit
    server, port = _echo_and_health_server(len(big) + (1 << 20))
    await server.start()
    try:
        address = f"127.0.0.1:{port}"
        async with net.aio_channel(address) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            echoed = await channel.unary_unary("/test.Echo/Echo")(big, timeout=10)
            assert echoed == big

        def sync_echo() -> bytes:
            with net.channel(address) as channel:
                return channel.unary_unary("/test.Echo/Echo")(big, timeout=10)

        # a blocking call, so off the loop that serves it
        assert await asyncio.to_thread(sync_echo) == big
    finally:
        await server.stop(None)


def test_a_callers_channel_options_are_added_and_win():
    options = dict(net._options([("grpc.max_send_message_length", 1), ("grpc.x", 2)]))
    assert options["grpc.max_send_message_length"] == 1
    assert options["grpc.x"] == 2
    assert options["grpc.max_receive_message_length"] == net.MAX_MESSAGE_BYTES


async def test_a_factory_dial_reaches_a_factory_listener():
    async def shout(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.readline()).upper())
        await writer.drain()
        writer.close()

    server = await net.serve_tcp(shout, "127.0.0.1", 0, reuse_port=True)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await net.connect_tcp("127.0.0.1", port)
        writer.write(b"hello raft\n")
        assert await asyncio.wait_for(reader.readline(), timeout=10) == b"HELLO RAFT\n"
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


def test_the_sync_channel_cache_keeps_one_channel_per_address_until_closed():
    channels = net.Channels()
    first = channels.of("127.0.0.1:1")
    assert channels.of("127.0.0.1:1") is first
    assert channels.of("127.0.0.1:2") is not first
    channels.close()
    assert channels.of("127.0.0.1:1") is not first
    channels.close()


# --- TLS -------------------------------------------------------------------------------


def _pki(folder: Path) -> tuple[certs.Issued, certs.Issued, certs.Issued]:
    """A CA, a server certificate and a client one it signed."""
    ca = certs.make_ca(folder)
    return ca, certs.issue(ca, folder, "server"), certs.issue(ca, folder, "client")


def _server_security(ca: certs.Issued, server: certs.Issued, *, mutual: bool) -> net.Security:
    return net.Security(
        str(ca.cert_file), str(server.cert_file), str(server.key_file), require_client_cert=mutual
    )


def _client_security(ca: certs.Issued, client: certs.Issued | None) -> net.Security:
    if client is None:
        return net.Security(str(ca.cert_file))
    return net.Security(str(ca.cert_file), str(client.cert_file), str(client.key_file))


async def _check(address: str, security: net.Security) -> str:
    """SERVING, or the refusal's gRPC status name."""
    async with net.aio_channel(address, security=security) as channel:
        try:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


async def test_a_mutual_tls_port_serves_a_client_with_a_certificate_only(tmp_path: Path):
    ca, server_cert, client_cert = _pki(tmp_path)
    server = net.aio_server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = net.add_port(
        server, "127.0.0.1:0", security=_server_security(ca, server_cert, mutual=True)
    )
    await server.start()
    try:
        address = f"127.0.0.1:{port}"
        assert await _check(address, _client_security(ca, client_cert)) == "SERVING"
        assert await _check(address, _client_security(ca, None)) == "UNAVAILABLE"
        assert await _check(address, net.PLAINTEXT) == "UNAVAILABLE"
        assert await _check(address, _client_security(ca, client_cert)) == "SERVING"
    finally:
        await server.stop(None)


async def test_the_raft_listener_takes_rotated_files_at_the_next_handshake(tmp_path: Path):
    """A connection opened before the rotation carries on with the old certificate; the
    next one is served the new (the listener's context is fixed when it starts)."""
    ca, server_cert, client_cert = _pki(tmp_path)

    async def shout(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    security = _server_security(ca, server_cert, mutual=True)
    server = await net.serve_tcp(shout, "127.0.0.1", 0, security=security)
    dial = _client_security(ca, client_cert)
    try:
        port = server.sockets[0].getsockname()[1]
        old_reader, old_writer = await net.connect_tcp("127.0.0.1", port, security=dial)
        old_writer.write(b"before\n")
        assert await asyncio.wait_for(old_reader.readline(), 10) == b"BEFORE\n"
        certs.issue(ca, tmp_path, "server", common_name="rotated")
        reader, writer = await net.connect_tcp("127.0.0.1", port, security=dial)
        subject = dict(x[0] for x in writer.get_extra_info("peercert")["subject"])
        assert subject["commonName"] == "rotated"
        writer.write(b"new\n")
        assert await asyncio.wait_for(reader.readline(), 10) == b"NEW\n"
        old_writer.write(b"still\n")  # the connection from before the rotation goes on
        assert await asyncio.wait_for(old_reader.readline(), 10) == b"STILL\n"
        for w in (writer, old_writer):
            w.close()
    finally:
        server.close()
        await server.wait_closed()


def test_files_that_do_not_load_are_refused_at_start_and_skipped_on_reload(tmp_path: Path):
    ca, server_cert, _ = _pki(tmp_path)
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("nonsense")
    with pytest.raises(TlsFileError, match=r"not-a-cert\.pem"):
        net.Security(None, str(bad), str(server_cert.key_file)).files(SERVER)
    files = _server_security(ca, server_cert, mutual=False).files(SERVER)
    version = files.version
    other = certs.issue(ca, tmp_path / "other", "server")
    server_cert.cert_file.write_bytes(other.cert_file.read_bytes())  # the key not yet
    assert not files.refresh() and files.version == version  # the last good pair stays
    server_cert.key_file.write_bytes(other.key_file.read_bytes())
    assert files.refresh() and files.version == version + 1
    with pytest.raises(ValueError, match="needs its key file"):
        net.Security(None, str(server_cert.cert_file))


async def test_a_server_accepts_at_most_its_connection_cap():
    """A broker's server bounds the connections it holds at once (derived from its
    open-file limit): one over the cap is closed as it arrives, and its client is served
    once a connection goes away. Unbounded, a burst of connections took the descriptors
    persists needed."""
    server = net.aio_server(max_connections=2)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = net.add_port(server, "127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    held = []
    try:
        for _ in range(2):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        assert await _check(address, net.PLAINTEXT) == "UNAVAILABLE"
        for _, writer in held:
            writer.close()
        held.clear()

        async def served() -> bool:
            return await _check(address, net.PLAINTEXT) == "SERVING"

        for _ in range(50):
            if await served():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the server never took a connection again")
    finally:
        for _, writer in held:
            writer.close()
        await server.stop(None)
