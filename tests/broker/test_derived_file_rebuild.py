"""Issue 20 with real brokers: a follower is stopped, a bit is flipped in each of its
derived files (a closed segment's offset index and time index, the log-start checkpoint,
the producer-state checkpoint, the broker's metadata cache), and it is started again.
Within 30 s it reports its replica REPLICA_OK, a read from it returns the same bytes as
its peers', its idempotent producer's state is rebuilt whole, and its log says, one
WARNING per file, what it rebuilt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format.records import Record, build_batch
from raftmq.log import checkpoints
from raftmq.log.atomic_file import read_atomic
from raftmq.log.log import Log
from raftmq.partition.producer_tracking import CHECKPOINT_FILE, ProducerTracking
from tests.broker.conftest import REBALANCE_ARGS, cluster_spec, log_tails
from tests.broker.test_broker_cluster import _hw_or_none, address_of, read_all, wait_until

TOPIC = "d"
SEGMENT_BYTES = 16 * 1024
RPC_TIMEOUT_S = 5.0


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three brokers with small segments, so a few records close segments (and write
    their index files)."""
    args = ["--tick-ms", "20", "--election-ticks", "10", "--segment-bytes", str(SEGMENT_BYTES)]
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
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x08
    path.write_bytes(bytes(raw))


def idempotent(pid: int, epoch: int, sequence: int, values: list[bytes]) -> bytes:
    now_ms = time.time_ns() // 1_000_000  # recent: retention by time must not delete them
    records = [Record(None, v, now_ms) for v in values]
    return build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence)


def own_state(client: LowLevelClient, address: str) -> int:
    """The state the broker at ``address`` reports for its own replica of the topic
    (UNSPECIFIED while it does not answer yet)."""
    try:
        md = client.stub(address).Metadata(
            pb.MetadataRequest(topics=[TOPIC]), timeout=RPC_TIMEOUT_S
        )
    except grpc.RpcError:
        return pb.REPLICA_STATE_UNSPECIFIED
    if not md.topics:
        return pb.REPLICA_STATE_UNSPECIFIED
    info = md.topics[0].partitions[0]
    mine = [rs.state for rs in info.replica_status if rs.broker_id == md.broker_id]
    return mine[0] if mine else pb.REPLICA_STATE_UNSPECIFIED


def write_producer_checkpoint(folder: Path) -> list[list[int]]:
    """Write the stopped replica's producer-state checkpoint with the real writer, as a
    running replica does every CHECKPOINT_EVERY_ENTRIES entries (more than this test
    writes); every entry in this log is committed (all were acknowledged). Its states."""
    with Log.open(folder) as log:
        tracking = ProducerTracking(folder, "check")
        tracking.catch_up(log, log.last_index)
        tracking.checkpoint()
    return tracking.states.to_json()


@pytest.mark.timeout(150)
def test_a_follower_with_every_derived_file_damaged_serves_the_same_bytes(
    cluster: LocalCluster,
) -> None:
    with cluster.client() as client:
        leader = client.refresh_leaders()[TOPIC, 0].broker_id
        victim = min(set(cluster.spec.brokers) - {leader})
        victim_address = address_of(cluster, victim)
        folder = cluster.data / f"broker-{victim}" / f"{TOPIC}-0"
        answer = client.stub(address_of(cluster, leader)).InitProducerId(
            pb.InitProducerIdRequest(), timeout=RPC_TIMEOUT_S
        )
        pid, epoch = answer.producer_id, answer.producer_epoch
        sent: list[bytes] = []
        batches: list[bytes] = []
        # Enough for closed segments (sealed, with index files) on the victim.
        for i in range(200):
            if len(list(folder.glob("*" + ".index"))) >= 2 and i >= 20:
                break
            values = [f"v-{i}-{k}-".encode() * 40 for k in range(4)]
            batches.append(idempotent(pid, epoch, len(sent), values))
            client.produce(TOPIC, 0, batches[-1])
            sent += values
            want = len(sent)
            wait_until(
                lambda want=want: _hw_or_none(client, victim_address, TOPIC) == want,
                10,
                f"broker {victim} to hold every record",
            )
        indexes = sorted(folder.glob("*.index"))
        assert len(indexes) >= 2, "the test needs sealed segments"

        cluster.stop(victim)
        states = write_producer_checkpoint(folder)
        assert states and states[0][0] == pid
        if checkpoints.read_start(folder) is None:
            # A log whose start never moved has no start checkpoint (it costs a new
            # replica fsyncs for nothing); one that moved has, and it may rot: write the
            # one it would hold, to damage it.
            checkpoints.write_start(folder, 1, 0, 0)
        damaged = {
            indexes[0]: 13,  # a slot's relative index
            indexes[1].with_suffix(".timeindex"): 2,  # a timestamp's high bytes
            folder / checkpoints.START_CHECKPOINT: 5,
            folder / CHECKPOINT_FILE: 10,
            cluster.data / f"broker-{victim}" / "metadata.cache": 40,
        }
        for path, position in damaged.items():
            assert path.exists(), path
            flip_bit(path, position)
        cluster.start(victim)

        wait_until(
            lambda: (
                own_state(client, victim_address) == pb.REPLICA_OK
                and _hw_or_none(client, victim_address, TOPIC) == len(sent)
            ),
            30,
            f"broker {victim} to report its replica REPLICA_OK with every record",
        )
        records, raw = read_all(client, TOPIC, 0, address=victim_address)
        for peer in set(cluster.spec.brokers) - {victim}:
            _, peer_raw = read_all(client, TOPIC, 0, address=address_of(cluster, peer))
            assert raw == peer_raw, f"broker {victim} and broker {peer} differ"
        assert [r.value for r in records] == sent

        # A read starting in the second segment loads its index (the first read loaded
        # the first segment's; later segments are read whole, without their index).
        second_base = int(indexes[1].stem.split("-")[0])
        tail, tail_raw = read_all(client, TOPIC, 0, address=victim_address, start=second_base)
        assert [r.value for r in tail] == sent[second_base:]
        _, leader_tail = read_all(
            client, TOPIC, 0, address=address_of(cluster, leader), start=second_base
        )
        assert tail_raw == leader_tail
        # The producer state was rebuilt whole: the victim wrote a fresh checkpoint in
        # place of the damaged one, and it plus the entries after it give the state the
        # damaged one held.
        wait_until(
            lambda: read_atomic(folder / CHECKPOINT_FILE) is not None,
            10,
            "the fresh producer-state checkpoint",
        )
        cluster.stop(victim)
        with Log.open(folder) as log:
            fresh = ProducerTracking(folder, "check")
            assert fresh.applied_index > 0
            fresh.open_at(log, log.last_index)
        assert fresh.states.to_json() == states
    text = cluster.log_path(victim).read_text()
    warned = [line for line in text.splitlines() if "WARNING" in line]
    names = [indexes[0].name, indexes[1].with_suffix(".timeindex").name]
    names += [checkpoints.START_CHECKPOINT, CHECKPOINT_FILE, "metadata.cache"]
    for name in names:
        assert any(name in line and ("rebuilt" in line or "ignored" in line) for line in warned), (
            name,
            warned[-20:],
        )
    assert "Traceback" not in text, text[-3000:]
