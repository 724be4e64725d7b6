"""The SharePartitions gRPC service (raftmq/broker/share_service.py) over a real partition
replica on a real Raft host, served by a real gRPC server: the membership check against the
broker's metadata (waiting for the version the member was answered with), the error
contract of each refusal, acknowledgement results per range, and the leaders' control
loop releasing a departed member's records and dropping a deleted group's state.

The broker around the replica is built in-process (its metadata a real MetadataState with
share groups in it): until the controller side of share groups is merged, no real cluster
holds a share group."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from raftmq import net
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.broker import share_dead_letters
from raftmq.broker.client_quotas import ClientQuotas
from raftmq.broker.delay_mover import Sender
from raftmq.broker.routing import Router
from raftmq.broker.service import BrokerService, add_to_server
from raftmq.broker.share_control import ShareControl, apply_metadata
from raftmq.broker.share_dead_letters import DeadLetterWriter
from raftmq.broker.share_service import SharePartitionsService, add_share_service
from raftmq.broker.unopened import UnopenedReplicas
from raftmq.controller.model import (
    Broker,
    ConsumerGroup,
    MetadataState,
    Partition,
    ShareGroup,
    ShareMember,
    Topic,
    TopicPartition,
)
from raftmq.format import entry
from raftmq.format import retry_headers as rh
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.log.config import LogConfig
from raftmq.partition.replica import Acks, PartitionReplica
from raftmq.partition.share_partition import ShareGroupView
from raftmq.share_settings import ShareSettings
from tests.partition.test_producer_tracking import open_leader

pytestmark = pytest.mark.timeout(60)
SETTINGS = ShareSettings(auto_offset_reset="earliest")


def member(mid: str) -> ShareMember:
    return ShareMember(mid, 1, ("t",), (TopicPartition("t", 0),), 0, 45_000)


def group(*members: str, created: int = 3) -> ShareGroup:
    return ShareGroup("g", created, 1, {m: member(m) for m in members}, SETTINGS, ("t",))


@dataclasses.dataclass
class InProcessBroker:
    """What the router and the service read of a broker (routing.BrokerState)."""

    replica: PartitionReplica
    dead: PartitionReplica
    metadata: MetadataState
    metadata_version: int = 10
    id: int = 1
    stopping: bool = False
    unopened: UnopenedReplicas = dataclasses.field(default_factory=UnopenedReplicas)
    topic_creator: None = None

    @property
    def replicas(self) -> dict[tuple[str, int], PartitionReplica]:
        return {("t", 0): self.replica, ("dead", 0): self.dead}


PORT = [0]


def state(*groups: ShareGroup, version: int = 10) -> MetadataState:
    topics = {
        n: Topic(n, i, 1, {}, (Partition((1,), leader=1),)) for i, n in enumerate(["t", "dead"])
    }
    return MetadataState(
        "c",
        version,
        brokers={1: Broker(1, "127.0.0.1", PORT[0], "127.0.0.1", 0, None, 1, 1, 0)},
        topics=topics,
        share_groups={g.group_id: g for g in groups},
        consumer_groups={"cg": ConsumerGroup("cg")},  # type: ignore[call-arg]
    )


Served = tuple[InProcessBroker, spb_grpc.SharePartitionsStub]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    host, replica = await open_leader(tmp_path)
    dead = PartitionReplica(host, "dead", 0, tmp_path / "dead", [1], LogConfig())
    while not (dead.is_leader and dead.producers.ready(dead.led_term)):
        await asyncio.sleep(0.01)
    broker = InProcessBroker(replica, dead, state(group("m1", "m2")))

    async def no_ids(count: int) -> tuple[int, int]:
        raise AssertionError("not used")

    async def no_rebuild(topic: str, partition: int, force: bool) -> int:
        raise AssertionError("not used")

    router = Router(broker, no_ids, no_rebuild)  # type: ignore[arg-type]
    server = grpc.aio.server()
    add_share_service(SharePartitionsService(router, broker), server)  # type: ignore[arg-type]
    add_to_server(BrokerService(router, ClientQuotas(lambda: broker.metadata)), server)
    PORT[0] = port = server.add_insecure_port("127.0.0.1:0")
    broker.metadata = state(group("m1", "m2"))
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield broker, spb_grpc.SharePartitionsStub(channel)
    finally:
        await channel.close()
        await server.stop(0)
        await host.stop()


def acknowledge(mid: str, *acks: spb.AcknowledgementBatch) -> spb.ShareAcknowledgeRequest:
    return spb.ShareAcknowledgeRequest(
        group_id="g",
        member_id=mid,
        metadata_version=10,
        topic="t",
        partition=0,
        acknowledgements=acks,
    )


def fetch(mid: str, version: int = 10, **kw: object) -> spb.ShareFetchRequest:
    return spb.ShareFetchRequest(
        group_id="g", member_id=mid, metadata_version=version, topic="t", partition=0, **kw
    )  # type: ignore[arg-type]


async def refused(call: object) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    err = info.value
    trailers = dict(err.trailing_metadata() or ())
    return err.code(), str(trailers.get("raftmq-error")), err.details() or ""


async def test_fetch_acknowledge_describe_reset(served: Served) -> None:
    broker, stub = served
    await broker.replica.produce(
        build_batch([Record(None, b"%d" % i, 1) for i in range(6)]), Acks.ALL, 5
    )
    got = await stub.ShareFetch(fetch("m1", max_records=4))
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got.acquired] == [(0, 3, 1)]
    assert got.entries and got.high_watermark == 6 and got.lock_deadline_ms > 0
    ack = spb.AcknowledgementBatch
    answer = await stub.ShareAcknowledge(
        acknowledge(
            "m1",
            ack(first_offset=0, last_offset=1, type=spb.ACKNOWLEDGE_TYPE_ACCEPT),
            ack(first_offset=3, last_offset=4, type=spb.ACKNOWLEDGE_TYPE_ACCEPT),
            ack(first_offset=2, last_offset=2, type=spb.ACKNOWLEDGE_TYPE_RENEW),
            ack(first_offset=3, last_offset=3, type=0),  # type: ignore[arg-type]
        )
    )
    assert [r.error.code for r in answer.results] == [
        "",
        "INVALID_RECORD_STATE",
        "",
        "INVALID_ACKNOWLEDGE_TYPE",
    ]
    assert answer.results[2].lock_deadline_ms >= got.lock_deadline_ms
    # Acknowledgements ride with the next fetch too, and are applied first.
    again = await stub.ShareFetch(
        fetch(
            "m1",
            acknowledgements=[
                ack(first_offset=2, last_offset=3, type=spb.ACKNOWLEDGE_TYPE_RELEASE)
            ],
        )
    )
    assert [r.error.code for r in again.acknowledge_results] == [""]
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in again.acquired] == [
        (2, 3, 2),
        (4, 5, 1),
    ]
    d = await stub.DescribeSharePartition(
        spb.DescribeSharePartitionRequest(group_id="g", topic="t", partition=0)
    )
    assert (d.exists, d.start_offset, d.end_offset, d.in_flight, d.acquired) == (True, 2, 6, 4, 4)
    reset = spb.ResetSharePartitionRequest(group_id="g", topic="t", partition=0, offset=5)
    assert (await refused(stub.ResetSharePartition(reset)))[1] == "GROUP_NOT_EMPTY"
    reset.force = True
    assert (await stub.ResetSharePartition(reset)).start_offset == 5
    reset.offset = 99
    _, name, message = await refused(stub.ResetSharePartition(reset))
    assert name == "OFFSET_OUT_OF_RANGE" and "between 0" in message


async def test_membership_is_judged_at_the_members_metadata_version(served: Served) -> None:
    broker, stub = served
    assert (await refused(stub.ShareFetch(fetch("m9"))))[1] == "UNKNOWN_MEMBER"
    # A member answered at version 12: the broker waits for it instead of refusing.
    waiting = asyncio.ensure_future(stub.ShareFetch(fetch("m9", 12)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    broker.metadata, broker.metadata_version = state(group("m1", "m9"), version=12), 12
    assert (await waiting).acquired == []
    other = spb.ShareFetchRequest(group_id="nope", member_id="m1", topic="t", partition=0)
    assert (await refused(stub.ShareFetch(other)))[1] == "UNKNOWN_GROUP"
    other.group_id = "cg"
    assert (await refused(stub.ShareFetch(other)))[1] == "INCONSISTENT_GROUP_TYPE"
    other.group_id = "bad id!"
    assert (await refused(stub.ShareFetch(other)))[1] == "INVALID_GROUP"
    other.group_id, other.topic = "g", "missing"
    assert (await refused(stub.ShareFetch(other)))[1] == "UNKNOWN_TOPIC"
    other.topic, other.max_wait_ms = "t", 60_000
    code, name, _ = await refused(stub.ShareFetch(other))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and name == "INVALID_ARGUMENT"


async def test_the_control_loop_releases_departed_members_and_drops_deleted_groups(
    served: Served,
) -> None:
    broker, stub = served
    replica = broker.replica
    await replica.produce(build_batch([Record(None, b"x", 1)] * 4), Acks.ALL, 5)
    await stub.ShareFetch(fetch("m1", max_records=2))
    await stub.ShareFetch(fetch("m2", max_records=2))
    view = ShareGroupView("g", 3, SETTINGS)
    await apply_metadata(replica, state(group("m2"), version=9))  # older: changes nothing
    assert replica.share.describe(view).acquired == 4
    await apply_metadata(replica, state(group("m2")))  # m1 left
    d = replica.share.describe(view)
    assert (d.acquired, d.available) == (2, 2)
    got = await stub.ShareFetch(fetch("m2"))
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got.acquired] == [(0, 1, 2)]
    await apply_metadata(replica, state(group("m2", created=8)))  # deleted, created again
    assert not replica.share.describe(view).exists
    assert replica.shares.states.groups == {}


async def test_archived_records_are_dead_lettered_with_their_history(served: Served) -> None:
    broker, stub = served
    replica = broker.replica
    dlq_settings = ShareSettings(
        auto_offset_reset="earliest", dead_letter_topic="dead", delivery_count_limit=2
    )
    g = dataclasses.replace(group("m1"), settings=dlq_settings)
    broker.metadata = state(g)
    original = Record(b"k", b"poison", 1_700_000_000_000, (("h", b"v"),))
    await replica.produce(build_batch([original, Record(None, b"fine", 1)]), Acks.ALL, 5)
    ack = spb.AcknowledgementBatch
    got = await stub.ShareFetch(fetch("m1"))
    assert [(a.first_offset, a.last_offset) for a in got.acquired] == [(0, 1)]
    release = ack(first_offset=0, last_offset=0, type=spb.ACKNOWLEDGE_TYPE_RELEASE)
    reject = ack(first_offset=1, last_offset=1, type=spb.ACKNOWLEDGE_TYPE_REJECT)
    got = await stub.ShareFetch(fetch("m1", acknowledgements=[release, reject]))
    assert [(a.first_offset, a.delivery_count) for a in got.acquired] == [(0, 2)]
    await stub.ShareAcknowledge(acknowledge("m1", release))
    view = ShareGroupView("g", 3, dlq_settings)
    st = replica.share.state(view)
    assert st is not None and st.waiting_dead_letter() == [0, 1]
    sender = Sender(lambda: broker.metadata, broker.replicas, net.PLAINTEXT, delayed=False)
    try:
        await DeadLetterWriter(sender)(replica, broker.metadata)
    finally:
        await sender.close()
    d = replica.share.describe(view)
    assert (d.archived_total, d.dead_lettered_total, d.in_flight, d.start_offset) == (2, 2, 0, 2)
    data = bytes(broker.dead.read(0, 1 << 20).data)
    letters = [r for h in entry.iter_headers(data) for r in decode_records(data, h)]
    assert [(r.key, r.value) for r in letters] == [(b"k", b"poison"), (None, b"fine")]
    info = rh.decode(letters[0].headers)
    assert info is not None and (info.original_topic, info.original_offset, info.attempts) == (
        "t",
        0,
        2,
    )
    assert rh.strip(letters[0].headers) == [("h", b"v")]


async def test_the_control_loop_looks_again_only_when_something_moved(served: Served) -> None:
    broker, stub = served
    replica = broker.replica
    control = ShareControl(broker.replicas, lambda: broker.metadata, lambda: False)

    async def one_pass() -> set[asyncio.Task[None]]:
        control.pass_once()
        tasks = set(control._tasks.values())
        await asyncio.gather(*tasks)
        return tasks

    await replica.produce(build_batch([Record(None, b"x", 1)] * 2), Acks.ALL, 5)
    await stub.ShareFetch(fetch("m1"))
    first = await one_pass()
    assert replica.share.describe(ShareGroupView("g", 3)).acquired == 2
    broker.metadata = state(group("m2"), version=11)  # m1 left
    second = await one_pass()
    assert second != first and replica.share.describe(ShareGroupView("g", 3)).available == 2
    third = await one_pass()  # its own RELEASE_MEMBER moved the state: one look more
    assert await one_pass() == third  # then nothing until the metadata or state moves


async def test_dead_letters_a_topic_refuses_wait_and_are_tried_again(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broker, stub = served
    replica = broker.replica
    monkeypatch.setattr(share_dead_letters, "RETRY_S", 0.05)
    missing = ShareSettings(auto_offset_reset="earliest", dead_letter_topic="missing")
    broker.metadata = state(dataclasses.replace(group("m1"), settings=missing))
    await replica.produce(build_batch([Record(None, b"bad", 1)]), Acks.ALL, 5)
    await stub.ShareFetch(fetch("m1"))
    reject = spb.AcknowledgementBatch(
        first_offset=0, last_offset=0, type=spb.ACKNOWLEDGE_TYPE_REJECT
    )
    await stub.ShareAcknowledge(acknowledge("m1", reject))
    sender = Sender(lambda: broker.metadata, broker.replicas, net.PLAINTEXT, delayed=False)
    writer = DeadLetterWriter(sender)
    view = ShareGroupView("g", 3, missing)
    try:
        with caplog.at_level(logging.WARNING):
            await writer(replica, broker.metadata)
        assert "UNKNOWN_TOPIC" in caplog.text
        st = replica.share.state(view)
        assert st is not None and st.waiting_dead_letter() == [0]  # kept, not lost
        found = ShareSettings(auto_offset_reset="earliest", dead_letter_topic="dead")
        broker.metadata = state(dataclasses.replace(group("m1"), settings=found))
        await asyncio.sleep(0.1)
        await writer(replica, broker.metadata)
    finally:
        await sender.close()
    assert st.waiting_dead_letter() == [] and st.dead_lettered_total == 1
    data = bytes(broker.dead.read(0, 1 << 20).data)
    assert [r.value for h in entry.iter_headers(data) for r in decode_records(data, h)] == [b"bad"]
