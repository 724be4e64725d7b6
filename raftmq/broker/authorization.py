"""The ACL authorizer (``raftmq broker --authorizer acl``, Kafka's StandardAuthorizer): what
every RPC needs (:data:`RULES`, one table for every method of every service), judged
against the ACLs of the broker's own copy of the metadata, and what a principal may not
see left out of the listings it gets.

With it on, super users (``--super-users "User:a;User:b"``, Kafka's ``super.users``) may
do everything; anyone else is denied unless an ACL allows it and none denies it
(raftmq.controller.acl_model). The brokers themselves call one another, and the
controller, under their own certificate's principal, so every broker's principal must be
a super user, or a cluster with the authorizer on cannot form (docs/security.md).

A denial is a Refusal with PERMISSION_DENIED and the resource type's code
(TOPIC_AUTHORIZATION_FAILED, ...), naming the principal, the operation and the resource;
it is raised by the guard before the method runs, so nothing is changed. A topic, group or
transactional id one may not DESCRIBE is left out of listings, and asking for it by name
is refused in the same words whether or not it exists.

Decisions are cached per (principal, host, resource, operation) and the cache dropped when
a new metadata version holds other ACLs, so a produce pays a dict lookup per request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.refusals import Refusal, shorten
from raftmq.controller.acl_model import (
    ANY_PRINCIPAL,
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    decide,
    denies,
    grants,
)
from raftmq.controller.model import MetadataState
from raftmq.format import delay, entry
from raftmq.format.delay import DELAY_TOPIC
from raftmq.format.errors import FormatError
from raftmq.format.records import decode_records
from raftmq.log_records import current_call

log = logging.getLogger(__name__)

MAX_CACHED_DECISIONS = 100_000
"""Decisions kept before the cache starts over (principals x resources can be many)."""

T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
Op = Operation

_DENIED_CODE = {
    T: pb.ERROR_CODE_TOPIC_AUTHORIZATION_FAILED,
    G: pb.ERROR_CODE_GROUP_AUTHORIZATION_FAILED,
    C: pb.ERROR_CODE_CLUSTER_AUTHORIZATION_FAILED,
    X: pb.ERROR_CODE_TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}
_WHAT = {T: "topic", G: "group", C: "cluster", X: "transactional id"}


class Need(NamedTuple):
    """One operation on one resource that a request needs; ``alternative``, when set,
    will do instead (CreateTopic: CREATE on the topic, or on the cluster). A tuple, not a
    dataclass: one is built for every request, and a frozen dataclass costs several times
    more to build."""

    resource_type: ResourceType
    name: str
    operation: Operation
    alternative: Need | None = None
    any_name: bool = False
    """``name`` is ignored: an ALLOW of the operation on any resource of the type will do
    (InitProducerId: WRITE on some topic, Kafka's rule since KIP-679)."""


def cluster(op: Operation) -> Need:
    return Need(C, CLUSTER_NAME, op)


def _topics(names: Iterable[str], op: Operation) -> list[Need]:
    return [Need(T, n, op) for n in dict.fromkeys(names)]


class View(NamedTuple):
    """What a rule may consult besides the request: the broker's metadata and whether
    it creates topics a produce names."""

    state: MetadataState
    auto_create: bool

    def creates(self, topic: str) -> bool:
        """Whether a produce (or a Metadata with allow_auto_create) of ``topic`` would
        create it here."""
        return self.auto_create and topic not in self.state.topics


def _create(topic: str) -> Need:
    return Need(T, topic, Op.CREATE, alternative=cluster(Op.CREATE))


def _produce(r: Any, v: View) -> list[Need]:
    if r.topic == DELAY_TOPIC:
        return _delayed(r.entries)
    needs = [Need(T, r.topic, Op.WRITE)]
    return [*needs, _create(r.topic)] if v.creates(r.topic) else needs


def _delayed(entries: bytes) -> list[Need]:
    """A produce of delayed messages (docs/delayed-delivery.md) needs WRITE on each topic
    its records are for, not on the internal topic that holds them: so a principal may
    delay messages exactly to the topics it may write, and no ACL names __delay. Records
    whose route cannot be read need WRITE on __delay itself (no one but a super user has
    it; the broker refuses them with INVALID_DELAY anyway)."""
    targets = []
    try:
        for header in entry.iter_headers(entries):
            for record in decode_records(entries, header):
                targets.append(delay.parse_route(record.headers)[0])
    except (FormatError, delay.DelayHeaderError):
        return [Need(T, DELAY_TOPIC, Op.WRITE)]
    return _topics(targets, Op.WRITE) or [Need(T, DELAY_TOPIC, Op.WRITE)]


def _metadata(r: Any, v: View) -> list[Need]:
    # __delay is internal: every client may see it and have it created (the brokers do).
    named = [t for t in r.topics if t != DELAY_TOPIC]
    needs = _topics(named, Op.DESCRIBE)
    if r.allow_auto_create:
        needs += [_create(t) for t in dict.fromkeys(named) if v.creates(t)]
    return needs


def _commit(r: Any, v: View) -> list[Need]:
    return [Need(G, r.group_id, Op.READ), *_topics((o.topic for o in r.offsets), Op.READ)]


def _share_read(r: Any, v: View) -> list[Need]:
    return [Need(G, r.group_id, Op.READ), Need(T, r.topic, Op.READ)]


def _txn(r: Any, v: View) -> list[Need]:
    return [Need(X, r.transactional_id, Op.WRITE)]


def _const(*needs: Need) -> Callable[[Any, View], list[Need]]:
    return lambda r, v: list(needs)


def _one(
    resource_type: ResourceType, field: str, op: Operation
) -> Callable[[Any, View], list[Need]]:
    return lambda r, v: [Need(resource_type, getattr(r, field), op)]


INTERNAL = _const(cluster(Op.CLUSTER_ACTION))
"""What brokers and controllers call on one another: their own principals, super users."""

NEEDS: dict[str, Callable[[Any, View], list[Need]]] = {
    # Broker service
    "Produce": _produce,
    "ProduceStream": _const(),  # each request as a Produce, refused in its own answer
    # (Guard.authorize_each, service.py), so one denied topic does not end the stream
    "Fetch": _one(T, "topic", Op.READ),
    "ListOffsets": _one(T, "topic", Op.DESCRIBE),
    "Metadata": _metadata,
    "InitProducerId": _const(
        Need(C, CLUSTER_NAME, Op.IDEMPOTENT_WRITE, alternative=Need(T, "", Op.WRITE, any_name=True))
    ),
    "RebuildReplica": _const(cluster(Op.ALTER)),
    "WriteTxnMarkers": INTERNAL,
    "DescribeDelayed": _one(T, "topic", Op.DESCRIBE),
    "ProduceDelayed": INTERNAL,
    "ProduceInternal": INTERNAL,
    # Admin service
    "CreateTopic": lambda r, v: [_create(r.name)],
    "DeleteTopic": _one(T, "name", Op.DELETE),
    "ListTopics": _const(),  # each topic shown only if DESCRIBE is allowed: SHOWN
    "DescribeTopic": _one(T, "name", Op.DESCRIBE),
    "AlterTopicConfig": _one(T, "name", Op.ALTER_CONFIGS),
    "AddPartitions": _one(T, "name", Op.ALTER),
    "DecommissionPartitions": _one(T, "name", Op.ALTER),
    "DescribeCluster": _const(cluster(Op.DESCRIBE)),
    "ClusterStatus": _const(cluster(Op.DESCRIBE)),
    "DrainBroker": _const(cluster(Op.ALTER)),
    "RebalanceCluster": _const(cluster(Op.ALTER)),
    "MoveReplica": _const(cluster(Op.ALTER)),
    "CreateAcls": _const(cluster(Op.ALTER)),
    "DescribeAcls": _const(cluster(Op.DESCRIBE)),
    "DeleteAcls": _const(cluster(Op.ALTER)),
    "AlterUserScramCredentials": _const(cluster(Op.ALTER)),
    "DescribeUserScramCredentials": _const(cluster(Op.DESCRIBE)),
    "AlterClientQuotas": _const(cluster(Op.ALTER_CONFIGS)),
    "DescribeClientQuotas": _const(cluster(Op.DESCRIBE_CONFIGS)),
    # Groups service
    "ConsumerGroupHeartbeat": lambda r, v: [
        Need(G, r.group_id, Op.READ),
        *_topics(r.subscriptions, Op.DESCRIBE),
    ],
    "CommitOffsets": _commit,
    "FetchOffsets": lambda r, v: [
        Need(G, r.group_id, Op.DESCRIBE),
        *_topics((p.topic for p in r.partitions), Op.DESCRIBE),
    ],
    "ListGroups": _const(),  # SHOWN
    "DescribeGroup": _one(G, "group_id", Op.DESCRIBE),
    "ResetOffsets": _commit,
    "DeleteGroup": _one(G, "group_id", Op.DELETE),
    # ShareGroups service (the coordinator's)
    "ShareGroupHeartbeat": lambda r, v: [
        Need(G, r.group_id, Op.READ),
        *_topics(r.subscriptions, Op.DESCRIBE),
    ],
    "ListShareGroups": _const(),  # SHOWN
    "DescribeShareGroup": _one(G, "group_id", Op.DESCRIBE),
    "AlterShareGroupConfig": _one(G, "group_id", Op.ALTER_CONFIGS),
    "DeleteShareGroup": _one(G, "group_id", Op.DELETE),
    # Transactions service
    "InitTransactions": _txn,
    "AddPartitionsToTxn": lambda r, v: [
        *_txn(r, v),
        *_topics((p.topic for p in r.partitions), Op.WRITE),
    ],
    "AddOffsetsToTxn": lambda r, v: [*_txn(r, v), *_commit(r, v)],
    "EndTxn": _txn,
    "ListTransactions": _const(),  # SHOWN
    "DescribeTransaction": _one(X, "transactional_id", Op.DESCRIBE),
    "AbortTransaction": _const(cluster(Op.ALTER)),
    # SharePartitions service (partition leaders)
    "ShareFetch": _share_read,
    "ShareAcknowledge": _share_read,
    "DescribeSharePartition": lambda r, v: [
        Need(G, r.group_id, Op.DESCRIBE),
        Need(T, r.topic, Op.DESCRIBE),
    ],
    "ResetSharePartition": lambda r, v: [Need(G, r.group_id, Op.DELETE), Need(T, r.topic, Op.READ)],
    # Controller service: brokers only
    "RegisterBroker": INTERNAL,
    "Heartbeat": INTERNAL,
    "WatchMetadata": INTERNAL,
    "ReportLeader": INTERNAL,
    "PromoteReplica": INTERNAL,
    "DescribeVoter": INTERNAL,
    "AllocateProducerIds": INTERNAL,
    # Authentication service: the SCRAM handshake, made before the caller has a principal
    # (it is User:ANONYMOUS then), so it needs nothing
    "ScramClientFirst": _const(),
    "ScramClientFinal": _const(),
}
"""Every RPC of every service -> what its request needs (tests/broker/test_acl_rules.py
fails for a method of a service with no entry, so no RPC can skip authorization)."""


SHOWN: dict[str, tuple[str, str, ResourceType]] = {
    "Metadata": ("topics", "name", T),
    "ListTopics": ("topics", "name", T),
    "FetchOffsets": ("offsets", "topic", T),
    "ListGroups": ("groups", "group_id", G),
    "ListShareGroups": ("groups", "group_id", G),
    "ListTransactions": ("transactions", "transactional_id", X),
}
"""Listings: RPC -> (the answer's repeated field, the item's name field, its resource
type). An item whose resource the principal may not DESCRIBE is left out."""


class AclAuthorizer:
    """The guard's authorizer (raftmq.broker.guard.Authorizer) over the ACLs of the
    metadata ``metadata()`` returns (the broker's newest copy)."""

    def __init__(
        self,
        metadata: Callable[[], MetadataState],
        super_users: Iterable[str] = (),
        *,
        auto_create: bool = False,
    ) -> None:
        self.metadata = metadata
        self.super_users = frozenset(super_users)
        self.auto_create = auto_create
        self._acls: tuple[AclBinding, ...] | None = None
        self._version = -1
        self._decisions: dict[tuple[Any, ...], bool] = {}
        self._producers: set[tuple[str, str]] = set()
        """(principal, topic) a Produce was allowed for, with the decisions (dropped with
        them): the produce path's one lookup."""
        self._by_host = False

    def authorize(self, rpc: str, request: object, principal: str) -> None:
        """Refusal (PERMISSION_DENIED, the resource type's code) for the first need of
        the request that ``principal`` is not allowed."""
        if principal in self.super_users:
            return
        state = self._current()
        fast = (
            rpc == "Produce"
            and not self._by_host
            and not self.auto_create
            and request.topic != DELAY_TOPIC  # type: ignore[attr-defined]
        )
        if fast and (principal, request.topic) in self._producers:  # type: ignore[attr-defined]
            return  # the produce path: one lookup once allowed
        for need in NEEDS[rpc](request, View(state, self.auto_create)):
            if not self.allowed(principal, need):
                raise self.denial(principal, need)
        if fast:
            self._producers.add((principal, request.topic))  # type: ignore[attr-defined]

    def shown(self, rpc: str, request: object, response: Any, principal: str) -> Any:
        """``response`` without the listed items ``principal`` may not DESCRIBE (changed
        in place: every answer is built for its call)."""
        listing = SHOWN.get(rpc)
        if listing is None or principal in self.super_users:
            return response
        if rpc in ("ListGroups", "ListShareGroups") and self.allowed(
            principal, cluster(Op.DESCRIBE)
        ):
            return response  # Kafka: DESCRIBE on the cluster lists every group
        field, name, resource_type = listing
        items = getattr(response, field)
        hidden = [
            i
            for i, item in enumerate(items)
            if not self.allowed(principal, Need(resource_type, getattr(item, name), Op.DESCRIBE))
            and not (resource_type == T and getattr(item, name) == DELAY_TOPIC)
        ]
        for i in reversed(hidden):
            del items[i]
        return response

    def allowed(self, principal: str, need: Need) -> bool:
        if principal in self.super_users:
            return True
        self._current()
        host = self._host() if self._by_host else WILDCARD
        key = (principal, host, need.resource_type, need.name, need.operation, need.any_name)
        decision = self._decisions.get(key)
        if decision is None:
            if need.any_name:
                decision = self._any(principal, host, need)
            else:
                decision = decide(
                    self._acls or (), principal, host, need.resource_type, need.name, need.operation
                )
            if len(self._decisions) >= MAX_CACHED_DECISIONS:
                self._decisions.clear()
                self._producers.clear()
            self._decisions[key] = decision
        if not decision and need.alternative is not None:
            return self.allowed(principal, need.alternative)
        return decision

    def denial(self, principal: str, need: Need) -> Refusal:
        what = _WHAT[need.resource_type]
        target = "any topic" if need.any_name else f"{what} {shorten(need.name)}"
        also = ""
        if need.alternative is not None:
            alt = need.alternative
            alt_target = "any topic" if alt.any_name else f"the {_WHAT[alt.resource_type]}"
            also = f" (nor {alt.operation} on {alt_target})"
        return Refusal(
            _DENIED_CODE[need.resource_type],
            f"{principal} may not {need.operation} on {target}{also}: no ACL allows it, or one "
            f"denies it; ask an operator to allow it ('raftmq acl add --allow-principal "
            f"{principal} --operation {need.operation.title().replace('_', '')} ...')",
        )

    def _current(self) -> MetadataState:
        """The metadata now. When its version moved, its ACLs are compared with the ones
        the decisions were made from (once per version: most versions change leaders, not
        ACLs), and the decisions dropped if they differ."""
        state = self.metadata()
        if state.version != self._version:
            self._version = state.version
            if state.acls != self._acls:
                self._acls = state.acls
                self._decisions = {}
                self._producers = set()
                self._by_host = any(b.host != WILDCARD for b in state.acls)
        return state

    def _any(self, principal: str, host: str, need: Need) -> bool:
        """An ALLOW of the operation on some resource of the type, not undone by a DENY
        of it on every name (``*``)."""
        matching = [
            b
            for b in self._acls or ()
            if b.resource_type == need.resource_type
            and b.principal in (principal, ANY_PRINCIPAL)
            and b.host in (host, WILDCARD)
        ]
        denied_everywhere = any(
            b.permission == Permission.DENY
            and b.pattern_type == PatternType.LITERAL
            and b.resource_name == WILDCARD
            and denies(b.operation, need.operation)
            for b in matching
        )
        return not denied_everywhere and any(
            b.permission == Permission.ALLOW and grants(b.operation, need.operation)
            for b in matching
        )

    @staticmethod
    def _host() -> str:
        """The calling client's IP address, as an ACL's host names it."""
        call = current_call()
        return call.host if call is not None else WILDCARD


def parse_super_users(text: str) -> frozenset[str]:
    """``--super-users``: principals separated by ``;`` (Kafka's super.users), each
    ``User:NAME``; ValueError naming a bad one."""
    users = [u.strip() for u in text.split(";") if u.strip()]
    for user in users:
        if not user.startswith("User:") or len(user) == len("User:"):
            raise ValueError(
                f"--super-users: {user!r} is not a principal; write User:NAME, several "
                "separated by ';' (e.g. 'User:admin;User:raftmq broker')"
            )
    return frozenset(users)
