"""raftmq.v1.Admin (admin.proto): the documented admin service operators use, on every
controller voter. A thin adapter over :class:`~raftmq.controller.quorum.ControllerQuorum`:
changes go through the quorum's leader (others answer NOT_CONTROLLER with its address, as
the Controller service does); reads are linearizable on any voter.

Checked here: what could make a command huge or a message long (a topic name, config
keys and values, a list of partitions), so it is refused quoted short before it is
proposed, with the code the state machine would give. Everything else (counts, factors,
config values, the state of topics and brokers) is the state machine's to judge, so one
rule holds whichever way a command arrives.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping

import grpc

from raftmq import net
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.acl_admin import AclAdmin
from raftmq.broker.live_state import LiveState
from raftmq.broker.quota_admin import QuotaAdmin
from raftmq.broker.refusals import Refusal, name_list, shorten
from raftmq.broker.rpc import add_service
from raftmq.broker.scram_admin import ScramAdmin
from raftmq.controller import healing
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import Broker, BrokerState, MetadataState, PartitionState, Topic
from raftmq.controller.quorum import ControllerQuorum
from raftmq.controller.topic_config import KEYS, MAX_CONFIG_VALUE_CHARS
from raftmq.controller.transitions import MAX_PARTITIONS_PER_TOPIC, MAX_REPLICATION_FACTOR
from raftmq.format.delay import DELAY_TOPIC

log = logging.getLogger(__name__)

_BROKER_STATE = {
    BrokerState.ALIVE: apb.BROKER_STATE_ALIVE,
    BrokerState.FENCED: apb.BROKER_STATE_FENCED,
    BrokerState.DRAINING: apb.BROKER_STATE_DRAINING,
}
_PARTITION_STATE = {
    PartitionState.ACTIVE: apb.PARTITION_STATE_ACTIVE,
    PartitionState.DECOMMISSIONED: apb.PARTITION_STATE_DECOMMISSIONED,
}


def topic_description(topic: Topic) -> apb.TopicDescription:
    settings = topic.settings
    log_config = settings.log_config
    effective = {
        "retention.ms": log_config.retention_ms,
        "retention.bytes": log_config.retention_bytes,
        "segment.bytes": log_config.segment_bytes,
        "segment.ms": log_config.segment_ms,
        "max.message.bytes": log_config.max_message_bytes,
        "flush.policy": log_config.flush_policy.value,
        "flush.interval.ms": log_config.flush_interval_ms,
        "min.insync.replicas": settings.min_insync_replicas,
        "delivery.max.delay.ms": settings.delivery_max_delay_ms,
    }
    assert set(effective) == set(KEYS), "a topic setting is missing from the description"
    return apb.TopicDescription(
        name=topic.name,
        topic_id=topic.topic_id,
        replication_factor=topic.replication_factor,
        partitions=[
            apb.PartitionDescription(
                partition=i,
                replicas=part.replicas,
                learners=part.learners,
                leader_id=part.leader or 0,
                leader_term=part.leader_term,
                state=_PARTITION_STATE[part.state],
                delete_after_ms=part.delete_after_ms or 0,
            )
            for i, part in enumerate(topic.partitions)
        ],
        config=dict(topic.config),
        effective_config={k: str(v) for k, v in effective.items()},
    )


def broker_description(broker: Broker) -> apb.BrokerDescription:
    return apb.BrokerDescription(
        id=broker.id,
        host=broker.host,
        port=broker.port,
        raft_host=broker.raft_host,
        raft_port=broker.raft_port,
        rack=broker.rack or "",
        state=_BROKER_STATE[broker.state],
        incarnation=broker.incarnation,
        epoch=broker.epoch,
    )


def _topic(state: MetadataState, name: str) -> Topic:
    topic = state.topics.get(name)
    if topic is None:
        raise Refusal(pb.ERROR_CODE_UNKNOWN_TOPIC, f"there is no topic {shorten(name)}")
    return topic


def _check_name(name: str) -> str:
    """Checked here as well as by the state machine so that a huge or garbled name is
    refused quoted short, before it becomes a command."""
    if not TOPIC_NAME.fullmatch(name):
        raise Refusal(
            pb.ERROR_CODE_INVALID_TOPIC_NAME,
            f"topic name {shorten(name)} must be 1-200 characters of A-Z a-z 0-9 . _ -",
        )
    return name


def _check_keys(keys: Collection[str], values: Iterable[str] = ()) -> None:
    """Unknown keys and long values refused quoted short (the state machine judges the
    rest, with the same codes)."""
    unknown = [k for k in keys if k not in KEYS]
    if unknown:
        raise Refusal(
            pb.ERROR_CODE_INVALID_CONFIG,
            f"{name_list(unknown)}: not a topic setting; the settings are {', '.join(KEYS)}",
        )
    for value in values:
        if len(value) > MAX_CONFIG_VALUE_CHARS:
            raise Refusal(
                pb.ERROR_CODE_INVALID_CONFIG,
                f"the value {shorten(value)} is over {MAX_CONFIG_VALUE_CHARS} characters",
            )


def _refs(keys: Iterable[tuple[str, int]]) -> list[apb.PartitionRef]:
    return [apb.PartitionRef(topic=t, partition=p) for t, p in keys]


def _loads(state: MetadataState) -> list[apb.BrokerLoad]:
    held = healing.brokers_holding(state, state.brokers)
    leads = dict.fromkeys(state.brokers, 0)
    for topic in state.topics.values():
        for part in topic.partitions:
            if part.state == PartitionState.ACTIVE and part.preferred_leader in leads:
                leads[part.preferred_leader] += 1
    return [
        apb.BrokerLoad(broker_id=b, replicas=held[b], preferred_leaders=leads[b])
        for b in sorted(state.brokers)
    ]


class AdminService(ScramAdmin, AclAdmin, QuotaAdmin):
    """The Admin service; its SCRAM user calls are :class:`ScramAdmin`'s, its ACL calls
    :class:`AclAdmin`'s, its client quota calls :class:`QuotaAdmin`'s."""

    def __init__(
        self,
        quorum: ControllerQuorum,
        addresses: Mapping[int, str],
        move_limits: healing.Limits = healing.DEFAULT_LIMITS,
        *,
        security: net.Security = net.PLAINTEXT,
    ) -> None:
        """``move_limits``: the mover's (its heal delay shapes what a status and a
        rebalance forecast say); ``security``: how to reach the other brokers."""
        super().__init__(quorum, addresses)
        self.move_limits = move_limits
        self.live = LiveState(security=security)
        """Asks leader brokers for DescribeTopic's live state (a channel per broker)."""

    async def CreateTopic(
        self, request: apb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> apb.CreateTopicResponse:
        _check_name(request.name)
        _check_keys(request.config, request.config.values())
        if len(request.assignment) > MAX_PARTITIONS_PER_TOPIC or any(
            len(r.brokers) > MAX_REPLICATION_FACTOR for r in request.assignment
        ):
            raise Refusal(
                pb.ERROR_CODE_INVALID_PARTITIONS,
                f"a replica assignment lists at most {MAX_PARTITIONS_PER_TOPIC} partitions of "
                f"at most {MAX_REPLICATION_FACTOR} brokers",
            )
        created = await self.call(
            self.quorum.create_topic(
                request.name,
                request.partitions,
                request.replication_factor,
                dict(request.config),
                [tuple(r.brokers) for r in request.assignment],
            )
        )
        topic, version = self._described(request.name, created.topic_id)
        log.info(
            "created topic %s (id %d): %d partitions of %d replicas, at metadata version %d",
            request.name,
            created.topic_id,
            len(topic.partitions),
            topic.replication_factor,
            version,
        )
        return apb.CreateTopicResponse(topic=topic, metadata_version=version)

    def _described(self, name: str, topic_id: int) -> tuple[apb.TopicDescription, int]:
        """The topic as applied here right after the leader's own command returned, and the
        version (it may hold later commands too; a topic deleted meanwhile is described by
        name and id only)."""
        version, state = self.quorum.local_state()
        topic = state.topics.get(name)
        if topic is None or topic.topic_id != topic_id:
            return apb.TopicDescription(name=name, topic_id=topic_id), version
        return topic_description(topic), version

    async def DeleteTopic(
        self, request: apb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        if request.name == DELAY_TOPIC:
            raise Refusal(
                pb.ERROR_CODE_INVALID_ARGUMENT,
                f"{DELAY_TOPIC} is internal: it holds the delayed messages not yet due "
                "(docs/delayed-delivery.md), and deleting it would lose them",
            )
        await self.call(self.quorum.delete_topic(_check_name(request.name)))
        version = self.quorum.local_state()[0]
        log.info("deleted topic %s, at metadata version %d", request.name, version)
        return apb.ChangeResponse(metadata_version=version)

    async def ListTopics(
        self, request: apb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> apb.ListTopicsResponse:
        version, state = await self.call(self.quorum.metadata(linearizable=True))
        return apb.ListTopicsResponse(
            topics=[topic_description(t) for _, t in sorted(state.topics.items())],
            metadata_version=version,
        )

    async def DescribeTopic(
        self, request: apb.DescribeTopicRequest, context: grpc.aio.ServicerContext
    ) -> apb.TopicDescription:
        _, state = await self.call(self.quorum.metadata(linearizable=True))
        described = topic_description(_topic(state, _check_name(request.name)))
        await self.live.fill(described, state)
        return described

    async def AlterTopicConfig(
        self, request: apb.AlterTopicConfigRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        _check_name(request.name)
        _check_keys([*request.set, *request.reset], request.set.values())
        await self.call(self.quorum.alter_config(request.name, dict(request.set), request.reset))
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def AddPartitions(
        self, request: apb.AddPartitionsRequest, context: grpc.aio.ServicerContext
    ) -> apb.AddPartitionsResponse:
        await self.call(self.quorum.add_partitions(_check_name(request.name), request.count))
        found = self.quorum.local_state()[1].topics.get(request.name)
        topic, version = self._described(request.name, found.topic_id if found else 0)
        return apb.AddPartitionsResponse(topic=topic, metadata_version=version)

    async def DecommissionPartitions(
        self, request: apb.DecommissionPartitionsRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        if len(request.partitions) > MAX_PARTITIONS_PER_TOPIC:
            raise Refusal(
                pb.ERROR_CODE_INVALID_PARTITIONS,
                f"{len(request.partitions)} partitions named; a topic has at most "
                f"{MAX_PARTITIONS_PER_TOPIC}",
            )
        await self.call(self.quorum.decommission(_check_name(request.name), request.partitions))
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def MoveReplica(
        self, request: apb.MoveReplicaRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        """AddReplica(to, replacing=from): the brokers make the partition's Raft group
        follow (raftmq.broker.membership_driver); the state machine judges the rest."""
        _check_name(request.topic)
        if request.from_broker == request.to_broker:
            raise Refusal(
                pb.ERROR_CODE_INVALID_REPLICA_CHANGE,
                f"from_broker and to_broker are both {request.from_broker}; a move needs two "
                "different brokers",
            )
        await self.call(
            self.quorum.add_replica(
                request.topic, request.partition, request.to_broker, replacing=request.from_broker
            )
        )
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def DescribeCluster(
        self, request: apb.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> apb.DescribeClusterResponse:
        version, state = await self.call(self.quorum.metadata(linearizable=True))
        return self._cluster(version, state)

    async def ClusterStatus(
        self, request: apb.ClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> apb.ClusterStatusResponse:
        version, state = await self.call(self.quorum.metadata(linearizable=True))
        stuck = healing.plan(state, self.quorum.now_ms(), self.move_limits).stuck
        return apb.ClusterStatusResponse(
            cluster=self._cluster(version, state),
            under_replicated=_refs(healing.under_replicated(state)),
            leaderless=_refs(healing.leaderless(state)),
            moves=[
                apb.MoveDescription(
                    topic=m.topic,
                    partition=m.partition,
                    learner=m.learner,
                    replacing=m.replacing or 0,
                )
                for m in healing.moves_under_way(state)
            ],
            loads=_loads(state),
            rebalance_requested=state.rebalance_requested,
            stuck=stuck,
        )

    async def DrainBroker(
        self, request: apb.DrainBrokerRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        await self.call(self.quorum.drain_broker(request.broker_id))
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def RebalanceCluster(
        self, request: apb.RebalanceClusterRequest, context: grpc.aio.ServicerContext
    ) -> apb.RebalanceClusterResponse:
        await self.call(self.quorum.request_rebalance())
        version, state = self.quorum.local_state()
        limits = dataclasses.replace(
            healing.UNLIMITED, heal_delay_ms=self.move_limits.heal_delay_ms
        )
        expected = healing.forecast(state, self.quorum.now_ms(), limits)
        return apb.RebalanceClusterResponse(
            moves=[
                apb.PlannedMove(
                    topic=m.topic,
                    partition=m.partition,
                    learner=m.learner,
                    replacing=m.replacing,
                    reason=m.reason.value,
                )
                for m in expected.moves
            ],
            leader_changes=[
                apb.PreferredLeaderChange(topic=r.name, partition=r.partition, replicas=r.replicas)
                for r in expected.reorders
            ],
            metadata_version=version,
        )

    def _cluster(self, version: int, state: MetadataState) -> apb.DescribeClusterResponse:
        return apb.DescribeClusterResponse(
            cluster=state.cluster_name,
            brokers=[broker_description(b) for _, b in sorted(state.brokers.items())],
            controller_voters=sorted(self.quorum.voters),
            controller_leader_id=self.quorum.leader,
            controller_id=self.quorum.node_id,
            metadata_version=version,
        )


def add_admin_service(service: AdminService, server: grpc.aio.Server) -> None:
    add_service(service, server, apb, "Admin")
