"""Each metadata command, applied and refused: a refusal carries its code and a sentence,
and leaves the state exactly as it was (only the version moves, as for every entry)."""

from __future__ import annotations

import dataclasses

import pytest

from raftmq.controller.commands import (
    AddPartitions,
    AddReplica,
    AllocateProducerIds,
    AlterTopicConfig,
    BrokerHeartbeat,
    BrokerRegistered,
    Command,
    CreateTopic,
    DecommissionPartitions,
    DeleteTopic,
    Done,
    DrainBroker,
    FenceBroker,
    LeadersReported,
    PartitionsAdded,
    ProducerIdsAllocated,
    PromoteReplica,
    Refused,
    RegisterBroker,
    RemoveReplica,
    ReorderReplicas,
    ReportLeader,
    ReportLeaders,
    TopicCreated,
    UnfenceBroker,
    encode,
)
from raftmq.controller.errors import RefusalCode as Code
from raftmq.controller.metadata import broker_addresses, preferred_leader
from raftmq.controller.model import BrokerState, PartitionState
from raftmq.format.delay import MOVER_PRODUCER_ID_BASE
from raftmq.log.config import DAY_MS
from tests.controller.machine import Driver


@pytest.fixture
def three() -> Driver:
    d = Driver()
    for b in (1, 2, 3):
        assert d.register(b) == BrokerRegistered(d.index)
    return d


def refused(d: Driver, command: Command, code: Code) -> str:
    """Applies ``command``, checks it is refused with ``code`` and changed nothing."""
    before = d.machine.state
    result = d(command)
    assert isinstance(result, Refused), result
    assert result.code == code, result
    assert len(result.message) > 20, result.message  # a sentence, not a bare code
    assert d.machine.state == dataclasses.replace(before, version=d.index)
    return result.message


# -- brokers -------------------------------------------------------------------------------


def test_register_gives_an_epoch_and_a_retry_gets_the_same(three: Driver) -> None:
    broker = three.machine.state.brokers[2]
    assert (broker.state, broker.incarnation, broker.epoch) == (BrokerState.ALIVE, 1, 2)
    assert three.register(2) == BrokerRegistered(2)  # same incarnation: a retry
    assert three.register(2, incarnation=9) == BrokerRegistered(three.index)
    assert three.machine.state.brokers[2].epoch == three.index


def test_registration_refusals(three: Driver) -> None:
    def reg(**kw: object) -> RegisterBroker:
        fields = dict(
            broker_id=4, host="h", port=1, raft_host="h", raft_port=2, rack=None,
            incarnation=1, now_ms=0,
        )  # fmt: skip
        return RegisterBroker(**(fields | kw))  # type: ignore[arg-type]

    refused(three, reg(broker_id=0), Code.INVALID_BROKER)
    refused(three, reg(host="a b"), Code.INVALID_BROKER)
    refused(three, reg(raft_port=70000), Code.INVALID_BROKER)
    refused(three, reg(rack="rack one"), Code.INVALID_BROKER)
    refused(three, reg(incarnation=-1), Code.INVALID_BROKER)
    msg = refused(three, reg(broker_id=1, incarnation=1), Code.INVALID_BROKER)
    assert "new incarnation" in msg  # same incarnation, other addresses
    three.register(1, incarnation=5)
    msg = refused(three, reg(broker_id=1, incarnation=4), Code.STALE_BROKER_INCARNATION)
    assert "since replaced" in msg


def test_heartbeat_stamps_the_proposers_time(three: Driver) -> None:
    assert three(BrokerHeartbeat(1, incarnation=1, now_ms=5_000)) == Done()
    assert three.machine.state.brokers[1].last_heartbeat_ms == 5_000
    refused(three, BrokerHeartbeat(9, 1, 0), Code.UNKNOWN_BROKER)
    refused(three, BrokerHeartbeat(1, 2, 0), Code.STALE_BROKER_INCARNATION)


def test_fence_unfence_and_drain(three: Driver) -> None:
    assert three(FenceBroker(1)) == Done()
    assert three.machine.state.brokers[1].state == BrokerState.FENCED
    refused(three, UnfenceBroker(1, incarnation=2), Code.STALE_BROKER_INCARNATION)
    assert three(UnfenceBroker(1, incarnation=1)) == Done()
    assert three.machine.state.brokers[1].state == BrokerState.ALIVE
    assert three(DrainBroker(2)) == Done()
    assert three(FenceBroker(2)) == Done()
    assert three.machine.state.brokers[2].state == BrokerState.FENCED
    three.register(2, incarnation=2)  # restarted: unfenced, and still draining
    assert three.machine.state.brokers[2].state == BrokerState.DRAINING
    for command in (FenceBroker(7), UnfenceBroker(7, 1), DrainBroker(7)):
        refused(three, command, Code.UNKNOWN_BROKER)


def test_fenced_and_draining_brokers_take_no_new_replicas(three: Driver) -> None:
    three(FenceBroker(1))
    three(DrainBroker(2))
    msg = refused(three, CreateTopic("t", 1, 2), Code.NOT_ENOUGH_BROKERS)
    assert "1 are" in msg
    created = three(CreateTopic("t", 4, 1))
    assert isinstance(created, TopicCreated)
    assert created.replicas == ((3,),) * 4


def test_producer_id_blocks_do_not_overlap(three: Driver) -> None:
    assert three(AllocateProducerIds(1, 1000)) == ProducerIdsAllocated(0, 1000)
    assert three(AllocateProducerIds(2, 10)) == ProducerIdsAllocated(1000, 10)
    assert three.machine.state.next_producer_id == 1010
    refused(three, AllocateProducerIds(1, 0), Code.INVALID_PRODUCER_ID_BLOCK)
    refused(three, AllocateProducerIds(1, 1 << 30), Code.INVALID_PRODUCER_ID_BLOCK)
    refused(three, AllocateProducerIds(8, 1), Code.UNKNOWN_BROKER)
    three(FenceBroker(3))
    refused(three, AllocateProducerIds(3, 1), Code.BROKER_NOT_AVAILABLE)


def test_producer_ids_run_out_with_a_refusal() -> None:
    """They end below the delay movers' reserved range (raftmq.format.delay)."""
    d = Driver()
    d.register(1)
    near_end = MOVER_PRODUCER_ID_BASE - 4
    state = dataclasses.replace(d.machine.state, next_producer_id=near_end)
    d.machine.restore(_snapshot_of(state))
    refused(d, AllocateProducerIds(1, 5), Code.PRODUCER_IDS_EXHAUSTED)
    assert d(AllocateProducerIds(1, 4)) == ProducerIdsAllocated(near_end, 4)


def _snapshot_of(state: object) -> bytes:
    from raftmq.controller import codec

    return codec.dumps({"format": 1, "state": codec.to_json(state)})


# -- topics --------------------------------------------------------------------------------


def test_create_topic_places_and_records_it(three: Driver) -> None:
    result = three(CreateTopic("orders", 3, 2, {"retention.ms": "3600000"}))
    assert isinstance(result, TopicCreated)
    assert result.topic_id == three.index
    topic = three.machine.state.topics["orders"]
    assert topic.topic_id == three.index
    assert [p.replicas for p in topic.partitions] == list(result.replicas)
    assert topic.config == {"retention.ms": "3600000"}
    assert topic.settings.log_config.retention_ms == 3_600_000
    assert topic.settings.log_config.segment_bytes == 128 * 1024 * 1024  # a default
    state = three.machine.state
    assert len(state.topics["orders"].partitions) == 3
    assert preferred_leader(state, "orders", 1) == topic.partitions[1].replicas[0]
    assert broker_addresses(state)[2] == "127.0.0.1:9002"
    assert state.version == three.index


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (CreateTopic("", 1, 1), Code.INVALID_TOPIC_NAME),
        (CreateTopic("a/b", 1, 1), Code.INVALID_TOPIC_NAME),
        (CreateTopic("demo\n", 1, 1), Code.INVALID_TOPIC_NAME),
        (CreateTopic("x" * 201, 1, 1), Code.INVALID_TOPIC_NAME),
        (CreateTopic("t", 0, 1), Code.INVALID_PARTITIONS),
        (CreateTopic("t", 10_001, 1), Code.INVALID_PARTITIONS),
        (CreateTopic("t", 1, 0), Code.INVALID_REPLICATION_FACTOR),
        (CreateTopic("t", 1, 4), Code.NOT_ENOUGH_BROKERS),
        (CreateTopic("t", 1, 1, {"retention.minutes": "5"}), Code.INVALID_CONFIG),
        (CreateTopic("t", 1, 1, {"retention.ms": "soon"}), Code.INVALID_CONFIG),
        (CreateTopic("t", 1, 1, {"retention.ms": "1.5"}), Code.INVALID_CONFIG),
        (CreateTopic("t", 1, 1, {"segment.bytes": "10"}), Code.INVALID_CONFIG),
        (CreateTopic("t", 1, 1, {"flush.policy": "sometimes"}), Code.INVALID_CONFIG),
        (CreateTopic("t", 1, 2, {"min.insync.replicas": "3"}), Code.INVALID_CONFIG),
    ],
)
def test_create_topic_refusals(three: Driver, command: CreateTopic, code: Code) -> None:
    refused(three, command, code)


def test_create_topic_takes_an_explicit_replica_assignment(three: Driver) -> None:
    assignment = ((3, 1), (2, 3), (1, 2))
    result = three(CreateTopic("placed", 3, 2, replica_assignment=assignment))
    assert isinstance(result, TopicCreated) and result.replicas == assignment
    topic = three.machine.state.topics["placed"]
    assert tuple(p.replicas for p in topic.partitions) == assignment


@pytest.mark.parametrize(
    ("assignment", "code"),
    [
        (((1, 2),), Code.INVALID_PARTITIONS),  # one list for two partitions
        (((1, 2), (3,)), Code.INVALID_REPLICATION_FACTOR),  # a list of the wrong length
        (((1, 1), (2, 3)), Code.INVALID_REPLICATION_FACTOR),  # a broker twice
        (((1, 2), (2, 4)), Code.UNKNOWN_BROKER),  # never registered
        (((1, 2), (2, 3)), Code.BROKER_NOT_AVAILABLE),  # 3 is fenced, below
    ],
)
def test_replica_assignment_refusals(
    three: Driver, assignment: tuple[tuple[int, ...], ...], code: Code
) -> None:
    three(FenceBroker(3))
    refused(three, CreateTopic("t", 2, 2, replica_assignment=assignment), code)


def test_a_duplicate_topic_is_refused(three: Driver) -> None:
    three(CreateTopic("t", 1, 1))
    refused(three, CreateTopic("t", 2, 1), Code.TOPIC_ALREADY_EXISTS)


def test_config_messages_use_the_operators_key_names(three: Driver) -> None:
    msg = refused(three, CreateTopic("t", 1, 1, {"segment.bytes": "10"}), Code.INVALID_CONFIG)
    assert "segment.bytes" in msg and "segment_bytes" not in msg


def test_alter_config_sets_and_removes_keys(three: Driver) -> None:
    three(CreateTopic("t", 1, 3, {"retention.ms": "1000", "segment.ms": "60000"}))
    change = AlterTopicConfig("t", {"min.insync.replicas": "2"}, removals=("retention.ms",))
    assert three(change) == Done()
    topic = three.machine.state.topics["t"]
    assert topic.config == {"min.insync.replicas": "2", "segment.ms": "60000"}
    assert topic.settings.log_config.retention_ms == 14 * DAY_MS
    refused(three, AlterTopicConfig("nope", {}), Code.UNKNOWN_TOPIC)
    refused(three, AlterTopicConfig("t", {"bogus": "1"}), Code.INVALID_CONFIG)
    refused(three, AlterTopicConfig("t", removals=("bogus",)), Code.INVALID_CONFIG)
    both = AlterTopicConfig("t", {"segment.ms": "5"}, removals=("segment.ms",))
    refused(three, both, Code.INVALID_CONFIG)
    refused(three, AlterTopicConfig("t", {"min.insync.replicas": "4"}), Code.INVALID_CONFIG)


def test_add_partitions_only_grows_and_leaves_existing_ones(three: Driver) -> None:
    three(CreateTopic("t", 2, 2))
    three(ReportLeader("t", 0, three.machine.state.topics["t"].partitions[0].replicas[1], 3))
    before = three.machine.state.topics["t"].partitions
    result = three(AddPartitions("t", 5))
    assert isinstance(result, PartitionsAdded)
    assert result.first_partition == 2 and len(result.replicas) == 3
    after = three.machine.state.topics["t"].partitions
    assert after[:2] == before
    assert [p.replicas for p in after[2:]] == list(result.replicas)
    refused(three, AddPartitions("t", 5), Code.INVALID_PARTITIONS)
    refused(three, AddPartitions("t", 1), Code.INVALID_PARTITIONS)
    refused(three, AddPartitions("t", 20_000), Code.INVALID_PARTITIONS)
    refused(three, AddPartitions("u", 9), Code.UNKNOWN_TOPIC)
    three(FenceBroker(1))
    three(FenceBroker(2))
    refused(three, AddPartitions("t", 6), Code.NOT_ENOUGH_BROKERS)


def test_decommission_sets_the_delete_time_from_retention(three: Driver) -> None:
    three(CreateTopic("t", 4, 1, {"retention.ms": "1000"}))
    assert three(DecommissionPartitions("t", (1, 3), now_ms=50_000)) == Done()
    parts = three.machine.state.topics["t"].partitions
    assert [p.state for p in parts] == [
        PartitionState.ACTIVE,
        PartitionState.DECOMMISSIONED,
        PartitionState.ACTIVE,
        PartitionState.DECOMMISSIONED,
    ]
    assert parts[1].delete_after_ms == 51_000
    assert len(three.machine.state.topics["t"].partitions) == 4  # still readable
    refused(three, DecommissionPartitions("t", (1,), 0), Code.PARTITION_DECOMMISSIONED)
    refused(three, DecommissionPartitions("t", (4,), 0), Code.UNKNOWN_PARTITION)
    refused(three, DecommissionPartitions("t", (), 0), Code.INVALID_PARTITIONS)
    refused(three, DecommissionPartitions("t", (0, 0), 0), Code.INVALID_PARTITIONS)
    msg = refused(three, DecommissionPartitions("t", (0, 2), 0), Code.INVALID_PARTITIONS)
    assert "delete the topic" in msg
    refused(three, DecommissionPartitions("u", (0,), 0), Code.UNKNOWN_TOPIC)


def test_decommission_under_infinite_retention_never_deletes(three: Driver) -> None:
    three(CreateTopic("t", 2, 1, {"retention.ms": "-1"}))
    three(DecommissionPartitions("t", (0,), now_ms=1))
    assert three.machine.state.topics["t"].partitions[0].delete_after_ms is None


def test_delete_topic_and_recreate_gets_a_new_id(three: Driver) -> None:
    three(CreateTopic("t", 1, 1))
    first_id = three.machine.state.topics["t"].topic_id
    assert three(DeleteTopic("t")) == Done()
    assert "t" not in three.machine.state.topics
    refused(three, DeleteTopic("t"), Code.UNKNOWN_TOPIC)
    three(CreateTopic("t", 1, 1))
    assert three.machine.state.topics["t"].topic_id > first_id


# -- replicas and leaders ------------------------------------------------------------------


def test_report_leader_keeps_the_newest_term(three: Driver) -> None:
    three(CreateTopic("t", 1, 3))
    assert three(ReportLeader("t", 0, leader=2, term=5)) == Done()
    refused(three, ReportLeader("t", 0, leader=3, term=4), Code.STALE_LEADER_TERM)
    refused(three, ReportLeader("t", 0, leader=3, term=5), Code.STALE_LEADER_TERM)
    assert three(ReportLeader("t", 0, leader=2, term=5)) == Done()  # a repeat
    assert three(ReportLeader("t", 0, leader=3, term=6)) == Done()
    part = three.machine.state.topics["t"].partitions[0]
    assert (part.leader, part.leader_term) == (3, 6)
    refused(three, ReportLeader("t", 1, 2, 7), Code.UNKNOWN_PARTITION)
    refused(three, ReportLeader("u", 0, 2, 7), Code.UNKNOWN_TOPIC)


def test_reports_in_one_entry_apply_or_refuse_each_as_alone(three: Driver) -> None:
    three(CreateTopic("t", 2, 3))
    three(CreateTopic("u", 1, 3))
    result = three(
        ReportLeaders(
            (
                ReportLeader("t", 0, leader=2, term=5),
                ReportLeader("t", 0, leader=3, term=4),  # older than the one before it
                ReportLeader("t", 1, leader=1, term=2),
                ReportLeader("t", 7, leader=1, term=2),
                ReportLeader("u", 0, leader=9, term=2),
                ReportLeader("gone", 0, leader=1, term=2),
                ReportLeader("u", 0, leader=3, term=3),
            )
        )
    )
    assert isinstance(result, LeadersReported)
    codes = [r.code if isinstance(r, Refused) else None for r in result.refusals]
    assert codes == [
        None,
        Code.STALE_LEADER_TERM,
        None,
        Code.UNKNOWN_PARTITION,
        Code.NOT_A_REPLICA,
        Code.UNKNOWN_TOPIC,
        None,
    ]
    topics = three.machine.state.topics
    assert [(p.leader, p.leader_term) for p in topics["t"].partitions] == [(2, 5), (1, 2)]
    assert (topics["u"].partitions[0].leader, topics["u"].partitions[0].leader_term) == (3, 3)


def test_a_leader_must_be_a_voting_replica(three: Driver) -> None:
    three.register(4)
    three(CreateTopic("t", 1, 3))
    outsider = ({1, 2, 3, 4} - set(three.machine.state.topics["t"].partitions[0].replicas)).pop()
    refused(three, ReportLeader("t", 0, outsider, 1), Code.NOT_A_REPLICA)


def test_a_move_adds_a_learner_promotes_it_then_removes_the_old_replica(three: Driver) -> None:
    three(CreateTopic("t", 1, 3))
    three.register(4)
    old = three.machine.state.topics["t"].partitions[0].replicas
    three(ReportLeader("t", 0, old[2], 1))
    # never fewer than the factor of voters: the old one goes last
    refused(three, RemoveReplica("t", 0, old[2]), Code.INVALID_REPLICA_CHANGE)
    refused(three, PromoteReplica("t", 0, 4), Code.NOT_A_REPLICA)
    assert three(AddReplica("t", 0, 4)) == Done()
    assert three.machine.state.topics["t"].partitions[0].learners == (4,)
    assert three.machine.state.topics["t"].partitions[0].replicas == old  # learners do not vote
    refused(three, AddReplica("t", 0, 4), Code.INVALID_REPLICA_CHANGE)
    refused(three, RemoveReplica("t", 0, old[2]), Code.INVALID_REPLICA_CHANGE)
    assert three(PromoteReplica("t", 0, 4)) == Done()
    assert three(RemoveReplica("t", 0, old[2])) == Done()
    part = three.machine.state.topics["t"].partitions[0]
    assert part.replicas == (*old[:2], 4)
    assert part.learners == ()
    assert part.leader is None  # the removed replica led it


def test_a_replacing_move_swaps_the_voter_in_one_step(three: Driver) -> None:
    three(CreateTopic("t", 1, 3))
    three.register(4)
    old = three.machine.state.topics["t"].partitions[0].replicas
    three(ReportLeader("t", 0, old[0], 1))
    refused(three, AddReplica("t", 0, 4, replacing=4), Code.NOT_A_REPLICA)
    assert three(AddReplica("t", 0, 4, replacing=old[0])) == Done()
    assert three.machine.state.topics["t"].partitions[0].replacing == old[0]
    assert three(PromoteReplica("t", 0, 4)) == Done()
    part = three.machine.state.topics["t"].partitions[0]
    # the learner takes the replaced voter's place: here the preferred leader's
    assert part.replicas == (4, *old[1:])
    assert (part.learners, part.replacing, part.leader) == ((), None, None)


def test_a_given_up_move_forgets_what_it_replaced(three: Driver) -> None:
    three(CreateTopic("t", 1, 3))
    three.register(4)
    old = three.machine.state.topics["t"].partitions[0].replicas
    three(AddReplica("t", 0, 4, replacing=old[1]))
    assert three(RemoveReplica("t", 0, 4)) == Done()
    part = three.machine.state.topics["t"].partitions[0]
    assert (part.replicas, part.learners, part.replacing) == (old, (), None)


def test_at_most_one_replica_beyond_the_factor(three: Driver) -> None:
    three.register(4)
    three.register(5)
    three(CreateTopic("t", 1, 3))
    free = sorted({1, 2, 3, 4, 5} - set(three.machine.state.topics["t"].partitions[0].replicas))
    three(AddReplica("t", 0, free[0]))
    msg = refused(three, AddReplica("t", 0, free[1]), Code.INVALID_REPLICA_CHANGE)
    assert "beyond its factor" in msg
    assert three(RemoveReplica("t", 0, free[0])) == Done()  # a learner: the move given up
    assert three(AddReplica("t", 0, free[1])) == Done()


def test_replica_moves_refuse_unknown_unavailable_and_decommissioned(three: Driver) -> None:
    three(CreateTopic("t", 2, 2))
    three.register(4)
    refused(three, AddReplica("t", 0, 9), Code.UNKNOWN_BROKER)
    three(DrainBroker(4))
    refused(three, AddReplica("t", 0, 4), Code.BROKER_NOT_AVAILABLE)
    refused(three, AddReplica("t", 5, 4), Code.UNKNOWN_PARTITION)
    refused(three, RemoveReplica("t", 0, 4), Code.NOT_A_REPLICA)
    three(DecommissionPartitions("t", (1,), 0))
    free = ({1, 2, 3} - set(three.machine.state.topics["t"].partitions[1].replicas)).pop()
    refused(three, AddReplica("t", 1, free), Code.PARTITION_DECOMMISSIONED)


def test_reorder_changes_only_the_preferred_leader(three: Driver) -> None:
    three(CreateTopic("t", 1, 3))
    old = three.machine.state.topics["t"].partitions[0].replicas
    new = (old[2], old[0], old[1])
    assert three(ReorderReplicas("t", 0, new)) == Done()
    assert preferred_leader(three.machine.state, "t", 0) == old[2]
    refused(three, ReorderReplicas("t", 0, (1, 2)), Code.INVALID_REPLICA_CHANGE)
    refused(three, ReorderReplicas("t", 0, (1, 1, 2)), Code.INVALID_REPLICA_CHANGE)


# -- bytes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", Code.MALFORMED_COMMAND),
        (b"\xff", Code.MALFORMED_COMMAND),
        (b"[]", Code.MALFORMED_COMMAND),
        (b'{"format":2,"type":"DeleteTopic","args":{"name":"t"}}', Code.UNSUPPORTED_VERSION),
        (b'{"format":1,"type":"Explode","args":{}}', Code.MALFORMED_COMMAND),
        (b'{"format":1,"type":"Done","args":{}}', Code.MALFORMED_COMMAND),  # a result
        (b'{"format":1,"type":"DeleteTopic","args":{}}', Code.MALFORMED_COMMAND),
        (b'{"format":1,"type":"DeleteTopic","args":{"name":"t","x":1}}', Code.MALFORMED_COMMAND),
        (b'{"format":1,"type":"DeleteTopic","args":{"name":7}}', Code.MALFORMED_COMMAND),
        (b'{"format":1,"type":"FenceBroker","args":{"broker_id":true}}', Code.MALFORMED_COMMAND),
        (b'{"format":1,"type":"FenceBroker","args":{"broker_id":1.0}}', Code.MALFORMED_COMMAND),
        (b'{"format":1,"type":"FenceBroker","args":{"broker_id":NaN}}', Code.MALFORMED_COMMAND),
        (
            b'{"format":1,"type":"FenceBroker","args":{"broker_id":99999999999999999999}}',
            Code.MALFORMED_COMMAND,
        ),
        (
            b'{"format":1,"type":"DeleteTopic","args":{"name":"t","name":"u"}}',
            Code.MALFORMED_COMMAND,
        ),
        (b"[" * 100_000 + b"]" * 100_000, Code.MALFORMED_COMMAND),
        (b" " * (1024 * 1024 + 1), Code.MALFORMED_COMMAND),
    ],
)
def test_bad_bytes_are_refused_and_still_advance_the_version(
    three: Driver, data: bytes, code: Code
) -> None:
    before = three.machine.state
    result = three.raw(data)
    assert isinstance(result, Refused) and result.code == code, result
    assert three.machine.state == dataclasses.replace(before, version=three.index)


def test_commands_encode_canonically() -> None:
    a = CreateTopic("t", 1, 1, {"segment.ms": "1", "retention.ms": "2"})
    b = CreateTopic("t", 1, 1, {"retention.ms": "2", "segment.ms": "1"})
    assert encode(a) == encode(b)
    assert encode(a).startswith(b'{"args":{"config":{"retention.ms":"2","segment.ms":"1"}')
