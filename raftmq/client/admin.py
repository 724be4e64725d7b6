"""A synchronous client of the raftmq.v1.Admin API (admin.proto): topics and the cluster;
and of the operators' side of raftmq.v1.Groups (groups.proto): list, describe, reset
offsets and delete consumer groups, of raftmq.v1.ShareGroups (share.proto): list,
describe, configure and delete share groups, and of raftmq.v1.Transactions
(transactions.proto): list, describe and abort transactions, all served by the same
controller leader. A share group's per-partition state is asked of each partition's
leader (SharePartitions).

It finds the controller quorum's leader from any bootstrap address: a voter that does not
lead answers NOT_CONTROLLER with the leader's address, and the call is resent there; with
no leader yet (CONTROLLER_NOT_AVAILABLE) or no answer, the next address is tried after a
backoff, a bounded number of times. Anything else is raised as a
:class:`~raftmq.client.errors.ClientError` with the code and the sentence.

A change whose connection broke mid-call is retried too, so it may turn out applied by the
first try: a create then answers TOPIC_ALREADY_EXISTS, a delete UNKNOWN_TOPIC. Callers
that must know describe the topic.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Unpack

import grpc

from raftmq import net, scram
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import admin_pb2_grpc as apb_grpc
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.api.v1 import transactions_pb2 as tpb
from raftmq.api.v1 import transactions_pb2_grpc as tpb_grpc
from raftmq.client.connections import SecuritySettings, checked_client_id, client_id_headers
from raftmq.client.errors import ClientError, error_of
from raftmq.client.lowlevel import LowLevelClient
from raftmq.client.sasl import client_security
from raftmq.format.delay import DELAY_TOPIC

_REDIRECTED = (pb.ERROR_CODE_NOT_CONTROLLER,)
_TRY_ANOTHER = (pb.ERROR_CODE_CONTROLLER_NOT_AVAILABLE,)


@dataclass(frozen=True, slots=True)
class DelayedSummary:
    """A topic's delayed messages not yet delivered (AdminClient.describe_delayed)."""

    pending: int
    next_due_ms: int
    """The earliest deliver-at among them, ms since the epoch; -1 when none."""
    complete: bool
    """False when a level's scan stopped at its bound or a level's leader did not
    answer: then ``pending`` is a lower bound."""


@dataclass(frozen=True, slots=True)
class SharePartitionState:
    """A share group's state on one partition (AdminClient.describe_share_partitions)."""

    topic: str
    partition: int
    description: spb.SharePartitionDescription | None
    """As the partition's leader has it; None when it did not answer (``error`` says)."""
    error: ClientError | None


class AdminClient:
    def __init__(
        self,
        bootstrap: Iterable[str],
        *,
        attempts: int = 60,
        backoff_s: float = 0.1,
        timeout_s: float = 15.0,
        client_id: str | None = None,
        **security: Unpack[SecuritySettings],
    ) -> None:
        """``security``: ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile`` (TLS) and
        ``sasl_mechanism``, ``sasl_username``, ``sasl_password``, ``sasl_oauth_token``
        (authentication), as the Producer's; ``client_id``: Kafka's ``client.id``, as the
        Producer's (None: ``adminclient-N``)."""
        self.bootstrap = list(bootstrap)
        if not self.bootstrap:
            raise ValueError("give at least one controller address host:port")
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.client_id = checked_client_id(client_id, "adminclient")
        self._channels = net.Channels(
            security=client_security(**security), headers=client_id_headers(self.client_id)
        )
        self._leader: str | None = None  # the controller leader's address, once known
        self._security = security

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channels.close()

    def _stub(self, address: str, service: type) -> Any:
        return service(self._channels.of(address))

    def _call(self, rpc: str, request: Any, service: type = apb_grpc.AdminStub) -> Any:
        last: ClientError | None = None
        turn = 0
        for _ in range(self.attempts):
            if self._leader is not None:
                address = self._leader
            else:
                address = self.bootstrap[turn % len(self.bootstrap)]
                turn += 1
            try:
                stub = self._stub(address, service)
                return getattr(stub, rpc)(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                last = error_of(exc)
            hint = last.meta.get("raftmq-leader-address", "")
            if last.code in _REDIRECTED and hint and hint != address:
                self._leader = hint
                continue
            if last.code in _REDIRECTED or last.code in _TRY_ANOTHER or last.unreachable:
                self._leader = None
                time.sleep(self.backoff_s)
                continue
            raise last
        assert last is not None
        raise last

    # --- topics -------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
        assignment: Iterable[Iterable[int]] = (),
    ) -> apb.CreateTopicResponse:
        """``assignment``: the brokers of each partition, preferred leader first (empty:
        the controller places them)."""
        return self._call(
            "CreateTopic",
            apb.CreateTopicRequest(
                name=name,
                partitions=partitions,
                replication_factor=replication_factor,
                config=dict(config or {}),
                assignment=[apb.ReplicaList(brokers=list(r)) for r in assignment],
            ),
        )

    def delete_topic(self, name: str) -> apb.ChangeResponse:
        return self._call("DeleteTopic", apb.DeleteTopicRequest(name=name))

    def list_topics(self) -> apb.ListTopicsResponse:
        return self._call("ListTopics", apb.ListTopicsRequest())

    def describe_topic(self, name: str) -> apb.TopicDescription:
        return self._call("DescribeTopic", apb.DescribeTopicRequest(name=name))

    def describe_delayed(self, name: str) -> DelayedSummary:
        """The delayed messages pending for topic ``name`` (docs/delayed-delivery.md):
        each level's leader counts them from its mover's cursor (a bounded scan) and the
        answers are added up. Levels no broker answered for make it incomplete."""
        try:
            answer = self._any_broker(
                "Metadata", pb.MetadataRequest(topics=[DELAY_TOPIC], routing_only=True)
            )
        except ClientError as exc:
            if exc.code == pb.ERROR_CODE_UNKNOWN_TOPIC:
                return DelayedSummary(0, -1, True)  # nothing was ever delayed
            raise
        levels_in_topic = {p.partition for t in answer.topics for p in t.partitions}
        pending, next_due, complete, answered = 0, -1, True, set()
        # Every broker, not the leaders one broker's metadata names: each answers for the
        # levels it moves now, so a leader change under way cannot hide a level.
        for address in sorted({f"{b.host}:{b.port}" for b in answer.brokers}):
            try:
                stub = pb_grpc.BrokerStub(self._channels.of(address))
                levels = stub.DescribeDelayed(
                    pb.DescribeDelayedRequest(topic=name), timeout=self.timeout_s
                ).levels
            except grpc.RpcError as exc:
                error = error_of(exc)
                if error.unreachable:
                    continue
                raise error from None
            for level in levels:
                if level.level in answered:
                    continue  # two brokers in one leader change: count the level once
                answered.add(level.level)
                pending += level.pending
                complete = complete and level.complete
                if level.next_due_ms >= 0:
                    due = level.next_due_ms
                    next_due = due if next_due < 0 else min(next_due, due)
        return DelayedSummary(pending, next_due, complete and answered >= levels_in_topic)

    def _any_broker(self, rpc: str, request: Any) -> Any:
        last: ClientError | None = None
        for address in self.bootstrap:
            try:
                stub = pb_grpc.BrokerStub(self._channels.of(address))
                return getattr(stub, rpc)(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                last = error_of(exc)
                if not last.unreachable:
                    raise last from None
        assert last is not None
        raise last

    def alter_topic_config(
        self, name: str, set: Mapping[str, str] | None = None, reset: Iterable[str] = ()
    ) -> apb.ChangeResponse:
        return self._call(
            "AlterTopicConfig",
            apb.AlterTopicConfigRequest(name=name, set=dict(set or {}), reset=list(reset)),
        )

    def add_partitions(self, name: str, count: int) -> apb.AddPartitionsResponse:
        return self._call("AddPartitions", apb.AddPartitionsRequest(name=name, count=count))

    def decommission_partitions(self, name: str, partitions: Iterable[int]) -> apb.ChangeResponse:
        return self._call(
            "DecommissionPartitions",
            apb.DecommissionPartitionsRequest(name=name, partitions=list(partitions)),
        )

    def move_replica(
        self, name: str, partition: int, from_broker: int, to_broker: int
    ) -> apb.ChangeResponse:
        """Start moving ``name``/``partition``'s replica from one broker to another; the
        answer says the move is recorded, not done (``to_broker`` is a learner until then:
        see :meth:`describe_topic`)."""
        return self._call(
            "MoveReplica",
            apb.MoveReplicaRequest(
                topic=name, partition=partition, from_broker=from_broker, to_broker=to_broker
            ),
        )

    # --- cluster ------------------------------------------------------------------------

    def describe_cluster(self) -> apb.DescribeClusterResponse:
        return self._call("DescribeCluster", apb.DescribeClusterRequest())

    def cluster_status(self) -> apb.ClusterStatusResponse:
        return self._call("ClusterStatus", apb.ClusterStatusRequest())

    def drain_broker(self, broker_id: int) -> apb.ChangeResponse:
        return self._call("DrainBroker", apb.DrainBrokerRequest(broker_id=broker_id))

    def rebalance_cluster(self) -> apb.RebalanceClusterResponse:
        return self._call("RebalanceCluster", apb.RebalanceClusterRequest())

    # --- ACLs (docs/security.md, "ACLs") --------------------------------------------------

    def create_acls(self, acls: Iterable[apb.AclBinding]) -> apb.ChangeResponse:
        """Add the bindings, all or none (ClientError INVALID_ACL names what is wrong)."""
        return self._call("CreateAcls", apb.CreateAclsRequest(acls=list(acls)))

    def describe_acls(self, acl_filter: apb.AclFilter | None = None) -> apb.DescribeAclsResponse:
        """The bindings ``acl_filter`` matches (None: every one)."""
        return self._call("DescribeAcls", apb.DescribeAclsRequest(filter=acl_filter))

    def delete_acls(self, filters: Iterable[apb.AclFilter]) -> apb.DeleteAclsResponse:
        """Remove every binding one of ``filters`` matches; the answer lists them."""
        return self._call("DeleteAcls", apb.DeleteAclsRequest(filters=list(filters)))

    # --- consumer groups ----------------------------------------------------------------

    def _groups(self, rpc: str, request: Any) -> Any:
        return self._call(rpc, request, gpb_grpc.GroupsStub)

    def list_groups(self) -> gpb.ListGroupsResponse:
        return self._groups("ListGroups", gpb.ListGroupsRequest())

    def describe_group(self, group_id: str) -> gpb.GroupDescription:
        return self._groups("DescribeGroup", gpb.DescribeGroupRequest(group_id=group_id))

    def fetch_group_offsets(
        self, group_id: str, partitions: Mapping[str, Iterable[int]] | None = None
    ) -> gpb.FetchOffsetsResponse:
        """The group's committed positions (of ``partitions``: topic -> partitions, or all)."""
        return self._groups(
            "FetchOffsets",
            gpb.FetchOffsetsRequest(
                group_id=group_id,
                partitions=[
                    gpb.GroupTopicPartitions(topic=t, partitions=list(p))
                    for t, p in (partitions or {}).items()
                ],
            ),
        )

    def reset_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[tuple[str, int], int],
        *,
        force: bool = False,
        metadata: str = "",
    ) -> gpb.ChangeDoneResponse:
        """Set the group's committed positions ((topic, partition) -> the next offset to
        consume); refused (GROUP_NOT_EMPTY) while it has members unless ``force``."""
        return self._groups(
            "ResetOffsets",
            gpb.ResetOffsetsRequest(
                group_id=group_id,
                offsets=[
                    gpb.OffsetToCommit(topic=t, partition=p, offset=o, metadata=metadata)
                    for (t, p), o in sorted(offsets.items())
                ],
                force=force,
            ),
        )

    def delete_group(self, group_id: str) -> gpb.ChangeDoneResponse:
        """Forget the group and its committed offsets; refused while it has members."""
        return self._groups("DeleteGroup", gpb.DeleteGroupRequest(group_id=group_id))

    # --- share groups (docs/share-groups.md) ----------------------------------------------

    def _share_groups(self, rpc: str, request: Any) -> Any:
        return self._call(rpc, request, spb_grpc.ShareGroupsStub)

    def list_share_groups(self) -> spb.ListShareGroupsResponse:
        return self._share_groups("ListShareGroups", spb.ListShareGroupsRequest())

    def describe_share_group(self, group_id: str) -> spb.ShareGroupDescription:
        """Members, their assignments, every setting (defaults included) and the topics
        the group consumed; the share-partition state is :meth:`describe_share_partitions`'."""
        return self._share_groups(
            "DescribeShareGroup", spb.DescribeShareGroupRequest(group_id=group_id)
        )

    def alter_share_group_config(
        self, group_id: str, settings: Mapping[str, str]
    ) -> gpb.ChangeDoneResponse:
        """Set share group settings (an empty value restores the default); creates the
        group, empty, when it does not exist (INVALID_SHARE_SETTING names a bad one)."""
        return self._share_groups(
            "AlterShareGroupConfig",
            spb.AlterShareGroupConfigRequest(
                group_id=group_id,
                settings=[
                    spb.ShareGroupSetting(name=k, value=v) for k, v in sorted(settings.items())
                ],
            ),
        )

    def delete_share_group(self, group_id: str) -> gpb.ChangeDoneResponse:
        """Forget the group (its partitions' leaders drop its state); refused while it has
        members."""
        return self._share_groups("DeleteShareGroup", gpb.DeleteGroupRequest(group_id=group_id))

    def describe_share_partitions(
        self, group_id: str, topics: Iterable[str] | None = None
    ) -> list[SharePartitionState]:
        """The group's state on each partition of ``topics`` (None: every topic it
        consumed), as each partition's leader has it. A partition whose leader did not
        answer carries the error instead, and the others are still described."""
        if topics is None:
            topics = self.describe_share_group(group_id).topics
        out = []
        with self._partition_client() as client:
            for topic in topics:
                try:
                    count = len(self.describe_topic(topic).partitions)
                except ClientError as exc:
                    if exc.code == pb.ERROR_CODE_UNKNOWN_TOPIC:
                        continue  # deleted since: its share-partition state went with it
                    raise
                for p in range(count):
                    request = spb.DescribeSharePartitionRequest(
                        group_id=group_id, topic=topic, partition=p
                    )
                    try:
                        described = client.call_leader(
                            topic,
                            p,
                            spb_grpc.SharePartitionsStub,
                            "DescribeSharePartition",
                            request,
                        )
                    except ClientError as exc:
                        out.append(SharePartitionState(topic, p, None, exc))
                        continue
                    out.append(SharePartitionState(topic, p, described, None))
        return out

    def reset_share_group_offsets(
        self, group_id: str, offsets: Mapping[tuple[str, int], int], *, force: bool = False
    ) -> dict[tuple[str, int], int]:
        """Move the group's share-partition start offsets ((topic, partition) -> offset,
        between each log's start and high watermark): records below are done, records
        from it available again with delivery count 0. Each partition's leader refuses it
        (GROUP_NOT_EMPTY) while the group has members unless ``force``; the first refusal
        is raised, the partitions before it are reset. Returns the new start offsets."""
        out = {}
        with self._partition_client() as client:
            for (topic, p), offset in sorted(offsets.items()):
                request = spb.ResetSharePartitionRequest(
                    group_id=group_id, topic=topic, partition=p, offset=offset, force=force
                )
                answer = client.call_leader(
                    topic, p, spb_grpc.SharePartitionsStub, "ResetSharePartition", request
                )
                out[topic, p] = answer.start_offset
        return out

    def _partition_client(self) -> LowLevelClient:
        """A client of the partition leaders, on the same addresses and security."""
        return LowLevelClient(
            self.bootstrap, retries=10, client_id=self.client_id, **self._security
        )

    # --- transactions -------------------------------------------------------------------

    def _transactions(self, rpc: str, request: Any) -> Any:
        return self._call(rpc, request, tpb_grpc.TransactionsStub)

    def list_transactions(self) -> tpb.ListTransactionsResponse:
        """Every transactional id the coordinator knows, with its state."""
        return self._transactions("ListTransactions", tpb.ListTransactionsRequest())

    def describe_transaction(self, transactional_id: str) -> tpb.TransactionDescription:
        return self._transactions(
            "DescribeTransaction",
            tpb.DescribeTransactionRequest(transactional_id=transactional_id),
        )

    def abort_transaction(self, transactional_id: str) -> tpb.AbortTransactionResponse:
        """Abort the id's open transaction (a hanging one): its producer then gets
        TRANSACTION_ABORTED and must abort and begin again."""
        return self._transactions(
            "AbortTransaction", tpb.AbortTransactionRequest(transactional_id=transactional_id)
        )

    # --- SCRAM users (docs/security.md) -------------------------------------------------

    def upsert_user_scram_credential(
        self, name: str, password: str, *, iterations: int = scram.DEFAULT_ITERATIONS
    ) -> apb.ChangeResponse:
        """Store (or replace) ``name``'s SCRAM-SHA-256 credential: the salt, StoredKey and
        ServerKey are computed here, so the password never leaves this process."""
        stored = scram.credential(password, iterations=iterations)
        upsertion = apb.ScramCredentialUpsertion(
            name=name,
            mechanism=scram.MECHANISM,
            iterations=stored.iterations,
            salt=stored.salt,
            stored_key=stored.stored_key,
            server_key=stored.server_key,
        )
        return self._call(
            "AlterUserScramCredentials",
            apb.AlterUserScramCredentialsRequest(upsertions=[upsertion]),
        )

    def delete_user_scram_credential(self, name: str) -> apb.ChangeResponse:
        """Delete ``name``'s credential (RESOURCE_NOT_FOUND if it has none)."""
        deletion = apb.ScramCredentialDeletion(name=name, mechanism=scram.MECHANISM)
        return self._call(
            "AlterUserScramCredentials", apb.AlterUserScramCredentialsRequest(deletions=[deletion])
        )

    def describe_user_scram_credentials(
        self, users: Iterable[str] = ()
    ) -> apb.DescribeUserScramCredentialsResponse:
        """The users with credentials (all, or ``users``): names, mechanisms, iterations."""
        return self._call(
            "DescribeUserScramCredentials",
            apb.DescribeUserScramCredentialsRequest(users=list(users)),
        )

    # --- client quotas ------------------------------------------------------------------

    def alter_client_quotas(
        self,
        user: str = "",
        client_id: str = "",
        *,
        set_values: Mapping[str, int] | None = None,
        remove: Iterable[str] = (),
    ) -> apb.ChangeResponse:
        """Kafka's AlterClientQuotas for one entity (docs/quotas.md): ``user`` and
        ``client_id`` each a name, ``<default>``, or "" when the entity does not name it;
        ``set_values`` sets quotas (``producer_byte_rate``, ``consumer_byte_rate``,
        ``request_percentage``), ``remove`` drops them (all dropped: the entity goes)."""
        alteration = apb.ClientQuotaAlteration(
            entity=apb.ClientQuotaEntity(user=user, client_id=client_id),
            set=dict(set_values or {}),
            remove=list(remove),
        )
        return self._call(
            "AlterClientQuotas", apb.AlterClientQuotasRequest(alterations=[alteration])
        )

    def describe_client_quotas(
        self, user: str = "", client_id: str = ""
    ) -> apb.DescribeClientQuotasResponse:
        """Every quota entity with its values; only those naming ``user`` or
        ``client_id`` exactly, when given."""
        return self._call(
            "DescribeClientQuotas",
            apb.DescribeClientQuotasRequest(user=user, client_id=client_id),
        )
