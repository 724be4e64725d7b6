"""TLS material read from files, re-read when they change: what lets an operator rotate a
broker's certificate by replacing its files, without a restart.

Why a class per endpoint rather than a cache per file: each consumer (a gRPC port's
certificate fetcher, the Raft listener, the Raft dialer, a client's channels) asks
"changed since I last looked?" and must not miss a change another consumer has already
seen, so a :class:`TlsFiles` counts its loads (:attr:`TlsFiles.version`) and each
consumer keeps the version it last used.

A change is taken only once the files make a valid whole: the certificate parses, the key
matches it, the CA parses. Replacing the certificate and then the key leaves a moment when
they do not match; the last good material stays in use meanwhile (with a warning), and the
next look takes the new pair. Looking costs one ``stat`` per file, and happens per new
connection only, never per message.

It imports only the standard library (raftmq.net and through it every layer use it).
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger(__name__)

SERVER = "server"
CLIENT = "client"


class TlsFileError(ValueError):
    """The TLS files cannot be used (missing, unreadable, not PEM, key not matching the
    certificate); the message names the file and what to do."""


@dataclass(frozen=True)
class Pem:
    """The bytes of the files, as gRPC takes them (None: the file is not set)."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None


class TlsFiles:
    """The CA, certificate and key files of one endpoint, loaded as an ``ssl`` context for
    ``side`` (SERVER or CLIENT) and as PEM bytes for gRPC, re-loaded by :meth:`refresh`
    when one of them changed on disk."""

    def __init__(
        self,
        ca_file: str | None,
        cert_file: str | None,
        key_file: str | None,
        *,
        side: str,
        require_client_cert: bool = False,
    ) -> None:
        if (cert_file is None) != (key_file is None):
            raise TlsFileError(
                "a TLS certificate file needs its key file, and a key its certificate"
            )
        if side == SERVER and cert_file is None:
            raise TlsFileError("a TLS listener needs a certificate file and its key file")
        if require_client_cert and ca_file is None:
            raise TlsFileError(
                "requiring client certificates needs a CA file to check them against"
            )
        self.paths = (ca_file, cert_file, key_file)
        self.side = side
        self.require_client_cert = require_client_cert
        self.version = 0
        self._seen: tuple[tuple[int, int], ...] | None = None
        self.pem = Pem(None, None, None)
        self.context = self._load()  # the first load must work: raises TlsFileError

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        """Modification time and size of each file set (what says it changed)."""
        out = []
        for path in self.paths:
            if path is not None:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self) -> ssl.SSLContext:
        try:
            stamp = self._stamp()
            ca, cert, key = (None if p is None else _read(p) for p in self.paths)
            context = self._context()
        except (OSError, ssl.SSLError) as exc:
            raise TlsFileError(f"cannot use the TLS files {self._named()}: {exc}") from exc
        self._seen, self.pem = stamp, Pem(ca, cert, key)
        self.version += 1
        return context

    def _context(self) -> ssl.SSLContext:
        """An ``ssl`` context from the files (loading them checks them: the key must match
        the certificate)."""
        ca_file, cert_file, key_file = self.paths
        if self.side == SERVER:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            if self.require_client_cert:
                context.verify_mode = ssl.CERT_REQUIRED
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the host name too
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if ca_file is not None:
            context.load_verify_locations(cafile=ca_file)
        elif self.side == CLIENT:
            context.load_default_certs()
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
        return context

    def _named(self) -> str:
        return ", ".join(p for p in self.paths if p is not None)

    def refresh(self) -> bool:
        """Re-load the files if one changed since the last load; True when new material was
        loaded. Material that does not load (a half-written rotation) is skipped with a
        warning and the last good one kept: the next call tries again."""
        try:
            if self._stamp() == self._seen:
                return False
            self.context = self._load()
        except (OSError, TlsFileError) as exc:
            log.warning("TLS files changed but cannot be used yet; keeping the last good: %s", exc)
            return False
        log.info("TLS files re-loaded: %s", self._named())
        return True


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
