"""Real brokers under a low open-file limit: many partitions, few descriptors.

Why: with 1,000 partitions x 3 replicas each broker held ~2,000 open files (a descriptor
per active segment and one per commit hint), so at a soft limit of 1,024 the Raft drivers
died of EMFILE and hundreds of partitions stayed leaderless. Segment files now share one
capped LRU per process and hints are opened only to be written.
"""

from __future__ import annotations

import os
from pathlib import Path

from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format.records import Record, build_batch, iter_records
from raftmq.log.handles import cap_for_limit
from raftmq.log.segment import LOG_SUFFIX, parse_segment_name
from tests.broker.conftest import LEADER_TIMEOUT, REBALANCE_ARGS, cluster_spec, log_tails

NOFILE = 200
PARTITIONS = 150  # per broker: more replicas than the cap, and than the limit with hints


def segment_fds(pid: int) -> int:
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            path = Path(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            continue
        if path.suffix == LOG_SUFFIX and parse_segment_name(path.stem) is not None:
            count += 1
    return count


def all_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_many_partitions_under_a_low_open_file_limit(tmp_path: Path) -> None:
    cap = cap_for_limit(NOFILE)
    assert cap < PARTITIONS
    cluster = LocalCluster(
        tmp_path,
        cluster_spec({"many": PARTITIONS}),
        broker_args=["--tick-ms", "20", "--election-ticks", "30", *REBALANCE_ARGS],
        nofile=NOFILE,
    )
    ok = False
    try:
        cluster.start()
        cluster.wait_for_leaders(timeout=LEADER_TIMEOUT * 3, preferred=True)
        pids = {b: p.pid for b, p in cluster.procs.items()}
        with cluster.client() as client:
            for p in range(PARTITIONS):
                value = f"p{p}".encode() * 100
                client.produce("many", p, build_batch([Record(None, value, 1)] * 3))
                assert max(segment_fds(pid) for pid in pids.values()) <= cap
            for p in range(PARTITIONS):  # every partition reads back, from its leader
                r = client.fetch("many", p, 0)
                values = [rec.value for rec in iter_records(r.entries)]
                assert values == [f"p{p}".encode() * 100] * 3, p
        for b, pid in pids.items():
            assert cluster.alive(b), f"broker {b} exited"
            assert segment_fds(pid) <= cap
            assert all_fds(pid) < NOFILE
            text = cluster.log_path(b).read_text(errors="replace")
            assert f"segment handle cap {cap}: TOO LOW for {PARTITIONS} replicas" in text
            assert "Too many open files" not in text and "driver stopped" not in text
        ok = True
    finally:
        if not ok:
            print(log_tails(cluster))
        for b in list(cluster.procs):
            cluster.kill(b)
        cluster.close()
