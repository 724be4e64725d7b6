"""HTTP API details beyond what toxiproxy-python exercises (raw requests)."""

from __future__ import annotations

import re
import socket

import pytest
import requests

from tests.chaos.helpers import Upstream, connect, refused, rtt_ms

pytestmark = [pytest.mark.timeout(30), pytest.mark.serial]  # latency bounds in ms


@pytest.fixture
def api(api_url: str, client) -> str:
    """The API URL, with the client fixture's reset/destroy_all teardown."""
    return api_url


def _create(api: str, name: str, upstream: str, **extra: object) -> dict:
    body = {"name": name, "upstream": upstream, "listen": "127.0.0.1:0", **extra}
    response = requests.post(f"{api}/proxies", json=body, timeout=5)
    assert response.status_code == 201, response.text
    return response.json()


def test_toxic_defaults_order_and_single_get(api: str, echo: Upstream) -> None:
    _create(api, "p", echo.address)
    url = f"{api}/proxies/p/toxics"
    down = requests.post(url, json={"type": "latency"}, timeout=5)
    assert down.status_code == 200
    assert down.json() == {
        "attributes": {"latency": 0, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
    }
    # Keys and stream are matched case-insensitively; unknown keys are ignored.
    up = requests.post(
        url,
        json={
            "Type": "slicer",
            "Stream": "UpStream",
            "name": "",
            "bogus": 1,
            "attributes": {"average_size": 10.0, "nope": "x"},
        },
        timeout=5,
    )
    assert up.status_code == 200, up.text
    assert up.json()["name"] == "slicer_upstream"
    assert up.json()["attributes"] == {"average_size": 10, "size_variation": 0, "delay": 0}
    requests.post(url, json={"type": "noop", "name": "n2"}, timeout=5)

    names = [t["name"] for t in requests.get(url, timeout=5).json()]
    assert names == ["slicer_upstream", "latency_downstream", "n2"]
    assert requests.get(f"{url}/n2", timeout=5).json()["type"] == "noop"
    missing = requests.get(f"{url}/zzz", timeout=5)
    assert missing.status_code == 404
    assert missing.json() == {"error": "toxic not found", "status": 404}

    proxy = requests.get(f"{api}/proxies/p", timeout=5).json()
    assert [t["name"] for t in proxy["toxics"]] == names


def test_toxic_validation(api: str, echo: Upstream) -> None:
    _create(api, "p", echo.address)
    url = f"{api}/proxies/p/toxics"

    def post(body: dict) -> requests.Response:
        return requests.post(url, json=body, timeout=5)

    assert post({"type": "latency", "attributes": {"latency": "slow"}}).status_code == 400
    assert post({"type": "latency", "attributes": {"latency": 1.5}}).status_code == 400
    assert post({"type": "down"}).json()["error"] == "invalid toxic type"
    assert post({"type": "latency", "stream": "x"}).json()["error"] == (
        "stream was invalid, can be either upstream or downstream"
    )
    assert post({"type": "noop", "name": "same"}).status_code == 200
    # Names are unique across both streams.
    clash = post({"type": "noop", "name": "same", "stream": "upstream"})
    assert clash.status_code == 409
    assert clash.json()["error"] == "toxic already exists"
    assert requests.post(url, data=b"[", timeout=5).status_code == 400
    ghost = requests.post(f"{api}/proxies/ghost/toxics", json={"type": "noop"}, timeout=5)
    assert ghost.json() == {"error": "proxy not found", "status": 404}


def test_toxic_update_merges_and_applies_to_live_connections(api: str, echo: Upstream) -> None:
    proxy = _create(api, "p", echo.address)
    url = f"{api}/proxies/p/toxics"
    requests.post(
        url, json={"type": "latency", "attributes": {"latency": 0, "jitter": 5}}, timeout=5
    )
    with connect(proxy["listen"]) as c:
        assert rtt_ms(c) < 100
        updated = requests.patch(
            f"{url}/latency_downstream",
            json={"attributes": {"latency": 250}, "name": "renamed", "stream": "upstream"},
            timeout=5,
        )
        assert updated.status_code == 200
        assert updated.json()["attributes"] == {"latency": 250, "jitter": 5}
        assert updated.json()["name"] == "latency_downstream"
        assert updated.json()["stream"] == "downstream"
        assert 240 <= rtt_ms(c) <= 450
        # POST works as an update too (toxiproxy-python only knows POST).
        off = requests.post(f"{url}/latency_downstream", json={"toxicity": 0}, timeout=5)
        assert off.json()["toxicity"] == 0.0
        assert rtt_ms(c) < 100


def test_proxy_update_and_listen_resolution(api: str, echo: Upstream) -> None:
    proxy = _create(api, "p", echo.address, listen="localhost:0")
    assert re.fullmatch(r"127\.0\.0\.1:[1-9][0-9]*", proxy["listen"]), proxy["listen"]
    with connect(proxy["listen"]) as c:
        assert rtt_ms(c) < 100
        other = Upstream(lambda conn: conn.close())
        try:
            # Changing the upstream restarts the proxy: live connections drop.
            changed = requests.post(
                f"{api}/proxies/p", json={"upstream": other.address, "name": "x"}, timeout=5
            )
            assert changed.status_code == 200
            assert changed.json()["name"] == "p"
            assert changed.json()["upstream"] == other.address
            assert changed.json()["enabled"] is True
            c.settimeout(1.0)
            assert c.recv(10) == b""
        finally:
            other.close()
    same = requests.patch(f"{api}/proxies/p", json={"enabled": True}, timeout=5)
    assert same.status_code == 200
    assert requests.post(f"{api}/proxies/p", data=b"nope", timeout=5).status_code == 400
    assert requests.delete(f"{api}/proxies/p", timeout=5).status_code == 204
    assert refused(proxy["listen"])
    assert requests.delete(f"{api}/proxies/p", timeout=5).status_code == 404


def test_populate_endpoint(api: str, echo: Upstream) -> None:
    listen = "127.0.0.1:0"
    bad = requests.post(
        f"{api}/populate",
        json=[{"name": "a", "upstream": echo.address, "listen": listen}, {"name": "b"}],
        timeout=5,
    )
    assert bad.status_code == 400
    assert bad.json()["error"] == "missing required field: upstream at proxy 2"
    assert requests.get(f"{api}/proxies", timeout=5).json() == {}

    entries = [{"name": "a", "upstream": echo.address, "listen": listen}]
    first = requests.post(f"{api}/populate", json=entries, timeout=5)
    assert first.status_code == 201
    [created] = first.json()["proxies"]
    assert created["listen"] != listen  # the port it got, not 0
    entries[0]["listen"] = created["listen"]  # the same proxy from now on
    requests.post(f"{api}/proxies/a/toxics", json={"type": "noop"}, timeout=5)
    again = requests.post(f"{api}/populate", json=entries, timeout=5).json()["proxies"]
    assert [t["name"] for t in again[0]["toxics"]] == ["noop_downstream"]
    # A different upstream replaces the proxy, toxics and all.
    entries[0]["upstream"] = "127.0.0.1:1"
    replaced = requests.post(f"{api}/populate", json=entries, timeout=5).json()["proxies"]
    assert replaced[0]["upstream"] == "127.0.0.1:1"
    assert replaced[0]["toxics"] == []
    empty = requests.post(f"{api}/populate", json=[], timeout=5)
    assert empty.status_code == 201
    assert empty.json() == {"proxies": []}


def test_http_plumbing(api: str) -> None:
    assert requests.delete(f"{api}/proxies", timeout=5).status_code == 405
    assert requests.get(f"{api}/reset", timeout=5).status_code == 405
    browser = requests.get(f"{api}/proxies", headers={"User-Agent": "Mozilla/5.0"}, timeout=5)
    assert browser.status_code == 403
    version = requests.get(f"{api}/version", timeout=5)
    assert version.headers["Content-Type"] == "application/json;charset=utf-8"
    assert version.content.endswith(b"}\n")
    # Keep-alive: many requests over one connection.
    with requests.Session() as session:
        for _ in range(20):
            assert session.get(f"{api}/proxies", timeout=5).status_code == 200
    chunked = requests.post(
        f"{api}/proxies",
        data=iter([b'{"name": "c",', b' "upstream": "127.0.0.1:1"}']),
        timeout=5,
    )
    assert chunked.status_code == 201
    assert requests.get(f"{api}/metrics", timeout=5).status_code == 404


def test_expect_100_continue(api: str) -> None:
    host, port = api.removeprefix("http://").split(":")
    body = b'{"name": "big", "upstream": "127.0.0.1:1", "pad": "' + b"x" * 2000 + b'"}'
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = (
            f"POST /proxies HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 201 Created\r\n")
    assert b'"name": "big"' in response
