"""Reading from the closest in-sync replica (client_rack, Kafka's KIP-392), with real
brokers in three racks: a consumer reads every partition from the follower in its rack,
only what that follower knows to be committed, its long polls woken by the follower's
commit; a follower that cannot serve a replica read sends the consumer to the leader; the
consumer falls back to the leader when its rack's broker dies. Plus the pure choice of
that replica from merged Metadata, and the isolation level's checks."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.cluster_view import Leader, merge_metadata
from raftmq.client.consumer import Consumer, ConsumerRecord
from raftmq.client.errors import error_of
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker.conftest import ClusterFactory
from tests.client.test_consumer import poll_until

pytestmark = pytest.mark.timeout(180)
RACKS = {1: "east", 2: "west", 3: "north"}
TOPIC = "rk"
PARTITIONS = 3


def racked_cluster(make_cluster: ClusterFactory) -> LocalCluster:
    """Brokers 1-3 in racks east, west, north; topic rk on all three, solo on broker 1."""
    return make_cluster(
        {TOPIC: PARTITIONS},
        single_replica={"solo": 1},
        per_broker_args={b: ["--rack", r] for b, r in RACKS.items()},
    )


def produce(cluster: LocalCluster, tag: str, count: int) -> dict[int, list[bytes]]:
    sent = {p: [f"{tag}-{p}-{i}".encode() for i in range(count)] for p in range(PARTITIONS)}
    with Producer(cluster.addresses, acks="all", linger_ms=1) as producer:
        futures = [producer.send(TOPIC, v, partition=p) for p, vs in sent.items() for v in vs]
    for f in futures:
        f.result(timeout=0)
    return sent


def by_partition(records: list[ConsumerRecord]) -> dict[int, list[bytes | None]]:
    return {p: [r.value for r in records if r.partition == p] for p in range(PARTITIONS)}


def leaders(cluster: LocalCluster) -> dict[int, int]:
    with cluster.client() as client:
        found = client.refresh_leaders()
    return {p: found[(TOPIC, p)].broker_id for p in range(PARTITIONS)}


def test_a_racked_consumer_reads_from_its_racks_follower_and_falls_back(
    make_cluster: ClusterFactory,
) -> None:
    cluster = racked_cluster(make_cluster)
    led_by = leaders(cluster)
    assert any(b != 2 for b in led_by.values()), "broker 2 leads everything: nothing to show"
    first = produce(cluster, "a", 150)
    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    with Consumer(
        cluster.addresses, auto_offset_reset="earliest", client_rack="west", fetch_max_wait_ms=200
    ) as consumer:
        consumer.assign(tps)
        assert by_partition(poll_until(consumer, 3 * 150, timeout=60)) == first
        states = consumer._fetcher.states
        # Every partition, led by broker 2 or not, was read from broker 2 (rack "west").
        assert {tp: states[tp].served_by for tp in tps} == {tp: 2 for tp in tps}
        # Never past the committed point: what it read is below every high watermark the
        # follower reported, which never passes the leader's.
        with cluster.client() as client:
            for tp in tps:
                hw = client.stub(address(cluster, led_by[tp[1]])).ListOffsets(
                    pb.ListOffsetsRequest(topic=TOPIC, partition=tp[1], position=pb.LATEST),
                    timeout=10,
                )
                assert consumer.position(tp) <= states[tp].high_watermark <= hw.offset

        cluster.kill(2)
        # Broker 2 led some partitions: wait for their new leaders before producing.
        cluster.wait_for_leaders(timeout=30, among={1, 3})
        second = produce(cluster, "b", 50)
        assert by_partition(poll_until(consumer, 3 * 50, timeout=60)) == second
        now_led_by = leaders(cluster)
        assert {tp: states[tp].served_by for tp in tps} == {tp: now_led_by[tp[1]] for tp in tps}
        assert consumer.poll(0.5) == []  # no duplicates from the switch


def address(cluster: LocalCluster, broker_id: int) -> str:
    return cluster.spec.brokers[broker_id].address


def test_a_follower_serves_replica_reads_only_up_to_its_commit(
    make_cluster: ClusterFactory,
) -> None:
    cluster = racked_cluster(make_cluster)
    led_by = leaders(cluster)
    partition = next(p for p, b in led_by.items() if b != 2)
    follower = next(b for b in RACKS if b != led_by[partition])
    produce(cluster, "c", 20)
    client = cluster.client()
    stub = client.stub(address(cluster, follower))

    def fetch(offset: int, wait_ms: int, replica_read: bool = True) -> pb.FetchResponse:
        request = pb.FetchRequest(
            topic=TOPIC,
            partition=partition,
            offset=offset,
            max_wait_ms=wait_ms,
            replica_read=replica_read,
        )
        answer: pb.FetchResponse = stub.Fetch(request, timeout=30)
        return answer

    deadline = time.monotonic() + 10
    while (answer := fetch(0, 0)).high_watermark < 20:
        assert time.monotonic() < deadline, "the follower's commit never reached 20"
    assert answer.broker_id == follower and answer.next_offset <= answer.high_watermark == 20

    # A long poll at the follower's end is woken by its commit, not its timeout.
    got: list[pb.FetchResponse] = []
    waiter = threading.Thread(target=lambda: got.append(fetch(20, 20_000)))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    with Producer(cluster.addresses, acks="all") as producer:
        producer.send(TOPIC, b"late", partition=partition).result(timeout=10)
    waiter.join(timeout=25)
    assert got and got[0].next_offset == 21 and got[0].high_watermark == 21
    assert time.monotonic() - started < 10

    # Past its commit a replica read waits, then sends the consumer to the leader; the
    # read without the flag keeps answering OFFSET_OUT_OF_RANGE as before.
    with pytest.raises(grpc.RpcError) as refused:
        fetch(50, 200)
    err = error_of(refused.value)
    assert err.code_name == "NOT_LEADER"
    assert err.meta["raftmq-leader-address"] == address(cluster, led_by[partition])
    assert "does not serve the read now" in str(err)
    with pytest.raises(grpc.RpcError) as plain:
        fetch(50, 0, replica_read=False)
    assert error_of(plain.value).code_name == "OFFSET_OUT_OF_RANGE"

    # A broker hosting no replica names the leader too (as reported to the controller).
    request = pb.FetchRequest(topic="solo", partition=0, offset=0, replica_read=True)
    deadline = time.monotonic() + 10
    while True:
        with pytest.raises(grpc.RpcError) as not_hosted:
            client.stub(address(cluster, 2)).Fetch(request, timeout=10)
        err = error_of(not_hosted.value)
        assert err.code_name == "NOT_HOSTED"
        if "raftmq-leader-address" in err.meta or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert err.meta["raftmq-leader-address"] == address(cluster, 1)
    client.close()


def _partition(leader: int, term: int, in_sync: list[int]) -> pb.PartitionInfo:
    return pb.PartitionInfo(
        partition=0,
        leader_id=leader,
        leader_term=term,
        replicas=[1, 2, 3],
        in_sync_replicas=in_sync,
    )


def _answer(broker_id: int, partition: pb.PartitionInfo) -> pb.MetadataResponse:
    return pb.MetadataResponse(
        broker_id=broker_id,
        brokers=[pb.BrokerInfo(id=b, host="h", port=9000 + b, rack=r) for b, r in RACKS.items()],
        topics=[pb.TopicInfo(name="t", partitions=[partition])],
    )


def test_the_closest_replica_is_the_leaders_in_sync_follower_in_the_rack() -> None:
    follower_first = [_answer(2, _partition(1, 4, [])), _answer(1, _partition(1, 4, [1, 2, 3]))]
    view = merge_metadata(follower_first)
    assert view.racks == RACKS
    assert view.closest_replica("t", 0, "west") == Leader(2, "h:9002")
    assert view.closest_replica("t", 0, "east") is None  # the leader is in that rack
    assert view.closest_replica("t", 0, "south") is None
    # Out of the leader's in-sync set: not chosen.
    view = merge_metadata([_answer(1, _partition(1, 4, [1, 3]))])
    assert view.closest_replica("t", 0, "west") is None
    # An older leader's in-sync set does not count once a newer leader is known.
    view = merge_metadata([_answer(1, _partition(1, 4, [1, 2])), _answer(3, _partition(3, 5, []))])
    assert view.leaders[("t", 0)].broker_id == 3
    assert view.closest_replica("t", 0, "west") is None


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"isolation_level": "read_dirty"}, "isolation_level must be 'read_uncommitted' or"),
        ({"client_rack": ""}, "client_rack '' is not a rack name"),
        ({"client_rack": "rack one"}, "is not a rack name"),
    ],
)
def test_bad_isolation_levels_and_racks_are_refused_at_construction(
    settings: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        Consumer("127.0.0.1:1", **settings)  # type: ignore[arg-type]


def test_both_isolation_levels_are_accepted() -> None:
    for level in ("read_uncommitted", "read_committed"):
        with Consumer("127.0.0.1:1", isolation_level=level) as consumer:  # type: ignore[arg-type]
            assert consumer.config.isolation_level == level
