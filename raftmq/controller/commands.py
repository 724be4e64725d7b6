"""The commands the metadata state machine applies (one Raft entry each) and the results
it returns, with their encoding. Callers build and read these typed values; only
:func:`encode`, :func:`decode_command` and :func:`decode_result` see bytes.

Times (``now_ms``) are stamped into a command by the controller that proposes it, from
its own clock: applying never reads a clock, so every replica reaches the same state.

Encoding: canonical JSON (codec.py) of ``{"format": 1, "type": NAME, "args": {...}}``;
results are ``{"format": 1, "type": NAME, "fields": {...}}``. A reader refuses a format
it does not know, an unknown type, a missing or extra field, and a value of the wrong
type, so a command from a newer controller is refused as a whole, never half-read.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from raftmq.controller import codec
from raftmq.controller.acl_model import AclBinding, AclFilter
from raftmq.controller.errors import RefusalCode
from raftmq.controller.model import TopicPartition
from raftmq.controller.scram_users import AlterScramCredentials

FORMAT_VERSION = 1
MAX_COMMAND_BYTES = 1024 * 1024


# -- commands ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker process announces itself at start; a higher ``incarnation`` means the
    process restarted (it is unfenced and gets a new epoch), the same one is a retry, a
    lower one is stale (see :attr:`~raftmq.controller.model.Broker.incarnation`)."""

    broker_id: int
    host: str
    port: int
    raft_host: str
    raft_port: int
    rack: str | None
    incarnation: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class BrokerHeartbeat:
    broker_id: int
    incarnation: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class FenceBroker:
    """Proposed by the controller leader when, by its own stamps, a broker's heartbeats
    stopped for longer than the session timeout. ``now_ms``: the proposer's clock, kept
    as the broker's ``fenced_at_ms`` (healing counts its delay from it)."""

    broker_id: int
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class UnfenceBroker:
    """Proposed by the controller leader when a fenced broker of this incarnation
    heartbeats again and has caught up."""

    broker_id: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class DrainBroker:
    """The broker takes no new replicas and the controller's mover moves its replicas off
    (controller/healing.py). Refused when the other placeable brokers are too few to hold
    a replica set of a partition it holds."""

    broker_id: int


@dataclass(frozen=True, slots=True)
class RequestRebalance:
    """Sets (``requested``) or clears the metadata's ``rebalance_requested`` flag: an
    operator sets it (``raftmq cluster rebalance``), the controller's mover clears it once
    it finds nothing left to even out."""

    requested: bool


PLACEMENT_RULES = 2
"""The placement rules new CreateTopic and AddPartitions entries are applied with: 1, the
greedy pass alone; 2, with the pass that evens out replicas (2026-11-27)."""


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """``replica_assignment``, when given, is the replica list of each partition
    (preferred leader first), as Kafka's ``--replica-assignment``: the launchers of local
    clusters place replicas round-robin so that tests know who leads what. Empty: the
    controller's plan."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)
    replica_assignment: tuple[tuple[int, ...], ...] = ()
    placement: int = 1
    """The version of the controller's placement rules this entry is applied with
    (:data:`PLACEMENT_RULES`); see :class:`AddPartitions`."""


@dataclass(frozen=True, slots=True)
class AlterTopicConfig:
    """Sets the keys in ``updates`` and returns the keys in ``removals`` to their defaults
    (Kafka's incremental alter); the resulting config is checked as a whole."""

    name: str
    updates: Mapping[str, str] = field(default_factory=dict)
    removals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AddPartitions:
    """Grows the topic to ``count`` partitions in all; existing ones stay as they are."""

    name: str
    count: int
    placement: int = 1
    """The version of the placement rules (raftmq/controller/placement.py) this entry is
    applied with. Placement runs when an entry is applied, so a voter that replays the
    entry later (from an older snapshot, after an upgrade) must place as the voters did
    that applied it first. Entries written before the field existed read as 1; a
    proposer writes :data:`PLACEMENT_RULES`."""


@dataclass(frozen=True, slots=True)
class DecommissionPartitions:
    """No new writes to these partitions; their data is deleted once the topic's
    retention has passed since ``now_ms``."""

    name: str
    partitions: tuple[int, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    name: str


@dataclass(frozen=True, slots=True)
class ReportLeader:
    """A partition's Raft group elected ``leader`` in ``term``; a report from an older
    term than the one recorded is refused as stale."""

    name: str
    partition: int
    leader: int
    term: int


@dataclass(frozen=True, slots=True)
class ReportLeaders:
    """Many partitions' :class:`ReportLeader` in one entry: the controller batches the
    reports that arrive while one batch is in its Raft round, so a thousand elections
    cost a few entries (and metadata versions), not a thousand. Each is applied or
    refused alone, in order, as if it were an entry of its own."""

    reports: tuple[ReportLeader, ...]


@dataclass(frozen=True, slots=True)
class AddReplica:
    """First step of a move: ``broker_id`` joins the partition as a learner (it copies
    the log but does not vote). At most one replica beyond the factor at a time.
    ``replacing``: the voter this learner takes the place of once promoted (healing a
    fenced broker's replica, draining, rebalancing); None to grow the set instead."""

    name: str
    partition: int
    broker_id: int
    replacing: int | None = None


@dataclass(frozen=True, slots=True)
class PromoteReplica:
    """Second step: the learner, caught up (the partition's leader checked its Raft
    progress and proposes this), becomes a voter; the voter the move replaces, if any,
    leaves in the same entry and the learner takes its place in the list (so a replaced
    preferred leader is replaced as preferred leader too)."""

    name: str
    partition: int
    broker_id: int


@dataclass(frozen=True, slots=True)
class RemoveReplica:
    """Last step: drop a voter (never below the replication factor) or cancel a learner."""

    name: str
    partition: int
    broker_id: int


@dataclass(frozen=True, slots=True)
class ReorderReplicas:
    """The same voters in a new order: changes only the preferred leader (first)."""

    name: str
    partition: int
    replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AllocateProducerIds:
    """Hands ``count`` consecutive producer ids to a broker for idempotent producers."""

    broker_id: int
    count: int


@dataclass(frozen=True, slots=True)
class GroupHeartbeat:
    """A consumer group member joins (``member_epoch`` 0; ``member_id`` "" for a new id),
    reports what it holds (its current epoch), or leaves (-1). The controller proposes a
    beat only when it changes something; one that changes nothing is answered from the
    leader's memory (raftmq.controller.groups)."""

    group_id: str
    member_id: str
    instance_id: str | None
    member_epoch: int
    subscriptions: tuple[str, ...]
    owned: tuple[TopicPartition, ...]
    assignor: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class RemoveGroupMembers:
    """Members whose heartbeats stopped for longer than their session timeout (the
    controller leader's timer proposes it) or that an operator removes."""

    group_id: str
    member_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OffsetEntry:
    topic: str
    partition: int
    offset: int
    metadata: str


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """One client's commit: a member's (its id and epoch), or, for a group with no
    members, a standalone consumer's (member id "")."""

    group_id: str
    member_id: str
    member_epoch: int
    offsets: tuple[OffsetEntry, ...]


@dataclass(frozen=True, slots=True)
class CommitOffsets:
    """Many clients' commits in one entry: the controller batches them, so thousands of
    commits a second do not each cost a Raft round. Each is accepted or refused alone."""

    commits: tuple[OffsetCommit, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class ResetOffsets:
    """An operator sets a group's committed offsets (``raftmq group reset-offsets``);
    refused while the group has members unless ``force``."""

    group_id: str
    offsets: tuple[OffsetEntry, ...]
    force: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Forget a group and its committed offsets; refused while it has members."""

    group_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupHeartbeat:
    """A share group member joins (``member_epoch`` 0; ``member_id`` "" for a new id),
    heartbeats (its current epoch) or leaves (-1). Proposed only when it changes
    something, as :class:`GroupHeartbeat` (raftmq.controller.share_groups)."""

    group_id: str
    member_id: str
    member_epoch: int
    subscriptions: tuple[str, ...]
    session_timeout_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class RemoveShareMembers:
    """Share group members whose heartbeats stopped for longer than their session
    timeout (the controller leader's timer proposes it)."""

    group_id: str
    member_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AlterShareGroupConfig:
    """Set share group settings (name: text; "" restores the default), creating the
    group, empty, when it does not exist."""

    group_id: str
    settings: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class DeleteShareGroup:
    """Forget a share group; refused while it has members."""

    group_id: str


@dataclass(frozen=True, slots=True)
class InitTransactions:
    """A producer takes its transactional id's producer id and a new epoch (fencing older
    instances); an open transaction is aborted first (raftmq.controller.transactions)."""

    transactional_id: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxn:
    """Consumer positions to commit with the transaction: the membership is checked as a
    member's commit is, now; the offsets apply with the commit decision."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: OffsetCommit


@dataclass(frozen=True, slots=True)
class EndTxn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class AbortTxn:
    """The coordinator aborts an open transaction on its own: its timeout passed (the
    leader's timer, with the producer id and epoch it saw expire, so a transaction that
    ended and began again meanwhile is left alone) or an operator asked (-1 and -1:
    whichever is open)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class TxnCall:
    """One caller's request in a :class:`TransactionCalls` batch: exactly one field set
    (the codec reads no untagged unions, so the kind is the field that is set)."""

    init: InitTransactions | None = None
    add_partitions: AddPartitionsToTxn | None = None
    add_offsets: AddOffsetsToTxn | None = None
    end: EndTxn | None = None
    abort: AbortTxn | None = None

    @property
    def request(
        self,
    ) -> InitTransactions | AddPartitionsToTxn | AddOffsetsToTxn | EndTxn | AbortTxn | None:
        """The call's request; None unless exactly one field is set."""
        requests = [
            r
            for r in (self.init, self.add_partitions, self.add_offsets, self.end, self.abort)
            if r is not None
        ]
        return requests[0] if len(requests) == 1 else None


@dataclass(frozen=True, slots=True)
class TransactionCalls:
    """Many transaction calls in one entry: the coordinator batches them, as offset
    commits, so thousands of transactions a second do not each cost a Raft round. Each is
    applied (or refused) alone, in order."""

    calls: tuple[TxnCall, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class WrittenMarkers:
    """The partitions of one transaction whose marker (``producer_id``,
    ``producer_epoch``: the marker's own) their leaders hold."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class RecordTxnMarkers:
    """The controller's marker driver records written markers; a transaction with none
    left pending is complete. A record for a transaction since moved on is ignored."""

    written: tuple[WrittenMarkers, ...]


# ACLs (raftmq.controller.acls)


@dataclass(frozen=True, slots=True)
class CreateAcls:
    """Adds the bindings (all or none); ones already held change nothing."""

    bindings: tuple[AclBinding, ...]


@dataclass(frozen=True, slots=True)
class DeleteAcls:
    """Removes every binding any of the filters matches."""

    filters: tuple[AclFilter, ...]


@dataclass(frozen=True, slots=True)
class QuotaAlteration:
    """One entity's change: ``updates`` set, ``removals`` dropped (an entity left with no
    value is deleted). Entity parts as in :class:`~raftmq.controller.model.ClientQuota`."""

    user: str
    client_id: str
    updates: Mapping[str, int] = field(default_factory=dict)
    removals: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterClientQuotas:
    """Kafka's AlterClientQuotas: every alteration applies, or none (raftmq.controller
    .quotas)."""

    alterations: tuple[QuotaAlteration, ...]


Command = Union[  # noqa: UP007 (a runtime value: get_args lists the commands)
    RegisterBroker,
    BrokerHeartbeat,
    FenceBroker,
    UnfenceBroker,
    DrainBroker,
    RequestRebalance,
    CreateTopic,
    AlterTopicConfig,
    AddPartitions,
    DecommissionPartitions,
    DeleteTopic,
    ReportLeader,
    ReportLeaders,
    AddReplica,
    PromoteReplica,
    RemoveReplica,
    ReorderReplicas,
    AllocateProducerIds,
    GroupHeartbeat,
    RemoveGroupMembers,
    CommitOffsets,
    ResetOffsets,
    DeleteGroup,
    ShareGroupHeartbeat,
    RemoveShareMembers,
    AlterShareGroupConfig,
    DeleteShareGroup,
    TransactionCalls,
    RecordTxnMarkers,
    AlterScramCredentials,
    CreateAcls,
    DeleteAcls,
    AlterClientQuotas,
]


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refused:
    """The command changed nothing; ``message`` says why and what to do instead."""

    code: RefusalCode
    message: str

    ok: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class Done:
    """Applied; the command returns nothing more."""

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class BrokerRegistered:
    epoch: int

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class TopicCreated:
    topic_id: int
    replicas: tuple[tuple[int, ...], ...]  # per partition, preferred leader first

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class PartitionsAdded:
    first_partition: int
    replicas: tuple[tuple[int, ...], ...]  # of the new partitions only

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ProducerIdsAllocated:
    first_id: int
    count: int

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """A member's answer to its heartbeat: who it is now, and what to do."""

    member_id: str
    member_epoch: int
    group_epoch: int
    assigned: tuple[TopicPartition, ...]
    """Consume these (and only these)."""
    revoke: tuple[TopicPartition, ...]
    """Stop consuming these, commit them, and say so in the next heartbeat."""

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class ShareAssignment:
    """A share group member's answer to its heartbeat: who it is now and what to fetch
    from (other members may fetch from the same partitions)."""

    member_id: str
    member_epoch: int
    group_epoch: int
    assigned: tuple[TopicPartition, ...]

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    code: str
    """"" when accepted, else the RefusalCode's value."""
    message: str


@dataclass(frozen=True, slots=True)
class CommitsApplied:
    outcomes: tuple[CommitOutcome, ...]
    """One per commit of the command, in order."""

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class LeadersReported:
    refusals: tuple[Refused | None, ...]
    """One per report of the command, in order: None when it applied."""

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class TxnOutcome:
    code: str
    """"" when accepted, else the RefusalCode's value (CONCURRENT_TRANSACTIONS after an
    InitTransactions that began aborting the open transaction: that one changed state)."""
    message: str
    producer_id: int = -1
    producer_epoch: int = -1
    """For InitTransactions and EndTxn: what the producer goes on with."""


@dataclass(frozen=True, slots=True)
class TxnOutcomes:
    outcomes: tuple[TxnOutcome, ...]
    """One per call of the command, in order."""

    ok: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class AclsDeleted:
    deleted: tuple[AclBinding, ...]
    """The bindings the command removed, sorted."""

    ok: ClassVar[bool] = True


Result = Union[  # noqa: UP007 (a runtime value: get_args lists the results)
    Refused,
    Done,
    BrokerRegistered,
    TopicCreated,
    PartitionsAdded,
    ProducerIdsAllocated,
    GroupAssignment,
    ShareAssignment,
    CommitsApplied,
    LeadersReported,
    TxnOutcomes,
    AclsDeleted,
]

_COMMANDS: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(Command)}
_RESULTS: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(Result)}


# -- encoding ------------------------------------------------------------------------------


class MalformedCommand(ValueError):
    """Bytes that are no command this version can apply; ``code`` says which way."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def encode(value: Command | Result) -> bytes:
    """The canonical bytes of a command (to propose) or a result (to return)."""
    kind = "fields" if type(value).__name__ in _RESULTS else "args"
    return codec.dumps(
        {"format": FORMAT_VERSION, "type": type(value).__name__, kind: codec.to_json(value)}
    )


def decode_command(data: bytes) -> Command:
    """Raises :class:`MalformedCommand` for anything but a command of a known type."""
    if len(data) > MAX_COMMAND_BYTES:
        raise MalformedCommand(
            RefusalCode.MALFORMED_COMMAND,
            f"a command of {len(data)} bytes exceeds the {MAX_COMMAND_BYTES}-byte limit",
        )
    value: Command = _decode(data, _COMMANDS, "args")
    return value


def decode_result(data: bytes) -> Result:
    """The typed result of an applied command (raises :class:`MalformedCommand` for bytes
    that are not one: a bug, since only the state machine writes results)."""
    value: Result = _decode(data, _RESULTS, "fields")
    return value


def _decode(data: bytes, known: dict[str, type], kind: str) -> Any:
    try:
        raw = codec.loads(data)
    except codec.CodecError as exc:
        raise MalformedCommand(RefusalCode.MALFORMED_COMMAND, str(exc)) from None
    if not isinstance(raw, dict) or set(raw) != {"format", "type", kind}:
        raise MalformedCommand(
            RefusalCode.MALFORMED_COMMAND, f"expected an object with format, type and {kind}"
        )
    if raw["format"] != FORMAT_VERSION:
        raise MalformedCommand(
            RefusalCode.UNSUPPORTED_VERSION,
            f"format {raw['format']!r} is not {FORMAT_VERSION}, the one this controller "
            "reads; upgrade every controller before using newer commands",
        )
    cls = known.get(raw["type"]) if isinstance(raw["type"], str) else None
    if cls is None:
        raise MalformedCommand(RefusalCode.MALFORMED_COMMAND, f"unknown type {raw['type']!r}")
    try:
        return codec.from_json(cls, raw[kind], cls.__name__)
    except TypeError as exc:
        raise MalformedCommand(RefusalCode.MALFORMED_COMMAND, str(exc)) from None
