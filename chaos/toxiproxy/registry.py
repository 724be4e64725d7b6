"""The set of named proxies and the API operations on them.

All mutations go through one lock: the only awaits inside are binds, so the
lock is held briefly, and it keeps concurrent API calls from interleaving a
half-done create with, say, a /reset.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from chaos.toxiproxy.addresses import same_listen
from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.proxy import Proxy
from chaos.toxiproxy.toxics import KINDS, STREAMS, Toxic, parse_attributes


@dataclass
class ProxySpec:
    """A validated request to create (or populate) a proxy."""

    name: str
    upstream: str
    listen: str
    enabled: bool


class PopulateError(ApiError):
    """A populate failure also reports the proxies created before it."""

    def __init__(self, status: int, message: str, proxies: list[Proxy]) -> None:
        super().__init__(status, message)
        self.proxies = proxies


async def _let_closes_happen() -> None:
    """Yield once so sockets aborted just now are really closed.

    asyncio closes an aborted socket in a callback on the next loop turn; the
    spec wants connections gone before the HTTP response goes out.
    """
    await asyncio.sleep(0)


class Registry:
    """Named proxies; methods map one-to-one onto API endpoints."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()

    def all(self) -> list[Proxy]:
        """Every proxy, in creation order."""
        return list(self._proxies.values())

    def get(self, name: str) -> Proxy:
        """A proxy by name, 404 if absent."""
        proxy = self._proxies.get(name)
        if proxy is None:
            raise ApiError(404, "proxy not found")
        return proxy

    async def create(self, spec: ProxySpec) -> Proxy:
        """Create and (unless disabled) bind a proxy; nothing is kept on failure."""
        async with self._lock:
            if spec.name in self._proxies:
                raise ApiError(409, "proxy already exists")
            return await self._create_locked(spec)

    async def _create_locked(self, spec: ProxySpec) -> Proxy:
        proxy = Proxy(spec.name, spec.listen, spec.upstream, self._rng)
        if spec.enabled:
            await proxy.start()
        self._proxies[spec.name] = proxy
        return proxy

    async def populate(self, specs: list[ProxySpec]) -> list[Proxy]:
        """Create or replace proxies in order; identical ones are left untouched."""
        async with self._lock:
            done: list[Proxy] = []
            for spec in specs:
                existing = self._proxies.get(spec.name)
                if (
                    existing is not None
                    and existing.upstream == spec.upstream
                    and same_listen(existing.listen, spec.listen)
                ):
                    done.append(existing)
                    continue
                if existing is not None:
                    existing.stop()
                    del self._proxies[spec.name]
                    await _let_closes_happen()
                try:
                    done.append(await self._create_locked(spec))
                except ApiError as exc:
                    raise PopulateError(exc.status, exc.message, done) from exc
            return done

    async def update(
        self, name: str, listen: str | None, upstream: str | None, enabled: bool | None
    ) -> Proxy:
        """Change a proxy's addresses and/or enabled state."""
        async with self._lock:
            proxy = self.get(name)
            await proxy.update(listen, upstream, enabled)
            await _let_closes_happen()
            return proxy

    async def delete(self, name: str) -> None:
        """Stop a proxy, drop its connections and forget it with its toxics."""
        async with self._lock:
            proxy = self.get(name)
            proxy.stop()
            del self._proxies[name]
            await _let_closes_happen()

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic (/reset)."""
        async with self._lock:
            for proxy in self.all():
                await proxy.start()
                proxy.remove_all_toxics()
            await _let_closes_happen()

    async def add_toxic(self, proxy_name: str, body: dict[str, Any]) -> Toxic:
        """Create a toxic from a lower-cased request body, in the Go check order."""
        async with self._lock:
            proxy = self.get(proxy_name)
            toxicity = _parse_toxicity(body.get("toxicity"), default=1.0)
            stream = body.get("stream")
            stream = "downstream" if stream in (None, "") else stream
            if not isinstance(stream, str) or stream.lower() not in STREAMS:
                raise ApiError(400, "stream was invalid, can be either upstream or downstream")
            stream = stream.lower()
            type_name = body.get("type")
            kind = KINDS.get(type_name) if isinstance(type_name, str) else None
            if kind is None:
                raise ApiError(400, "invalid toxic type")
            name = body.get("name")
            if name is None or name == "":
                name = f"{kind.type_name}_{stream}"
            if not isinstance(name, str):
                raise ApiError(400, "bad request body: name must be a string")
            if any(t.name == name for t in proxy.toxics()):
                raise ApiError(409, "toxic already exists")
            attributes = parse_attributes(kind, body.get("attributes"))
            toxic = Toxic(kind, name, stream, toxicity, attributes)
            proxy.add_toxic(toxic)
            return toxic

    async def update_toxic(self, proxy_name: str, toxic_name: str, body: dict[str, Any]) -> Toxic:
        """Merge partial attributes and/or a new toxicity into a toxic."""
        async with self._lock:
            proxy = self.get(proxy_name)
            toxic = proxy.get_toxic(toxic_name)
            attributes = parse_attributes(toxic.kind, body.get("attributes"))
            toxicity = _parse_toxicity(body.get("toxicity"), default=None)
            proxy.update_toxic(toxic, attributes, toxicity)
            return toxic

    async def remove_toxic(self, proxy_name: str, toxic_name: str) -> None:
        """Remove a toxic; data it holds is released (timeout: connections close)."""
        async with self._lock:
            self.get(proxy_name).remove_toxic(toxic_name)
            await _let_closes_happen()

    async def stop_all(self) -> None:
        """Close every listener and connection; used at shutdown."""
        async with self._lock:
            for proxy in self.all():
                proxy.stop()
            await _let_closes_happen()


def _parse_toxicity(value: Any, default: float | None) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, "bad request body: toxicity must be a number")
    return float(value)
