"""The share group coordinator served by real broker processes (raftmq.v1.ShareGroups on
the controller voters), driven through raw stubs as a share consumer would: members join,
heartbeat and leave; 50 members on a 3-partition topic all get a partition; steady
heartbeats write nothing and every answer names a metadata version that holds the
member; a stale epoch is fenced; a silent member is removed after its session timeout; a
group id is a consumer group or a share group, refused both ways; bad settings, a delete
of a group with members, and a follower voter's redirect (a broker-only node's is in
test_controller_layouts). And the share groups through the metadata watch's encoding and
the broker's metadata cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.broker.controller_service import ControllerService
from raftmq.broker.metadata_cache import MetadataCache
from raftmq.client.admin import AdminClient
from raftmq.controller.commands import AlterShareGroupConfig, CreateTopic, ShareGroupHeartbeat
from raftmq.controller.state_machine import decode_snapshot
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker import test_controller_layouts as layouts
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import assert_error, rpc_error, wait_until
from tests.broker.test_controller_wiring import CONTROLLER_FAILOVER_S
from tests.controller.machine import Driver

pytestmark = pytest.mark.timeout(180)
FP, IA = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT
TP = tuple[str, int]


def held(listed) -> set[TP]:
    return {(tp.topic, p) for tp in listed for p in tp.partitions}


def join(stub: spb_grpc.ShareGroupsStub, group: str, topics: list[str], **kw: int):
    return stub.ShareGroupHeartbeat(
        spb.ShareGroupHeartbeatRequest(group_id=group, subscriptions=topics, **kw), timeout=10
    )


def again(stub: spb_grpc.ShareGroupsStub, group: str, answer, topics: list[str], **kw: int):
    return stub.ShareGroupHeartbeat(
        spb.ShareGroupHeartbeatRequest(
            group_id=group,
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            subscriptions=topics,
            **kw,
        ),
        timeout=10,
    )


def metadata_version(cluster: LocalCluster) -> int:
    with AdminClient(cluster.controller_addresses) as admin:
        return admin.describe_cluster().metadata_version


def broker_version(address: str) -> int:
    """The metadata version a broker's own copy holds (what a partition leader judges a
    member by)."""
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.BrokerStub(channel).Metadata(
            pb.MetadataRequest(routing_only=True), timeout=10
        )
    return answer.metadata_version


def test_membership_assignment_fencing_expiry_and_refusals(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"jobs": 3})
    every = {("jobs", p) for p in range(3)}
    leader = layouts.controller_leader(cluster.controller_addresses)
    follower = next(b for b in cluster.spec.voters if b != leader)
    with grpc.insecure_channel(cluster.spec.brokers[follower].address) as channel:
        err = rpc_error(
            lambda: spb_grpc.ShareGroupsStub(channel).ListShareGroups(
                spb.ListShareGroupsRequest(), timeout=10
            )
        )
        assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER", "resend to")
        assert err.meta["raftmq-leader-address"] == cluster.spec.brokers[leader].address

    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        stub = spb_grpc.ShareGroupsStub(channel)
        # Join, then steady heartbeats that write nothing.
        a = join(stub, "q", ["jobs"], session_timeout_ms=6000)
        assert a.member_id and a.member_epoch == a.group_epoch == 1
        assert held(a.assigned) == every and a.heartbeat_interval_ms == 2000
        assert 0 < a.metadata_version <= metadata_version(cluster)
        before = metadata_version(cluster)
        for _ in range(10):
            steady = again(stub, "q", a, ["jobs"], session_timeout_ms=6000)
            assert held(steady.assigned) == every and steady.member_epoch == a.member_epoch
            assert steady.metadata_version >= a.metadata_version
        assert metadata_version(cluster) == before, "steady heartbeats wrote entries"

        # 50 members on 3 partitions: every member gets one, every partition has members.
        async def fifty() -> list[spb.ShareGroupHeartbeatResponse]:
            async with grpc.aio.insecure_channel(cluster.spec.brokers[leader].address) as ch:
                s = spb_grpc.ShareGroupsStub(ch)
                joined = await asyncio.gather(
                    *(
                        s.ShareGroupHeartbeat(
                            spb.ShareGroupHeartbeatRequest(group_id="many", subscriptions=["jobs"]),
                            timeout=30,
                        )
                        for _ in range(50)
                    )
                )
                return list(
                    await asyncio.gather(
                        *(
                            s.ShareGroupHeartbeat(
                                spb.ShareGroupHeartbeatRequest(
                                    group_id="many",
                                    member_id=j.member_id,
                                    member_epoch=j.member_epoch,
                                    subscriptions=["jobs"],
                                ),
                                timeout=30,
                            )
                            for j in joined
                        )
                    )
                )

        answers = asyncio.run(fifty())
        assert len({x.member_id for x in answers}) == 50
        assert all(len(held(x.assigned)) == 1 for x in answers)
        assert set().union(*(held(x.assigned) for x in answers)) == every
        # Each answer's version holds its member: every broker reaches it and the member
        # is in its copy of the metadata (what a partition leader judges ShareFetch by).
        newest = max(x.metadata_version for x in answers)
        for bid in cluster.spec.brokers:
            wait_until(
                lambda bid=bid: broker_version(cluster.spec.brokers[bid].address) >= newest,
                15,
                f"broker {bid} to apply metadata version {newest}",
            )
        with AdminClient([cluster.spec.brokers[leader].address]) as admin:
            described = admin.describe_share_group("many")
            assert {m.member_id for m in described.members} == {x.member_id for x in answers}
            listed = {g.group_id: g.member_count for g in admin.list_share_groups().groups}
            assert listed == {"q": 1, "many": 50}

        # A second member in "q": a's share shrinks; its old epoch is fenced from then on.
        b = join(stub, "q", ["jobs"], session_timeout_ms=6000)
        a2 = again(stub, "q", a, ["jobs"], session_timeout_ms=6000)
        assert a2.member_epoch > a.member_epoch
        assert {len(held(a2.assigned)), len(held(b.assigned))} == {1, 2}  # dealt 2 and 1
        assert held(a2.assigned) | held(b.assigned) == every
        err = rpc_error(lambda: again(stub, "q", a, ["jobs"]))
        assert_error(err, FP, "FENCED_MEMBER_EPOCH", "join again")

        # A silent member is removed after its session timeout; the other takes its share.
        silent = join(stub, "q", ["jobs"], session_timeout_ms=1000)
        live = {"a": a2, "b": b}
        with AdminClient([cluster.spec.brokers[leader].address]) as admin:

            def members() -> set[str]:
                for name, answer in live.items():  # the live ones keep beating
                    live[name] = again(stub, "q", answer, ["jobs"], session_timeout_ms=6000)
                return {m.member_id for m in admin.describe_share_group("q").members}

            wait_until(lambda: silent.member_id not in members(), 15, "the silent member's removal")
            assert members() == {a2.member_id, b.member_id}
        a2, b = live["a"], live["b"]
        assert held(a2.assigned) | held(b.assigned) == every
        err = rpc_error(lambda: again(stub, "q", silent, ["jobs"]))
        assert_error(err, FP, "UNKNOWN_MEMBER", "session timeout")

        # Leave: the answer says -1, and the group forgets the member.
        left = stub.ShareGroupHeartbeat(
            spb.ShareGroupHeartbeatRequest(group_id="q", member_id=a2.member_id, member_epoch=-1),
            timeout=10,
        )
        assert left.member_epoch == -1 and not left.assigned

        # A group id is one kind of group.
        groups = gpb_grpc.GroupsStub(channel)
        err = rpc_error(
            lambda: groups.ConsumerGroupHeartbeat(
                gpb.ConsumerGroupHeartbeatRequest(group_id="q", subscriptions=["jobs"]), timeout=10
            )
        )
        assert_error(err, FP, "INCONSISTENT_GROUP_TYPE", "share group")
        err = rpc_error(
            lambda: groups.CommitOffsets(
                gpb.CommitOffsetsRequest(
                    group_id="q", offsets=[gpb.OffsetToCommit(topic="jobs", partition=0, offset=1)]
                ),
                timeout=10,
            )
        )
        assert_error(err, FP, "INCONSISTENT_GROUP_TYPE", "share group")
        groups.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(group_id="cg", subscriptions=["jobs"]), timeout=10
        )
        err = rpc_error(lambda: join(stub, "cg", ["jobs"]))
        assert_error(err, FP, "INCONSISTENT_GROUP_TYPE", "consumer group")

        # Settings and deletion.
        with AdminClient([cluster.spec.brokers[leader].address]) as admin:
            admin.alter_share_group_config("q", {"share.delivery.count.limit": "3"})
            settings = {s.name: s.value for s in admin.describe_share_group("q").settings}
            assert settings["share.delivery.count.limit"] == "3"
            assert settings["share.record.lock.duration.ms"] == "30000"
            err = rpc_error(
                lambda: admin.alter_share_group_config("q", {"share.delivery.count.limit": "11"})
            )
            assert_error(err, IA, "INVALID_SHARE_SETTING", "between 1 and 10")
            err = rpc_error(lambda: admin.alter_share_group_config("q", {"nope": "1"}))
            assert_error(err, IA, "INVALID_SHARE_SETTING", "unknown share group setting")
            err = rpc_error(lambda: admin.delete_share_group("q"))
            assert_error(err, FP, "GROUP_NOT_EMPTY", "active members")
            stub.ShareGroupHeartbeat(
                spb.ShareGroupHeartbeatRequest(
                    group_id="q", member_id=b.member_id, member_epoch=-1
                ),
                timeout=10,
            )
            admin.delete_share_group("q")
            err = rpc_error(lambda: admin.describe_share_group("q"))
            assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_GROUP", "no share group")


def test_share_groups_reach_brokers_through_the_watch_and_the_metadata_cache(
    tmp_path: Path,
) -> None:
    """What a broker holds of the share groups: the watch's encoding of the state (the
    controller's, decoded by the broker's link) and the broker's on-disk cache."""
    driver = Driver()
    for b in (1, 2, 3):
        driver.register(b)
    assert driver(CreateTopic("jobs", 3, 3)).ok
    assert driver(ShareGroupHeartbeat("q", "", 0, ("jobs",), 45_000, 1_000)).ok
    assert driver(AlterShareGroupConfig("q", {"share.dead.letter.topic": "dlq"})).ok
    state = driver.machine.state
    watched = ControllerService(None, {})._encoded(state.version, state)  # type: ignore[arg-type]
    assert decode_snapshot(watched).share_groups == state.share_groups

    async def cached() -> None:
        cache = MetadataCache(tmp_path, "test")
        cache.offer(state)
        await cache.close()

    asyncio.run(cached())
    loaded = MetadataCache(tmp_path, "test").load()
    assert loaded is not None and loaded.share_groups == state.share_groups
    assert loaded.share_groups["q"].settings.dead_letter_topic == "dlq"


def test_members_survive_a_controller_leader_kill(make_cluster: ClusterFactory) -> None:
    """Membership is in the log: after the controller leader's SIGKILL the members keep
    their ids, epochs and partitions at the new leader (their next beats are steady
    ones), which counts them as heard when it took over, so none is removed for the old
    leader's silence; a member joining there gets its share."""
    cluster = make_cluster({"jobs": 3})
    leader = layouts.controller_leader(cluster.controller_addresses)
    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        stub = spb_grpc.ShareGroupsStub(channel)
        a = join(stub, "q", ["jobs"], session_timeout_ms=8000)
        b = join(stub, "q", ["jobs"], session_timeout_ms=8000)
        a = again(stub, "q", a, ["jobs"], session_timeout_ms=8000)
    cluster.kill(leader)
    survivors = [cluster.spec.brokers[v].address for v in cluster.spec.voters if v != leader]
    new_leader = wait_until(
        lambda: layouts.controller_leader(survivors), CONTROLLER_FAILOVER_S, "a new leader"
    )
    with grpc.insecure_channel(cluster.spec.brokers[new_leader].address) as channel:
        stub = spb_grpc.ShareGroupsStub(channel)
        for before in (a, b):
            after = again(stub, "q", before, ["jobs"], session_timeout_ms=8000)
            assert (after.member_id, after.member_epoch) == (before.member_id, before.member_epoch)
            assert held(after.assigned) == held(before.assigned)
        c = join(stub, "q", ["jobs"], session_timeout_ms=8000)
        assert len(held(c.assigned)) == 1
        with AdminClient(survivors) as admin:
            described = admin.describe_share_group("q")
        assert {m.member_id for m in described.members} == {a.member_id, b.member_id, c.member_id}
        assert all(0 <= m.last_heartbeat_age_ms < 10_000 for m in described.members)
