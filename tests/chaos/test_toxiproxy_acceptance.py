"""The 15 acceptance tests of docs/toxiproxy-compat-spec section 4.

Each drives the server through the real toxiproxy-python client, with the
server in its own process and every byte going over real loopback sockets.
Timing bounds are deliberately loose: the CI machine has two shared cores.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import threading
import time

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.api import validate_response
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.proxy import Proxy

from raftmq.devtools.ports import reserve
from tests.chaos.helpers import (
    Sink,
    Upstream,
    connect,
    pattern,
    recv_exactly,
    refused,
    rtt_ms,
    wait_closed,
)

pytestmark = [pytest.mark.timeout(30), pytest.mark.serial]  # latency bounds in ms


def _port(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def test_1_api_basics_and_errors(client: Toxiproxy, api_url: str) -> None:
    assert client.running() is True
    assert isinstance(json.loads(client.version())["version"], str)
    assert client.proxies() == {}

    response = requests.get(api_url + "/nope", timeout=5)
    assert response.status_code == 404
    with pytest.raises(NotFound):
        validate_response(response)

    response = requests.post(api_url + "/proxies", json={"name": "x"}, timeout=5)
    assert response.status_code == 400
    assert response.json() == {"error": "missing required field: upstream", "status": 400}

    response = requests.post(api_url + "/proxies", data=b"{not json", timeout=5)
    assert response.status_code == 400
    assert response.json()["status"] == 400

    ghost = Proxy(name="ghost", upstream="127.0.0.1:1", enabled=True, listen="127.0.0.1:1")
    with pytest.raises(NotFound):
        ghost.toxics()
    with pytest.raises(NotFound):
        ghost.disable()
    with pytest.raises(NotFound):
        ghost.destroy_toxic("x")


def test_2_create_get_duplicate_disabled_populate(
    client: Toxiproxy, api_url: str, echo: Upstream
) -> None:
    p1 = client.create(upstream=echo.address, name="p1")
    assert p1.enabled is True
    assert p1.upstream == echo.address
    match = re.fullmatch(r"127\.0\.0\.1:(\d+)", p1.listen)
    assert match and int(match.group(1)) != 0
    assert not refused(p1.listen)

    raw = requests.get(api_url + "/proxies/p1", timeout=5)
    assert raw.status_code == 200
    assert raw.json()["toxics"] == []

    with pytest.raises(ProxyExists):
        client.create(upstream=echo.address, name="p1")
    dup = requests.post(
        api_url + "/proxies",
        json={"name": "p1", "upstream": echo.address, "listen": "127.0.0.1:0"},
        timeout=5,
    )
    assert dup.status_code == 409
    assert dup.json()["error"] == "proxy already exists"

    p2 = client.create(upstream=echo.address, name="p2", listen="127.0.0.1:0", enabled=False)
    assert p2.listen == "127.0.0.1:0"  # not bound yet: no port to report
    assert p2.enabled is False
    p2.enable()
    listen2 = client.get_proxy("p2").listen
    assert listen2 != "127.0.0.1:0"
    assert not refused(listen2)
    p2.disable()
    assert refused(listen2)
    p2.enable()  # binds the same port again
    assert client.get_proxy("p2").listen == listen2
    assert not refused(listen2)

    clash = requests.post(
        api_url + "/proxies",
        json={"name": "clash", "upstream": echo.address, "listen": p1.listen},
        timeout=5,
    )
    assert clash.status_code == 500
    assert clash.json()["status"] == 500 and clash.json()["error"]
    assert "clash" not in client.proxies()

    entry = {"name": "p3", "upstream": echo.address, "listen": "127.0.0.1:0"}
    created = client.populate([entry])
    assert len(created) == 1
    p3 = created[0]
    entry["listen"] = p3.listen  # the port it got: the same proxy from now on
    p3.add_toxic(type="latency", attributes={"latency": 10})
    assert client.populate([entry]) == []
    assert list(client.get_proxy("p3").toxics()) == ["latency_downstream"]


def test_3_byte_exact_proxying(client: Toxiproxy, echo: Upstream) -> None:
    p1 = client.create(upstream=echo.address, name="p1")

    blob = os.urandom(1024 * 1024)
    with connect(p1.listen) as sock:
        sender = threading.Thread(target=sock.sendall, args=(blob,))
        sender.start()
        assert recv_exactly(sock, len(blob)) == blob
        sender.join()

    with connect(p1.listen) as sock:
        rtts = [rtt_ms(sock) for _ in range(200)]
    assert statistics.median(rtts) < 20

    results: list[bool] = []

    def one_connection() -> None:
        payload = os.urandom(64 * 1024)
        with connect(p1.listen) as sock:
            writer = threading.Thread(target=sock.sendall, args=(payload,))
            writer.start()
            results.append(recv_exactly(sock, len(payload)) == payload)
            writer.join()

    threads = [threading.Thread(target=one_connection) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == [True] * 5

    with reserve() as nobody:  # held, never listening: connections to it are refused
        dead = client.create(upstream=f"127.0.0.1:{nobody.getsockname()[1]}", name="dead")
    with connect(dead.listen) as sock:
        start = time.monotonic()
        assert wait_closed(sock, 1.0) == b""
        assert time.monotonic() - start < 1.0


def test_4_latency(client: Toxiproxy, echo: Upstream) -> None:
    p1 = client.create(upstream=echo.address, name="p1")
    with connect(p1.listen) as c:
        assert rtt_ms(c) < 50
        assert p1.add_toxic(type="latency", attributes={"latency": 300}) is None
        toxic = p1.toxics()["latency_downstream"]
        assert toxic.stream == "downstream"
        assert toxic.toxicity == 1.0
        assert toxic.attributes == {"latency": 300, "jitter": 0}

        assert 300 <= rtt_ms(c) <= 450  # on the connection opened before
        with connect(p1.listen) as fresh:
            assert 300 <= rtt_ms(fresh) <= 450

        p1.add_toxic(type="latency", name="lat_up", stream="upstream", attributes={"latency": 200})
        assert 500 <= rtt_ms(c) <= 700


def test_5_deleting_a_toxic_restores_traffic(client: Toxiproxy, echo: Upstream) -> None:
    p1 = client.create(upstream=echo.address, name="p1")
    with connect(p1.listen) as c:
        p1.add_toxic(type="latency", attributes={"latency": 300})
        p1.add_toxic(type="latency", name="lat_up", stream="upstream", attributes={"latency": 200})
        assert rtt_ms(c) >= 500

        # Sent while both toxics hold it; deleting them must release it intact.
        payload = pattern(64)
        start = time.monotonic()
        c.sendall(payload)
        time.sleep(0.05)
        assert p1.destroy_toxic("latency_downstream") is True
        assert p1.destroy_toxic("lat_up") is True
        assert recv_exactly(c, 64) == payload
        assert time.monotonic() - start < 0.4

        assert p1.toxics() == {}
        assert rtt_ms(c) < 50

    with pytest.raises(NotFound):
        p1.destroy_toxic("lat_up")
    p1.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(ProxyExists):
        p1.add_toxic(type="latency", attributes={"latency": 1})
    with pytest.raises(InvalidToxic):
        p1.add_toxic(type="bogus")
    with pytest.raises(InvalidToxic):
        p1.add_toxic(type="latency", stream="sideways")


def test_6_down_disable_and_enable(client: Toxiproxy, echo: Upstream) -> None:
    p1 = client.create(upstream=echo.address, name="p1")
    p1.add_toxic(type="latency", attributes={"latency": 200})
    with connect(p1.listen) as c:
        assert rtt_ms(c) >= 200
        p1.disable()
        start = time.monotonic()
        assert wait_closed(c, 1.0) == b""
        assert time.monotonic() - start < 1.0
    with pytest.raises(ConnectionRefusedError):
        connect(p1.listen)
    listed = client.get_proxy("p1")
    assert listed.enabled is False
    assert listed.listen == p1.listen

    p1.enable()
    with connect(p1.listen) as c:
        assert 200 <= rtt_ms(c) <= 400
    assert list(p1.toxics()) == ["latency_downstream"]

    with p1.down():
        assert refused(p1.listen)
    with connect(p1.listen) as c:
        assert rtt_ms(c) >= 200


def test_7_timeout_zero_holds_forever_and_drops(client: Toxiproxy, sink: Sink) -> None:
    p = client.create(upstream=sink.address, name="pt")
    p.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    with connect(p.listen) as c:
        c.sendall(b"ping")
        c.settimeout(1.0)
        with pytest.raises(TimeoutError):
            c.recv(10)
        assert sink.received == 0

        start = time.monotonic()
        assert p.destroy_toxic("timeout_upstream") is True
        assert time.monotonic() - start < 1.0
        assert wait_closed(c, 1.0) == b""
    assert sink.eof.wait(2.0)

    with connect(p.listen) as c:
        c.sendall(b"hello")
        deadline = time.monotonic() + 2.0
        while sink.received < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sink.received == 5


def test_8_timeout_closes(client: Toxiproxy, echo: Upstream) -> None:
    p = client.create(upstream=echo.address, name="pt")
    p.add_toxic(type="timeout", attributes={"timeout": 500})
    with connect(p.listen) as c:
        start = time.monotonic()
        c.sendall(b"ping")
        assert wait_closed(c, 2.0) == b""
        elapsed = time.monotonic() - start
    assert 0.45 <= elapsed <= 1.2


def test_9_reset_peer(client: Toxiproxy, echo: Upstream) -> None:
    p = client.create(upstream=echo.address, name="pr")
    p.add_toxic(type="reset_peer", attributes={"timeout": 0})
    with connect(p.listen) as c:
        c.sendall(b"ping")
        c.settimeout(1.0)
        with pytest.raises(ConnectionResetError):
            c.recv(10)

    p.destroy_toxic("reset_peer_downstream")
    p.add_toxic(type="reset_peer", attributes={"timeout": 500})
    with connect(p.listen) as c, connect(p.listen) as quiet:
        start = time.monotonic()
        c.sendall(b"ping")
        c.settimeout(2.0)
        with pytest.raises(ConnectionResetError):
            c.recv(10)
        assert 0.45 <= time.monotonic() - start <= 1.2

        time.sleep(max(0.0, 1.0 - (time.monotonic() - start)))
        quiet.settimeout(0.05)
        with pytest.raises(TimeoutError):
            quiet.recv(10)  # still open: no data, no EOF, no reset


def _receive_all(listen: str, n: int) -> tuple[bytes, float]:
    start = time.monotonic()
    with connect(listen) as sock:
        data = recv_exactly(sock, n)
    return data, time.monotonic() - start


def test_10_bandwidth(client: Toxiproxy, sender) -> None:
    upstream = sender(200_000)
    p = client.create(upstream=upstream.address, name="pb")
    p.add_toxic(type="bandwidth", attributes={"rate": 100})
    data, elapsed = _receive_all(p.listen, 200_000)
    assert data == pattern(200_000)
    assert 1.6 <= elapsed <= 3.0

    p.destroy_toxic("bandwidth_downstream")
    data, elapsed = _receive_all(p.listen, 200_000)
    assert data == pattern(200_000)
    assert elapsed < 0.5


def test_11_slow_close(client: Toxiproxy, bye: Upstream) -> None:
    p = client.create(upstream=bye.address, name="ps")
    p.add_toxic(type="slow_close", attributes={"delay": 500})
    start = time.monotonic()
    with connect(p.listen) as c:
        assert recv_exactly(c, 3) == b"bye"
        assert time.monotonic() - start < 0.2
        assert wait_closed(c, 2.0) == b""
    assert 0.45 <= time.monotonic() - start <= 1.2

    p.destroy_toxic("slow_close_downstream")
    start = time.monotonic()
    with connect(p.listen) as c:
        assert wait_closed(c, 2.0) == b"bye"
    assert time.monotonic() - start < 0.2


def test_12_limit_data(client: Toxiproxy, sender, sink: Sink) -> None:
    upstream = sender(5000)
    p = client.create(upstream=upstream.address, name="pl")
    p.add_toxic(type="limit_data", attributes={"bytes": 1000})
    with connect(p.listen) as c:
        assert wait_closed(c, 2.0) == pattern(1000)

    q = client.create(upstream=sink.address, name="pl2")
    q.add_toxic(type="limit_data", stream="upstream", attributes={"bytes": 10})
    with connect(q.listen) as c:
        start = time.monotonic()
        c.sendall(pattern(100))
        assert sink.eof.wait(2.0)
        assert sink.received == 10
        assert wait_closed(c, 1.0) == b""
        assert time.monotonic() - start < 1.0


def test_13_slicer(client: Toxiproxy, echo: Upstream) -> None:
    p = client.create(upstream=echo.address, name="psl")
    p.add_toxic(
        type="slicer", attributes={"average_size": 64, "size_variation": 0, "delay": 20_000}
    )
    payload = os.urandom(2048)
    with connect(p.listen) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.monotonic()
        c.sendall(payload)
        pieces: list[bytes] = []
        while sum(map(len, pieces)) < len(payload):
            piece = c.recv(65536)
            assert piece
            pieces.append(piece)
        elapsed = time.monotonic() - start
    assert b"".join(pieces) == payload
    assert elapsed >= 0.2
    assert len(pieces) >= 5
    assert max(map(len, pieces)) <= 256


def test_14_toxicity(client: Toxiproxy, echo: Upstream) -> None:
    p = client.create(upstream=echo.address, name="px")
    p.add_toxic(type="latency", name="never", toxicity=0.0, attributes={"latency": 500})
    assert p.toxics()["never"].toxicity == 0.0
    for _ in range(5):
        with connect(p.listen) as c:
            assert rtt_ms(c) < 100

    p.destroy_toxic("never")
    p.add_toxic(type="latency", name="never", toxicity=1.0, attributes={"latency": 500})
    for _ in range(5):
        with connect(p.listen) as c:
            assert rtt_ms(c) >= 500


def test_15_reset(client: Toxiproxy, echo: Upstream) -> None:
    pa = client.create(upstream=echo.address, name="pA")
    pb = client.create(upstream=echo.address, name="pB")
    pa.add_toxic(type="latency", attributes={"latency": 300})
    pb.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    pa.disable()
    assert refused(pa.listen)

    assert client.reset() is True
    proxies = client.proxies()
    assert set(proxies) == {"pA", "pB"}
    assert proxies["pA"].enabled and proxies["pB"].enabled
    assert proxies["pA"].listen == pa.listen
    assert pa.toxics() == {} and pb.toxics() == {}
    for proxy in (pa, pb):
        with connect(proxy.listen) as c:
            assert rtt_ms(c) < 50
    assert client.reset() is True
