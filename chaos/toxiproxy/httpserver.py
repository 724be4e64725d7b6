"""A deliberately small HTTP/1.1 server on asyncio streams.

The project may not add dependencies and ``http.server`` is thread-based, so
this implements just what the toxiproxy API needs: Content-Length and chunked
request bodies, keep-alive, bounded sizes, and the Go server's time limits.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus

log = logging.getLogger("chaos.toxiproxy.http")

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
READ_TIMEOUT = 15.0  # Go server: ReadTimeout
WRITE_TIMEOUT = 30.0  # Go server: WriteTimeout
HANDLER_TIMEOUT = 25.0  # Go server: TimeoutHandler
IDLE_TIMEOUT = 120.0


@dataclass
class Request:
    """A parsed request; header names are lower-cased."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]


@dataclass
class Response:
    """What a handler returns; the server adds framing headers."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """The request cannot be parsed; answered with 400 and the connection closed."""


class HttpServer:
    """Serves ``handler`` on one listening socket, each connection in its own task."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._request_ids = itertools.count(1)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and return the concrete address (port 0 picks a free port)."""
        self._server = await asyncio.start_server(self._serve, host, port)
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def stop(self) -> None:
        """Stop listening and end in-flight connections."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve_requests(reader, writer)
        except (ConnectionError, OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._connections.discard(task)
            writer.transport.abort()

    async def _serve_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        first = True
        while True:
            try:
                # Wait for the first byte with the idle limit, then the rest
                # of the request with the (shorter) read limit.
                wait = READ_TIMEOUT if first else IDLE_TIMEOUT
                head_start = await asyncio.wait_for(reader.read(1), wait)
                if not head_start:
                    return
                request = await asyncio.wait_for(
                    _read_request(head_start, reader, writer), READ_TIMEOUT
                )
            except BadRequest as exc:
                await _write(writer, _plain(400, f"400 Bad Request: {exc}"), "HTTP/1.1", close=True)
                return
            first = False
            keep_alive = _wants_keep_alive(request)
            response = await self._dispatch(request)
            response.headers.setdefault("X-Toxiproxy-Request-Id", str(next(self._request_ids)))
            await asyncio.wait_for(
                _write(writer, response, request.version, close=not keep_alive), WRITE_TIMEOUT
            )
            if not keep_alive:
                return

    async def _dispatch(self, request: Request) -> Response:
        try:
            return await asyncio.wait_for(self._handler(request), HANDLER_TIMEOUT)
        except TimeoutError:
            return _plain(503, "Handler timeout")
        except Exception:
            log.exception("handler failed for %s %s", request.method, request.target)
            return _plain(500, "Internal Server Error")


def _plain(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode(), "text/plain; charset=utf-8")


def _wants_keep_alive(request: Request) -> bool:
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    if request.version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


async def _read_request(
    first_byte: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request:
    try:
        rest = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as exc:
        raise BadRequest("header too large") from exc
    head = first_byte + rest
    if len(head) > MAX_HEADER_BYTES:
        raise BadRequest("header too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest("malformed header")
        headers[name.strip().lower()] = value.strip()
    if headers.get("expect", "").lower() == "100-continue":
        # curl waits (1 s) for this before sending a body of more than 1 KiB.
        writer.write(f"{version} 100 Continue\r\n\r\n".encode("latin-1"))
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        length_text = headers.get("content-length", "0") or "0"
        if not length_text.isdigit():
            raise BadRequest("bad content-length")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise BadRequest("body too large")
        body = await reader.readexactly(length)
    return Request(method.upper(), target, version, headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise BadRequest("bad chunk size") from exc
        if size == 0:
            # Skip trailers up to the blank line.
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return bytes(body)
        if len(body) + size > MAX_BODY_BYTES:
            raise BadRequest("body too large")
        body += await reader.readexactly(size)
        await reader.readexactly(2)


async def _write(
    writer: asyncio.StreamWriter, response: Response, version: str, close: bool
) -> None:
    reason = HTTPStatus(response.status).phrase
    lines = [f"{version if version == 'HTTP/1.0' else 'HTTP/1.1'} {response.status} {reason}"]
    headers = dict(response.headers)
    headers["Date"] = formatdate(usegmt=True)
    if response.content_type is not None:
        headers["Content-Type"] = response.content_type
    if response.status != 204:
        headers["Content-Length"] = str(len(response.body))
    headers["Connection"] = "close" if close else "keep-alive"
    lines += [f"{name}: {value}" for name, value in headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    if response.status != 204:
        writer.write(response.body)
    await writer.drain()
