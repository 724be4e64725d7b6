"""What CreateAcls and DeleteAcls do to the metadata: pure transitions, like every other
(raftmq.controller.transitions), over ``MetadataState.acls``, a sorted tuple of distinct
bindings (raftmq.controller.acl_model says what a binding means).

A binding is checked whole before any is added: a principal ``User:NAME`` (or ``User:*``),
a host that is ``*`` or an IP address (what the broker sees of a client), a resource name
(``*`` only as LITERAL; the CLUSTER's is always ``raftmq-cluster``), and an operation that
means something on its resource type. One bad binding refuses the whole command, so an
operator's ``acl add`` of several takes all of them or none. Adding a binding that exists
changes nothing; the count is bounded (:data:`MAX_ACLS`) so the metadata every broker
holds stays small.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re

from raftmq.controller.acl_model import (
    CLUSTER_NAME,
    OPERATIONS,
    WILDCARD,
    AclBinding,
    PatternType,
    ResourceType,
)
from raftmq.controller.commands import AclsDeleted, CreateAcls, DeleteAcls, Done, Result
from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.model import MetadataState

MAX_ACLS = 10_000
"""Bindings the cluster keeps at most (Kafka sets no limit; every broker holds them all)."""
MAX_ACLS_PER_REQUEST = 1_000
PRINCIPAL = re.compile(r"\AUser:[\x20-\x3a\x3c-\x7e]{1,255}\Z")
"""``User:`` and 1-255 printable ASCII characters but ``;`` (the separator of
``--super-users``); a certificate's common name may hold spaces."""
RESOURCE_NAME = re.compile(r"\A[A-Za-z0-9._-]{1,255}\Z")
"""The characters topic, group and transactional-id names are made of (a prefix, too)."""

Outcome = tuple[MetadataState, Result]


def check_binding(b: AclBinding) -> None:
    """CommandRefused (INVALID_ACL, saying what to fix) unless ``b`` can be stored."""
    if not PRINCIPAL.fullmatch(b.principal):
        raise CommandRefused(
            Code.INVALID_ACL,
            f"principal {b.principal[:64]!r} must be User:NAME (1-255 printable characters, "
            "no ';') or User:* for every principal",
        )
    if b.host != WILDCARD:
        try:
            ipaddress.ip_address(b.host)
        except ValueError:
            raise CommandRefused(
                Code.INVALID_ACL,
                f"host {b.host[:64]!r} must be * or an IP address, as the broker sees the "
                "client's connection",
            ) from None
    if b.resource_type == ResourceType.CLUSTER:
        if b.resource_name != CLUSTER_NAME or b.pattern_type != PatternType.LITERAL:
            raise CommandRefused(
                Code.INVALID_ACL,
                f"the cluster resource is the literal name {CLUSTER_NAME!r}, not "
                f"{b.resource_name[:64]!r} ({b.pattern_type})",
            )
    elif b.resource_name == WILDCARD:
        if b.pattern_type != PatternType.LITERAL:
            raise CommandRefused(
                Code.INVALID_ACL,
                "the name * matches every resource only as a LITERAL pattern; a prefixed "
                "pattern is a beginning of names",
            )
    elif not RESOURCE_NAME.fullmatch(b.resource_name):
        raise CommandRefused(
            Code.INVALID_ACL,
            f"resource name {b.resource_name[:64]!r} must be 1-255 characters of "
            "A-Z a-z 0-9 . _ -, or * (every name)",
        )
    valid = OPERATIONS[b.resource_type]
    if b.operation not in valid:
        raise CommandRefused(
            Code.INVALID_ACL,
            f"operation {b.operation} means nothing on a {b.resource_type}; its operations "
            f"are {', '.join(valid)}",
        )


def create_acls(state: MetadataState, index: int, c: CreateAcls) -> Outcome:
    if not 1 <= len(c.bindings) <= MAX_ACLS_PER_REQUEST:
        raise CommandRefused(
            Code.INVALID_ACL,
            f"a request creates 1-{MAX_ACLS_PER_REQUEST} ACLs, not {len(c.bindings)}",
        )
    for b in c.bindings:
        check_binding(b)
    merged = set(state.acls) | set(c.bindings)
    if len(merged) > MAX_ACLS:
        raise CommandRefused(
            Code.TOO_MANY_ACLS,
            f"the cluster would hold {len(merged)} ACLs, over its limit of {MAX_ACLS}; remove "
            "unused ones, or use prefixed patterns and User:* to say more with fewer",
        )
    if len(merged) == len(state.acls):
        return state, Done()
    return dataclasses.replace(state, acls=tuple(sorted(merged))), Done()


def delete_acls(state: MetadataState, index: int, c: DeleteAcls) -> Outcome:
    """Removes every binding some filter matches; answers with them (none is no error)."""
    if not 1 <= len(c.filters) <= MAX_ACLS_PER_REQUEST:
        raise CommandRefused(
            Code.INVALID_ACL,
            f"a request names 1-{MAX_ACLS_PER_REQUEST} ACL filters, not {len(c.filters)}",
        )
    gone = tuple(b for b in state.acls if any(f.matches(b) for f in c.filters))
    if not gone:
        return state, AclsDeleted(())
    removed = set(gone)
    kept = tuple(b for b in state.acls if b not in removed)
    return dataclasses.replace(state, acls=kept), AclsDeleted(gone)


def problems(state: MetadataState) -> list[str]:
    """What a restored state's ACLs break of the rules the transitions keep (a snapshot
    breaking one is damaged)."""
    found = []
    if list(state.acls) != sorted(set(state.acls)):
        found.append("the ACLs are not sorted and distinct")
    if len(state.acls) > MAX_ACLS:
        found.append(f"{len(state.acls)} ACLs, over the limit of {MAX_ACLS}")
    for b in state.acls:
        try:
            check_binding(b)
        except CommandRefused as refusal:
            found.append(f"ACL {b.describe()}: {refusal.message}")
    return found
