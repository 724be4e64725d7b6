"""How a raftmq process writes its log: text lines for a person, or (``--log-format
json``) one JSON object per line for a log pipeline, with the context a line was written
in as fields: the node, the RPC and its request id, the partition it names, and the
principal (Kafka's ``User:NAME``: the common name of a mutual-TLS client's certificate,
else ``User:ANONYMOUS``).

The context rides in a ContextVar. The RPC wrappers (raftmq.broker.rpc) bind the call for
the task that serves it, so every line that call's work writes carries it, in whatever
layer the line is written; nothing is computed on the request path unless a line is
written (the fields are read from the call then). A line may also pass fields itself with
``extra={"partition": ...}``.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from typing import Any, Literal

from raftmq.limits import CLIENT_ID_HEADER

LogFormat = Literal["text", "json"]
FIELDS = ("rpc", "request_id", "partition", "principal")
"""The context fields a JSON line carries when they are known, in this order."""
REQUEST_ID_HEADER = "x-request-id"
"""A client's own id for a request (gRPC metadata); else the broker makes one up."""
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
ANONYMOUS = "User:ANONYMOUS"
COMMON_NAME = "x509_common_name"
"""gRPC's auth-context key for the peer certificate's common name."""


class CallContext:
    """What a line written while serving one call knows about it. ``metadata`` and
    ``request`` are read only when a line asks (never on a quiet request path)."""

    __slots__ = (
        "_auth",
        "_client_id",
        "_metadata",
        "_peer",
        "_principal",
        "_request",
        "_request_id",
        "rpc",
    )

    def __init__(
        self,
        rpc: str,
        metadata: Callable[[], Any] | None = None,
        request: object = None,
        auth: Callable[[], Mapping[str, Sequence[bytes]]] | None = None,
        peer: Callable[[], str] | None = None,
    ) -> None:
        self.rpc = rpc
        self._metadata = metadata
        self._request = request
        self._auth = auth
        self._request_id: str | None = None
        self._principal: str | None = None
        self._peer = peer
        self._client_id: str | None = None

    @property
    def request_id(self) -> str:
        if self._request_id is None:
            given = None
            if self._metadata is not None:
                for key, value in self._metadata() or ():
                    if key == REQUEST_ID_HEADER and isinstance(value, str) and value:
                        given = value[:64]
                        break
            self._request_id = given or secrets.token_hex(8)
        return self._request_id

    @property
    def client_id(self) -> str:
        """The client's id (Kafka's ``client.id``) from the call's metadata, at most 255
        characters; "" when it sent none. Client quotas are set per client id."""
        if self._client_id is None:
            found = ""
            if self._metadata is not None:
                for key, value in self._metadata() or ():
                    if key == CLIENT_ID_HEADER and isinstance(value, str):
                        found = value[:255]
                        break
            self._client_id = found
        return self._client_id

    @property
    def partition(self) -> str | None:
        topic = getattr(self._request, "topic", None)
        partition = getattr(self._request, "partition", None)
        if isinstance(topic, str) and topic and isinstance(partition, int):
            return f"{topic}/{partition}"
        return None

    @property
    def principal(self) -> str:
        """The principal the server's guard authenticated (raftmq.broker.guard); when it
        established none, ``User:`` and the common name of the client's certificate
        (mutual TLS), else ``User:ANONYMOUS``, as Kafka names an unauthenticated client."""
        if self._principal is not None:
            return self._principal
        names = (self._auth() or {}).get(COMMON_NAME) if self._auth is not None else None
        # kept: an authorizer asks for every request of a stream
        self._principal = "User:" + names[0].decode(errors="replace") if names else ANONYMOUS
        return self._principal

    @principal.setter
    def principal(self, value: str) -> None:
        self._principal = value

    @property
    def host(self) -> str:
        """The client's IP address (gRPC's peer ``ipv4:1.2.3.4:port`` or
        ``ipv6:[::1]:port``), as an ACL's host names it; ``*`` when unknown."""
        peer = self._peer() if self._peer is not None else ""
        kind, _, address = (peer or "").partition(":")
        if kind == "ipv6" and address.startswith("["):
            return address[1 : address.find("]")]
        if kind == "ipv4":
            return address.rpartition(":")[0]
        return "*"


def current_call() -> CallContext | None:
    """The call the running task serves (None outside an RPC)."""
    return _call.get()


_call: ContextVar[CallContext | None] = ContextVar("raftmq_call", default=None)


def bind_call(call: CallContext) -> Token[CallContext | None]:
    """Lines written from here on in this task (and tasks it starts) carry ``call``."""
    return _call.set(call)


def unbind_call(token: Token[CallContext | None]) -> None:
    _call.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601 with milliseconds), level, logger,
    message, node, the context FIELDS that are known, and the exception's traceback."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        millis = int((record.created - seconds) * 1000)
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.node is not None:
            out["node"] = self.node
        call = _call.get()
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is None and call is not None:
                value = getattr(call, name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(log_format: LogFormat, *, node: str | None = None, level: int = logging.INFO) -> None:
    """Send this process's log to stderr in ``log_format`` (replacing other handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
