"""The toxiproxy HTTP API: routing, JSON bodies and status codes.

Statuses follow the Go server, including its quirks that clients rely on:
creating a proxy answers 201 but creating a toxic answers 200, deletes answer
204, and updates accept POST as well as PATCH because toxiproxy-python only
sends POST.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import unquote

from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.httpserver import Request, Response
from chaos.toxiproxy.registry import PopulateError, ProxySpec, Registry
from chaos.toxiproxy.version import SERVER_VERSION

log = logging.getLogger("chaos.toxiproxy.api")

JSON_TYPE = "application/json"


def _json(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload).encode() + b"\n", JSON_TYPE)


def _error(status: int, message: str, **extra: Any) -> Response:
    return _json(status, {"error": message, "status": status, **extra})


def _lower_keys(value: Any) -> Any:
    """Go decodes JSON field names case-insensitively; lower-case top-level keys."""
    if isinstance(value, dict):
        return {str(k).lower(): v for k, v in value.items()}
    return value


def _parse_body(request: Request, allow_empty: bool = False) -> Any:
    if allow_empty and not request.body.strip():
        return {}
    try:
        return json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"bad request body: {exc}") from exc


def _object_body(request: Request, allow_empty: bool = False) -> dict[str, Any]:
    body = _lower_keys(_parse_body(request, allow_empty))
    if not isinstance(body, dict):
        raise ApiError(400, "bad request body: expected a JSON object")
    return body


def _optional(body: dict[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise ApiError(400, f"bad request body: {key} must be a {kind.__name__}")
    return value


def _proxy_spec(entry: Any, position: int | None = None) -> ProxySpec:
    body = _lower_keys(entry)
    if not isinstance(body, dict):
        raise ApiError(400, "bad request body: expected a JSON object")
    name = _optional(body, "name", str) or ""
    upstream = _optional(body, "upstream", str) or ""
    listen = _optional(body, "listen", str) or "127.0.0.1:0"
    enabled = _optional(body, "enabled", bool)
    suffix = "" if position is None else f" at proxy {position}"
    if not name:
        raise ApiError(400, f"missing required field: name{suffix}")
    if not upstream:
        raise ApiError(400, f"missing required field: upstream{suffix}")
    return ProxySpec(name, upstream, listen, True if enabled is None else enabled)


class Api:
    """Maps requests onto :class:`Registry` operations."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def handle(self, request: Request) -> Response:
        """Entry point for the HTTP server."""
        if request.headers.get("user-agent", "").startswith("Mozilla/"):
            # The Go server refuses browsers so that a web page cannot drive
            # the API through the user's loopback interface.
            return Response(403, b"User agent not allowed\n", "text/plain; charset=utf-8")
        segments = [unquote(s) for s in request.path.strip("/").split("/")]
        route = self._route(segments)
        if route is None:
            return Response(404, b"404 page not found\n", "text/plain; charset=utf-8")
        handlers, args = route
        handler = handlers.get(request.method)
        if handler is None:
            allow = ", ".join(sorted(handlers))
            return Response(405, b"", None, {"Allow": allow})
        try:
            return await handler(request, *args)
        except PopulateError as exc:
            proxies = [proxy.to_json() for proxy in exc.proxies]
            return _error(exc.status, exc.message, proxies=proxies)
        except ApiError as exc:
            if exc.status >= 500:
                log.warning("%s %s: %s", request.method, request.path, exc.message)
            return _error(exc.status, exc.message)

    def _route(self, segments: list[str]) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        match segments:
            case ["proxies"]:
                return {"GET": self.list_proxies, "POST": self.create_proxy}, ()
            case ["populate"]:
                return {"POST": self.populate}, ()
            case ["reset"]:
                return {"POST": self.reset}, ()
            case ["version"]:
                return {"GET": self.version}, ()
            case ["proxies", proxy] if proxy:
                update = self.update_proxy
                return {
                    "GET": self.get_proxy,
                    "POST": update,
                    "PATCH": update,
                    "DELETE": self.delete_proxy,
                }, (proxy,)
            case ["proxies", proxy, "toxics"] if proxy:
                return {"GET": self.list_toxics, "POST": self.create_toxic}, (proxy,)
            case ["proxies", proxy, "toxics", toxic] if proxy and toxic:
                update = self.update_toxic
                return {
                    "GET": self.get_toxic,
                    "POST": update,
                    "PATCH": update,
                    "DELETE": self.delete_toxic,
                }, (proxy, toxic)
        return None

    # -- proxies -----------------------------------------------------------

    async def list_proxies(self, request: Request) -> Response:
        """GET /proxies: an object keyed by name (``{}`` when empty)."""
        return _json(200, {p.name: p.to_json() for p in self.registry.all()})

    async def create_proxy(self, request: Request) -> Response:
        """POST /proxies: 201 with the bound listen address."""
        spec = _proxy_spec(_parse_body(request))
        proxy = await self.registry.create(spec)
        return _json(201, proxy.to_json())

    async def populate(self, request: Request) -> Response:
        """POST /populate: validate all entries first, then create or keep each."""
        body = _parse_body(request)
        if not isinstance(body, list):
            raise ApiError(400, "bad request body: expected a JSON array")
        specs = [_proxy_spec(entry, index) for index, entry in enumerate(body, start=1)]
        proxies = await self.registry.populate(specs)
        return _json(201, {"proxies": [proxy.to_json() for proxy in proxies]})

    async def get_proxy(self, request: Request, name: str) -> Response:
        """GET /proxies/{p}."""
        return _json(200, self.registry.get(name).to_json())

    async def update_proxy(self, request: Request, name: str) -> Response:
        """POST or PATCH /proxies/{p}: listen, upstream and enabled; never the name."""
        self.registry.get(name)
        body = _object_body(request)
        proxy = await self.registry.update(
            name,
            listen=_optional(body, "listen", str) or None,
            upstream=_optional(body, "upstream", str) or None,
            enabled=_optional(body, "enabled", bool),
        )
        return _json(200, proxy.to_json())

    async def delete_proxy(self, request: Request, name: str) -> Response:
        """DELETE /proxies/{p}: 204."""
        await self.registry.delete(name)
        return Response(204)

    async def reset(self, request: Request) -> Response:
        """POST /reset: enable everything and drop all toxics; 204."""
        await self.registry.reset()
        return Response(204)

    async def version(self, request: Request) -> Response:
        """GET /version."""
        body = json.dumps({"version": SERVER_VERSION}).encode() + b"\n"
        return Response(200, body, "application/json;charset=utf-8")

    # -- toxics ------------------------------------------------------------

    async def list_toxics(self, request: Request, proxy: str) -> Response:
        """GET /proxies/{p}/toxics: upstream toxics first, then downstream."""
        toxics = self.registry.get(proxy).toxics()
        return _json(200, [toxic.to_json() for toxic in toxics])

    async def create_toxic(self, request: Request, proxy: str) -> Response:
        """POST /proxies/{p}/toxics: 200 (not 201) with the full toxic."""
        self.registry.get(proxy)
        toxic = await self.registry.add_toxic(proxy, _object_body(request))
        return _json(200, toxic.to_json())

    async def get_toxic(self, request: Request, proxy: str, toxic: str) -> Response:
        """GET /proxies/{p}/toxics/{t}."""
        return _json(200, self.registry.get(proxy).get_toxic(toxic).to_json())

    async def update_toxic(self, request: Request, proxy: str, toxic: str) -> Response:
        """POST or PATCH /proxies/{p}/toxics/{t}: merge attributes, set toxicity."""
        self.registry.get(proxy).get_toxic(toxic)
        updated = await self.registry.update_toxic(proxy, toxic, _object_body(request))
        return _json(200, updated.to_json())

    async def delete_toxic(self, request: Request, proxy: str, toxic: str) -> Response:
        """DELETE /proxies/{p}/toxics/{t}: 204."""
        await self.registry.remove_toxic(proxy, toxic)
        return Response(204)
