"""What the brokers refuse a share group member, each with its own code and nothing
changed: acknowledging a record whose lock expired, or that another member holds
(INVALID_RECORD_STATE); an acknowledgement type that is none of the four
(INVALID_ACKNOWLEDGE_TYPE); a stale member epoch (FENCED_MEMBER_EPOCH) or an unknown
member (UNKNOWN_MEMBER); a consumer group's id (INCONSISTENT_GROUP_TYPE). The
ShareConsumer reports refused acknowledgements as results and goes on."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from raftmq.api.v1 import share_pb2 as spb
from raftmq.client import AcknowledgeType, ClientError, Consumer, ShareConsumer
from raftmq.devtools.local_cluster import LocalCluster
from tests.share.conftest import earliest_group, now_ms, produce_numbered
from tests.share.raw import RawMember, refusal_code

pytestmark = pytest.mark.timeout(120)
TOPIC = "sbad"
ACCEPT = spb.ACKNOWLEDGE_TYPE_ACCEPT


@pytest.fixture(scope="module", autouse=True)
def records(cluster: LocalCluster) -> None:
    produce_numbered(cluster, TOPIC, 5)


@pytest.fixture
def members(cluster: LocalCluster) -> Iterator[list[RawMember]]:
    made: list[RawMember] = []
    yield made
    for m in made:
        m.close()


def joined(cluster: LocalCluster, group: str, made: list[RawMember]) -> RawMember:
    member = RawMember(cluster, group, [TOPIC])
    made.append(member)
    member.heartbeat(0)
    assert member.member_id and member.epoch > 0
    return member


def acquire_all(member: RawMember) -> spb.ShareFetchResponse:
    answer = member.fetch(TOPIC)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in answer.acquired] == [
        (0, 4, 1)
    ], answer.acquired
    return answer


def test_an_acknowledgement_after_the_lock_expired_is_refused(
    cluster: LocalCluster, members: list[RawMember]
) -> None:
    earliest_group(cluster, "g-expired", record_lock_duration_ms="1000")
    a = joined(cluster, "g-expired", members)
    answer = acquire_all(a)
    while now_ms() <= answer.lock_deadline_ms + 100:
        time.sleep(0.1)
    assert refusal_code(lambda: a.acknowledge(TOPIC, 0, 4, ACCEPT)) == "INVALID_RECORD_STATE"
    again = a.fetch(TOPIC)  # nothing changed: all available again, delivered a second time
    assert [(x.first_offset, x.last_offset, x.delivery_count) for x in again.acquired] == [
        (0, 4, 2)
    ]


def test_an_acknowledgement_of_another_members_record_is_refused(
    cluster: LocalCluster, members: list[RawMember]
) -> None:
    earliest_group(cluster, "g-other")
    a = joined(cluster, "g-other", members)
    b = joined(cluster, "g-other", members)
    a.heartbeat()  # the group moved on when b joined
    acquire_all(a)
    for kind in (ACCEPT, spb.ACKNOWLEDGE_TYPE_RELEASE, spb.ACKNOWLEDGE_TYPE_RENEW):
        assert refusal_code(lambda k=kind: b.acknowledge(TOPIC, 0, 4, k)) == "INVALID_RECORD_STATE"
    # Partly held is not held: one range is judged whole.
    assert refusal_code(lambda: a.acknowledge(TOPIC, 3, 6, ACCEPT)) == "INVALID_RECORD_STATE"
    done = a.acknowledge(TOPIC, 0, 4, ACCEPT)  # a still holds all of them
    assert not done.error.code, done


def test_an_unknown_acknowledgement_type_is_refused(
    cluster: LocalCluster, members: list[RawMember]
) -> None:
    earliest_group(cluster, "g-type")
    a = joined(cluster, "g-type", members)
    acquire_all(a)
    for bad in (spb.ACKNOWLEDGE_TYPE_UNSPECIFIED, 9):
        assert refusal_code(lambda t=bad: a.acknowledge(TOPIC, 0, 4, t)) == (
            "INVALID_ACKNOWLEDGE_TYPE"
        )
    assert not a.acknowledge(TOPIC, 0, 4, ACCEPT).error.code


def test_a_stale_member_epoch_and_an_unknown_member_are_refused(
    cluster: LocalCluster, members: list[RawMember]
) -> None:
    a = joined(cluster, "g-epoch", members)
    assert refusal_code(lambda: a.heartbeat(a.epoch + 5)) == "FENCED_MEMBER_EPOCH"
    a.member_id = "no-such-member"
    assert refusal_code(lambda: a.heartbeat(1)) == "UNKNOWN_MEMBER"
    assert refusal_code(lambda: a.fetch(TOPIC, max_wait_ms=0)) == "UNKNOWN_MEMBER"


def test_a_consumer_groups_id_is_refused_to_a_share_consumer(cluster: LocalCluster) -> None:
    with Consumer(cluster.addresses, group_id="g-classic") as consumer:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert consumer.assignment()
        with ShareConsumer(cluster.addresses, "g-classic") as share:
            share.subscribe(TOPIC)
            with pytest.raises(ClientError) as refused:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    share.poll(0.5)
            assert refused.value.code_name == "INCONSISTENT_GROUP_TYPE"


def test_the_share_consumer_reports_refused_acknowledgements_as_results(
    cluster: LocalCluster,
) -> None:
    group = "g-results"
    earliest_group(cluster, group)
    settings = {"acknowledgement_mode": "explicit"} | {"max_concurrent_fetches": 1}
    with (
        ShareConsumer(cluster.addresses, group, **settings) as holder,  # type: ignore[arg-type]
        ShareConsumer(cluster.addresses, group, **settings) as other,  # type: ignore[arg-type]
    ):
        holder.subscribe(TOPIC)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            got += holder.poll(0.5)
        assert len(got) == 5
        other.subscribe(TOPIC)
        for r in got:
            other.acknowledge(r)  # not other's: the leader refuses, as a result
        results = other.commit_sync()
        assert [(r.first_offset, r.last_offset, r.ok) for r in results] == [(0, 4, False)]
        assert results[0].error is not None
        assert results[0].error.code_name == "INVALID_RECORD_STATE"
        assert other.poll(0.5) == []  # and it goes on (the records are the holder's)
        for r in got:
            holder.acknowledge(r, AcknowledgeType.ACCEPT)
        assert all(r.ok for r in holder.commit_sync())
        with pytest.raises(TypeError):
            holder.acknowledge(got[0], "ACCEPT")  # type: ignore[arg-type]
