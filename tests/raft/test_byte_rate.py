"""The learner byte rate: pacing arithmetic, and a real host whose leader copies a log to a
new learner no faster than its cap (while its voters get entries at full speed)."""

from __future__ import annotations

import asyncio
import time

from raftmq.format import entry
from raftmq.raft.host.byte_rate import ByteRate
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.transport import MemoryNetwork
from raftmq.raft.membership import Membership
from tests.raft.test_driver import FAST, MEMBERS, SMALL, leader_of, wait_for


def test_a_burst_passes_then_the_rate_holds() -> None:
    rate = ByteRate(1000, burst_s=1.0)
    delays = [rate.delay_s(1000, 0.0) for _ in range(10)]
    assert delays == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    # idle time earns back at most the burst
    assert ByteRate(1000).delay_s(500, 100.0) == 0.0
    later = ByteRate(1000, burst_s=0.5)
    assert later.delay_s(1000, 10.0) == 0.0
    assert later.delay_s(1000, 10.0) == 0.5


RATE_BYTES_PER_S = 100_000
LOG_BYTES = 300_000
APPEND_BYTES = 32 * 1024
"""Appends of at most this: the rate paces whole messages (one passes whole)."""


async def test_a_learner_is_caught_up_no_faster_than_the_cap(tmp_path) -> None:
    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    for node in (1, 2, 3, 4):
        host = RaftHost(
            node,
            net.transport(node),
            seed=node,
            learner_bytes_per_s=RATE_BYTES_PER_S,
            max_append_bytes=APPEND_BYTES,
            **FAST,
        )
        host.open_group(
            "g",
            tmp_path / f"n{node}",
            MEMBERS if node != 4 else Membership(MEMBERS.voters, frozenset({4})),
            log_config=SMALL,
        )
        await host.start()
        hosts[node] = host
    voters = {n: h for n, h in hosts.items() if n != 4}
    try:
        await wait_for(lambda: leader_of(voters) is not None, what="a leader")
        leader = leader_of(voters)
        assert leader is not None
        value = b"v" * 1000
        started = time.monotonic()
        dones = [
            leader.propose("g", entry.encode(value, record_count=1)).done
            for _ in range(LOG_BYTES // len(value))
        ]
        await asyncio.gather(*dones)
        voters_took_s = time.monotonic() - started
        learner = hosts[4].groups["g"]
        copying = time.monotonic()
        added = await leader.propose_membership("g", Membership(MEMBERS.voters, frozenset({4})))
        await wait_for(lambda: learner.commit_index >= added, 30, "the learner caught up")
        learner_took_s = time.monotonic() - copying
        print(f"voters {voters_took_s:.2f} s, learner {learner_took_s:.2f} s")
        # 300 kB at 100 kB/s after one second's burst and a first append: 1.7 s at least
        floor_s = (LOG_BYTES - APPEND_BYTES) / RATE_BYTES_PER_S - 1.0
        assert learner_took_s >= floor_s - 0.2, learner_took_s
        # the voters were not held to the learners' cap (that would be 6 s for two)
        assert voters_took_s < 2 * LOG_BYTES / RATE_BYTES_PER_S - 2.0, voters_took_s
    finally:
        for host in hosts.values():
            await host.stop()
