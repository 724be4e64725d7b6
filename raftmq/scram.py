"""SCRAM-SHA-256 (RFC 5802, RFC 7677): the mathematics and the messages, shared by the
client (which proves a password) and the broker (which checks the proof against what the
controller stores: a salt, an iteration count, StoredKey and ServerKey, never the
password).

Why a top-level helper: the client may import only the contracts and top-level helpers
(tests/test_layers.py), and both sides must compute the same bytes; so it imports only the
standard library. No channel binding: the messages' gs2 header is ``n,,`` (TLS below
protects the exchange), and an authorization identity is not supported.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
MIN_ITERATIONS = 4096
"""RFC 7677's minimum, and Kafka's."""
DEFAULT_ITERATIONS = 8192
MAX_ITERATIONS = 1_000_000
SALT_BYTES = 32
KEY_BYTES = 32
"""SHA-256's size: StoredKey and ServerKey are one digest each."""
NONCE_BYTES = 24
GS2_HEADER = "n,,"
CHANNEL_BINDING = base64.b64encode(GS2_HEADER.encode()).decode()  # "biws"


class ScramError(ValueError):
    """A SCRAM message that does not parse, or a proof or signature that does not check."""


@dataclass(frozen=True)
class Credential:
    """What the controller stores for a user (RFC 5802's names)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, "sha256")


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i): PBKDF2-HMAC-SHA-256 (no SASLprep: a password is
    taken as its UTF-8 bytes, which is SASLprep's result for the printable ASCII ones)."""
    return hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)


def credential(
    password: str, *, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
) -> Credential:
    """The stored form of ``password`` (a random salt unless given): what the client sends
    the controller, so the password itself never leaves it."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    salted = salted_password(password, salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return Credential(
        salt, iterations, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")
    )


def new_nonce() -> str:
    """A printable nonce (base64 of random bytes: no ',' in it)."""
    return base64.b64encode(secrets.token_bytes(NONCE_BYTES)).decode()


def _fields(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, eq, value = part.partition("=")
        if len(key) != 1 or not eq:
            raise ScramError(f"not a SCRAM attribute: {part[:40]!r}")
        out.setdefault(key, value)
    return out


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ScramError(f"{what} is not base64") from None


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unsaslname(name: str) -> str:
    if "=" in name.replace("=3D", "").replace("=2C", ""):
        raise ScramError("the user name has a '=' not followed by 2C or 3D")
    return name.replace("=2C", ",").replace("=3D", "=")


# --- the messages ----------------------------------------------------------------------


def client_first(username: str, nonce: str) -> tuple[str, str]:
    """(client-first-message, its bare part, which the proof covers)."""
    bare = f"n={_saslname(username)},r={nonce}"
    return GS2_HEADER + bare, bare


def parse_client_first(message: str) -> tuple[str, str, str]:
    """(user name, client nonce, bare part) of a client-first-message."""
    if not message.startswith(GS2_HEADER):
        raise ScramError(
            "the client-first message must start with 'n,,' (no channel binding, no "
            "authorization identity)"
        )
    bare = message[len(GS2_HEADER) :]
    fields = _fields(bare)
    if "n" not in fields or "r" not in fields or not fields["r"]:
        raise ScramError("the client-first message needs n=USER and r=NONCE")
    return _unsaslname(fields["n"]), fields["r"], bare


def server_first(nonce: str, salt: bytes, iterations: int) -> str:
    return f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"


def parse_server_first(message: str, client_nonce: str) -> tuple[str, bytes, int]:
    """(combined nonce, salt, iterations) of a server-first-message, checked."""
    fields = _fields(message)
    try:
        nonce, salt, iterations = fields["r"], _b64(fields["s"], "the salt"), int(fields["i"])
    except (KeyError, ValueError) as exc:
        raise ScramError(f"the server-first message is not r=,s=,i= ({exc})") from None
    if not nonce.startswith(client_nonce) or len(nonce) == len(client_nonce):
        raise ScramError("the server's nonce does not extend the client's")
    if iterations < MIN_ITERATIONS:
        raise ScramError(f"the server asks for {iterations} iterations, fewer than 4096")
    return nonce, salt, iterations


def _auth_message(client_first_bare: str, server_first_message: str, final_bare: str) -> bytes:
    return f"{client_first_bare},{server_first_message},{final_bare}".encode()


def client_final(
    password: str,
    client_first_bare: str,
    server_first_message: str,
    nonce: str,
    salt: bytes,
    iterations: int,
) -> tuple[str, bytes]:
    """(client-final-message, the server signature to expect in server-final)."""
    salted = salted_password(password, salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    stored_key = hashlib.sha256(client_key).digest()
    final_bare = f"c={CHANNEL_BINDING},r={nonce}"
    auth = _auth_message(client_first_bare, server_first_message, final_bare)
    signature = _hmac(stored_key, auth)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_signature = _hmac(_hmac(salted, b"Server Key"), auth)
    return f"{final_bare},p={base64.b64encode(proof).decode()}", server_signature


def parse_client_final(message: str) -> tuple[str, str, bytes]:
    """(nonce, the bare part without the proof, proof) of a client-final-message."""
    bare, sep, proof_text = message.rpartition(",p=")
    if not sep:
        raise ScramError("the client-final message has no proof (p=)")
    fields = _fields(bare)
    if fields.get("c") != CHANNEL_BINDING:
        raise ScramError("the client-final message's channel binding must be c=biws")
    if "r" not in fields:
        raise ScramError("the client-final message has no nonce (r=)")
    return fields["r"], bare, _b64(proof_text, "the proof")


def verify_proof(
    stored: Credential,
    client_first_bare: str,
    server_first_message: str,
    final_bare: str,
    proof: bytes,
) -> bytes | None:
    """The server signature (for server-final) when ``proof`` proves the password behind
    ``stored``; None when it does not."""
    if len(proof) != KEY_BYTES:
        return None
    auth = _auth_message(client_first_bare, server_first_message, final_bare)
    signature = _hmac(stored.stored_key, auth)
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    if not hmac.compare_digest(hashlib.sha256(client_key).digest(), stored.stored_key):
        return None
    return _hmac(stored.server_key, auth)


def server_final(signature: bytes) -> str:
    return f"v={base64.b64encode(signature).decode()}"


def check_server_final(message: str, expected: bytes) -> None:
    """Raises ScramError unless the server proved it knows the credential."""
    fields = _fields(message)
    if "e" in fields:
        raise ScramError(f"the server refused: {fields['e']}")
    if not hmac.compare_digest(_b64(fields.get("v", ""), "the signature"), expected):
        raise ScramError("the server's signature does not check: it does not hold the credential")
