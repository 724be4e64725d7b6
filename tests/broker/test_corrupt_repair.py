"""A flipped bit in a closed segment of one replica, with real brokers: a Fetch over the
range finds it, the replica restores the range from a healthy replica in place, reports
what it replaced, and the Fetch then succeeds with the same bytes as the leader's."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.log.inspect import verify_folder
from raftmq.raft.host.state_store import Kind
from tests.broker.conftest import REBALANCE_ARGS, ClusterFactory, cluster_spec, log_tails
from tests.broker.test_broker_cluster import (
    _hw_or_none,
    address_of,
    batch,
    read_all,
    wait_until,
)
from tests.broker.test_disk_loss import fill_and_replicate, stored_entries
from tests.broker.test_metrics import scrape, value
from tests.raft import stored

TOPIC = "c"
SEGMENT_BYTES = 16 * 1024


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three brokers with small segments, so a few records fill closed segments, and no
    background scrubber: these tests show what a read or an open does with damage, and a
    scrub pass (or a leader's audit of its followers, which rides on it) finding the damage
    first would leave the read nothing to prove."""
    args = ["--tick-ms", "20", "--election-ticks", "10", "--segment-bytes", str(SEGMENT_BYTES)]
    args += ["--scrub-bytes-per-s", "0"]
    c = LocalCluster(
        tmp_path / "cluster", cluster_spec({TOPIC: 1}), broker_args=args + REBALANCE_ARGS
    )
    c.start()
    try:
        c.wait_for_leaders(timeout=30, preferred=True)
        yield c
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(log_tails(c))
        for bid in list(c.procs):
            c.kill(bid)
        c.close()


def flip_bit(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x10]))


def close_segments(
    cluster: LocalCluster, client: LowLevelClient, broker: int, sent: list[bytes]
) -> list[Path]:
    """Produce (adding to ``sent``) until ``broker``'s replica has closed segments, each
    record held by it too; its segment files. A follower that fell behind (a loaded
    machine) catches up in large appends, and an append is never split across segments:
    hence writing on until the segments are there rather than a fixed amount."""
    address = address_of(cluster, broker)
    folder = cluster.data / f"broker-{broker}" / f"{TOPIC}-0"
    for i in range(200):
        if len(sorted(folder.glob("*.log"))) >= 3:
            break
        values = [f"more-{i}-".encode() * 40]
        client.produce(TOPIC, 0, batch(values))
        sent += values
        want = len(sent)
        wait_until(
            lambda want=want: _hw_or_none(client, address, TOPIC) == want,
            10,
            f"broker {broker} to hold every record",
        )
    segments = sorted(folder.glob("*.log"))
    assert len(segments) >= 3, "the test needs closed segments"
    return segments


@pytest.mark.timeout(120)
def test_a_flipped_bit_is_repaired_from_a_replica_and_the_fetch_then_succeeds(
    cluster: LocalCluster,
) -> None:
    with cluster.client() as client:
        leader, victim, sent = fill_and_replicate(cluster, client, TOPIC, 30)
        victim_address = address_of(cluster, victim)
        folder = cluster.data / f"broker-{victim}" / f"{TOPIC}-0"
        segments = close_segments(cluster, client, victim, sent)
        # A broker verified what it appended; the bit rots while it is down and is found
        # by the first read after its restart.
        cluster.stop(victim)
        flip_bit(segments[0], 700)
        good_copy = sorted((cluster.data / f"broker-{leader}" / f"{TOPIC}-0").glob("*.log"))
        cluster.start(victim)
        wait_until(
            lambda: _hw_or_none(client, victim_address, TOPIC) == len(sent),
            20,
            "the restarted replica to answer",
        )
        with pytest.raises((grpc.RpcError, ClientError)):
            client.fetch(TOPIC, 0, 0, max_bytes=1 << 20, address=victim_address)

        def fetch_works() -> bool:
            try:
                client.fetch(TOPIC, 0, 0, max_bytes=1 << 20, address=victim_address)
                return True
            except (grpc.RpcError, ClientError):
                return False

        wait_until(fetch_works, 20, "the corrupt range to be repaired")
        records, raw = read_all(client, TOPIC, 0, address=victim_address)
        _, leader_raw = read_all(client, TOPIC, 0, address=address_of(cluster, leader))
        assert [r.value for r in records] == sent
        assert raw == leader_raw
        # An operator sees it too: the victim's repair counters (docs/metrics.md).
        metrics_address = cluster.wait_ready()[victim].metrics
        assert metrics_address
        samples = scrape(metrics_address)
        assert value(samples, "raftmq_repair_damaged_ranges_total") >= 1
        assert value(samples, "raftmq_repair_repaired_ranges_total") >= 1
        assert value(samples, "raftmq_repair_unrepaired_ranges_total") == 0
    log_text = cluster.log_path(victim).read_text()
    assert "repaired entries" in log_text and "bytes replaced" in log_text, log_text[-3000:]
    # The failed read itself asked for the repair (not only the scrubber's later pass).
    assert "found by a client read" in log_text, log_text[-3000:]
    cluster.stop()
    assert verify_folder(folder).ok
    # Byte for byte over what both hold: a leader change near the stop (the preferred
    # replica taking leadership back) can leave one log an entry longer than the other.
    mine, theirs = stored_entries(folder), stored_entries(good_copy[0].parent)
    shared = min(len(mine), len(theirs))
    assert shared > 0 and mine[:shared] == theirs[:shared]


@pytest.mark.timeout(120)
def test_a_read_of_the_leader_s_corrupt_range_is_retried_until_it_is_repaired(
    cluster: LocalCluster,
) -> None:
    """A client reading without naming a replica reads the leader. When the leader's own
    copy of the range fails its checksum, it answers CORRUPT_DATA (retriable in
    broker.proto) and restores the range from a follower; the client retries and the
    reader gets every record instead of the error."""
    with cluster.client() as client:
        leader, _, sent = fill_and_replicate(cluster, client, TOPIC, 30)
        segments = close_segments(cluster, client, leader, sent)
        # The bit rots while the leader is down. It leads again once back in sync (it is
        # the preferred replica; a write shows the interim leader that it is), and the
        # first read of the range finds the damage.
        cluster.stop(leader)
        flip_bit(segments[0], 700)
        cluster.start(leader)
        sent.append(b"after the restart")
        client.produce(TOPIC, 0, batch(sent[-1:]))
        cluster.wait_for_leaders(timeout=30, preferred=True)
        assert client.refresh_leaders()[TOPIC, 0].broker_id == leader
        records, _ = read_all(client, TOPIC, 0)
        assert [r.value for r in records] == sent
    log_text = cluster.log_path(leader).read_text()
    assert "repaired entries" in log_text, log_text[-3000:]
    assert "failed its checksum" in log_text, log_text[-3000:]


@pytest.mark.timeout(120)
def test_a_replica_whose_open_reads_a_corrupt_entry_is_repaired_before_it_opens(
    cluster: LocalCluster,
) -> None:
    """Issue 20: the damaged entry is one the Raft core reads as the group opens (with no
    commit hint, it replays the whole log for configurations), so the replica cannot open.
    Its broker reports it as opening (repairing), fetches the damaged range from a peer,
    then opens it; it serves the leader's bytes, and its other work never stopped."""
    with cluster.client() as client:
        leader, victim, sent = fill_and_replicate(cluster, client, TOPIC, 30)
        folder = cluster.data / f"broker-{victim}" / f"{TOPIC}-0"
        segments = close_segments(cluster, client, victim, sent)
        cluster.stop(victim)
        flip_bit(segments[0], 700)
        stored.forget(folder, Kind.HINT)  # the open reads the whole log
        cluster.start(victim)
        log_text = _repaired_at_open(cluster, client, leader, victim, sent)
    assert "applying metadata version" not in log_text, log_text[-3000:]


@pytest.mark.timeout(120)
def test_a_replica_whose_commit_entry_rotted_in_a_sealed_segment_is_repaired_at_open(
    cluster: LocalCluster,
) -> None:
    """Found by chaos seed 7102: the partition reads the entry at its commit index as it
    opens (for its high watermark). When that entry lies in a sealed segment (the commit
    hint is written lazily, so it can point there) and rotted while the broker was down,
    the open names it as damage and the broker repairs it from a peer, instead of failing
    the same read every second for good."""
    with cluster.client() as client:
        leader, victim, sent = fill_and_replicate(cluster, client, TOPIC, 30)
        folder = cluster.data / f"broker-{victim}" / f"{TOPIC}-0"
        segments = close_segments(cluster, client, victim, sent)
        cluster.stop(victim)
        last_sealed = segments[-2]
        *_, rotted = entry.iter_headers(last_sealed.read_bytes())
        flip_bit(last_sealed, rotted.end - 1)
        hint = stored.commit_hint(folder)
        assert hint is not None and hint.through >= rotted.index
        lagging = dataclasses.replace(
            hint,
            through=rotted.index,
            changes=tuple(c for c in hint.changes if c[0] <= rotted.index),
        )
        stored.put(folder, Kind.HINT, lagging.encode())
        cluster.start(victim)
        _repaired_at_open(cluster, client, leader, victim, sent)


def _repaired_at_open(
    cluster: LocalCluster, client: LowLevelClient, leader: int, victim: int, sent: list[bytes]
) -> str:
    """Wait until the restarted ``victim``, whose open found damage, was repaired from its
    peers and serves the leader's bytes; its broker's log."""
    victim_address = address_of(cluster, victim)

    def repaired_and_ok() -> bool:
        return _hw_or_none(client, victim_address, TOPIC) == len(sent)

    wait_until(repaired_and_ok, 30, "the replica to be repaired, open and caught up")
    records, raw = read_all(client, TOPIC, 0, address=victim_address)
    _, leader_raw = read_all(client, TOPIC, 0, address=address_of(cluster, leader))
    assert [r.value for r in records] == sent
    assert raw == leader_raw
    log_text = cluster.log_path(victim).read_text()
    assert "repairing it from its peers" in log_text, log_text[-3000:]
    assert f"repaired its replica of {TOPIC}/0" in log_text, log_text[-3000:]
    return log_text


def _log_start(client: LowLevelClient, address: str) -> int:
    """The log start the broker at ``address`` reports for its own replica."""
    md = client.stub(address).Metadata(pb.MetadataRequest(topics=[TOPIC]), timeout=5)
    return md.topics[0].partitions[0].log_start_offset


@pytest.mark.timeout(150)
def test_a_replica_whose_snapshot_meta_no_peer_can_mend_starts_over_from_its_leader(
    make_cluster: ClusterFactory,
) -> None:
    """Chaos, --faults all, seeds 3003 and 4004: the snapshot meta of a replica whose log
    starts above 1 (retention ran) is damaged, and no commit hint names the configuration
    there, so it cannot open, and no peer's entries can mend a file of its own. Another
    replica leads and holds every committed entry: the broker starts this one over from
    it (as rebuild-replica would), and it serves the leader's bytes again."""
    cluster = make_cluster(
        {TOPIC: 1},
        extra_args=[
            "--segment-bytes",
            str(SEGMENT_BYTES),
            "--retention-bytes",
            str(3 * SEGMENT_BYTES),
            "--retention-check-ms",
            "200",
        ],
    )
    with cluster.client() as client:
        leader, victim, sent = fill_and_replicate(cluster, client, TOPIC, 30)
        victim_address = address_of(cluster, victim)
        folder = cluster.data / f"broker-{victim}" / f"{TOPIC}-0"
        for i in range(60):
            values = [f"more-{i}-".encode() * 60]
            client.produce(TOPIC, 0, batch(values))
            sent += values
        wait_until(
            lambda: _log_start(client, victim_address) > 0,
            30,
            "retention to move the victim's log start",
        )
        cluster.stop(victim)
        stored.forget(folder, Kind.META)  # as a damaged record of it is
        stored.forget(folder, Kind.HINT)
        cluster.start(victim)
        wait_until(
            lambda: _hw_or_none(client, victim_address, TOPIC) == len(sent),
            40,
            "the replica to start over from its leader and catch up",
        )
        mine, theirs = (
            {
                r.offset: r.value
                for r in read_all(
                    client, TOPIC, 0, address=address, start=_log_start(client, address)
                )[0]
            }
            for address in (victim_address, address_of(cluster, leader))
        )
        shared = set(mine) & set(theirs)
        assert shared and all(mine[o] == theirs[o] for o in shared)
        assert max(mine) == len(sent) - 1
    log_text = cluster.log_path(victim).read_text()
    assert "starts over from that leader's log" in log_text, log_text[-3000:]
