"""A follower whose data directory for a partition is lost (wiped, or cut back with its
Raft hard state gone) rejoins with real brokers: it catches up to a log byte-identical to
the leader's, no acknowledged record is lost, and the leader does not spin meanwhile
(docs/raft.md, "Rejoining after disk loss")."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.log.config import LogConfig
from raftmq.log.log import Log
from raftmq.raft.host.state_store import Kind
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import (
    _hw_or_none,
    address_of,
    batch,
    leader_of,
    read_all,
    wait_until,
)
from tests.raft import stored

TOPIC = "w"
CATCH_UP_S = 30.0
MAX_LEADER_CPU_SHARE = 0.5
"""Of one core, while the rejoined follower is idle: the spinning leader used most of one."""


def partition_dir(cluster: LocalCluster, broker_id: int) -> Path:
    return cluster.data / f"broker-{broker_id}" / f"{TOPIC}-0"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lose_disk(directory: Path, how: str) -> None:
    if how == "wiped":
        shutil.rmtree(directory)
        return
    if how == "replaced":
        # The broker's whole data directory: the state store beside each partition's
        # folder, which says that it once voted and acknowledged, is gone too.
        shutil.rmtree(directory.parent)
        return
    # Cut back: the newest segment loses its second half (recovery cuts the torn entry)
    # and the group's Raft state goes but for its promise record: a disk restored from an
    # older copy, without its hard state.
    last = sorted(directory.glob("*.log"))[-1]
    os.truncate(last, last.stat().st_size // 2)
    stored.forget(directory, Kind.HARD)
    stored.forget(directory, Kind.HINT)
    stored.put(directory, Kind.PROMISED, b"")


def fill_and_replicate(
    cluster: LocalCluster, client: LowLevelClient, topic: str, batches: int
) -> tuple[int, int, list[bytes]]:
    """Produce ``batches`` acks=all batches of 5 records, wait until the lowest-numbered
    follower holds them all; (leader, that follower, the values sent)."""
    leader = leader_of(client, topic)
    follower = min(set(cluster.spec.brokers) - {leader})
    sent: list[bytes] = []
    for i in range(batches):
        values = [f"before-{i}-{k}-".encode() * 20 for k in range(5)]
        client.produce(topic, 0, batch(values))
        sent += values
    wait_until(
        lambda: _hw_or_none(client, address_of(cluster, follower), topic) == len(sent),
        10,
        f"broker {follower} to hold every record",
    )
    return leader, follower, sent


def stored_entries(directory: Path) -> bytes:
    """Every entry of a stopped replica's log, as stored, read by index."""
    log = Log.open(directory, LogConfig())
    try:
        assert log.start_index == 1
        return log.read_entries(1, 1 << 30, log.last_index + 1)
    finally:
        log.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["wiped", "cut", "replaced"])
def test_follower_that_lost_its_disk_rejoins_byte_identical(
    make_cluster: ClusterFactory, how: str
) -> None:
    cluster = make_cluster({TOPIC: 1})
    with cluster.client() as client:
        # The follower acknowledged everything: the leader's record for it says so.
        leader, follower, sent = fill_and_replicate(cluster, client, TOPIC, 40)
        follower_address = address_of(cluster, follower)
        cluster.stop(follower)
        lose_disk(partition_dir(cluster, follower), how)
        cluster.start(follower)
        if how == "replaced":
            # Nothing on its disk says it took part: its peers do, and it rejoins.
            # (Or, when no peer answers the probe in time on a loaded machine, it assumes
            # the past: either way its replica rejoins rather than passing for new.)
            wait_until(
                lambda: "rejoin" in cluster.log_path(follower).read_text(),
                30,
                "the broker to learn from its peers that its replicas had a past",
            )
        for i in range(10):
            values = [f"after-{i}".encode()]
            r = client.produce(TOPIC, 0, batch(values), timeout_ms=10_000)
            assert r.base_offset == len(sent)
            sent += values
        wait_until(
            lambda: _hw_or_none(client, follower_address, TOPIC) == len(sent),
            CATCH_UP_S,
            "the follower that lost its disk to catch up with the leader",
        )
        leader = leader_of(client, TOPIC)
        records, raw = read_all(client, TOPIC, 0, address=follower_address)
        leader_records, leader_raw = read_all(client, TOPIC, 0, address=address_of(cluster, leader))
        assert [r.value for r in leader_records] == sent  # no acknowledged record lost
        assert [r.value for r in records] == sent
        assert raw == leader_raw
        # Idle now: the leader must not keep re-sending to the rejoined follower.
        pid = cluster.procs[leader].pid
        time.sleep(0.5)
        before, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(3.0)
        share = (cpu_seconds(pid) - before) / (time.monotonic() - t0)
        assert share < MAX_LEADER_CPU_SHARE, f"idle leader used {share:.0%} of a core"
    # SIGKILL, not a graceful stop: a stop hands leadership over, and the new leader's
    # no-op may reach some replicas and not others before they exit.
    for bid in cluster.spec.brokers:
        cluster.kill(bid)
    logs = {bid: stored_entries(partition_dir(cluster, bid)) for bid in cluster.spec.brokers}
    assert logs[follower] == logs[leader]
    assert len(set(logs.values())) == 1, "replicas differ"
