"""The mover on a real three-voter controller quorum (in-process, real Raft over TCP): the
test plays every partition's Raft leader by proposing PromoteReplica for learners. A
fenced broker's replicas are replaced once the heal delay has passed, not before; an
operator's rebalance survives a change of controller leader (its mover gone) and ends
with the request cleared and the replicas even."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import pytest

from raftmq.controller import commands as c
from raftmq.controller.healing import Limits
from raftmq.controller.model import MetadataState
from raftmq.controller.mover import Mover
from raftmq.controller.quorum import GROUP, ControllerError, ControllerQuorum
from tests.controller.quorum_cluster import QuorumCluster
from tests.controller.test_quorum import register
from tests.raft.test_driver import wait_for

pytestmark = pytest.mark.timeout(120)


def movers(
    cluster: QuorumCluster, limits: Limits, rebalance_every_s: float | None = None
) -> dict[int, Mover]:
    out = {
        n: Mover(q, limits, period_s=0.1, rebalance_every_s=rebalance_every_s)
        for n, q in cluster.quorums.items()
    }
    for m in out.values():
        m.start()
    return out


async def current(cluster: QuorumCluster) -> tuple[ControllerQuorum, MetadataState] | None:
    """A voter that leads and the metadata it confirms as current, or None for now (no
    leader, or a deposed one that has not heard of its successor yet)."""
    for q in list(cluster.quorums.values()):
        if q.is_leader:
            try:
                _, state = await q.metadata(linearizable=True)
            except ControllerError:
                continue
            return q, state
    return None


PROMOTE_ERRORS: list[str] = []  # for the message of a test that times out


async def promote_learners(leader: ControllerQuorum, state: MetadataState) -> None:
    """As each partition's leader would once its learner caught up: promote every learner."""
    for name, topic in sorted(state.topics.items()):
        for i, part in enumerate(topic.partitions):
            for learner in part.learners:
                try:
                    await leader.promote_replica(name, i, learner)
                except ControllerError as exc:  # leadership moved, or the move was given up
                    PROMOTE_ERRORS.append(f"{name}/{i} on {leader.node_id}: {exc!r}")


def picture(cluster: QuorumCluster) -> str:
    """Each running voter's view, for a test that times out."""
    lines = []
    for n, q in sorted(cluster.quorums.items()):
        version, s = q.local_state()
        parts = [(p.replicas, p.learners) for t in s.topics.values() for p in t.partitions]
        lines.append(f"voter {n}: leader? {q.is_leader} ({q.leader}) v{version} {parts}")
    return "\n".join([*lines, *PROMOTE_ERRORS[-5:]])


async def wait_state(cluster: QuorumCluster, check, what: str, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        found = await current(cluster)
        if found is not None and check(found[1]):
            return found[1]
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{picture(cluster)}"
        if found is not None:
            await promote_learners(*found)
        await asyncio.sleep(0.1)


async def test_a_fenced_brokers_replicas_are_replaced_after_the_heal_delay(tmp_path):
    cluster = await QuorumCluster(tmp_path).start()
    running = movers(cluster, Limits(heal_delay_ms=1500))
    try:
        leader = await cluster.leader()
        for b in (1, 2, 3, 4):
            await register(leader, b)
        await leader.create_topic(
            "t", 4, 3, assignment=[(1, 2, 3), (2, 3, 1), (3, 1, 2), (2, 3, 4)]
        )
        await leader.propose_change(c.FenceBroker(1, time.time_ns() // 1_000_000))
        await asyncio.sleep(0.5)
        _, state = leader.local_state()
        assert all(not p.learners for p in state.topics["t"].partitions), "moved too early"

        def healed(s: MetadataState) -> bool:
            return all(1 not in p.replicas + p.learners for p in s.topics["t"].partitions)

        state = await wait_state(cluster, healed, "broker 1's replicas to be replaced")
        assert [p.replicas for p in state.topics["t"].partitions] == [
            (4, 2, 3),
            (2, 3, 4),
            (3, 4, 2),
            (2, 3, 4),
        ]
    finally:
        for m in running.values():
            await m.stop()
        await cluster.stop()


async def test_a_rebalance_survives_a_change_of_controller_leader(tmp_path):
    cluster = await QuorumCluster(tmp_path).start()
    running = movers(cluster, Limits(moves_per_broker=1))
    try:
        leader = await cluster.leader()
        for b in (1, 2, 3):
            await register(leader, b)
        await leader.create_topic("t", 8, 3)
        await register(leader, 4)
        await leader.request_rebalance()
        await wait_for(
            lambda: any(p.learners for p in leader.local_state()[1].topics["t"].partitions),
            what="the first rebalance move",
        )
        # Leadership moves mid-rebalance, and the old leader's mover is gone: only what the
        # metadata says (the request, the move under way) can carry the rebalance on.
        old = await cluster.leader()  # leadership may have moved since (a loaded machine)
        await running.pop(old.node_id).stop()
        to = min(n for n in cluster.quorums if n != old.node_id)
        # A transfer is dropped if the target is not caught up in time (a loaded machine):
        # ask again until another voter leads.
        deadline = time.monotonic() + 60
        while not any(q.is_leader for n, q in cluster.quorums.items() if n != old.node_id):
            assert time.monotonic() < deadline, f"leadership never left voter {old.node_id}"
            with contextlib.suppress(Exception):
                cluster.hosts[old.node_id].transfer_leadership(GROUP, to)
            await asyncio.sleep(0.5)

        def balanced(s: MetadataState) -> bool:
            return not s.rebalance_requested

        state = await wait_state(cluster, balanced, "the rebalance to finish", timeout_s=60)
        parts = state.topics["t"].partitions
        assert all(not p.learners for p in parts)
        replicas = Counter(b for p in parts for b in p.replicas)
        leaders = Counter(p.replicas[0] for p in parts)
        assert (
            set(replicas) == {1, 2, 3, 4} and max(replicas.values()) - min(replicas.values()) <= 1
        )
        assert max(leaders.values()) - min(leaders.values()) <= 1
    finally:
        for m in running.values():
            await m.stop()
        await cluster.stop()


async def test_a_timed_rebalance_runs_without_a_request(tmp_path):
    cluster = await QuorumCluster(tmp_path).start()
    running = movers(cluster, Limits(), rebalance_every_s=0.3)
    try:
        leader = await cluster.leader()
        for b in (1, 2, 3):
            await register(leader, b)
        await leader.create_topic("t", 4, 3)
        await register(leader, 4)

        def spread(s: MetadataState) -> bool:
            parts = s.topics["t"].partitions
            counts = Counter(b for p in parts for b in p.replicas)
            return not any(p.learners for p in parts) and set(counts) == {1, 2, 3, 4}

        state = await wait_state(cluster, spread, "a replica on broker 4")
        assert not state.rebalance_requested
    finally:
        for m in running.values():
            await m.stop()
        await cluster.stop()
