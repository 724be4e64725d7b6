"""A proxy: its configuration, its listening socket and its live connections."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from typing import Any

from chaos.toxiproxy.addresses import join_host_port, resolve_listen, same_listen
from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.link import READ_SIZE, Connection
from chaos.toxiproxy.toxics import DOWNSTREAM, UPSTREAM, Toxic

log = logging.getLogger("chaos.toxiproxy.proxy")

LISTEN_BACKLOG = 128


class Proxy:
    """One named proxy.

    Every method is synchronous except :meth:`start`, so callers can change a
    proxy and have the effect visible (sockets closed, toxics applied) before
    they send the HTTP response.
    """

    def __init__(self, name: str, listen: str, upstream: str, rng: random.Random) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self._rng = rng
        self._server: asyncio.Server | None = None
        self._toxics: dict[str, Toxic] = {}
        self._connections: set[Connection] = set()

    # -- representation ----------------------------------------------------

    def toxics(self) -> list[Toxic]:
        """Upstream toxics in the order added, then downstream ones (API order)."""
        ordered = [t for t in self._toxics.values() if t.stream == UPSTREAM]
        ordered += [t for t in self._toxics.values() if t.stream == DOWNSTREAM]
        return ordered

    def to_json(self) -> dict[str, Any]:
        """The API representation of the proxy."""
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [toxic.to_json() for toxic in self.toxics()],
        }

    @property
    def connection_count(self) -> int:
        """Open connections; exposed for tests that check clean-up."""
        return len(self._connections)

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Bind and listen; on failure the proxy stays disabled (500)."""
        if self.enabled:
            return
        family, ip, port = resolve_listen(self.listen)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # Lets a disabled proxy re-bind its old port while old connections
            # sit in TIME_WAIT, which is what "re-enable" must do.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ip, port))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
            self._server = await asyncio.start_server(self._accept, sock=sock, limit=READ_SIZE * 2)
        except OSError as exc:
            sock.close()
            reason = (exc.strerror or str(exc)).lower()
            raise ApiError(500, f"listen tcp {self.listen}: bind: {reason}") from exc
        bound = sock.getsockname()
        self.listen = join_host_port(str(bound[0]), int(bound[1]))
        self.enabled = True
        log.info("proxy %s listening on %s -> %s", self.name, self.listen, self.upstream)

    def stop(self) -> None:
        """Close the listener (new connects are refused) and drop every connection."""
        if self._server is not None:
            # Server.close() closes the listening socket synchronously.
            self._server.close()
            self._server = None
        self.enabled = False
        for conn in list(self._connections):
            conn.abort()
        self._connections.clear()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Accept first, then dial: a dead upstream shows up as connect + EOF.
        if not self.enabled:
            writer.transport.abort()
            return
        conn = Connection(
            self.upstream, reader, writer, self.toxics, self._rng, self._connections.discard
        )
        self._connections.add(conn)
        conn.start()

    async def update(self, listen: str | None, upstream: str | None, enabled: bool | None) -> None:
        """Apply a partial update: restart on address change, then (dis)enable."""
        new_listen = self.listen if listen is None else listen
        new_upstream = self.upstream if upstream is None else upstream
        if not same_listen(new_listen, self.listen) or new_upstream != self.upstream:
            was_enabled = self.enabled
            self.stop()
            self.listen, self.upstream = new_listen, new_upstream
            if enabled is None:
                enabled = was_enabled
        if enabled is None:
            return
        if enabled:
            await self.start()
        else:
            self.stop()

    # -- toxics ------------------------------------------------------------

    def get_toxic(self, name: str) -> Toxic:
        """Look a toxic up by name, 404 if absent."""
        toxic = self._toxics.get(name)
        if toxic is None:
            raise ApiError(404, "toxic not found")
        return toxic

    def add_toxic(self, toxic: Toxic) -> None:
        """Register a toxic and apply it to live connections at once."""
        if toxic.name in self._toxics:
            raise ApiError(409, "toxic already exists")
        self._toxics[toxic.name] = toxic
        for conn in list(self._connections):
            conn.attach(toxic)

    def update_toxic(
        self, toxic: Toxic, attributes: dict[str, int], toxicity: float | None
    ) -> None:
        """Merge new settings and re-roll toxicity on live connections."""
        toxic.update(attributes, toxicity)
        for conn in list(self._connections):
            conn.update(toxic)

    def remove_toxic(self, name: str) -> None:
        """Unregister a toxic; data it holds moves on (or its connections close)."""
        toxic = self.get_toxic(name)
        del self._toxics[name]
        for conn in list(self._connections):
            conn.detach(toxic)

    def remove_all_toxics(self) -> None:
        """Used by /reset."""
        for name in list(self._toxics):
            self.remove_toxic(name)
