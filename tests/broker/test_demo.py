"""``raftmq demo`` checks only its own records: two demos and another producer share the
demo topic and every demo still passes; a real difference is reported by partition and
offset."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from raftmq.cli.cluster_cmd import DEMO_TOPIC
from raftmq.cli.demo_check import RUN_HEADER, check_partition
from raftmq.format.records import Record, build_batch
from tests.broker.conftest import ClusterFactory

RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]


@pytest.mark.timeout(240)
def test_two_demos_and_another_writer_share_the_topic(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({DEMO_TOPIC: 3})
    bootstrap = ",".join(cluster.addresses)
    stop = threading.Event()
    foreign = [0]

    def other_writer() -> None:
        with cluster.client() as c:
            while not stop.is_set():
                for p in range(3):
                    c.produce(DEMO_TOPIC, p, build_batch([Record(b"k", b"not a demo", 1)]))
                    foreign[0] += 1

    writer = threading.Thread(target=other_writer, daemon=True)
    writer.start()
    try:
        demos = [
            subprocess.Popen(
                [*RAFTMQ, "demo", "--bootstrap", bootstrap, "--records", "3000"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [d.communicate(timeout=180)[0] for d in demos]
    finally:
        stop.set()
        writer.join(timeout=30)
    assert foreign[0] > 0
    for demo, out in zip(demos, outputs, strict=True):
        assert demo.returncode == 0, out
        assert "Every record came back exactly as written" in out, out


def test_a_difference_is_reported_by_partition_and_offset() -> None:
    run, other = b"r" * 8, b"o" * 8

    def ours(offset: int, value: bytes) -> Record:
        return Record(None, value, 0, ((RUN_HEADER, run),), offset)

    written = [(10, b"v0"), (11, b"v1"), (13, b"v2"), (14, b"v3"), (15, b"v4")]
    read = [
        ours(10, b"v0"),
        ours(11, b"V1-changed" * 10),
        Record(None, b"foreign", 0, (), 12),  # another writer: ignored
        Record(None, b"other demo", 0, ((RUN_HEADER, other),), 13),  # where v2 should be
        ours(14, b"v3"),
        ours(16, b"v3"),  # a second copy
    ]
    check = check_partition(2, run, written, read)
    assert not check.ok
    assert check.read_back == 2
    assert check.missing == [15]
    assert [d[0] for d in check.differing] == [11, 13]
    assert check.duplicates == [16]
    text = "\n".join(check.problems())
    assert "partition 2 offset 11: expected b'v1', found b'V1-changedV1-changedV1-c'" in text
    assert "(100 bytes)" in text
    assert (
        "partition 2 offset 13: expected b'v2', found b'other demo' (another writer's record)"
        in text
    )
    assert "1 acknowledged records missing, at offsets 15" in text
    assert "1 duplicates of this run's records, at offsets 16" in text
    # Other writers' records alone never make a run fail.
    clean = [ours(o, v) for o, v in written] + [Record(None, b"x", 0, (), 99)]
    assert check_partition(0, run, written, clean).ok
