"""What each command does to the metadata: pure functions from (state, entry index,
command) to (next state, result).

Every handler checks everything first and builds the next state only when the command
is accepted, so a refusal returns the state it was given: nothing is ever half-applied.
No clock, no randomness, no iteration over anything unordered: the same state and
command give the same next state on every replica. The entry's index is the only
identity a command gets (a topic's id, a broker's epoch).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from raftmq.controller import (
    acls,
    codec,
    groups,
    quotas,
    scram_users,
    share_groups,
    transactions,
)
from raftmq.controller.commands import (
    PLACEMENT_RULES,
    AddPartitions,
    AddReplica,
    AllocateProducerIds,
    AlterClientQuotas,
    AlterShareGroupConfig,
    AlterTopicConfig,
    BrokerHeartbeat,
    BrokerRegistered,
    Command,
    CommitOffsets,
    CreateAcls,
    CreateTopic,
    DecommissionPartitions,
    DeleteAcls,
    DeleteGroup,
    DeleteShareGroup,
    DeleteTopic,
    Done,
    DrainBroker,
    FenceBroker,
    GroupHeartbeat,
    LeadersReported,
    PartitionsAdded,
    ProducerIdsAllocated,
    PromoteReplica,
    RecordTxnMarkers,
    Refused,
    RegisterBroker,
    RemoveGroupMembers,
    RemoveReplica,
    RemoveShareMembers,
    ReorderReplicas,
    ReportLeader,
    ReportLeaders,
    RequestRebalance,
    ResetOffsets,
    Result,
    ShareGroupHeartbeat,
    TopicCreated,
    TransactionCalls,
    UnfenceBroker,
)
from raftmq.controller.errors import CommandRefused
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import Broker, MetadataState, Partition, PartitionState, Topic
from raftmq.controller.placement import Candidate, plan
from raftmq.controller.scram_users import AlterScramCredentials
from raftmq.controller.topic_config import KEYS, ConfigError, canonical
from raftmq.format.delay import MOVER_PRODUCER_ID_BASE
from raftmq.limits import RACK

MAX_PARTITIONS_PER_TOPIC = 10_000
MAX_REPLICATION_FACTOR = 16
MAX_PRODUCER_ID_BLOCK = 1 << 20
HOST = re.compile(r"\A[A-Za-z0-9._:\[\]-]{1,253}\Z")  # a DNS name, IPv4 or [IPv6]

Outcome = tuple[MetadataState, Result]


def apply_command(state: MetadataState, index: int, command: Command) -> Outcome:
    """The state after ``command``, applied as the entry at ``index``, and its result.
    A refused command returns ``state`` itself. ``version`` is the caller's to set."""
    handler = _HANDLERS[type(command)]
    try:
        return handler(state, index, command)
    except CommandRefused as refusal:
        return state, Refused(refusal.code, refusal.message)


# -- brokers -------------------------------------------------------------------------------


def _register(state: MetadataState, index: int, c: RegisterBroker) -> Outcome:
    if c.broker_id < 1:
        raise CommandRefused(Code.INVALID_BROKER, f"broker id {c.broker_id} must be positive")
    for what, host, port in (("client", c.host, c.port), ("raft", c.raft_host, c.raft_port)):
        if not HOST.fullmatch(host):
            raise CommandRefused(
                Code.INVALID_BROKER, f"the {what} host {host!r} is not a host name or address"
            )
        if not 1 <= port <= 65535:
            raise CommandRefused(Code.INVALID_BROKER, f"the {what} port {port} is not 1-65535")
    if c.rack is not None and not RACK.fullmatch(c.rack):
        raise CommandRefused(
            Code.INVALID_BROKER, f"rack {c.rack!r} must be 1-64 characters of A-Z a-z 0-9 . _ -"
        )
    if c.incarnation < 0:
        raise CommandRefused(Code.INVALID_BROKER, "the incarnation must not be negative")
    old = state.brokers.get(c.broker_id)
    addresses = (c.host, c.port, c.raft_host, c.raft_port, c.rack)
    if old is not None and old.incarnation == c.incarnation:
        if (old.host, old.port, old.raft_host, old.raft_port, old.rack) != addresses:
            raise CommandRefused(
                Code.INVALID_BROKER,
                f"broker {c.broker_id} incarnation {c.incarnation} registered already with "
                "other addresses; a restarted broker must pick a new incarnation",
            )
        return state, BrokerRegistered(old.epoch)  # a retry of the same registration
    if old is not None and c.incarnation < old.incarnation:
        raise CommandRefused(
            Code.STALE_BROKER_INCARNATION,
            f"broker {c.broker_id} is registered as incarnation {old.incarnation}, newer "
            f"than {c.incarnation}: this registration comes from a process since replaced "
            "(or two brokers share the id)",
        )
    broker = Broker(
        c.broker_id,
        c.host,
        c.port,
        c.raft_host,
        c.raft_port,
        c.rack,
        incarnation=c.incarnation,
        epoch=index,
        last_heartbeat_ms=c.now_ms,
        draining=old is not None and old.draining,
    )
    return _with_broker(state, broker), BrokerRegistered(index)


def _heartbeat(state: MetadataState, index: int, c: BrokerHeartbeat) -> Outcome:
    broker = _current_broker(state, c.broker_id, c.incarnation)
    return _with_broker(state, dataclasses.replace(broker, last_heartbeat_ms=c.now_ms)), Done()


def _fence(state: MetadataState, index: int, c: FenceBroker) -> Outcome:
    broker = _broker(state, c.broker_id)
    if broker.fenced:  # fenced already: healing keeps counting from the first fence
        return state, Done()
    fenced = dataclasses.replace(broker, fenced=True, fenced_at_ms=c.now_ms)
    return _with_broker(state, fenced), Done()


def _unfence(state: MetadataState, index: int, c: UnfenceBroker) -> Outcome:
    broker = _current_broker(state, c.broker_id, c.incarnation)
    return _with_broker(state, dataclasses.replace(broker, fenced=False)), Done()


def _drain(state: MetadataState, index: int, c: DrainBroker) -> Outcome:
    broker = _broker(state, c.broker_id)
    if broker.draining:
        return state, Done()
    others = sum(b.placeable for b in state.brokers.values() if b.id != c.broker_id)
    for name, topic in sorted(state.topics.items()):
        held = any(
            c.broker_id in part.replicas + part.learners
            for part in topic.partitions
            if part.state == PartitionState.ACTIVE
        )
        if held and topic.replication_factor > others:
            raise CommandRefused(
                Code.NOT_ENOUGH_BROKERS,
                f"broker {c.broker_id} holds replicas of topic {name} (replication factor "
                f"{topic.replication_factor}) and only {others} other brokers can take "
                "replicas; start another broker (or bring a fenced one back) before draining",
            )
    return _with_broker(state, dataclasses.replace(broker, draining=True)), Done()


def _request_rebalance(state: MetadataState, index: int, c: RequestRebalance) -> Outcome:
    return dataclasses.replace(state, rebalance_requested=c.requested), Done()


def _allocate_producer_ids(state: MetadataState, index: int, c: AllocateProducerIds) -> Outcome:
    broker = _broker(state, c.broker_id)
    if broker.fenced:
        raise CommandRefused(
            Code.BROKER_NOT_AVAILABLE,
            f"broker {c.broker_id} is fenced; it gets producer ids once it heartbeats again",
        )
    if not 1 <= c.count <= MAX_PRODUCER_ID_BLOCK:
        raise CommandRefused(
            Code.INVALID_PRODUCER_ID_BLOCK,
            f"a block of {c.count} producer ids is not 1-{MAX_PRODUCER_ID_BLOCK}",
        )
    first = state.next_producer_id
    # Ids stop below the delay movers' reserved range (raftmq.format.delay), which the
    # partitions treat by another rule.
    if first + c.count > MOVER_PRODUCER_ID_BASE:
        raise CommandRefused(
            Code.PRODUCER_IDS_EXHAUSTED,
            f"only {MOVER_PRODUCER_ID_BASE - first} producer ids are left; ask for fewer",
        )
    next_state = dataclasses.replace(state, next_producer_id=first + c.count)
    return next_state, ProducerIdsAllocated(first, c.count)


# -- topics --------------------------------------------------------------------------------


def _create_topic(state: MetadataState, index: int, c: CreateTopic) -> Outcome:
    if not TOPIC_NAME.fullmatch(c.name):
        raise CommandRefused(
            Code.INVALID_TOPIC_NAME,
            f"topic name {c.name!r} must be 1-200 characters of A-Z a-z 0-9 . _ -",
        )
    if c.name in state.topics:
        raise CommandRefused(
            Code.TOPIC_ALREADY_EXISTS,
            f"topic {c.name} exists already; describe it, or delete it first",
        )
    _check_partition_count(c.partitions)
    if not 1 <= c.replication_factor <= MAX_REPLICATION_FACTOR:
        raise CommandRefused(
            Code.INVALID_REPLICATION_FACTOR,
            f"replication factor {c.replication_factor} is not 1-{MAX_REPLICATION_FACTOR}",
        )
    config = _checked_config(c.config, c.replication_factor)
    if c.replica_assignment:
        replicas = _checked_assignment(state, c)
    else:
        replicas = _place(
            state, c.partitions, c.replication_factor, first_partition=0, rules=c.placement
        )
    topic = Topic(
        c.name,
        topic_id=index,
        replication_factor=c.replication_factor,
        config=config,
        partitions=tuple(Partition(r) for r in replicas),
    )
    state = share_groups.topic_changed(_with_topic(state, topic), c.name)
    return state, TopicCreated(index, replicas)


def _alter_config(state: MetadataState, index: int, c: AlterTopicConfig) -> Outcome:
    topic = _topic(state, c.name)
    for key in c.removals:
        if key not in KEYS:
            raise CommandRefused(Code.INVALID_CONFIG, f"{key!r} is not a topic setting")
        if key in c.updates:
            raise CommandRefused(Code.INVALID_CONFIG, f"{key} is both set and removed; choose one")
    merged = {k: v for k, v in topic.config.items() if k not in c.removals} | dict(c.updates)
    config = _checked_config(merged, topic.replication_factor)
    return _with_topic(state, dataclasses.replace(topic, config=config)), Done()


def _add_partitions(state: MetadataState, index: int, c: AddPartitions) -> Outcome:
    topic = _topic(state, c.name)
    have = len(topic.partitions)
    if c.count <= have:
        raise CommandRefused(
            Code.INVALID_PARTITIONS,
            f"topic {c.name} has {have} partitions; the count can only grow, so ask for "
            f"more than {have}",
        )
    _check_partition_count(c.count)
    replicas = _place(
        state, c.count - have, topic.replication_factor, first_partition=have, rules=c.placement
    )
    grown = topic.partitions + tuple(Partition(r) for r in replicas)
    state = _with_topic(state, dataclasses.replace(topic, partitions=grown))
    return share_groups.topic_changed(state, c.name), PartitionsAdded(have, replicas)


def _decommission(state: MetadataState, index: int, c: DecommissionPartitions) -> Outcome:
    topic = _topic(state, c.name)
    if not c.partitions or len(set(c.partitions)) != len(c.partitions):
        raise CommandRefused(Code.INVALID_PARTITIONS, "name each partition to decommission once")
    for p in c.partitions:
        if _partition(topic, p).state == PartitionState.DECOMMISSIONED:
            raise CommandRefused(
                Code.PARTITION_DECOMMISSIONED, f"{c.name}/{p} is decommissioned already"
            )
    active = sum(p.state == PartitionState.ACTIVE for p in topic.partitions)
    if len(c.partitions) >= active:
        raise CommandRefused(
            Code.INVALID_PARTITIONS,
            f"that would leave topic {c.name} no partition to write to; delete the topic instead",
        )
    retention_ms = topic.settings.log_config.retention_ms
    delete_after_ms = None if retention_ms == -1 else min(c.now_ms + retention_ms, codec.INT64_MAX)
    parts = list(topic.partitions)
    for p in c.partitions:
        parts[p] = dataclasses.replace(
            parts[p], state=PartitionState.DECOMMISSIONED, delete_after_ms=delete_after_ms
        )
    return _with_topic(state, dataclasses.replace(topic, partitions=tuple(parts))), Done()


def _delete_topic(state: MetadataState, index: int, c: DeleteTopic) -> Outcome:
    _topic(state, c.name)
    topics = {name: t for name, t in state.topics.items() if name != c.name}
    state = groups.forget_topic(dataclasses.replace(state, topics=topics), c.name)
    state = share_groups.topic_changed(state, c.name)
    return transactions.forget_topic(state, c.name), Done()


# -- replicas and leaders ------------------------------------------------------------------


def _report_leader(state: MetadataState, index: int, c: ReportLeader) -> Outcome:
    topic = _topic(state, c.name)
    changed = _reported(_partition(topic, c.partition), c)
    return _with_partition(state, topic, c.partition, changed), Done()


def _report_leaders(state: MetadataState, index: int, c: ReportLeaders) -> Outcome:
    """Each report as :func:`_report_leader` would apply it after the ones before it;
    each topic's partitions are copied once, so the entry costs what it changes (plus
    one copy per topic it touches), not a copy of the topic per report."""
    changed: dict[str, list[Partition]] = {}
    refusals: list[Refused | None] = []
    for report in c.reports:
        try:
            topic = _topic(state, report.name)
            _partition(topic, report.partition)  # refuses one the topic does not have
            if report.name not in changed:
                changed[report.name] = list(topic.partitions)
            parts = changed[report.name]
            parts[report.partition] = _reported(parts[report.partition], report)
            refusals.append(None)
        except CommandRefused as refusal:
            refusals.append(Refused(refusal.code, refusal.message))
    for name, parts in changed.items():
        state = _with_topic(state, dataclasses.replace(state.topics[name], partitions=tuple(parts)))
    return state, LeadersReported(tuple(refusals))


def _reported(part: Partition, c: ReportLeader) -> Partition:
    """``part`` with the leader ``c`` reports; CommandRefused when the report is not of a
    voting replica or older than the one recorded."""
    if c.leader not in part.replicas:
        raise CommandRefused(
            Code.NOT_A_REPLICA,
            f"broker {c.leader} is no voting replica of {c.name}/{c.partition} "
            f"(replicas {list(part.replicas)}), so it cannot lead it",
        )
    if c.term < part.leader_term or (
        c.term == part.leader_term and part.leader not in (None, c.leader)
    ):
        raise CommandRefused(
            Code.STALE_LEADER_TERM,
            f"{c.name}/{c.partition} has a report from term {part.leader_term} "
            f"(leader {part.leader}); this one from term {c.term} is older",
        )
    return dataclasses.replace(part, leader=c.leader, leader_term=c.term)


def _add_replica(state: MetadataState, index: int, c: AddReplica) -> Outcome:
    topic = _topic(state, c.name)
    part = _active_partition(topic, c.partition)
    broker = _broker(state, c.broker_id)
    if not broker.placeable:
        raise CommandRefused(
            Code.BROKER_NOT_AVAILABLE,
            f"broker {c.broker_id} is {broker.state}; new replicas go to alive brokers only",
        )
    if c.broker_id in part.replicas + part.learners:
        raise CommandRefused(
            Code.INVALID_REPLICA_CHANGE,
            f"broker {c.broker_id} holds {c.name}/{c.partition} already",
        )
    if len(part.replicas) + len(part.learners) > topic.replication_factor:
        raise CommandRefused(
            Code.INVALID_REPLICA_CHANGE,
            f"{c.name}/{c.partition} already runs one replica beyond its factor "
            f"({topic.replication_factor}); finish that move (promote, then remove) first",
        )
    if c.replacing is not None and c.replacing not in part.replicas:
        raise CommandRefused(
            Code.NOT_A_REPLICA,
            f"broker {c.replacing} is no voting replica of {c.name}/{c.partition} "
            f"(replicas {list(part.replicas)}), so a move cannot replace it",
        )
    changed = dataclasses.replace(
        part, learners=(*part.learners, c.broker_id), replacing=c.replacing
    )
    return _with_partition(state, topic, c.partition, changed), Done()


def _promote_replica(state: MetadataState, index: int, c: PromoteReplica) -> Outcome:
    topic = _topic(state, c.name)
    part = _active_partition(topic, c.partition)
    if c.broker_id not in part.learners:
        raise CommandRefused(
            Code.NOT_A_REPLICA,
            f"broker {c.broker_id} is no learner of {c.name}/{c.partition}; add it first",
        )
    if part.replacing is None:
        replicas = (*part.replicas, c.broker_id)
    else:  # the learner takes the replaced voter's place, first (preferred) included
        replicas = tuple(c.broker_id if b == part.replacing else b for b in part.replicas)
    changed = dataclasses.replace(
        part,
        replicas=replicas,
        learners=tuple(b for b in part.learners if b != c.broker_id),
        replacing=None,
        leader=None if part.leader == part.replacing else part.leader,
    )
    return _with_partition(state, topic, c.partition, changed), Done()


def _remove_replica(state: MetadataState, index: int, c: RemoveReplica) -> Outcome:
    topic = _topic(state, c.name)
    part = _partition(topic, c.partition)
    if c.broker_id in part.learners:  # a move given up before its promotion
        changed = dataclasses.replace(
            part, learners=tuple(b for b in part.learners if b != c.broker_id), replacing=None
        )
    elif c.broker_id in part.replicas:
        if len(part.replicas) <= topic.replication_factor:
            raise CommandRefused(
                Code.INVALID_REPLICA_CHANGE,
                f"{c.name}/{c.partition} has {len(part.replicas)} voting replicas and needs "
                f"{topic.replication_factor}; add and promote a replacement before removing "
                f"broker {c.broker_id}",
            )
        changed = dataclasses.replace(
            part,
            replicas=tuple(b for b in part.replicas if b != c.broker_id),
            leader=None if part.leader == c.broker_id else part.leader,
        )
    else:
        raise CommandRefused(
            Code.NOT_A_REPLICA, f"broker {c.broker_id} holds no replica of {c.name}/{c.partition}"
        )
    return _with_partition(state, topic, c.partition, changed), Done()


def _reorder_replicas(state: MetadataState, index: int, c: ReorderReplicas) -> Outcome:
    topic = _topic(state, c.name)
    part = _partition(topic, c.partition)
    if len(c.replicas) != len(part.replicas) or set(c.replicas) != set(part.replicas):
        raise CommandRefused(
            Code.INVALID_REPLICA_CHANGE,
            f"{list(c.replicas)} is not an order of {c.name}/{c.partition}'s replicas "
            f"{list(part.replicas)}; change the set with add, promote and remove",
        )
    changed = dataclasses.replace(part, replicas=c.replicas)
    return _with_partition(state, topic, c.partition, changed), Done()


# -- helpers -------------------------------------------------------------------------------


def _broker(state: MetadataState, broker_id: int) -> Broker:
    broker = state.brokers.get(broker_id)
    if broker is None:
        raise CommandRefused(Code.UNKNOWN_BROKER, f"broker {broker_id} has not registered")
    return broker


def _current_broker(state: MetadataState, broker_id: int, incarnation: int) -> Broker:
    broker = _broker(state, broker_id)
    if broker.incarnation != incarnation:
        raise CommandRefused(
            Code.STALE_BROKER_INCARNATION,
            f"broker {broker_id} is registered as incarnation {broker.incarnation}, not "
            f"{incarnation}; a restarted broker registers again",
        )
    return broker


def _topic(state: MetadataState, name: str) -> Topic:
    topic = state.topics.get(name)
    if topic is None:
        raise CommandRefused(Code.UNKNOWN_TOPIC, f"there is no topic {name!r}")
    return topic


def _partition(topic: Topic, partition: int) -> Partition:
    if not 0 <= partition < len(topic.partitions):
        raise CommandRefused(
            Code.UNKNOWN_PARTITION,
            f"topic {topic.name} has partitions 0-{len(topic.partitions) - 1}, not {partition}",
        )
    return topic.partitions[partition]


def _active_partition(topic: Topic, partition: int) -> Partition:
    part = _partition(topic, partition)
    if part.state != PartitionState.ACTIVE:
        raise CommandRefused(
            Code.PARTITION_DECOMMISSIONED,
            f"{topic.name}/{partition} is decommissioned; its replicas no longer move",
        )
    return part


def _check_partition_count(count: int) -> None:
    if not 1 <= count <= MAX_PARTITIONS_PER_TOPIC:
        raise CommandRefused(
            Code.INVALID_PARTITIONS,
            f"a topic has 1-{MAX_PARTITIONS_PER_TOPIC} partitions, not {count}",
        )


def _checked_config(config: Mapping[str, str], replication_factor: int) -> dict[str, str]:
    try:
        return canonical(config, replication_factor)
    except ConfigError as exc:
        raise CommandRefused(Code.INVALID_CONFIG, str(exc)) from None


def _checked_assignment(state: MetadataState, c: CreateTopic) -> tuple[tuple[int, ...], ...]:
    """The explicit replica lists of ``c``, refused unless there is one per partition, of
    ``replication_factor`` distinct brokers, each registered and taking new replicas."""
    if len(c.replica_assignment) != c.partitions:
        raise CommandRefused(
            Code.INVALID_PARTITIONS,
            f"the replica assignment lists {len(c.replica_assignment)} partitions, "
            f"not {c.partitions}",
        )
    for p, replicas in enumerate(c.replica_assignment):
        if len(replicas) != c.replication_factor or len(set(replicas)) != len(replicas):
            raise CommandRefused(
                Code.INVALID_REPLICATION_FACTOR,
                f"partition {p} is assigned to brokers {list(replicas)}; each partition needs "
                f"{c.replication_factor} distinct brokers (the replication factor)",
            )
        for b in replicas:
            broker = state.brokers.get(b)
            if broker is None:
                raise CommandRefused(
                    Code.UNKNOWN_BROKER,
                    f"partition {p} is assigned to broker {b}, which has not registered",
                )
            if not broker.placeable:
                raise CommandRefused(
                    Code.BROKER_NOT_AVAILABLE,
                    f"partition {p} is assigned to broker {b}, which is {broker.state} and "
                    "takes no new replicas",
                )
    return c.replica_assignment


def _place(
    state: MetadataState, partitions: int, factor: int, *, first_partition: int, rules: int
) -> tuple[tuple[int, ...], ...]:
    """Replica sets for new partitions over the alive brokers, given the cluster's load,
    by the entry's version of the placement rules (commands.PLACEMENT_RULES)."""
    if not 1 <= rules <= PLACEMENT_RULES:
        raise CommandRefused(
            Code.MALFORMED_COMMAND,
            f"placement rules {rules} are not known here (1-{PLACEMENT_RULES}): a newer "
            "controller proposed this entry",
        )
    candidates = [Candidate(b.id, b.rack) for _, b in sorted(state.brokers.items()) if b.placeable]
    if factor > len(candidates):
        raise CommandRefused(
            Code.NOT_ENOUGH_BROKERS,
            f"replication factor {factor} needs {factor} alive brokers, and "
            f"{len(candidates)} are (fenced and draining ones take no new replicas); "
            "lower the factor or start more brokers",
        )
    replica_load: dict[int, int] = {}
    leader_load: dict[int, int] = {}
    for topic in state.topics.values():
        for part in topic.partitions:
            for b in part.replicas + part.learners:
                replica_load[b] = replica_load.get(b, 0) + 1
            leader_load[part.preferred_leader] = leader_load.get(part.preferred_leader, 0) + 1
    return plan(
        candidates,
        partitions,
        factor,
        replica_load=replica_load,
        leader_load=leader_load,
        first_partition=first_partition,
        even_out=rules >= 2,
    )


def _with_broker(state: MetadataState, broker: Broker) -> MetadataState:
    return dataclasses.replace(state, brokers={**state.brokers, broker.id: broker})


def _with_topic(state: MetadataState, topic: Topic) -> MetadataState:
    return dataclasses.replace(state, topics={**state.topics, topic.name: topic})


def _with_partition(
    state: MetadataState, topic: Topic, index: int, partition: Partition
) -> MetadataState:
    parts = (*topic.partitions[:index], partition, *topic.partitions[index + 1 :])
    return _with_topic(state, dataclasses.replace(topic, partitions=parts))


_HANDLERS: dict[type, Callable[[MetadataState, int, Any], Outcome]] = {
    RegisterBroker: _register,
    BrokerHeartbeat: _heartbeat,
    FenceBroker: _fence,
    UnfenceBroker: _unfence,
    DrainBroker: _drain,
    RequestRebalance: _request_rebalance,
    AllocateProducerIds: _allocate_producer_ids,
    CreateTopic: _create_topic,
    AlterTopicConfig: _alter_config,
    AddPartitions: _add_partitions,
    DecommissionPartitions: _decommission,
    DeleteTopic: _delete_topic,
    ReportLeader: _report_leader,
    ReportLeaders: _report_leaders,
    AddReplica: _add_replica,
    PromoteReplica: _promote_replica,
    RemoveReplica: _remove_replica,
    ReorderReplicas: _reorder_replicas,
    GroupHeartbeat: groups.heartbeat,
    RemoveGroupMembers: groups.remove_members,
    CommitOffsets: groups.commit_offsets,
    ResetOffsets: groups.reset_offsets,
    DeleteGroup: groups.delete_group,
    ShareGroupHeartbeat: share_groups.heartbeat,
    RemoveShareMembers: share_groups.remove_members,
    AlterShareGroupConfig: share_groups.alter_config,
    DeleteShareGroup: share_groups.delete_group,
    TransactionCalls: transactions.apply_calls,
    RecordTxnMarkers: transactions.record_markers,
    AlterScramCredentials: scram_users.alter,
    CreateAcls: acls.create_acls,
    DeleteAcls: acls.delete_acls,
    AlterClientQuotas: quotas.alter,
}
