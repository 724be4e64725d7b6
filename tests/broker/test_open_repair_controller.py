"""A bit flipped in a sealed segment of one controller voter's metadata log while its
broker is down, with real broker processes: the entry is one the metadata group reads when
it opens, so the open fails; the broker repairs the range from the other voters instead of
crash-looping, serves again, and its metadata catches up (a topic created afterwards shows
on it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.controller.quorum import GROUP, METADATA_SEGMENT_BYTES_ENV
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.format.entry import EntryType
from tests.broker.conftest import cluster_spec, log_tails
from tests.broker.test_broker_cluster import address_of, wait_until

TOPIC = "t"
METADATA_SEGMENT_BYTES = 2048


@pytest.fixture
def cluster(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LocalCluster]:
    """Three brokers, all controller voters, whose metadata logs roll every 2 KiB."""
    monkeypatch.setenv(METADATA_SEGMENT_BYTES_ENV, str(METADATA_SEGMENT_BYTES))
    c = LocalCluster(
        tmp_path / "cluster",
        cluster_spec({TOPIC: 1}),
        broker_args=["--tick-ms", "20", "--election-ticks", "10"],
    )
    c.start()
    try:
        c.wait_for_leaders(timeout=30)
        yield c
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(log_tails(c))
        for bid in list(c.procs):
            c.kill(bid)
        c.close()


def metadata_dir(cluster: LocalCluster, broker: int) -> Path:
    return cluster.data / f"broker-{broker}" / GROUP


def topics_on(address: str) -> set[str]:
    """The topics broker ``address`` itself knows (its own metadata, no other broker's)."""
    client = LowLevelClient([address])
    try:
        return {t.name for t in client.metadata(timeout=2.0).topics}
    except ClientError:
        return set()
    finally:
        client.close()


@pytest.mark.timeout(180)
def test_a_voter_whose_metadata_log_is_damaged_repairs_it_and_serves(
    cluster: LocalCluster,
) -> None:
    victim = 2  # every broker is a voter (no controller_voters in the spec)
    folder = metadata_dir(cluster, victim)
    assert folder.is_dir()
    with cluster.admin() as admin:
        # Metadata commands until the victim's log has sealed segments (each alter is
        # one entry; a few dozen fill several 2 KiB segments).
        for i in range(400):
            if len(sorted(folder.glob("*.log"))) >= 4:
                break
            admin.alter_topic_config(TOPIC, {"retention.ms": str(86_400_000 + i)})
        assert len(sorted(folder.glob("*.log"))) >= 4, sorted(p.name for p in folder.iterdir())
        cluster.stop(victim)
        seg = sorted(folder.glob("*.log"))[1]
        original = seg.read_bytes()
        h = next(h for h in entry.iter_headers(original) if h.type == EntryType.METADATA)
        with open(seg, "r+b") as f:  # the payload's last byte: its CRC catches it
            f.seek(h.end - 1)
            f.write(bytes([original[h.end - 1] ^ 0x10]))
        cluster.start(victim)
        victim_address = address_of(cluster, victim)
        wait_until(lambda: seg.read_bytes() == original, 60, "the metadata log's repair")
        admin.create_topic("after-repair", 1, 3)
    wait_until(
        lambda: "after-repair" in topics_on(victim_address),
        60,
        "the repaired broker to serve the new topic",
    )
    log_text = cluster.log_path(victim).read_text()
    assert "its metadata log cannot open" in log_text, log_text[-3000:]
    assert "repaired entries" in log_text and seg.stem in log_text, log_text[-3000:]
    assert cluster.procs[victim].poll() is None, "the repaired broker exited"
