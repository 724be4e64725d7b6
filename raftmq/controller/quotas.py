"""Client quotas, Kafka's model, as the controller's metadata holds them: the entities, the
checks of an AlterClientQuotas, and which entity's value applies to a caller.

An entity names a user (the name of a principal ``User:NAME``), a client id (Kafka's
``client.id``), or both; either part may be ``<default>``, standing for every user (or
client id) without an entity of its own. Its values are Kafka's: ``producer_byte_rate``
and ``consumer_byte_rate`` (bytes a second, per broker) and ``request_percentage`` (the
percentage of one request-handling thread's time, per broker). The brokers enforce them
(raftmq.broker.client_quotas); docs/quotas.md says how.

Why a sorted tuple in the state and not a map: an entity has two parts that may each hold
any printable character, so no text key would be both readable and unambiguous; the
brokers index the tuple once per change (:func:`index`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from raftmq.controller.commands import AlterClientQuotas, Done, QuotaAlteration, Result
from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.model import ClientQuota, MetadataState
from raftmq.limits import CLIENT_ID

DEFAULT = "<default>"
"""The entity part that stands for every user (or client id) with none of its own."""
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
LIMITS = {
    PRODUCER_BYTE_RATE: (1, 1 << 40),
    CONSUMER_BYTE_RATE: (1, 1 << 40),
    REQUEST_PERCENTAGE: (1, 100),
}
"""Each quota key and its bounds (whole numbers). A Python broker handles requests on one
event loop, so 100% is all of it."""
KEYS = tuple(LIMITS)
MAX_CLIENT_QUOTAS = 10_000
"""Entities in the metadata at most: each broker indexes them all."""
MAX_ALTERATIONS = 1_000
"""Entities one AlterClientQuotas may change."""
USER = re.compile(r"\A[^\x00-\x1f\x7f]{1,255}\Z")
"""A user's name: 1-255 characters, no control characters."""

Outcome = tuple[MetadataState, Result]
Entity = tuple[str, str]
"""(user, client id), each a name, DEFAULT, or "" when the entity does not name it."""


def entity_text(user: str, client_id: str) -> str:
    """How messages and the CLI show an entity: ``user=alice,client-id=app``."""
    parts = [f"user={user}" if user else "", f"client-id={client_id}" if client_id else ""]
    return ",".join(p for p in parts if p)


def entity_problem(user: str, client_id: str) -> str | None:
    """What is wrong with an entity, or None."""
    if not user and not client_id:
        return "a quota entity names a user, a client id, or both (either may be <default>)"
    if user and user != DEFAULT and not USER.fullmatch(user):
        return "a user name is 1-255 characters without control characters"
    if client_id and client_id != DEFAULT and not CLIENT_ID.fullmatch(client_id):
        return "a client id is 1-255 printable ASCII characters"
    return None


def value_problem(key: str, value: int) -> str | None:
    if key not in LIMITS:
        return f"{key!r} is not a quota; the quotas are {', '.join(KEYS)}"
    low, high = LIMITS[key]
    if not low <= value <= high:
        return f"{key} must be a whole number from {low} to {high}, not {value}"
    return None


def alter(state: MetadataState, index: int, c: AlterClientQuotas) -> Outcome:
    """Every alteration of ``c`` checked, then applied in order (or none is)."""
    if len(c.alterations) > MAX_ALTERATIONS:
        raise CommandRefused(
            Code.INVALID_CLIENT_QUOTA, f"at most {MAX_ALTERATIONS} entities change at once"
        )
    quotas: dict[Entity, Mapping[str, int]] = {
        (q.user, q.client_id): q.values for q in state.client_quotas
    }
    for alteration in c.alterations:
        key = (alteration.user, alteration.client_id)
        _check(alteration)
        values = {k: v for k, v in quotas.get(key, {}).items() if k not in alteration.removals}
        values.update(alteration.updates)
        if values:
            quotas[key] = values
        else:
            quotas.pop(key, None)
    if len(quotas) > MAX_CLIENT_QUOTAS and len(quotas) > len(state.client_quotas):
        raise CommandRefused(
            Code.TOO_MANY_CLIENT_QUOTAS,
            f"the cluster holds at most {MAX_CLIENT_QUOTAS} quota entities; delete some, or "
            "use <default> entities for many users or client ids",
        )
    held = tuple(
        ClientQuota(user, client_id, dict(sorted(values.items())))
        for (user, client_id), values in sorted(quotas.items())
    )
    return dataclasses.replace(state, client_quotas=held), Done()


def _check(alteration: QuotaAlteration) -> None:
    where = entity_text(alteration.user, alteration.client_id)
    problem = entity_problem(alteration.user, alteration.client_id)
    if problem is None:
        problems = [value_problem(k, v) for k, v in sorted(alteration.updates.items())]
        problems += [value_problem(k, 1) for k in alteration.removals]
        both = set(alteration.updates) & set(alteration.removals)
        if both:
            problems.append(f"{', '.join(sorted(both))} both set and removed; choose one")
        problem = next((p for p in problems if p is not None), None)
    if problem is not None:
        raise CommandRefused(Code.INVALID_CLIENT_QUOTA, f"{where or 'the entity'}: {problem}")


def problems(state: MetadataState) -> list[str]:
    """What a snapshot's quotas break of the rules :func:`alter` keeps."""
    found = []
    keys = [(q.user, q.client_id) for q in state.client_quotas]
    if keys != sorted(set(keys)):
        found.append("client quotas unsorted or repeated")
    for q in state.client_quotas:
        bad = entity_problem(q.user, q.client_id) or next(
            (p for p in (value_problem(k, v) for k, v in q.values.items()) if p), None
        )
        if bad is not None or not q.values:
            found.append(f"quota {entity_text(q.user, q.client_id)!r}: {bad or 'no values'}")
    if len(keys) > MAX_CLIENT_QUOTAS:
        found.append(f"{len(keys)} quota entities")
    return found


# -- which entity applies ------------------------------------------------------------------

Index = Mapping[Entity, Mapping[str, int]]


def index(quotas: tuple[ClientQuota, ...]) -> dict[Entity, Mapping[str, int]]:
    return {(q.user, q.client_id): q.values for q in quotas}


def resolve(quotas: Index, key: str, user: str, client_id: str) -> tuple[int, Entity] | None:
    """The ``key`` quota that applies to a caller, with the caller's share of it: Kafka's
    order of precedence (the first entity holding ``key`` wins), each quota type on its
    own. The share is the bucket the caller draws from: the parts the entity names, with
    ``<default>`` replaced by the caller's own name (every user under a default user
    quota has a bucket of its own), "" for a part the entity does not name (every client
    id of a user quota shares it). None: no quota of this type applies."""
    for entity in (
        (user, client_id),
        (user, DEFAULT),
        (user, ""),
        (DEFAULT, client_id),
        (DEFAULT, DEFAULT),
        (DEFAULT, ""),
        ("", client_id),
        ("", DEFAULT),
    ):
        found = quotas.get(entity)
        if found is not None and key in found:
            share = (user if entity[0] else "", client_id if entity[1] else "")
            return found[key], share
    return None
