"""A bit flipped in a sealed segment of one controller voter's metadata log while its
broker is down, with real broker processes: the entry is one the metadata group reads when
it opens, so the open fails; the broker repairs the range from the other voters instead of
crash-looping, serves again, and its metadata catches up (a topic created afterwards shows
on it). And a voter whose metadata snapshot is corrupt resynchronises from the others."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.controller.quorum import GROUP, METADATA_SEGMENT_BYTES_ENV, ControllerQuorum
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.raft.host.state_machine import SNAPSHOT_FILE
from tests.broker.conftest import cluster_spec, log_tails
from tests.broker.test_broker_cluster import address_of, wait_for_broker_state, wait_until
from tests.controller.quorum_cluster import VOTERS, QuorumCluster, retry
from tests.raft.test_driver import tcp_transports, wait_for
from tests.raft.test_state_machine import new_host

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
        # Three replicas need three alive brokers: a slow restart may have let the
        # victim's session lapse, and it is placed on again once it has registered anew.
        wait_for_broker_state(admin, victim, apb.BROKER_STATE_ALIVE, 60)
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


async def test_a_voter_whose_metadata_snapshot_is_corrupt_resynchronises(tmp_path: Path) -> None:
    """Damage no peer's entries can mend: the state machine snapshot the metadata log
    extends fails its CRC. ControllerQuorum.open moves the group's directory aside, the
    voter rejoins empty, and the leader sends it the metadata again (three voters in this
    process, real hosts over TCP)."""
    options: dict[str, Any] = {"snapshot_every_entries": 5, "catch_up_entries": 2}
    cluster = await QuorumCluster(tmp_path, **options).start()
    try:
        leader = await cluster.leader()
        for b in VOTERS:
            await leader.register_broker(b, "127.0.0.1", 9000 + b, "127.0.0.1", 9100 + b, None, 1)
        for i in range(8):
            await leader.create_topic(f"t{i}", 1, 2, {})
        version = await cluster.settled()
        victim = next(n for n, q in cluster.quorums.items() if not q.is_leader)
        assert cluster.quorums[victim].rsm.snapshot_index > 0
        await cluster.stop(victim)
        group_dir = tmp_path / f"n{victim}" / GROUP
        snapshot = group_dir / SNAPSHOT_FILE
        raw = bytearray(snapshot.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        snapshot.write_bytes(bytes(raw))

        transport = tcp_transports(VOTERS)[victim]
        host = new_host(victim, transport)
        quorum = await ControllerQuorum.open(
            host, tmp_path / f"n{victim}", VOTERS, "test", **options
        )
        await host.start()
        quorum.start()
        cluster.transports[victim], cluster.hosts[victim] = transport, host
        cluster.quorums[victim] = quorum
        for n, t in cluster.transports.items():
            for p, other in cluster.transports.items():
                if p != n:
                    t.set_peer_address(p, ("127.0.0.1", other.port))
        (aside,) = group_dir.parent.glob(f"{GROUP}.damaged-*")
        assert (aside / SNAPSHOT_FILE).read_bytes() == bytes(raw)  # kept as it was
        # The metadata changes on (a write wakes the leader's group, if it quiesced, at once).
        leader = await cluster.leader()
        await retry(lambda: leader.create_topic("after", 1, 3, {}))
        await wait_for(lambda: quorum.local_state()[0] > version, 20, "the voter to catch up")
        await wait_for(lambda: not quorum.raft_status().rejoining, 20, "the rejoin to end")
        await wait_for(
            lambda: "after" in quorum.local_state()[1].topics, 20, "the new topic on the voter"
        )
    finally:
        await cluster.stop()
