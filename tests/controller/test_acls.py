"""ACLs in the metadata and their matcher: CreateAcls and DeleteAcls applied and refused
(a refusal changes nothing), carried by snapshots, bounded; and Kafka's judgement (deny
wins, ALLOW must match, the implications, literal, wildcard and prefixed patterns)."""

from __future__ import annotations

import dataclasses

import pytest

from raftmq.controller import acls
from raftmq.controller.acl_model import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    decide,
)
from raftmq.controller.commands import AclsDeleted, CreateAcls, DeleteAcls, Done, Refused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.state_machine import MetadataStateMachine, SnapshotError, encode_snapshot
from tests.controller.machine import Driver

T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation


def acl(
    principal: str = "User:alice",
    rtype: ResourceType = T,
    name: str = "orders",
    op: Operation = Op.READ,
    permission: Permission = ALLOW,
    pattern: PatternType = LIT,
    host: str = "*",
) -> AclBinding:
    return AclBinding(principal, host, rtype, name, pattern, op, permission)


def allowed(
    bindings: list[AclBinding],
    op: Operation,
    name: str = "orders",
    rtype: ResourceType = T,
    principal: str = "User:alice",
    host: str = "10.0.0.1",
) -> bool:
    return decide(bindings, principal, host, rtype, name, op)


# -- the matcher ---------------------------------------------------------------------------


def test_nothing_is_allowed_without_an_allow() -> None:
    assert not allowed([], Op.READ)
    assert not allowed([acl(principal="User:bob")], Op.READ)
    assert not allowed([acl(rtype=G)], Op.READ)
    assert not allowed([acl(name="other")], Op.READ)
    assert allowed([acl()], Op.READ)


def test_deny_wins_over_allow() -> None:
    both = [acl(), acl(permission=DENY)]
    assert not allowed(both, Op.READ)
    assert not allowed([acl(), acl(principal="User:*", op=Op.ALL, permission=DENY)], Op.READ)
    # a deny of READ leaves DESCRIBE (implied by the allow) alone, as in Kafka
    assert allowed(both, Op.DESCRIBE)


@pytest.mark.parametrize("granted", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.DESCRIBE, Op.ALL])
def test_describe_is_implied(granted: Operation) -> None:
    assert allowed([acl(op=granted)], Op.DESCRIBE)


def test_implications_go_one_way() -> None:
    assert allowed([acl(op=Op.ALTER_CONFIGS)], Op.DESCRIBE_CONFIGS)
    assert not allowed([acl(op=Op.DESCRIBE)], Op.READ)
    assert not allowed([acl(op=Op.DESCRIBE_CONFIGS)], Op.ALTER_CONFIGS)
    assert not allowed([acl(op=Op.READ)], Op.WRITE)
    assert not allowed([acl(op=Op.CREATE)], Op.DESCRIBE)
    for op in (Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER_CONFIGS):
        assert allowed([acl(op=Op.ALL)], op)


def test_patterns() -> None:
    prefixed = [acl(name="orders-", pattern=PRE)]
    assert allowed(prefixed, Op.READ, "orders-eu")
    assert allowed(prefixed, Op.READ, "orders-")
    assert not allowed(prefixed, Op.READ, "orders")
    assert not allowed(prefixed, Op.READ, "my-orders-eu")
    wildcard = [acl(name="*")]
    assert allowed(wildcard, Op.READ, "anything")
    # a literal name is itself, not a pattern
    assert not allowed([acl(name="orders")], Op.READ, "orders-eu")
    # a prefixed deny carves a hole in a wildcard allow
    assert not allowed(
        [*wildcard, acl(name="secret.", pattern=PRE, permission=DENY)], Op.READ, "secret.x"
    )


def test_principal_and_host_wildcards() -> None:
    assert allowed([acl(principal="User:*")], Op.READ, principal="User:anyone")
    assert allowed([acl(host="10.0.0.1")], Op.READ, host="10.0.0.1")
    assert not allowed([acl(host="10.0.0.2")], Op.READ, host="10.0.0.1")


# -- the metadata --------------------------------------------------------------------------


def _refused(d: Driver, command: CreateAcls | DeleteAcls, code: Code) -> str:
    before = d.machine.state
    result = d(command)
    assert isinstance(result, Refused), result
    assert result.code == code
    assert d.machine.state == dataclasses.replace(before, version=d.index)
    return result.message


def test_create_describe_delete_round_trip() -> None:
    d = Driver()
    first = (acl(), acl(op=Op.WRITE), acl(rtype=G, name="billing"))
    assert d(CreateAcls(first)) == Done()
    assert d.machine.state.acls == tuple(sorted(first))
    assert d(CreateAcls((acl(),))) == Done()  # held already: nothing changes
    assert d.machine.state.acls == tuple(sorted(first))
    gone = d(DeleteAcls((AclFilter(resource_type=T, principal="User:alice"),)))
    assert gone == AclsDeleted(tuple(sorted(first[:2])))
    assert d.machine.state.acls == (first[2],)
    assert d(DeleteAcls((AclFilter(principal="User:nobody"),))) == AclsDeleted(())


@pytest.mark.parametrize(
    ("binding", "says"),
    [
        (acl(principal="alice"), "User:NAME"),
        (acl(principal="User:a;b"), "User:NAME"),
        (acl(host="somewhere"), "IP address"),
        (acl(name="bad name"), "1-255 characters"),
        (acl(name="*", pattern=PRE), "LITERAL"),
        (acl(rtype=C, name="other"), CLUSTER_NAME),
        (acl(rtype=G, op=Op.WRITE), "means nothing on a GROUP"),
        (acl(rtype=X, op=Op.READ), "means nothing on a TRANSACTIONAL_ID"),
        (acl(rtype=T, op=Op.CLUSTER_ACTION), "means nothing on a TOPIC"),
    ],
)
def test_a_bad_binding_refuses_the_whole_command(binding: AclBinding, says: str) -> None:
    d = Driver()
    message = _refused(d, CreateAcls((acl(), binding)), Code.INVALID_ACL)
    assert says in message


def test_the_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acls, "MAX_ACLS", 2)
    d = Driver()
    assert d(CreateAcls((acl(), acl(op=Op.WRITE)))) == Done()
    message = _refused(d, CreateAcls((acl(op=Op.DELETE),)), Code.TOO_MANY_ACLS)
    assert "limit of 2" in message
    _refused(d, CreateAcls(()), Code.INVALID_ACL)
    _refused(d, DeleteAcls(()), Code.INVALID_ACL)


def test_snapshots_carry_acls_and_refuse_bad_ones() -> None:
    d = Driver()
    d(CreateAcls((acl(), acl(rtype=C, name=CLUSTER_NAME, op=Op.IDEMPOTENT_WRITE))))
    restored = MetadataStateMachine("test")
    restored.restore(d.machine.snapshot())
    assert restored.state == d.machine.state
    bad = dataclasses.replace(d.machine.state, acls=(acl(host="nowhere"),))
    with pytest.raises(SnapshotError, match="IP address"):
        restored.restore(encode_snapshot(bad))
