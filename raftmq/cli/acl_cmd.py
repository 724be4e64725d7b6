"""``raftmq acl ...``: add, list and remove ACLs through the Admin API's CreateAcls,
DescribeAcls and DeleteAcls (admin.proto), in the spirit of Kafka's ``kafka-acls.sh``: the
same flags (``--allow-principal``, ``--deny-principal``, ``--operation``, ``--topic``,
``--group``, ``--cluster``, ``--transactional-id``, ``--resource-pattern-type``), the same
operation names (``Read``, ``Write``, ``IdempotentWrite``...; any case, with or without
underscores). One ``add`` stores every combination of its principals, operations and
resources, all or none. ACLs take effect on brokers started with ``--authorizer acl``
(docs/security.md, "ACLs").
"""

from __future__ import annotations

import itertools
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.cli.cluster_cmd import DEFAULT_DATA, BootstrapAddresses, RunningClusterData, console
from raftmq.cli.topic_cmd import JsonFlag, _call

app = typer.Typer(
    help="ACLs: allow or deny principals operations on topics, groups, transactional ids "
    "and the cluster (Kafka's kafka-acls)."
)

CLUSTER_NAME = "raftmq-cluster"
"""The cluster resource's one name (raftmq.controller.acl_model.CLUSTER_NAME)."""

Principals = Annotated[
    list[str] | None,
    typer.Option(help="User:NAME (or User:* for everyone); repeatable."),
]
Operations = Annotated[
    list[str] | None,
    typer.Option(
        "--operation",
        help="Read, Write, Create, Delete, Alter, Describe, AlterConfigs, DescribeConfigs, "
        "ClusterAction, IdempotentWrite or All; repeatable.",
    ),
]
Topics = Annotated[list[str] | None, typer.Option("--topic", help="A topic name (repeatable).")]
Groups = Annotated[
    list[str] | None, typer.Option("--group", help="A consumer group id (repeatable).")
]
TxnIds = Annotated[
    list[str] | None,
    typer.Option("--transactional-id", help="A transactional id (repeatable)."),
]
Cluster = Annotated[bool, typer.Option("--cluster", help="The cluster resource.")]
PatternOpt = Annotated[
    str | None,
    typer.Option(
        "--resource-pattern-type",
        help="literal (the name itself; * is every name) or prefixed (names that start "
        "with it). add: literal by default; list and remove: any unless given.",
    ),
]
Host = Annotated[
    str | None,
    typer.Option(help="The client's IP address, or * for any (add: * by default)."),
]


def _enum_value(enum: Any, prefix: str, text: str, flag: str) -> str:
    """The proto enum value's name for a kafka-acls style name (``IdempotentWrite`` ->
    ``ACL_OPERATION_IDEMPOTENT_WRITE``)."""
    wanted = text.replace("_", "").replace("-", "").upper()
    for name, number in enum.items():
        short = name.removeprefix(prefix)
        if number and short.replace("_", "") == wanted:
            return str(name)
    names = ", ".join(n.removeprefix(prefix).title().replace("_", "") for n, v in enum.items() if v)
    console.print(f"[red]{flag} {text!r} is not one of {names}[/]", highlight=False)
    raise typer.Exit(2)


ANY_PATTERN = "ACL_PATTERN_TYPE_UNSPECIFIED"


def _pattern(text: str | None) -> str:
    if text is None:
        return ANY_PATTERN
    return _enum_value(apb.AclPatternType, "ACL_PATTERN_TYPE_", text, "--resource-pattern-type")


def _resources(
    topics: list[str] | None, groups: list[str] | None, txn_ids: list[str] | None, cluster: bool
) -> list[tuple[str, str]]:
    """(resource type's enum name, resource name) for each resource given."""
    return [
        *(("ACL_RESOURCE_TYPE_TOPIC", t) for t in topics or []),
        *(("ACL_RESOURCE_TYPE_GROUP", g) for g in groups or []),
        *(("ACL_RESOURCE_TYPE_TRANSACTIONAL_ID", t) for t in txn_ids or []),
        *([("ACL_RESOURCE_TYPE_CLUSTER", CLUSTER_NAME)] if cluster else []),
    ]


def _grants(allow: list[str] | None, deny: list[str] | None) -> list[tuple[str, str]]:
    return [
        *((p, "ACL_PERMISSION_ALLOW") for p in allow or []),
        *((p, "ACL_PERMISSION_DENY") for p in deny or []),
    ]


def _operations(operations: list[str] | None) -> list[str]:
    return [
        _enum_value(apb.AclOperation, "ACL_OPERATION_", o, "--operation") for o in operations or []
    ]


def _plain(binding: apb.AclBinding) -> dict[str, str]:
    """A binding with its enums as their short names (TOPIC, READ, ALLOW...)."""
    return {
        "principal": binding.principal,
        "host": binding.host,
        "resource_type": apb.AclResourceType.Name(binding.resource_type).removeprefix(
            "ACL_RESOURCE_TYPE_"
        ),
        "resource_name": binding.resource_name,
        "pattern_type": apb.AclPatternType.Name(binding.pattern_type).removeprefix(
            "ACL_PATTERN_TYPE_"
        ),
        "operation": apb.AclOperation.Name(binding.operation).removeprefix("ACL_OPERATION_"),
        "permission": apb.AclPermission.Name(binding.permission).removeprefix("ACL_PERMISSION_"),
    }


def _print(bindings: Any, title: str, json_out: bool, version: int) -> None:
    rows = [_plain(b) for b in bindings]
    if json_out:
        print(json.dumps({"acls": rows, "metadata_version": version}, indent=2, sort_keys=True))
        return
    if not rows:
        console.print(f"No ACLs{title}.")
        return
    table = Table(title=f"ACLs{title} (metadata version {version})")
    for col in ("permission", "principal", "host", "operation", "resource", "name", "pattern"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["permission"],
            r["principal"],
            r["host"],
            r["operation"],
            r["resource_type"],
            r["resource_name"],
            r["pattern_type"],
        )
    console.print(table)


def _usage(message: str) -> typer.Exit:
    console.print(f"[red]{message}[/]", highlight=False)
    return typer.Exit(2)


@app.command()
def add(
    allow_principal: Principals = None,
    deny_principal: Principals = None,
    operation: Operations = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TxnIds = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOpt = None,
    host: Host = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Allow (or deny) each principal each operation on each resource, e.g. 'raftmq acl
    add --allow-principal User:alice --operation Read --operation Write --topic orders'.
    All or none is stored; storing one that exists changes nothing."""
    grants = _grants(allow_principal, deny_principal)
    ops = _operations(operation)
    resources = _resources(topic, group, transactional_id, cluster)
    if not grants or not ops or not resources:
        raise _usage(
            "give at least one --allow-principal or --deny-principal, one --operation, and "
            "one resource (--topic, --group, --transactional-id or --cluster)"
        )
    pattern = resource_pattern_type or "literal"
    bindings = [
        apb.AclBinding(
            principal=principal,
            host=host or "*",
            resource_type=rtype,
            resource_name=name,
            pattern_type=_pattern(pattern),
            operation=op,
            permission=permission,
        )
        for (principal, permission), op, (rtype, name) in itertools.product(grants, ops, resources)
    ]
    done = _call(data, bootstrap, lambda a: a.create_acls(bindings))
    for b in bindings:
        r = _plain(b)
        console.print(
            f"Added {r['permission']} {r['principal']} from {r['host']} {r['operation']} on "
            f"{r['resource_type']} {r['resource_name']} ({r['pattern_type'].lower()}).",
            highlight=False,
        )
    console.print(f"Metadata version {done.metadata_version}.", highlight=False)


def _filters(
    grants: list[tuple[str, str]],
    ops: list[str],
    resources: list[tuple[str, str]],
    pattern: str,
    host: str | None,
) -> list[apb.AclFilter]:
    """One filter per combination given; a dimension left out matches anything."""
    return [
        apb.AclFilter(
            principal=principal,
            host=host or "",
            resource_type=rtype,
            resource_name=name,
            pattern_type=pattern,
            operation=op,
            permission=permission,
        )
        for (principal, permission), op, (rtype, name) in itertools.product(
            grants or [("", "ACL_PERMISSION_UNSPECIFIED")],
            ops or ["ACL_OPERATION_UNSPECIFIED"],
            resources or [("ACL_RESOURCE_TYPE_UNSPECIFIED", "")],
        )
    ]


@app.command("list")
def list_acls(
    principal: Annotated[
        str | None, typer.Option(help="Only this principal's ACLs (User:NAME).")
    ] = None,
    operation: Operations = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TxnIds = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOpt = None,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """The ACLs, all of them or those of a principal, operation or resource."""
    filters = _filters(
        [(principal, "ACL_PERMISSION_UNSPECIFIED")] if principal else [],
        _operations(operation),
        _resources(topic, group, transactional_id, cluster),
        _pattern(resource_pattern_type),
        None,
    )

    def describe(admin: Any) -> tuple[list[apb.AclBinding], int]:
        found: dict[str, apb.AclBinding] = {}
        version = 0
        for f in filters:
            answer = admin.describe_acls(f)
            version = max(version, answer.metadata_version)
            found |= {b.SerializeToString(deterministic=True): b for b in answer.acls}
        return [found[k] for k in sorted(found)], version

    bindings, version = _call(data, bootstrap, describe)
    _print(bindings, "", json_out, version)


@app.command()
def remove(
    allow_principal: Principals = None,
    deny_principal: Principals = None,
    operation: Operations = None,
    topic: Topics = None,
    group: Groups = None,
    transactional_id: TxnIds = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOpt = None,
    host: Host = None,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Remove the ACLs that match: what 'add' with the same flags stored, or, with fewer
    flags, every ACL of those principals or resources (at least one of either)."""
    grants = _grants(allow_principal, deny_principal)
    resources = _resources(topic, group, transactional_id, cluster)
    if not grants and not resources:
        raise _usage(
            "name a principal (--allow-principal, --deny-principal) or a resource (--topic, "
            "--group, --transactional-id, --cluster) whose ACLs to remove"
        )
    filters = _filters(
        grants, _operations(operation), resources, _pattern(resource_pattern_type), host
    )
    done = _call(data, bootstrap, lambda a: a.delete_acls(filters))
    _print(done.deleted, " removed", json_out, done.metadata_version)
