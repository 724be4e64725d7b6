"""What counts as healed after a broker died for good: the controller's status and the
leader's live description must both say so (chaos/replication.py)."""

from chaos.cluster import TOPIC
from chaos.replication import partition_problems
from raftmq.api.v1 import admin_pb2 as apb


def _part(p: int, replicas: list[int], in_sync: list[int], **kw) -> apb.PartitionDescription:
    states = [apb.ReplicaLiveState(broker_id=b, state="in_sync") for b in in_sync]
    return apb.PartitionDescription(
        partition=p, replicas=replicas, live=True, replica_states=states, **kw
    )


def _topic(*parts: apb.PartitionDescription) -> apb.TopicDescription:
    return apb.TopicDescription(name=TOPIC, replication_factor=3, partitions=list(parts))


def test_every_partition_at_its_factor_in_sync_on_live_brokers_is_healed():
    topic = _topic(_part(0, [1, 2, 3], [1, 2, 3]), _part(1, [2, 3, 1], [1, 2, 3]))
    assert partition_problems(apb.ClusterStatusResponse(), topic, {4}) == {}


def test_each_way_a_partition_is_not_yet_healed_is_named():
    status = apb.ClusterStatusResponse(
        under_replicated=[apb.PartitionRef(topic=TOPIC, partition=0)],
        moves=[apb.MoveDescription(topic=TOPIC, partition=1, learner=1, replacing=4)],
    )
    topic = _topic(
        _part(0, [1, 2, 4], [1, 2]),
        _part(1, [2, 3, 4], [2, 3], learners=[1]),
        _part(2, [2, 3], [2, 3]),
        _part(3, [1, 2, 3], [1, 2, 3], learners=[4]),
        apb.PartitionDescription(partition=4, replicas=[1, 2, 3], live_unknown_reason="timeout"),
        _part(5, [1, 2, 3], [1, 3]),
        _part(6, [1, 2, 3], [1, 2, 3]),
    )
    problems = partition_problems(status, topic, {4})
    assert problems[0] == "the controller lists it under-replicated"
    assert problems[1] == "a move is under way: learner 1 replacing 4"
    assert problems[2] == "2 voters [2, 3], not the factor 3"
    assert problems[3] == "learners [4] not yet promoted"
    assert problems[4] == "no leader answered: timeout"
    assert problems[5] == "replicas [2] of [1, 2, 3] are not in sync"
    assert 6 not in problems
    # Without the controller's word, a dead voter is named from the description.
    assert partition_problems(apb.ClusterStatusResponse(), topic, {4})[0] == (
        "replicas [1, 2, 4] still include dead broker(s) [4]"
    )
