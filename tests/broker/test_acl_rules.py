"""The authorizer's table and judgement without a cluster: every method of every service
has a rule (so no RPC can be added that skips authorization), each rule reads fields its
request has, listings name fields their answers have; and the ACL authorizer over a
metadata state: super users, the implications, denials naming principal, operation and
resource with their codes, hidden listings, and the cache dropped when the ACLs change."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass

from raftmq.api.v1 import (
    admin_pb2,
    broker_pb2,
    controller_pb2,
    groups_pb2,
    share_pb2,
    transactions_pb2,
)
from raftmq.broker.authorization import (
    NEEDS,
    SHOWN,
    AclAuthorizer,
    View,
    parse_super_users,
)
from raftmq.broker.refusals import Refusal
from raftmq.controller.acl_model import (
    CLUSTER_NAME,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from raftmq.controller.model import MetadataState, Topic
from raftmq.format import delay
from raftmq.format.records import Record, build_batch

API = Path(broker_pb2.__file__).parent
MODULES = tuple(
    importlib.import_module(f"raftmq.api.v1.{proto.stem}_pb2")
    for proto in sorted(API.glob("*.proto"))
)
"""Every service of every .proto: a new file's methods need rules too."""
METHODS = [
    (module, service, method)
    for module in MODULES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


def test_every_rpc_of_every_service_has_a_rule() -> None:
    names = [m.name for _, _, m in METHODS]
    missing = [f"{s.name}.{m.name}" for _, s, m in METHODS if m.name not in NEEDS]
    assert not missing, f"RPCs without an authorization rule in NEEDS: {missing}"
    # the guard sees a method's name only: a name in two services would be ambiguous
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert set(NEEDS) == set(names), f"rules for no RPC: {set(NEEDS) - set(names)}"


@pytest.mark.parametrize(
    ("module", "method"), [(mod, m) for mod, _, m in METHODS], ids=[m.name for _, _, m in METHODS]
)
def test_each_rule_reads_its_request(module: Any, method: Any) -> None:
    request = GetMessageClass(method.input_type)()
    needs = NEEDS[method.name](request, View(MetadataState("c"), auto_create=True))
    assert isinstance(needs, list)


def test_listings_name_fields_their_answers_have() -> None:
    outputs = {m.name: GetMessageClass(m.output_type) for _, _, m in METHODS}
    for rpc, (field, name, _) in SHOWN.items():
        item = getattr(outputs[rpc](), field).add()
        assert isinstance(getattr(item, name), str), (rpc, field, name)


def _acl(
    principal: str,
    rtype: ResourceType,
    name: str,
    op: Operation,
    permission: Permission = Permission.ALLOW,
    pattern: PatternType = PatternType.LITERAL,
) -> AclBinding:
    return AclBinding(principal, "*", rtype, name, pattern, op, permission)


class Metadata:
    """A metadata state the test swaps, as a broker's copy changes."""

    def __init__(self, *acls: AclBinding) -> None:
        self.state = MetadataState("c", acls=tuple(sorted(acls)))

    def __call__(self) -> MetadataState:
        return self.state


def _refusal(authorizer: AclAuthorizer, rpc: str, request: object, principal: str) -> Refusal:
    with pytest.raises(Refusal) as caught:
        authorizer.authorize(rpc, request, principal)
    return caught.value


def test_denials_name_principal_operation_and_resource() -> None:
    alice = "User:alice"
    metadata = Metadata(_acl(alice, ResourceType.TOPIC, "orders", Operation.READ))
    authorizer = AclAuthorizer(metadata, {"User:admin"})
    authorizer.authorize("Fetch", broker_pb2.FetchRequest(topic="orders"), alice)
    authorizer.authorize("DeleteTopic", admin_pb2.DeleteTopicRequest(name="x"), "User:admin")
    denied = _refusal(authorizer, "Produce", broker_pb2.ProduceRequest(topic="orders"), alice)
    assert denied.status == grpc.StatusCode.PERMISSION_DENIED
    assert denied.name == "TOPIC_AUTHORIZATION_FAILED"
    assert "User:alice" in denied.message and "WRITE" in denied.message
    assert "'orders'" in denied.message
    cases = [
        ("ConsumerGroupHeartbeat", groups_pb2.ConsumerGroupHeartbeatRequest(group_id="g"), "GROUP"),
        ("DrainBroker", admin_pb2.DrainBrokerRequest(), "CLUSTER"),
        ("Heartbeat", controller_pb2.HeartbeatRequest(), "CLUSTER"),
        ("EndTxn", transactions_pb2.EndTxnRequest(transactional_id="t"), "TRANSACTIONAL_ID"),
    ]
    for rpc, request, kind in cases:
        assert _refusal(authorizer, rpc, request, alice).name == f"{kind}_AUTHORIZATION_FAILED"


def test_a_topic_one_may_not_describe_is_refused_alike_whether_or_not_it_exists() -> None:
    metadata = Metadata()
    metadata.state = dataclasses.replace(
        metadata.state, topics={"secret": Topic("secret", 1, 1, {}, ())}
    )
    authorizer = AclAuthorizer(metadata)
    said = []
    for name in ("secret", "nothing"):
        refusal = _refusal(
            authorizer, "DescribeTopic", admin_pb2.DescribeTopicRequest(name=name), "User:bob"
        )
        assert refusal.name == "TOPIC_AUTHORIZATION_FAILED"
        said.append(refusal.message.replace(repr(name), "NAME"))
    assert said[0] == said[1]


def test_create_topic_takes_create_on_the_topic_or_the_cluster() -> None:
    carol, dave = "User:carol", "User:dave"
    metadata = Metadata(
        _acl(carol, ResourceType.CLUSTER, CLUSTER_NAME, Operation.CREATE),
        _acl(dave, ResourceType.TOPIC, "dave-", Operation.CREATE, pattern=PatternType.PREFIXED),
    )
    authorizer = AclAuthorizer(metadata)
    create = admin_pb2.CreateTopicRequest
    authorizer.authorize("CreateTopic", create(name="anything"), carol)
    authorizer.authorize("CreateTopic", create(name="dave-1"), dave)
    refusal = _refusal(authorizer, "CreateTopic", create(name="other"), dave)
    assert "CREATE on the cluster" in refusal.message


def test_idempotent_producers_need_idempotent_write_or_write_on_some_topic() -> None:
    metadata = Metadata(
        _acl("User:w", ResourceType.TOPIC, "t", Operation.WRITE),
        _acl("User:i", ResourceType.CLUSTER, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE),
    )
    authorizer = AclAuthorizer(metadata)
    request = broker_pb2.InitProducerIdRequest()
    authorizer.authorize("InitProducerId", request, "User:w")
    authorizer.authorize("InitProducerId", request, "User:i")
    _refusal(authorizer, "InitProducerId", request, "User:r")


def test_listings_leave_out_what_one_may_not_describe() -> None:
    eve = "User:eve"
    metadata = Metadata(
        _acl(eve, ResourceType.TOPIC, "pub-", Operation.READ, pattern=PatternType.PREFIXED)
    )
    authorizer = AclAuthorizer(metadata, {"User:admin"})
    answer = admin_pb2.ListTopicsResponse(
        topics=[admin_pb2.TopicDescription(name=n) for n in ("priv", "pub-a", "pub-b", "x")]
    )
    full = admin_pb2.ListTopicsResponse()
    full.CopyFrom(answer)
    assert authorizer.shown("ListTopics", None, full, "User:admin") == answer
    shown = authorizer.shown("ListTopics", None, answer, eve)
    assert [t.name for t in shown.topics] == ["pub-a", "pub-b"]
    groups = groups_pb2.ListGroupsResponse(groups=[groups_pb2.GroupSummary(group_id="g")])
    assert not authorizer.shown("ListGroups", None, groups, eve).groups


def test_decisions_follow_acl_changes() -> None:
    frank = "User:frank"
    metadata = Metadata(_acl(frank, ResourceType.TOPIC, "t", Operation.ALL))
    authorizer = AclAuthorizer(metadata)
    fetch = broker_pb2.FetchRequest(topic="t")
    authorizer.authorize("Fetch", fetch, frank)  # cached now
    deny = _acl(frank, ResourceType.TOPIC, "*", Operation.READ, Permission.DENY)
    metadata.state = dataclasses.replace(
        metadata.state, acls=tuple(sorted((*metadata.state.acls, deny))), version=2
    )
    _refusal(authorizer, "Fetch", fetch, frank)
    authorizer.authorize("ListOffsets", broker_pb2.ListOffsetsRequest(topic="t"), frank)


def test_super_users_parse_like_kafka() -> None:
    assert parse_super_users("User:a; User:raftmq broker;") == {"User:a", "User:raftmq broker"}
    assert parse_super_users("") == frozenset()
    with pytest.raises(ValueError, match="User:NAME"):
        parse_super_users("admin")


def test_delayed_messages_need_write_on_their_targets_not_on_the_delay_topic() -> None:
    """docs/delayed-delivery.md: a produce to __delay is judged by the topics its records
    are for, and every principal may see __delay and have the brokers create it."""
    eve = "User:eve"
    metadata = Metadata(_acl(eve, ResourceType.TOPIC, "pub", Operation.WRITE))
    authorizer = AclAuthorizer(metadata, {"User:admin"}, auto_create=True)

    def produce(*targets: str) -> broker_pb2.ProduceRequest:
        records = [
            Record(None, b"x", 1, tuple(delay.route_headers(t, 0, 5_000, 1_000))) for t in targets
        ]
        entries = build_batch(records) if records else b""
        return broker_pb2.ProduceRequest(topic=delay.DELAY_TOPIC, partition=3, entries=entries)

    authorizer.authorize("Produce", produce("pub", "pub"), eve)
    refusal = _refusal(authorizer, "Produce", produce("pub", "secret"), eve)
    assert "'secret'" in refusal.message and "WRITE" in refusal.message
    authorizer.authorize("Produce", produce("pub"), eve)  # not cached past the targets
    _refusal(authorizer, "Produce", produce("secret"), eve)
    no_route = broker_pb2.ProduceRequest(
        topic=delay.DELAY_TOPIC, entries=build_batch([Record(None, b"x", 1)])
    )
    assert delay.DELAY_TOPIC in _refusal(authorizer, "Produce", no_route, eve).message
    asked = broker_pb2.MetadataRequest(topics=[delay.DELAY_TOPIC], allow_auto_create=True)
    authorizer.authorize("Metadata", asked, eve)
    listing = broker_pb2.MetadataResponse(
        topics=[broker_pb2.TopicInfo(name=n) for n in (delay.DELAY_TOPIC, "secret")]
    )
    shown = authorizer.shown("Metadata", asked, listing, eve)
    assert [t.name for t in shown.topics] == [delay.DELAY_TOPIC]


def test_share_groups_need_read_describe_alter_configs_and_delete_on_the_group() -> None:
    member, operator = "User:member", "User:operator"
    metadata = Metadata(
        _acl(member, ResourceType.GROUP, "q", Operation.READ),
        _acl(member, ResourceType.TOPIC, "jobs", Operation.READ),
        _acl(operator, ResourceType.GROUP, "q", Operation.ALTER_CONFIGS),
        _acl(operator, ResourceType.GROUP, "q", Operation.DELETE),
    )
    authorizer = AclAuthorizer(metadata)
    beat = share_pb2.ShareGroupHeartbeatRequest(group_id="q", subscriptions=["jobs"])
    authorizer.authorize("ShareGroupHeartbeat", beat, member)
    authorizer.authorize(
        "DescribeShareGroup", share_pb2.DescribeShareGroupRequest(group_id="q"), member
    )
    alter = share_pb2.AlterShareGroupConfigRequest(group_id="q")
    refusal = _refusal(authorizer, "AlterShareGroupConfig", alter, member)
    assert refusal.name == "GROUP_AUTHORIZATION_FAILED" and "ALTER_CONFIGS" in refusal.message
    authorizer.authorize("AlterShareGroupConfig", alter, operator)
    authorizer.authorize("DeleteShareGroup", groups_pb2.DeleteGroupRequest(group_id="q"), operator)
    _refusal(authorizer, "ShareGroupHeartbeat", beat, operator)
    listed = share_pb2.ListShareGroupsResponse(
        groups=[share_pb2.ShareGroupSummary(group_id=g) for g in ("q", "other")]
    )
    shown = authorizer.shown("ListShareGroups", None, listed, member)
    assert [g.group_id for g in shown.groups] == ["q"]
