"""SCRAM-SHA-256 credentials in the controller's replicated metadata (Kafka keeps them in
its metadata log too): per user a salt, an iteration count, StoredKey and ServerKey (RFC
5802), never the password, which never leaves the client that set it (raftmq.scram).

Why here: a user added on one broker must be known to all of them, survive any controller
failover or restart, and reach every broker's copy of the metadata, which is what each
broker's Authentication service checks a handshake against; the metadata already does all
that (the snapshot carries :attr:`MetadataState.scram_users`).

Bytes are kept as base64 text (the controller's canonical JSON has no bytes).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code

if TYPE_CHECKING:
    from raftmq.controller.commands import Done
    from raftmq.controller.model import MetadataState

MECHANISM = "SCRAM-SHA-256"
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 1_000_000
KEY_BYTES = 32
SALT_BYTES = (16, 64)
MAX_NAME_CHARS = 200
MAX_USERS = 100_000


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """A user's stored SCRAM-SHA-256 credential (base64 fields)."""

    iterations: int
    salt: str
    stored_key: str
    server_key: str
    mechanism: str = MECHANISM


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    name: str
    credential: ScramCredential


@dataclass(frozen=True, slots=True)
class AlterScramCredentials:
    """Kafka's AlterUserScramCredentials: store or replace (``upsertions``) and delete
    (``deletions``, user names) credentials, all or none."""

    upsertions: tuple[ScramUpsertion, ...] = ()
    deletions: tuple[str, ...] = ()


def _b64_bytes(text: str) -> int:
    try:
        return len(base64.b64decode(text, validate=True))
    except ValueError:
        return -1


def check_name(name: str) -> None:
    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        raise CommandRefused(
            Code.UNACCEPTABLE_CREDENTIAL,
            f"a SCRAM user name must be 1-{MAX_NAME_CHARS} printable characters, not {name[:40]!r}",
        )


def _check(upsertion: ScramUpsertion) -> None:
    check_name(upsertion.name)
    c = upsertion.credential
    if c.mechanism != MECHANISM:
        raise CommandRefused(
            Code.UNACCEPTABLE_CREDENTIAL,
            f"mechanism {c.mechanism[:40]!r} is not supported; use {MECHANISM}",
        )
    if not MIN_ITERATIONS <= c.iterations <= MAX_ITERATIONS:
        raise CommandRefused(
            Code.UNACCEPTABLE_CREDENTIAL,
            f"{c.iterations} iterations for {upsertion.name!r}: SCRAM-SHA-256 needs "
            f"{MIN_ITERATIONS} to {MAX_ITERATIONS}",
        )
    if not SALT_BYTES[0] <= _b64_bytes(c.salt) <= SALT_BYTES[1]:
        raise CommandRefused(
            Code.UNACCEPTABLE_CREDENTIAL,
            f"the salt for {upsertion.name!r} must be {SALT_BYTES[0]}-{SALT_BYTES[1]} bytes",
        )
    if _b64_bytes(c.stored_key) != KEY_BYTES or _b64_bytes(c.server_key) != KEY_BYTES:
        raise CommandRefused(
            Code.UNACCEPTABLE_CREDENTIAL,
            f"StoredKey and ServerKey for {upsertion.name!r} must be {KEY_BYTES} bytes each",
        )


def alter(state: MetadataState, index: int, c: AlterScramCredentials) -> tuple[MetadataState, Done]:
    """The transition of :class:`AlterScramCredentials` (raftmq.controller.transitions)."""
    from raftmq.controller.commands import Done

    stored = {u.name for u in c.upsertions}
    for upsertion in c.upsertions:
        _check(upsertion)
    if len(stored) != len(c.upsertions):
        raise CommandRefused(Code.UNACCEPTABLE_CREDENTIAL, "a user is named twice")
    for name in c.deletions:
        if name in stored:
            raise CommandRefused(
                Code.UNACCEPTABLE_CREDENTIAL, f"user {name[:40]!r} is both stored and deleted"
            )
        if name not in state.scram_users:
            raise CommandRefused(
                Code.RESOURCE_NOT_FOUND,
                f"no SCRAM credentials are stored for user {name[:40]!r}",
            )
    users: dict[str, ScramCredential] = dict(state.scram_users)
    for name in c.deletions:
        del users[name]
    for upsertion in c.upsertions:
        users[upsertion.name] = upsertion.credential
    if len(users) > MAX_USERS:
        raise CommandRefused(
            Code.UNACCEPTABLE_CREDENTIAL, f"the cluster holds at most {MAX_USERS} SCRAM users"
        )
    return dataclasses.replace(state, scram_users=dict(sorted(users.items()))), Done()


def lookup(users: Mapping[str, ScramCredential], name: str) -> ScramCredential | None:
    return users.get(name)
