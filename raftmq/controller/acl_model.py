"""Access control lists on Kafka's model: what an ACL binding says, and how a request is
judged against a set of them.

A binding allows or denies one principal (or every one, ``User:*``), from one host (or
any, ``*``), one operation on resources of one type whose name matches a pattern: the
name itself (LITERAL; the literal ``*`` matches every name) or a prefix of it (PREFIXED).
The bindings live in the controller's replicated metadata (``MetadataState.acls``, changed
by :mod:`raftmq.controller.acls`), so every broker judges from the same copy it routes by.

The judgement is Kafka's: a DENY that matches wins over any ALLOW; otherwise an ALLOW must
match, or the request is denied. An ALLOW of READ, WRITE, DELETE or ALTER also allows
DESCRIBE, ALTER_CONFIGS allows DESCRIBE_CONFIGS, and ALL allows (or denies) everything.
Super users bypass the lists; that is the authorizer's business (raftmq.broker
.authorization), not the metadata's.

Pure and free of other raftmq imports: the metadata model holds these values, and the
broker's authorizer indexes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class ResourceType(StrEnum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class PatternType(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(StrEnum):
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"
    ALL = "ALL"


class Permission(StrEnum):
    ALLOW = "ALLOW"
    DENY = "DENY"


CLUSTER_NAME = "raftmq-cluster"
"""The one CLUSTER resource's name (Kafka's ``kafka-cluster``)."""
WILDCARD = "*"
"""As a LITERAL resource name: every name. As a host: every host."""
ANY_PRINCIPAL = "User:*"

OPERATIONS: dict[ResourceType, tuple[Operation, ...]] = {
    ResourceType.TOPIC: (
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.ALTER_CONFIGS,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALL,
    ),
    ResourceType.GROUP: (
        Operation.READ,
        Operation.DELETE,
        Operation.DESCRIBE,
        Operation.ALTER_CONFIGS,  # a share group's settings
        Operation.ALL,
    ),
    ResourceType.CLUSTER: (
        Operation.CREATE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.CLUSTER_ACTION,
        Operation.ALTER_CONFIGS,
        Operation.DESCRIBE_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
        Operation.ALL,
    ),
    ResourceType.TRANSACTIONAL_ID: (Operation.WRITE, Operation.DESCRIBE, Operation.ALL),
}
"""The operations that mean something on each resource type (Kafka's table); a binding
for another one is refused, since it could never match a request."""

IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}
"""An operation -> the ALLOWed operations that grant it (besides ALL and itself)."""


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    principal: str
    """``User:NAME``, or ``User:*`` for every principal."""
    host: str
    """The client's IP address, or ``*`` for any."""
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    permission: Permission

    def names(self, name: str) -> bool:
        """Whether this binding's resource pattern covers the resource ``name``."""
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def describe(self) -> str:
        """One line a person reads: who, what, where."""
        pattern = "" if self.pattern_type == PatternType.LITERAL else " (prefixed)"
        return (
            f"{self.permission} {self.principal} from {self.host} {self.operation} on "
            f"{self.resource_type} {self.resource_name!r}{pattern}"
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings DescribeAcls shows and DeleteAcls removes: each field None matches
    any value, a set one the binding's own exactly (Kafka's ANY and exact filters)."""

    principal: str | None = None
    host: str | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: PatternType | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def matches(self, binding: AclBinding) -> bool:
        return all(
            want is None or want == getattr(binding, name)
            for name, want in (
                ("principal", self.principal),
                ("host", self.host),
                ("resource_type", self.resource_type),
                ("resource_name", self.resource_name),
                ("pattern_type", self.pattern_type),
                ("operation", self.operation),
                ("permission", self.permission),
            )
        )


def grants(allowed: Operation, wanted: Operation) -> bool:
    """Whether an ALLOW of ``allowed`` allows ``wanted``."""
    return allowed in (wanted, Operation.ALL) or allowed in IMPLIED_BY.get(wanted, ())


def denies(denied: Operation, wanted: Operation) -> bool:
    """Whether a DENY of ``denied`` denies ``wanted`` (no implication: denying READ
    leaves DESCRIBE alone, as in Kafka)."""
    return denied in (wanted, Operation.ALL)


def decide(
    bindings: Iterable[AclBinding],
    principal: str,
    host: str,
    resource_type: ResourceType,
    name: str,
    operation: Operation,
) -> bool:
    """Kafka's rule over ``bindings``: allowed when an ALLOW matches and no DENY does.
    ``bindings`` may hold any; those of other resources or principals are skipped."""
    allowed = False
    for b in bindings:
        if (
            b.resource_type != resource_type
            or b.principal not in (principal, ANY_PRINCIPAL)
            or b.host not in (host, WILDCARD)
            or not b.names(name)
        ):
            continue
        if b.permission == Permission.DENY:
            if denies(b.operation, operation):
                return False
        elif grants(b.operation, operation):
            allowed = True
    return allowed
