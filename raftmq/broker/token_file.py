"""Bearer tokens (``oauthbearer``) checked against a file the operator keeps
(``raftmq broker --token-file FILE``), re-read when it changes.

Each line names a principal and the SHA-256 (hex) of its token, so the file holds no
secret a reader could replay::

    # principal   sha256(token)
    User:alice    2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824

Blank lines and ``#`` comments are skipped; a principal without ``User:`` gets it. A
client sends ``authorization: Bearer TOKEN`` (gRPC metadata). Make one with
``raftmq.broker.token_file.token_line(principal, token)`` or
``printf %s TOKEN | sha256sum``.

Why it stays cheap: a token once hashed and found is remembered (a bounded dict), so a
request costs a dict lookup; the file is looked at (one ``stat``) at most once a second,
and a change drops what was remembered, so a revoked token stops working within a second.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

log = logging.getLogger(__name__)

TOKEN_SHAPE = re.compile(r"[A-Za-z0-9\-._~+/]{16,4096}=*")
"""RFC 6750's b64token, at least 16 characters (a shorter one is guessable)."""
CHECK_EVERY_S = 1.0
REMEMBERED = 10_000
"""Tokens remembered as found; the dict is cleared when full (it refills as they come)."""
_HEX = re.compile(r"[0-9a-f]{64}")


class TokenFileError(ValueError):
    """The file cannot be read or a line is not ``PRINCIPAL SHA256HEX``."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_line(principal: str, token: str) -> str:
    """The token file's line for ``principal`` and ``token``."""
    return f"{principal} {token_digest(token)}\n"


def parse(text: str, path: str) -> dict[str, str]:
    """digest -> principal for the lines of a token file."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not _HEX.fullmatch(fields[1].lower()):
            raise TokenFileError(
                f"{path}:{number}: expected 'PRINCIPAL SHA256HEX' (the token's SHA-256 as 64 "
                f"hex digits), not {line[:80]!r}"
            )
        principal = fields[0] if fields[0].startswith("User:") else f"User:{fields[0]}"
        out[fields[1].lower()] = principal
    return out


class TokenFile:
    """The principals of a token file, re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._digests: dict[str, str] = {}
        self._found: dict[str, str | None] = {}
        self._load()  # the first load must work: raises TokenFileError

    def _load(self) -> None:
        try:
            st = os.stat(self.path)
            text = self.path.read_text()
        except OSError as exc:
            raise TokenFileError(f"cannot read the token file {self.path}: {exc}") from None
        self._digests = parse(text, str(self.path))
        self._stamp = (st.st_mtime_ns, st.st_size)
        self._found = {}

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        try:
            st = os.stat(self.path)
            if (st.st_mtime_ns, st.st_size) == self._stamp:
                return
            self._load()
        except (OSError, TokenFileError) as exc:
            log.warning("token file changed but cannot be used; keeping the last good: %s", exc)
            return
        log.info("token file re-loaded: %s (%d tokens)", self.path, len(self._digests))

    def principal(self, token: str) -> str | None:
        """The principal ``token`` stands for, or None when the file does not hold it."""
        self._refresh()
        found = self._found.get(token, "")
        if found != "":
            return found
        principal = self._digests.get(token_digest(token))
        if len(self._found) >= REMEMBERED:
            self._found.clear()
        self._found[token] = principal
        return principal
