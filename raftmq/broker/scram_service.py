"""raftmq.v1.Authentication on a broker: the SCRAM-SHA-256 handshake (authentication.proto,
raftmq.scram) against the credentials in this broker's copy of the metadata
(raftmq.controller.scram_users), and the sessions it issues, which the listener's
authenticator (raftmq.broker.authentication) looks up on every later call.

Both tables are bounded in size and time, so no caller can grow them without end: a
pending exchange (a nonce issued by ScramClientFirst) lives :data:`PENDING_TTL_S` and a
session ``session_lifetime_s``; past :data:`MAX_PENDING` or ``max_sessions`` the oldest
goes first. A nonce is used once: its exchange leaves the pending table when its
client-final arrives, right or wrong, and is remembered as used for a while, so a
replayed client-final is told it is a replay rather than a stranger.

An unknown user gets a server-first like a known one's (a salt derived from the name and
a secret of this process, the default iteration count), and the same refusal at the end
as a wrong password: the answers do not tell which names exist (Kafka does likewise).
"""

from __future__ import annotations

import base64
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc

from raftmq import scram
from raftmq.api.v1 import authentication_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.refusals import Refusal
from raftmq.broker.rpc import add_service
from raftmq.controller.scram_users import ScramCredential

log = logging.getLogger(__name__)
T = TypeVar("T")

PENDING_TTL_S = 30.0
MAX_PENDING = 10_000
USED_TTL_S = 300.0
MAX_USED = 100_000
SESSION_LIFETIME_S = 3600.0
MAX_SESSIONS = 100_000
MAX_MESSAGE_CHARS = 1024

INVALID_CREDENTIALS = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-256: check sasl_username and sasl_password"
)
"""Kafka's sentence, for a wrong password and an unknown user alike."""


@dataclass(frozen=True)
class _Pending:
    name: str
    client_first_bare: str
    server_first: str
    credential: scram.Credential | None  # None: an unknown user
    expires_at: float


def _stored(credential: ScramCredential) -> scram.Credential:
    return scram.Credential(
        base64.b64decode(credential.salt),
        credential.iterations,
        base64.b64decode(credential.stored_key),
        base64.b64decode(credential.server_key),
    )


class _Expiring(OrderedDict[str, tuple[float, object]]):
    """Key -> (deadline, value), oldest first, bounded: what both tables are."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: str, deadline: float, value: object) -> None:
        self[key] = (deadline, value)
        self.move_to_end(key)
        now = time.monotonic()
        while self and (len(self) > self.limit or next(iter(self.values()))[0] <= now):
            self.popitem(last=False)

    def live(self, key: str) -> object | None:
        found = self.get(key)
        if found is None:
            return None
        if found[0] <= time.monotonic():
            del self[key]
            return None
        return found[1]


class ScramService:
    """The Authentication service, and the session table the authenticator reads."""

    def __init__(
        self,
        users: Callable[[], Mapping[str, ScramCredential]],
        *,
        session_lifetime_s: float = SESSION_LIFETIME_S,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        """``users``: the SCRAM users of this broker's newest metadata."""
        self.users = users
        self.session_lifetime_s = session_lifetime_s
        self._secret = secrets.token_bytes(32)
        self._pending = _Expiring(MAX_PENDING)
        self._used = _Expiring(MAX_USED)
        self._sessions = _Expiring(max_sessions)

    # --- what the authenticator asks, per call: a dict lookup ----------------------------

    def principal(self, token: str) -> str | None:
        found = self._sessions.live(token)
        return found if isinstance(found, str) else None

    # --- the handshake -------------------------------------------------------------------

    async def ScramClientFirst(
        self, request: apb.ScramClientFirstRequest, context: grpc.aio.ServicerContext
    ) -> apb.ScramClientFirstResponse:
        if request.mechanism.upper() != scram.MECHANISM:
            raise Refusal(
                pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM,
                f"mechanism {request.mechanism[:40]!r} is not supported by this handshake; "
                "use SCRAM-SHA-256",
            )
        name, client_nonce, bare = _parsed(
            scram.parse_client_first, request.message, "client-first"
        )
        known = self.users().get(name)
        stored = None if known is None else _stored(known)
        if stored is not None:
            salt, iterations = stored.salt, stored.iterations
        else:
            salt = hmac.digest(self._secret, name.encode(), "sha256")
            iterations = scram.DEFAULT_ITERATIONS
        nonce = client_nonce + scram.new_nonce()
        server_first = scram.server_first(nonce, salt, iterations)
        deadline = time.monotonic() + PENDING_TTL_S
        self._pending.put(nonce, deadline, _Pending(name, bare, server_first, stored, deadline))
        return apb.ScramClientFirstResponse(message=server_first)

    async def ScramClientFinal(
        self, request: apb.ScramClientFinalRequest, context: grpc.aio.ServicerContext
    ) -> apb.ScramClientFinalResponse:
        nonce, final_bare, proof = _parsed(
            scram.parse_client_final, request.message, "client-final"
        )
        pending = self._pending.live(nonce)
        if not isinstance(pending, _Pending):
            if self._used.live(nonce) is not None:
                raise Refusal(
                    pb.ERROR_CODE_ILLEGAL_SASL_STATE,
                    "this SCRAM nonce was used already: a client-final cannot be replayed; "
                    "start a new handshake with ScramClientFirst",
                )
            raise Refusal(
                pb.ERROR_CODE_ILLEGAL_SASL_STATE,
                "this broker did not issue that SCRAM nonce, or its exchange expired (after "
                f"{PENDING_TTL_S:.0f} s) or the broker restarted: start a new handshake with "
                "ScramClientFirst",
            )
        del self._pending[nonce]
        self._used.put(nonce, time.monotonic() + USED_TTL_S, True)
        signature = None
        if pending.credential is not None:
            signature = scram.verify_proof(
                pending.credential,
                pending.client_first_bare,
                pending.server_first,
                final_bare,
                proof,
            )
        if signature is None:
            log.info("SCRAM authentication failed for user %r", pending.name[:64])
            raise Refusal(pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED, INVALID_CREDENTIALS)
        token = secrets.token_urlsafe(32)
        principal = f"User:{pending.name}"
        self._sessions.put(token, time.monotonic() + self.session_lifetime_s, principal)
        return apb.ScramClientFinalResponse(
            message=scram.server_final(signature),
            session_token=token,
            session_lifetime_ms=int(self.session_lifetime_s * 1000),
            principal=principal,
        )


def _parsed(parse: Callable[[str], T], message: str, which: str) -> T:
    """``parse(message)``, or MALFORMED_REQUEST naming the ``which`` message and why."""
    if len(message) > MAX_MESSAGE_CHARS:
        raise Refusal(
            pb.ERROR_CODE_MALFORMED_REQUEST,
            f"a SCRAM message is at most {MAX_MESSAGE_CHARS} characters, not {len(message)}",
        )
    try:
        return parse(message)
    except scram.ScramError as exc:
        raise Refusal(
            pb.ERROR_CODE_MALFORMED_REQUEST, f"the SCRAM {which} message: {exc}"
        ) from None


def add_scram_service(service: ScramService, server: grpc.aio.Server) -> None:
    add_service(service, server, apb, "Authentication")
