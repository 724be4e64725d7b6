"""Wires the registry, the API and the HTTP server together and runs them."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
from pathlib import Path

from chaos.toxiproxy.api import Api, _proxy_spec
from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.httpserver import HttpServer
from chaos.toxiproxy.registry import Registry

log = logging.getLogger("chaos.toxiproxy.server")


class ToxiproxyServer:
    """An embeddable server: start it on a loop, stop it, read back its port.

    Tests in the same process can use it directly; the command line and the
    launcher run it in a separate process, like the Go binary.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.registry = Registry(random.Random(seed))
        self.api = Api(self.registry)
        self.http = HttpServer(self.api.handle)
        self.host = ""
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 8474) -> None:
        """Start serving the API; port 0 picks a free one."""
        self.host, self.port = await self.http.start(host, port)
        log.info("API listening on %s:%d", self.host, self.port)

    async def load_config(self, path: str) -> None:
        """Create the proxies listed in a JSON file, like POST /populate.

        As in the Go server, a bad file is logged and the server keeps
        running, so a typo does not take the whole chaos setup down.
        """
        try:
            entries = json.loads(Path(path).read_text())
            if not isinstance(entries, list):
                raise ValueError("expected a JSON array of proxies")
            specs = [_proxy_spec(entry, i) for i, entry in enumerate(entries, start=1)]
            proxies = await self.registry.populate(specs)
        except (OSError, ValueError, ApiError) as exc:
            log.error("failed to populate proxies from %s: %s", path, exc)
            return
        log.info("populated %d proxies from %s", len(proxies), path)

    async def stop(self) -> None:
        """Stop the API first (no new changes), then every proxy."""
        await self.http.stop()
        await self.registry.stop_all()


async def serve(host: str, port: int, config: str | None, seed: int | None) -> None:
    """Run until SIGINT or SIGTERM, then shut down cleanly."""
    server = ToxiproxyServer(seed)
    await server.start(host, port)
    if config:
        await server.load_config(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await server.stop()
