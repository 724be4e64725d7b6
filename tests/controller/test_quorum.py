"""The controller quorum as a running service (raftmq/controller/quorum.py): three voters
on real Raft hosts over TCP with their logs and snapshots on disk. Typed commands and
refusals, NOT_CONTROLLER on followers, heartbeats and fencing (and no fencing by a new
leader without history), leader loss, a full restart, and the coalescing watch."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from raftmq.controller import commands as c
from raftmq.controller.errors import RefusalCode
from raftmq.controller.model import MetadataState
from raftmq.controller.quorum import (
    ControllerQuorum,
    ControllerRefusal,
    ControllerUnavailableError,
    NotControllerError,
    OutcomeUnknown,
)
from raftmq.raft.host.state_machine import Applied
from tests.controller.quorum_cluster import QuorumCluster, retry
from tests.raft.test_driver import wait_for

pytestmark = pytest.mark.timeout(120)


async def register(quorum: ControllerQuorum, broker_id: int, incarnation: int = 1) -> int:
    registered = await quorum.register_broker(
        broker_id, "127.0.0.1", 9000 + broker_id, "127.0.0.1", 9100 + broker_id, None, incarnation
    )
    return registered.epoch


class Heartbeats:
    """Brokers beating to whichever voter leads, every ``period_s``, from a task."""

    def __init__(self, cluster: QuorumCluster, brokers: set[int], period_s: float = 0.2):
        self.cluster = cluster
        self.brokers = set(brokers)
        self.period_s = period_s
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            leaders = [q for q in self.cluster.quorums.values() if q.is_leader]
            for quorum in leaders:
                version = quorum.local_state()[0]
                for broker in sorted(self.brokers):
                    with contextlib.suppress(
                        NotControllerError, ControllerUnavailableError, OutcomeUnknown
                    ):
                        await quorum.heartbeat(broker, 1, version)
            await asyncio.sleep(self.period_s)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def fenced(state: MetadataState) -> set[int]:
    return {b.id for b in state.brokers.values() if b.fenced}


async def test_typed_commands_refusals_and_not_controller(tmp_path):
    cluster = await QuorumCluster(tmp_path).start()
    try:
        leader = await cluster.leader()
        with pytest.raises(ControllerRefusal) as refused:
            await leader.create_topic("t", 1, 1)
        assert refused.value.code == RefusalCode.NOT_ENOUGH_BROKERS
        assert "start more brokers" in refused.value.message
        for b in (1, 2, 3):
            await register(leader, b)
        created = await leader.create_topic("t", 6, 3, {"retention.ms": "60000"})
        assert isinstance(created, c.TopicCreated) and len(created.replicas) == 6
        with pytest.raises(ControllerRefusal) as refused:
            await leader.create_topic("t", 1, 1)
        assert refused.value.code == RefusalCode.TOPIC_ALREADY_EXISTS
        added = await leader.add_partitions("t", 8)
        assert added.first_partition == 6
        await leader.alter_config("t", {"segment.bytes": "1048576"}, ["retention.ms"])
        await leader.decommission("t", [7])
        block = await leader.allocate_producer_ids(2, 100)
        assert (block.first_id, block.count) == (0, 100)
        await leader.report_leader("t", 0, created.replicas[0][0], 3)
        with pytest.raises(ControllerRefusal) as refused:  # 1 and 2 cannot hold 3 replicas
            await leader.drain_broker(3)
        assert refused.value.code == RefusalCode.NOT_ENOUGH_BROKERS
        await register(leader, 4)
        await leader.drain_broker(3)

        follower = cluster.follower()
        with pytest.raises(NotControllerError) as not_ctl:
            await follower.create_topic("u", 1, 1)
        assert not_ctl.value.leader == leader.node_id
        with pytest.raises(NotControllerError):
            await follower.heartbeat(1, 1, 0)
        # A follower's linearizable read sees everything the leader applied.
        version, state = await follower.metadata(linearizable=True)
        assert version == leader.local_state()[0]
        topic = state.topics["t"]
        assert len(topic.partitions) == 8 and topic.config == {"segment.bytes": "1048576"}
        assert topic.partitions[7].state == "decommissioned"
        assert state.brokers[3].draining and state.next_producer_id == 100
    finally:
        await cluster.stop()


async def test_a_silent_broker_is_fenced_and_a_returning_one_unfenced(tmp_path):
    cluster = await QuorumCluster(tmp_path, session_timeout_s=1.0).start()
    beats = None
    try:
        leader = await cluster.leader()
        for b in (1, 2, 3):
            await register(leader, b)
        with pytest.raises(ControllerRefusal) as refused:
            await leader.heartbeat(9, 1, 0)
        assert refused.value.code == RefusalCode.UNKNOWN_BROKER
        with pytest.raises(ControllerRefusal) as refused:
            await leader.heartbeat(1, 7, 0)
        assert refused.value.code == RefusalCode.STALE_BROKER_INCARNATION
        beats = Heartbeats(cluster, {1, 2})
        await wait_for(lambda: fenced(leader.local_state()[1]) == {3}, 10, "broker 3 fenced")
        await asyncio.sleep(1.5)  # beating brokers stay unfenced
        assert fenced(leader.local_state()[1]) == {3}
        with pytest.raises(ControllerRefusal) as refused:
            await leader.create_topic("t", 1, 3)  # fenced brokers take no replicas
        assert refused.value.code == RefusalCode.NOT_ENOUGH_BROKERS
        # Back: told it is fenced until it has caught up with the leader's metadata.
        version = leader.local_state()[0]
        assert await leader.heartbeat(3, 1, version - 1) == (True, leader.local_state()[0])
        is_fenced, _ = await leader.heartbeat(3, 1, version)
        assert not is_fenced
        assert fenced(leader.local_state()[1]) == set()
        beats.brokers.add(3)
        await leader.create_topic("t", 1, 3)
    finally:
        if beats is not None:
            await beats.stop()
        await cluster.stop()


async def test_a_new_leader_does_not_fence_live_brokers_and_loses_nothing(tmp_path):
    """The leader's host stops (a crash): another voter leads, with the topic, and the
    brokers that keep beating are never fenced, though the new leader never heard them
    before; one that stopped beating is fenced, but not before the new leader led for a
    session timeout."""
    session_s = 1.5
    cluster = await QuorumCluster(tmp_path, session_timeout_s=session_s).start()
    beats = None
    try:
        old = await cluster.leader()
        for b in (1, 2, 3, 4):
            await register(old, b)
        await old.create_topic("kept", 4, 3)
        beats = Heartbeats(cluster, {1, 2, 3, 4})
        await asyncio.sleep(0.5)
        beats.brokers.discard(4)  # silent from here on
        # Every command the survivors apply from here, to see no live broker is ever
        # fenced, not even for a moment (a heartbeat would unfence it at once).
        watchers = [q.rsm.watch() for q in cluster.quorums.values() if q is not old]
        await cluster.stop(old.node_id)
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        new = await cluster.leader()
        elected_at = loop.time()
        assert new is not old
        _, state = await retry(lambda: new.metadata(linearizable=True))
        assert len(state.topics["kept"].partitions) == 4
        await wait_for(lambda: fenced(new.local_state()[1]) == {4}, 10, "broker 4 fenced")
        # Silent for more than a session before the crash plus the election; yet fenced
        # only once the new leader itself led for a whole session.
        assert loop.time() - elected_at >= session_s - 0.1, (stopped_at, elected_at)
        await asyncio.sleep(2 * session_s)
        assert fenced(new.local_state()[1]) == {4}
        for watcher in watchers:
            fences = []
            while True:
                try:
                    event = await asyncio.wait_for(watcher.get(), 0.1)
                except TimeoutError:
                    break
                if isinstance(event, Applied):
                    command = c.decode_command(event.command)
                    if isinstance(command, c.FenceBroker):
                        fences.append(command.broker_id)
            assert fences == [4]
    finally:
        if beats is not None:
            await beats.stop()
        await cluster.stop()


async def test_a_restart_of_every_voter_restores_the_same_metadata(tmp_path):
    options: dict[str, Any] = {"snapshot_every_entries": 5, "catch_up_entries": 2}
    cluster = await QuorumCluster(tmp_path, **options).start()
    try:
        leader = await cluster.leader()
        for b in (1, 2, 3):
            await register(leader, b)
        for i in range(8):
            await leader.create_topic(f"t{i}", i + 1, 2, {"retention.ms": str(1000 * (i + 1))})
        await leader.delete_topic("t3")
        await leader.add_partitions("t0", 3)
        version = await cluster.settled()
        before = {n: q.local_state()[1] for n, q in cluster.quorums.items()}
        assert all(q.rsm.snapshot_index > 0 for q in cluster.quorums.values())
    finally:
        await cluster.stop()
    cluster = await QuorumCluster(tmp_path, **options).start()
    try:
        for q in cluster.quorums.values():  # from the snapshot, before any leader spoke
            assert q.rsm.snapshot_index > 0 and len(q.local_state()[1].topics) >= 5
        leader = await cluster.leader()
        again, state = await retry(lambda: leader.metadata(linearizable=True))
        assert again >= version
        await cluster.settled()
        for n, q in cluster.quorums.items():
            restored = q.local_state()[1]
            assert restored.topics == before[n].topics and restored.brokers == before[n].brokers
        assert sorted(state.topics) == ["t0", "t1", "t2", "t4", "t5", "t6", "t7"]
        await leader.create_topic("after", 1, 3)
    finally:
        await cluster.stop()


async def collect(
    quorum: ControllerQuorum, from_version: int, into: list[tuple[int, MetadataState]]
) -> None:
    async for version, state in quorum.watch(from_version):
        into.append((version, state))
        await asyncio.sleep(0.2)  # a slow consumer: bursts coalesce


async def test_watch_delivers_newer_whole_states_in_order_and_resumes(tmp_path):
    cluster = await QuorumCluster(tmp_path).start()
    tasks: list[asyncio.Task[None]] = []
    try:
        leader = await cluster.leader()
        follower = cluster.follower()
        seen: dict[int, list[tuple[int, MetadataState]]] = {1: [], 2: []}
        tasks.append(asyncio.create_task(collect(leader, 0, seen[1])))
        tasks.append(asyncio.create_task(collect(follower, 0, seen[2])))
        for b in (1, 2, 3):
            await register(leader, b)
        for i in range(20):
            await leader.create_topic(f"t{i}", 1, 1)
        final = await cluster.settled()
        for got in seen.values():
            await wait_for(lambda got=got: got and got[-1][0] == final, what="the last state")
            versions = [v for v, _ in got]
            assert versions == sorted(set(versions)), "versions only grow"
            assert all(state.version == v for v, state in got), "each state is its version's"
            assert len(got) < 23, "a burst coalesces"
            assert len(got[-1][1].topics) == 20
        # Each state holds every change up to its version: topics only ever accumulate.
        counts = [len(state.topics) for _, state in seen[2]]
        assert counts == sorted(counts)
        # Resume from a version in the middle, on another voter: the first state is newer.
        middle = final - 3  # a version in the middle (delivered or coalesced away)
        resumed: list[tuple[int, MetadataState]] = []
        tasks.append(asyncio.create_task(collect(follower, middle, resumed)))
        await wait_for(lambda: resumed, what="the resumed watch")
        assert resumed[0][0] > middle and resumed[0][0] == final
        await leader.delete_topic("t0")
        await wait_for(lambda: len(resumed) == 2, what="the next change")
        assert "t0" not in resumed[1][1].topics and resumed[1][0] > final
        # A watch from the newest version waits for the next change.
        idle: list[tuple[int, MetadataState]] = []
        tasks.append(asyncio.create_task(collect(leader, resumed[1][0], idle)))
        await asyncio.sleep(0.3)
        assert idle == []
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await cluster.stop()


async def test_leader_reports_that_arrive_together_share_an_entry(tmp_path):
    cluster = await QuorumCluster(tmp_path).start()
    try:
        leader = await cluster.leader()
        for b in (1, 2, 3):
            await register(leader, b)
        created = await leader.create_topic("t", 100, 3)
        before = leader.local_state()[0]
        calls = [leader.report_leader("t", p, r[0], 2) for p, r in enumerate(created.replicas)]
        calls.append(leader.report_leader("t", 0, created.replicas[0][1], 1))  # an older one
        *done, stale = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(d, c.Done) for d in done), done
        assert isinstance(stale, ControllerRefusal), stale
        assert stale.code == RefusalCode.STALE_LEADER_TERM
        version, state = leader.local_state()
        assert version - before <= 3, "100 reports made more than a few entries"
        assert [(p.leader, p.leader_term) for p in state.topics["t"].partitions] == [
            (r[0], 2) for r in created.replicas
        ]
    finally:
        await cluster.stop()
