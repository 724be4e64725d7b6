"""The Admin service's ACL calls (admin.proto: CreateAcls, DescribeAcls, DeleteAcls) and
the translation between their messages and the metadata's bindings
(raftmq.controller.acl_model).

Checked here: what the enums and string lengths of a message can get wrong, refused with
INVALID_ACL before anything is proposed; the state machine (raftmq.controller.acls)
judges each binding again, so one rule holds whichever way a command arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import grpc

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.controller_service import ControllerFace
from raftmq.broker.refusals import Refusal
from raftmq.controller import commands as c
from raftmq.controller.acl_model import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftmq.controller.acls import MAX_ACLS_PER_REQUEST, check_binding
from raftmq.controller.errors import CommandRefused

E = TypeVar("E")


def _table(enum: Any, prefix: str, values: Iterable[E]) -> dict[int, E]:
    """Proto enum number -> our value, by name (``ACL_OPERATION_READ`` -> READ)."""
    return {int(enum.Value(f"{prefix}{v}")): v for v in values}


_RESOURCE = _table(apb.AclResourceType, "ACL_RESOURCE_TYPE_", ResourceType)
_PATTERN = _table(apb.AclPatternType, "ACL_PATTERN_TYPE_", PatternType)
_OPERATION = _table(apb.AclOperation, "ACL_OPERATION_", Operation)
_PERMISSION = _table(apb.AclPermission, "ACL_PERMISSION_", Permission)
MAX_FIELD_CHARS = 300
"""Longer than any valid principal, host or name: refused before it is quoted or proposed."""


def _enum(table: Mapping[int, E], value: int, what: str) -> E:
    found = table.get(value)
    if found is None:
        names = ", ".join(str(v) for v in table.values())
        raise Refusal(pb.ERROR_CODE_INVALID_ACL, f"{what} must be one of {names}, not {value}")
    return found


def _any_or(table: Mapping[int, E], value: int, what: str) -> E | None:
    """In a filter: 0 (UNSPECIFIED) matches any value."""
    return None if value == 0 else _enum(table, value, what)


def _text(value: str, what: str) -> str:
    if len(value) > MAX_FIELD_CHARS:
        raise Refusal(pb.ERROR_CODE_INVALID_ACL, f"the {what} is {len(value)} characters; too long")
    return value


def binding_from_pb(m: apb.AclBinding) -> AclBinding:
    binding = AclBinding(
        principal=_text(m.principal, "principal"),
        host=_text(m.host, "host"),
        resource_type=_enum(_RESOURCE, m.resource_type, "resource_type"),
        resource_name=_text(m.resource_name, "resource name"),
        pattern_type=_enum(_PATTERN, m.pattern_type, "pattern_type"),
        operation=_enum(_OPERATION, m.operation, "operation"),
        permission=_enum(_PERMISSION, m.permission, "permission"),
    )
    try:
        check_binding(binding)
    except CommandRefused as refusal:
        raise Refusal(pb.ERROR_CODE_INVALID_ACL, refusal.message) from None
    return binding


def filter_from_pb(m: apb.AclFilter) -> AclFilter:
    return AclFilter(
        principal=_text(m.principal, "principal") or None,
        host=_text(m.host, "host") or None,
        resource_type=_any_or(_RESOURCE, m.resource_type, "resource_type"),
        resource_name=_text(m.resource_name, "resource name") or None,
        pattern_type=_any_or(_PATTERN, m.pattern_type, "pattern_type"),
        operation=_any_or(_OPERATION, m.operation, "operation"),
        permission=_any_or(_PERMISSION, m.permission, "permission"),
    )


def _number(table: Mapping[int, E], value: E) -> Any:
    """The proto enum number of ``value`` (an int; typed Any for the generated stubs)."""
    return next(k for k, v in table.items() if v == value)


def binding_to_pb(b: AclBinding) -> apb.AclBinding:
    return apb.AclBinding(
        principal=b.principal,
        host=b.host,
        resource_type=_number(_RESOURCE, b.resource_type),
        resource_name=b.resource_name,
        pattern_type=_number(_PATTERN, b.pattern_type),
        operation=_number(_OPERATION, b.operation),
        permission=_number(_PERMISSION, b.permission),
    )


def _count(n: int, what: str) -> None:
    if not 1 <= n <= MAX_ACLS_PER_REQUEST:
        raise Refusal(
            pb.ERROR_CODE_INVALID_ACL, f"a request names 1-{MAX_ACLS_PER_REQUEST} {what}, not {n}"
        )


class AclAdmin(ControllerFace):
    """The three ACL calls of the Admin service (its other calls: admin_service.py)."""

    async def CreateAcls(
        self, request: apb.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        _count(len(request.acls), "ACLs")
        bindings = tuple(binding_from_pb(m) for m in request.acls)
        await self.call(self.quorum.propose(c.CreateAcls(bindings), c.Done))
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def DescribeAcls(
        self, request: apb.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> apb.DescribeAclsResponse:
        wanted = filter_from_pb(request.filter)
        version, state = await self.call(self.quorum.metadata(linearizable=True))
        return apb.DescribeAclsResponse(
            acls=[binding_to_pb(b) for b in state.acls if wanted.matches(b)],
            metadata_version=version,
        )

    async def DeleteAcls(
        self, request: apb.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> apb.DeleteAclsResponse:
        _count(len(request.filters), "ACL filters")
        filters = tuple(filter_from_pb(m) for m in request.filters)
        done = await self.call(self.quorum.propose(c.DeleteAcls(filters), c.AclsDeleted))
        return apb.DeleteAclsResponse(
            deleted=[binding_to_pb(b) for b in done.deleted],
            metadata_version=self.quorum.local_state()[0],
        )
