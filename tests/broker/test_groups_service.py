"""The consumer group coordinator served by real broker processes (raftmq.v1.Groups on
the controller voters), driven through raw Groups stubs as a consumer would: a member
joins and gets every partition, a second one joins and partitions move incrementally
(revoked from the first, given to the second only once the first gave them up), a stale
member's commit is refused, a follower voter redirects, the controller leader's SIGKILL
in the middle of a rebalance loses no commit and no member's assignment (the rebalance
goes on with the new leader), a silent member is removed after its session timeout and
concurrent commits share metadata entries."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from raftmq.api.v1 import groups_pb2 as gpb
from raftmq.api.v1 import groups_pb2_grpc as gpb_grpc
from raftmq.client.admin import AdminClient
from raftmq.devtools.local_cluster import LocalCluster
from tests.broker import test_controller_layouts as layouts
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import assert_error, rpc_error, wait_until
from tests.broker.test_controller_wiring import CONTROLLER_FAILOVER_S

pytestmark = pytest.mark.timeout(180)
FP = grpc.StatusCode.FAILED_PRECONDITION
TP = tuple[str, int]


def held(listed) -> set[TP]:
    return {(tp.topic, p) for tp in listed for p in tp.partitions}


def wire(tps: set[TP]) -> list[gpb.GroupTopicPartitions]:
    topics: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        topics.setdefault(t, []).append(p)
    return [gpb.GroupTopicPartitions(topic=t, partitions=ps) for t, ps in topics.items()]


class Member:
    """One group member's side of the protocol over a raw stub to the controller
    leader: what it holds, its id and epoch."""

    def __init__(
        self,
        stub: gpb_grpc.GroupsStub,
        group: str,
        topics: list[str],
        session_timeout_ms: int = 20000,
    ) -> None:
        self.stub, self.group, self.topics = stub, group, topics
        self.session_timeout_ms = session_timeout_ms
        self.member_id, self.epoch = "", 0
        self.holds: set[TP] = set()
        self.last: gpb.ConsumerGroupHeartbeatResponse | None = None

    def beat(self, *, give_up: bool = True) -> gpb.ConsumerGroupHeartbeatResponse:
        """Heartbeat what it holds; take what is assigned; give up what is revoked at
        once when ``give_up`` (else keep holding it, as a member still committing)."""
        answer = self.stub.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(
                group_id=self.group,
                member_id=self.member_id,
                member_epoch=self.epoch,
                subscriptions=self.topics,
                owned=wire(self.holds),
                session_timeout_ms=self.session_timeout_ms,
            ),
            timeout=10,
        )
        self.member_id, self.epoch, self.last = answer.member_id, answer.member_epoch, answer
        revoked = held(answer.revoke)
        self.holds = held(answer.assigned) | (set() if give_up else (self.holds & revoked))
        return answer

    def commit(self, offsets: dict[TP, int], epoch: int | None = None) -> int:
        answer = self.stub.CommitOffsets(
            gpb.CommitOffsetsRequest(
                group_id=self.group,
                member_id=self.member_id,
                member_epoch=self.epoch if epoch is None else epoch,
                offsets=[
                    gpb.OffsetToCommit(topic=t, partition=p, offset=o)
                    for (t, p), o in sorted(offsets.items())
                ],
            ),
            timeout=10,
        )
        return answer.metadata_version


def committed(stub: gpb_grpc.GroupsStub, group: str) -> dict[TP, int]:
    answer = stub.FetchOffsets(gpb.FetchOffsetsRequest(group_id=group), timeout=10)
    return {(o.topic, o.partition): o.offset for o in answer.offsets}


def test_incremental_rebalance_fencing_and_a_controller_leader_kill_mid_rebalance(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"orders": 4})
    every = {("orders", p) for p in range(4)}
    leader = layouts.controller_leader(cluster.controller_addresses)
    follower = next(b for b in cluster.spec.voters if b != leader)
    with grpc.insecure_channel(cluster.spec.brokers[follower].address) as channel:
        err = rpc_error(
            lambda: gpb_grpc.GroupsStub(channel).ListGroups(gpb.ListGroupsRequest(), timeout=10)
        )
        assert_error(err, grpc.StatusCode.UNAVAILABLE, "NOT_CONTROLLER", "resend to")
        assert err.meta["raftmq-leader-address"] == cluster.spec.brokers[leader].address

    with grpc.insecure_channel(cluster.spec.brokers[leader].address) as channel:
        stub = gpb_grpc.GroupsStub(channel)
        a = Member(stub, "g", ["orders"])
        first = a.beat()
        assert held(first.assigned) == every and not first.revoke
        a.beat()
        assert a.commit({tp: 10 for tp in every}) > 0

        b = Member(stub, "g", ["orders"])
        joined = b.beat()
        assert not held(joined.assigned), "b got partitions a still holds"
        told = a.beat(give_up=False)  # a learns what moves, keeps consuming it for now
        moving = held(told.revoke)
        assert len(moving) == 2 and held(told.assigned) == every - moving
        # a may still commit what it is giving up, stamped with its new epoch...
        a.commit({tp: 11 for tp in moving})
        # ...but not with the epoch it had before: a zombie's progress is refused.
        err = rpc_error(lambda: a.commit({tp: 12 for tp in moving}, epoch=first.member_epoch))
        assert_error(err, FP, "FENCED_MEMBER_EPOCH", "heartbeat")
        assert not held(b.beat().assigned), "b got partitions before a gave them up"
        a.holds -= moving  # gives them up, and says so at once
        a.beat()
        assert held(b.beat().assigned) == moving
        err = rpc_error(lambda: a.commit({tp: 13 for tp in moving}))
        assert_error(err, FP, "PARTITION_NOT_ASSIGNED", "another member")
        b.commit({tp: 20 for tp in moving})
        kept = every - moving
        a.commit({tp: 21 for tp in kept})
        want = {**{tp: 20 for tp in moving}, **{tp: 21 for tp in kept}}
        assert committed(stub, "g") == want
        # A third member joins: the rebalance is under way (one of a and b is told to
        # give a partition up, and has not yet) when the controller leader dies.
        c = Member(stub, "g", ["orders"])
        assert not held(c.beat().assigned)
        told_a, told_b = a.beat(give_up=False), b.beat(give_up=False)
        assert len(held(told_a.revoke) | held(told_b.revoke)) == 1
        before_kill = {m.member_id: (m.epoch, held(m.last.assigned)) for m in (a, b)}

    cluster.kill(leader)
    survivors = [cluster.spec.brokers[v].address for v in cluster.spec.voters if v != leader]
    new_leader = wait_until(
        lambda: layouts.controller_leader(survivors), CONTROLLER_FAILOVER_S, "a new leader"
    )
    assert new_leader != leader
    with grpc.insecure_channel(cluster.spec.brokers[new_leader].address) as channel:
        stub = gpb_grpc.GroupsStub(channel)
        assert committed(stub, "g") == want, "a commit was lost with the controller leader"
        a.stub = b.stub = c.stub = stub
        # The members keep their ids, epochs and partitions across the failover...
        for m in (a, b):
            m.beat(give_up=False)
            assert (m.epoch, held(m.last.assigned)) == before_kill[m.member_id]
        # ...and the rebalance goes on: the revoked partition is given up, c gets it.
        for m in (a, b, c, a, b, c):
            m.holds -= held(m.last.revoke)
            m.beat()
        holdings = [held(m.last.assigned) for m in (a, b, c)]
        assert sorted(map(len, holdings)) == [1, 1, 2] and set().union(*holdings) == every
        a.commit({tp: 30 for tp in a.holds})
        with AdminClient(survivors) as admin:
            described = admin.describe_group("g")
            assert described.state == "stable"
            assert {m.member_id for m in described.members} == {
                a.member_id,
                b.member_id,
                c.member_id,
            }
            assert all(0 <= m.last_heartbeat_age_ms < 10_000 for m in described.members)
            listed = admin.list_groups()
            assert [(g.group_id, g.member_count) for g in listed.groups] == [("g", 3)]
        # Both leave: the group is empty, and an operator may reset and delete it.
        for m in (a, b, c):
            m.epoch = -1
            assert m.beat().member_epoch == -1
        with AdminClient(survivors) as admin:
            admin.reset_group_offsets("g", {("orders", 0): 0})
            assert committed(stub, "g")[("orders", 0)] == 0
            admin.delete_group("g")
            assert committed(stub, "g") == {}
            err = rpc_error(lambda: admin.describe_group("g"))
            assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_GROUP", "no consumer group")


def controller_leader_address(cluster: LocalCluster) -> str:
    """The client address of the controller quorum's leader, once there is one."""
    deadline = time.monotonic() + CONTROLLER_FAILOVER_S
    while not (leader := layouts.controller_leader(cluster.controller_addresses)):
        assert time.monotonic() < deadline, f"no controller leader in {CONTROLLER_FAILOVER_S} s"
        time.sleep(0.1)
    return cluster.spec.brokers[leader].address


def test_a_silent_member_is_removed_and_commits_are_batched(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"jobs": 4})
    every = {("jobs", p) for p in range(4)}
    leader = layouts.controller_leader(cluster.controller_addresses)
    address = cluster.spec.brokers[leader].address
    with grpc.insecure_channel(address) as channel:
        stub = gpb_grpc.GroupsStub(channel)
        silent = Member(stub, "s", ["jobs"], session_timeout_ms=1000)
        silent.beat()
        silent.beat()  # holds all four, then says nothing more
        live = Member(stub, "s", ["jobs"])
        assert not held(live.beat().assigned)
        wait_until(
            lambda: held(live.beat().assigned) == every,
            15,
            "the silent member's partitions to reach the live one",
        )
        with AdminClient([address]) as admin:
            members = {m.member_id for m in admin.describe_group("s").members}
        assert members == {live.member_id}, "the silent member was not removed"
        err = rpc_error(silent.beat)
        assert_error(err, FP, "UNKNOWN_MEMBER", "session timeout")

    # Many clients committing at once: a handful of metadata entries, not one each.
    async def commit_all(address: str, count: int) -> int:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = gpb_grpc.GroupsStub(channel)
            await asyncio.gather(
                *(
                    stub.CommitOffsets(
                        gpb.CommitOffsetsRequest(
                            group_id=f"c{i}",
                            offsets=[gpb.OffsetToCommit(topic="jobs", partition=i % 4, offset=i)],
                        ),
                        timeout=30,
                    )
                    for i in range(count)
                )
            )
        return count

    with AdminClient(cluster.controller_addresses) as admin:
        # On a busy machine the controller's leadership may move mid-way (CI saw it): the
        # commits refused then (NOT_CONTROLLER) are all sent again to the new leader, and
        # the batching is measured over that round, whose commits all land on one leader.
        for _ in range(3):
            address = controller_leader_address(cluster)
            before = admin.describe_cluster().metadata_version
            try:
                asyncio.run(commit_all(address, 300))
                break
            except grpc.aio.AioRpcError as exc:
                if "does not lead the quorum" not in (exc.details() or ""):
                    raise
        else:
            raise AssertionError("the controller's leadership moved in each of 3 rounds")
        written = admin.describe_cluster().metadata_version - before
        assert written <= 300 // 4, f"300 commits took {written} metadata entries"
        assert {g.group_id for g in admin.list_groups().groups} >= {f"c{i}" for i in range(300)}
        assert admin.fetch_group_offsets("c299").offsets[0].offset == 299
