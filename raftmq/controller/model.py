"""The cluster's metadata as the controller group holds it: immutable records, and one
immutable :class:`MetadataState` that the state machine replaces on every applied entry.

Why immutable, copied on write: a command is checked against one state and produces the
next one whole, so a refusal leaves nothing half-applied, and a reader (a watch stream,
a broker's copy) can hold on to a state as a consistent picture of one
version while later entries apply. The maps are plain dicts by type only; nothing
mutates one after the state holding it is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from raftmq.controller.acl_model import AclBinding
from raftmq.controller.scram_users import ScramCredential
from raftmq.controller.topic_config import TopicConfig, resolve
from raftmq.share_settings import ShareSettings


class BrokerState(StrEnum):
    ALIVE = "alive"
    FENCED = "fenced"  # heartbeats stopped: no placement target, its replicas get replaced
    DRAINING = "draining"  # leaving: no placement target, its replicas move off it


@dataclass(frozen=True, slots=True)
class Broker:
    id: int
    host: str  # where clients reach it (gRPC)
    port: int
    raft_host: str  # where its peers reach its Raft transport
    raft_port: int
    rack: str | None
    incarnation: int
    """Chosen by the broker process at start, growing with every start (a boot counter
    kept with its data, or its start time in ms): a registration with a higher
    incarnation is a restarted process, one with the same is a retry, one with a lower
    is a late message from a process since replaced, and refused."""
    epoch: int
    """The index of the entry that registered this incarnation (as KRaft's broker epoch):
    grows with every new incarnation, so anything stamped with an older one is stale."""
    last_heartbeat_ms: int  # as stamped by the proposing controller, on its clock
    fenced: bool = False
    draining: bool = False
    """Kept apart from ``fenced`` so a draining broker that dies and comes back is still
    draining: the operator's intent outlives the process."""
    fenced_at_ms: int = 0
    """When the controller that fenced it stamped the fence (0: never fenced). Healing
    waits a heal delay from here before it replaces the broker's replicas, and a new
    controller leader keeps counting from the same instant."""

    @property
    def state(self) -> BrokerState:
        if self.fenced:
            return BrokerState.FENCED
        return BrokerState.DRAINING if self.draining else BrokerState.ALIVE

    @property
    def placeable(self) -> bool:
        """Whether new replicas may go to this broker."""
        return self.state == BrokerState.ALIVE


class PartitionState(StrEnum):
    ACTIVE = "active"
    DECOMMISSIONED = "decommissioned"  # no new writes; readable until deleted


@dataclass(frozen=True, slots=True)
class Partition:
    replicas: tuple[int, ...]
    """The voting replicas, preferred leader first."""
    learners: tuple[int, ...] = ()
    """Replicas being added (healing, rebalance): they copy the log but do not vote until
    promoted."""
    replacing: int | None = None
    """The voter the move under way replaces: it leaves ``replicas`` in the same entry that
    promotes the learner, so the voting set never drops below the factor and is never two
    beyond it. None: no move, or one that adds a replica beyond the factor (a
    ``RemoveReplica`` ends that)."""
    leader: int | None = None  # as last reported by the partition's own Raft group
    leader_term: int = 0
    state: PartitionState = PartitionState.ACTIVE
    delete_after_ms: int | None = None
    """For a decommissioned partition: when its data may be deleted (None: never, its
    topic keeps data forever)."""

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0]


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    topic_id: int
    """The index of the entry that created the topic: unique for ever, so a topic deleted
    and created again under the same name is told apart (a broker that was down during the
    delete finds its old replicas under an id that no longer exists)."""
    replication_factor: int
    config: Mapping[str, str]  # the overrides an operator set, canonical text
    partitions: tuple[Partition, ...]

    @property
    def settings(self) -> TopicConfig:
        """The overrides with every default filled in."""
        return resolve(self.config, self.replication_factor)


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    instance_id: str | None
    """Static membership: a restarted member with the same instance id takes its place
    (and partitions) back, where a new member id would mean a rebalance."""
    member_epoch: int
    """The group epoch of the member's last assignment: a commit or heartbeat stamped
    with another is refused, so a zombie (a member removed, or since reassigned) cannot
    write progress for partitions it no longer holds."""
    subscriptions: tuple[str, ...]
    assigned: tuple[TopicPartition, ...]
    """What it may consume now (sorted)."""
    owned: tuple[TopicPartition, ...]
    """What it said it holds at its last heartbeat: until it gives a partition up, no
    other member gets it."""
    joined_ms: int


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str
    committed_ms: int


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    """A consumer group, coordinated here in the style of Kafka 4's protocol (KIP-848):
    members heartbeat, the coordinator computes a target assignment whenever membership,
    subscriptions or partition counts change (``epoch`` grows), and moves each member
    toward it incrementally (raftmq.controller.groups)."""

    group_id: str
    epoch: int = 0
    assignor: str = "sticky"
    members: Mapping[str, GroupMember] = field(default_factory=dict)
    target: Mapping[str, tuple[TopicPartition, ...]] = field(default_factory=dict)
    """Member id: the partitions it should end up with (computed at ``epoch``)."""
    target_counts: Mapping[str, int] = field(default_factory=dict)
    """The partition counts ``target`` was computed for: a topic that grew (or went)
    since makes the coordinator compute it again."""
    committed_offsets: Mapping[str, Mapping[int, CommittedOffset]] = field(default_factory=dict)
    """Topic: partition: the committed position (the next record to consume)."""


@dataclass(frozen=True, slots=True)
class ShareMember:
    """A share group member: what it subscribes to and the partitions it fetches from
    (several members may share one; raftmq.controller.share_groups assigns them)."""

    member_id: str
    member_epoch: int
    """The group epoch of its last assignment: a heartbeat stamped with another is
    FENCED_MEMBER_EPOCH."""
    subscriptions: tuple[str, ...]
    assigned: tuple[TopicPartition, ...]
    joined_ms: int
    session_timeout_ms: int


@dataclass(frozen=True, slots=True)
class ShareGroup:
    """A share group (docs/share-groups.md): members, assignments and settings only.
    Which records are acquired, by whom and until when is the share-partition state,
    kept by each partition's leader in the partition's own Raft group, never here:
    every broker watches this state, and acquisitions change with every fetch."""

    group_id: str
    created_version: int
    """The metadata version that created it: partition leaders tell a group deleted and
    created again under the same id from the old one, whose share-partition state they
    drop."""
    epoch: int = 0
    members: Mapping[str, ShareMember] = field(default_factory=dict)
    settings: ShareSettings = field(default_factory=ShareSettings)
    topics: tuple[str, ...] = ()
    """Every topic a member ever subscribed to while it existed, sorted (describe lists
    their partitions); a deleted topic leaves it, with its share-partition state."""


class TxnState(StrEnum):
    EMPTY = "empty"  # an id initialised, no transaction begun since
    ONGOING = "ongoing"
    PREPARE_COMMIT = "prepare_commit"  # decided: markers being written
    PREPARE_ABORT = "prepare_abort"
    COMPLETE_COMMIT = "complete_commit"  # every marker written
    COMPLETE_ABORT = "complete_abort"

    @property
    def ending(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def ended(self) -> bool:
        """Decided (markers pending or written): the last transaction's end is known."""
        return self.ending or self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def commits(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)


class TxnEndedBy(StrEnum):
    """Who ended the last transaction: what a call still carrying its epoch is told."""

    NONE = ""  # no transaction ended since the id's last InitTransactions
    PRODUCER = "producer"  # its EndTxn: a retry with the same decision answers again
    COORDINATOR = "coordinator"  # timeout or operator: TRANSACTION_ABORTED, abort succeeds
    INIT = "init"  # another instance's InitTransactions: the old epoch is fenced


@dataclass(frozen=True, slots=True)
class PendingOffset:
    offset: int
    metadata: str


@dataclass(frozen=True, slots=True)
class Transaction:
    """One transactional id's producer and its current (or last) transaction, kept by the
    coordinator (raftmq.controller.transactions; docs/transactions.md)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    """What the producer's calls must carry now. The end of each transaction moves it
    one up (or, at the top of the 16-bit range, to a new producer id at epoch 0), in the
    decision's own entry: never 32767, which only markers carry."""
    state: TxnState
    timeout_ms: int
    started_ms: int = 0
    """When the open (or ending) transaction began, on its proposer's clock; 0 if none."""
    partitions: tuple[TopicPartition, ...] = ()
    """The current (or ending) transaction's partitions, sorted."""
    group_id: str = ""
    offsets: Mapping[str, Mapping[int, PendingOffset]] = field(default_factory=dict)
    """Topic: partition: the position the commit applies to ``group_id`` (checked against
    the group when added); dropped by an abort."""
    pending_markers: tuple[TopicPartition, ...] = ()
    """The partitions whose marker of the last ended transaction is not written yet,
    sorted: in prepare_*, or in ongoing when the next transaction began before they
    were all written (the markers are off the producer's path: a partition holds the
    next transaction's batches until its marker lands)."""
    last_producer_id: int = -1
    last_epoch: int = -1
    """The producer id and epoch of the transaction being (or last) ended, -1 when none
    since the last InitTransactions or begin (or, in ongoing, once its markers are all
    written). Its markers carry (``last_producer_id``, ``last_epoch + 1``)."""
    ended_by: TxnEndedBy = TxnEndedBy.NONE
    last_committed: bool = False
    """In ongoing with markers pending: the last transaction's decision (in prepare_* the
    state says it). False otherwise."""


@dataclass(frozen=True, slots=True)
class ClientQuota:
    """The quota values set for one entity, Kafka's model (raftmq.controller.quotas;
    docs/quotas.md): a user, a client id, or both; each part is a name, ``<default>``
    (every user, or client id, with no entity of its own) or "" (the entity does not
    name that part)."""

    user: str
    client_id: str
    values: Mapping[str, int]
    """``producer_byte_rate``, ``consumer_byte_rate``, ``request_percentage``: the ones set."""


@dataclass(frozen=True, slots=True)
class MetadataState:
    cluster_name: str
    version: int = 0
    """The index of the last applied entry (refused ones too): a broker whose copy is at
    version V has seen exactly the entries up to V, so a watch resumes from V."""
    brokers: Mapping[int, Broker] = field(default_factory=dict)
    topics: Mapping[str, Topic] = field(default_factory=dict)
    next_producer_id: int = 0
    consumer_groups: Mapping[str, ConsumerGroup] = field(default_factory=dict)
    share_groups: Mapping[str, ShareGroup] = field(default_factory=dict)
    """Share groups by id; a group id names a consumer group or a share group, not both."""
    rebalance_requested: bool = False
    """An operator asked for a rebalance (``RequestRebalance``) and the controller's mover
    has not yet found the cluster balanced. In the metadata, not in the leader's memory,
    so a controller failover in the middle of a rebalance carries it on."""
    transactions: Mapping[str, Transaction] = field(default_factory=dict)
    """Transactional id: its producer and transaction (the coordinator's state)."""
    scram_users: Mapping[str, ScramCredential] = field(default_factory=dict)
    """User name: its SCRAM-SHA-256 credential (raftmq.controller.scram_users)."""
    acls: tuple[AclBinding, ...] = ()
    """The access control lists, sorted and distinct (raftmq.controller.acls)."""
    client_quotas: tuple[ClientQuota, ...] = ()
    """Every quota entity with its values, sorted by (user, client id)."""
