"""The partition side of transactions against real brokers (docs/transactions.md): raw
gRPC Produce of transactional batches, WriteTxnMarkers as the coordinator sends it, and
Fetch at both isolation levels, on the leader and on a follower. A COMMIT makes the
records visible to read_committed readers; an ABORT lists the transaction, so a reader
that applies the list drops its batches; the last stable offset holds at an open
transaction's first offset; a late batch of the ended epoch is fenced; a resent marker
appends nothing; and the open and aborted transactions are the same after a failover to
a follower and on a restarted broker."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.format.records import Record, build_batch, decode_records
from tests.broker.conftest import (
    SHARED_BROKER_ARGS,
    ClusterFactory,
    cluster_spec,
    module_cluster,
)
from tests.broker.test_broker_cluster import (
    RPC_TIMEOUT,
    address_of,
    assert_error,
    leader_of,
    rpc_error,
    wait_until,
)
from tests.partition.test_txn_replica import txn_batch, unowned_txn_batch

TOPICS = {"commit": 1, "abort": 1, "fence": 1, "refuse": 1}


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    with module_cluster(
        tmp_path_factory.mktemp("txn"), cluster_spec(TOPICS), SHARED_BROKER_ARGS, request
    ) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[LowLevelClient]:
    with cluster.client() as c:
        yield c


def plain(*values: bytes) -> bytes:
    return build_batch([Record(None, v, 1_700_000_000_000) for v in values])


def markers(client: LowLevelClient, address: str, *marks: tuple[str, int, int, bool]) -> list[str]:
    """Send (topic, producer id, epoch, commit) markers for partition 0 to ``address``;
    each marker's error code, "" when it is held."""
    answer = client.stub(address).WriteTxnMarkers(
        pb.WriteTxnMarkersRequest(
            markers=[
                pb.TxnMarker(topic=t, partition=0, producer_id=p, producer_epoch=e, commit=c)
                for t, p, e, c in marks
            ],
            timeout_ms=10_000,
        ),
        timeout=RPC_TIMEOUT,
    )
    assert [r.index for r in answer.results] == list(range(len(marks)))
    return [r.error.code for r in answer.results]


def fetch(
    client: LowLevelClient,
    address: str,
    topic: str,
    *,
    committed: bool,
    offset: int = 0,
    replica_read: bool = False,
) -> pb.FetchResponse:
    return client.stub(address).Fetch(
        pb.FetchRequest(
            topic=topic,
            partition=0,
            offset=offset,
            isolation_level=pb.READ_COMMITTED if committed else pb.READ_UNCOMMITTED,
            replica_read=replica_read,
        ),
        timeout=RPC_TIMEOUT,
    )


def visible(answer: pb.FetchResponse) -> list[bytes]:
    """What a read_committed reader keeps of a fetch: the records of DATA entries, minus
    each transactional entry of an aborted transaction (its producer's, from its first
    offset up to its marker)."""
    out: list[bytes] = []
    for h in entry.iter_headers(answer.entries):
        if h.type != entry.EntryType.DATA:
            continue
        if h.attributes & entry.TRANSACTIONAL and any(
            t.producer_id == h.producer_id and t.first_offset <= h.base_offset < t.last_offset
            for t in answer.aborted_transactions
        ):
            continue
        out += [r.value for r in decode_records(answer.entries, h) if r.value is not None]
    return out


def marker_entries(answer: pb.FetchResponse) -> int:
    return sum(h.type == entry.EntryType.TXN_MARKER for h in entry.iter_headers(answer.entries))


@pytest.mark.timeout(60)
def test_a_committed_transaction_becomes_visible_to_read_committed(
    cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader = address_of(cluster, leader_of(client, "commit"))
    client.produce("commit", 0, plain(b"before"))
    client.produce("commit", 0, txn_batch(500, 0, 0, b"t1", b"t2"))
    client.produce("commit", 0, plain(b"beside"))
    open_ = fetch(client, leader, "commit", committed=True)
    assert (open_.last_stable_offset, open_.high_watermark) == (1, 4)
    assert visible(open_) == [b"before"]  # stops at the open transaction's first offset
    assert visible(fetch(client, leader, "commit", committed=False)) == [
        b"before",
        b"t1",
        b"t2",
        b"beside",
    ]
    assert markers(client, leader, ("commit", 500, 1, True)) == [""]
    done = fetch(client, leader, "commit", committed=True)
    assert done.last_stable_offset == done.high_watermark == 4
    assert visible(done) == [b"before", b"t1", b"t2", b"beside"]
    assert list(done.aborted_transactions) == []


@pytest.mark.timeout(60)
def test_an_aborted_transaction_is_listed_and_dropped_on_the_leader_and_a_follower(
    cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader_id = leader_of(client, "abort")
    leader = address_of(cluster, leader_id)
    client.produce("abort", 0, txn_batch(600, 3, 0, b"gone1"))
    client.produce("abort", 0, plain(b"kept"))
    client.produce("abort", 0, txn_batch(600, 3, 1, b"gone2"))
    assert markers(client, leader, ("abort", 600, 4, False)) == [""]
    client.produce("abort", 0, plain(b"after"))
    for address, replica_read in [(leader, False)] + [
        (address_of(cluster, b), True) for b in cluster.spec.brokers if b != leader_id
    ]:
        wait_until(
            lambda a=address: fetch(client, a, "abort", committed=False).high_watermark == 4,
            10,
            f"{address} to hold the marker and the last record",
        )
        answer = fetch(client, address, "abort", committed=True, replica_read=replica_read)
        assert answer.last_stable_offset == 4
        assert [
            (t.producer_id, t.first_offset, t.last_offset) for t in answer.aborted_transactions
        ] == [(600, 0, 3)]
        assert visible(answer) == [b"kept", b"after"]
        uncommitted = fetch(client, address, "abort", committed=False, replica_read=replica_read)
        assert list(uncommitted.aborted_transactions) == []
        assert visible(uncommitted) == [b"gone1", b"kept", b"gone2", b"after"]
    # A fetch past the aborted range lists nothing.
    assert list(fetch(client, leader, "abort", committed=True, offset=3).aborted_transactions) == []


@pytest.mark.timeout(60)
def test_a_late_batch_is_fenced_and_a_resent_marker_appends_nothing(
    cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader = address_of(cluster, leader_of(client, "fence"))
    client.produce("fence", 0, txn_batch(700, 0, 0, b"a"))
    # The marker twice in one request and once more after: one marker entry.
    assert markers(client, leader, ("fence", 700, 1, True), ("fence", 700, 1, True)) == ["", ""]
    assert markers(client, leader, ("fence", 700, 1, True)) == [""]
    err = rpc_error(lambda: client.produce("fence", 0, txn_batch(700, 0, 1, b"late")))
    assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "PRODUCER_FENCED", "epoch 0 is fenced")
    client.produce("fence", 0, txn_batch(700, 1, 0, b"next"))  # the new epoch from 0
    client.produce("fence", 0, plain(b"end"))  # so the fetch reads past the marker
    answer = fetch(client, leader, "fence", committed=False)
    assert marker_entries(answer) == 1
    assert answer.last_stable_offset == 1  # epoch 1's transaction is open


@pytest.mark.timeout(60)
def test_bad_transactional_writes_and_misdirected_markers_are_refused(
    cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader_id = leader_of(client, "refuse")
    leader = address_of(cluster, leader_id)
    client.produce("refuse", 0, txn_batch(800, 0, 0, b"a"))
    idempotent = build_batch(
        [Record(None, b"i", 1_700_000_000_000)], producer_id=800, producer_epoch=0, base_sequence=1
    )
    err = rpc_error(lambda: client.produce("refuse", 0, idempotent))
    assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "INVALID_TXN_STATE", "transaction open")
    err = rpc_error(lambda: client.produce("refuse", 0, unowned_txn_batch()))
    assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_BATCH", "names no producer")
    follower = address_of(cluster, next(b for b in cluster.spec.brokers if b != leader_id))
    answer = client.stub(follower).WriteTxnMarkers(
        pb.WriteTxnMarkersRequest(
            markers=[
                pb.TxnMarker(topic="refuse", partition=0, producer_id=800, producer_epoch=1),
                pb.TxnMarker(topic="nope", partition=0, producer_id=800, producer_epoch=1),
            ]
        ),
        timeout=RPC_TIMEOUT,
    )
    not_leader, unknown = answer.results
    assert not_leader.error.code == "NOT_LEADER"
    assert not_leader.error.leader_address == leader
    assert unknown.error.code == "UNKNOWN_TOPIC"
    err = rpc_error(
        lambda: client.stub(leader).Fetch(
            pb.FetchRequest(topic="refuse", partition=0, isolation_level=7), timeout=RPC_TIMEOUT
        )
    )
    assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "isolation_level")
    assert fetch(client, leader, "refuse", committed=True).last_stable_offset == 0


def _txn_view(
    client: LowLevelClient, address: str, replica_read: bool
) -> tuple[int, list[tuple[int, int, int]]]:
    answer = fetch(client, address, "fo", committed=True, replica_read=replica_read)
    aborted = [(t.producer_id, t.first_offset, t.last_offset) for t in answer.aborted_transactions]
    return answer.last_stable_offset, aborted


@pytest.mark.timeout(120)
def test_open_and_aborted_transactions_survive_failover_and_restart(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"fo": 1})
    with cluster.client() as client:
        old_leader = leader_of(client, "fo")
        client.produce("fo", 0, txn_batch(900, 0, 0, b"aborted"))
        assert markers(client, address_of(cluster, old_leader), ("fo", 900, 1, False)) == [""]
        client.produce("fo", 0, plain(b"plain"))
        client.produce("fo", 0, txn_batch(901, 0, 0, b"open"))
        client.produce("fo", 0, plain(b"tail"))
        want = (2, [(900, 0, 1)])
        assert _txn_view(client, address_of(cluster, old_leader), False) == want
        cluster.kill(old_leader)
        new_leader = wait_until(
            lambda: (lead := _leader_or_none(client)) not in (None, old_leader) and lead,
            30,
            "a new leader",
        )
        assert isinstance(new_leader, int)
        new = address_of(cluster, new_leader)
        wait_until(lambda: _txn_view(client, new, False) == want, 10, "the new leader's view")
        # The new leader ends the open transaction; a late batch of it is fenced there.
        assert markers(client, new, ("fo", 901, 1, True)) == [""]
        assert _txn_view(client, new, False)[0] == 4
        err = rpc_error(lambda: client.produce("fo", 0, txn_batch(901, 0, 1, b"late")))
        assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "PRODUCER_FENCED")
        # The killed broker comes back and rebuilds the same state from its disk.
        cluster.start(old_leader)
        back = address_of(cluster, old_leader)
        wait_until(
            lambda: _view_or_none(client, back) == (4, [(900, 0, 1)]),
            30,
            "the restarted broker's view",
        )


def _leader_or_none(client: LowLevelClient) -> int | None:
    try:
        return leader_of(client, "fo")
    except (AssertionError, grpc.RpcError):
        return None


def _view_or_none(
    client: LowLevelClient, address: str
) -> tuple[int, list[tuple[int, int, int]]] | None:
    try:
        return _txn_view(client, address, True)
    except grpc.RpcError:
        return None


@pytest.mark.timeout(120)
def test_a_follower_that_takes_a_snapshot_takes_the_producer_state_with_it(
    make_cluster: ClusterFactory,
) -> None:
    """A follower saw a transaction open, then was down while the leader committed its
    marker and retention cut the log past it: it catches up from a snapshot, which
    carries the leader's producer state, so it does not keep the transaction open (its
    last stable offset stuck for ever at the transaction's first offset)."""
    cluster = make_cluster({}, extra_args=["--retention-check-ms", "200"])
    with cluster.admin() as admin:
        admin.create_topic("snap", 1, 3, {"segment.bytes": "4096", "retention.bytes": "16384"})
    with cluster.client() as client:
        wait_until(lambda: client.refresh_leaders(timeout=1.0).get(("snap", 0)), 30, "a leader")
        leader = leader_of(client, "snap")
        follower = next(b for b in (1, 2, 3) if b != leader)
        client.produce("snap", 0, txn_batch(950, 0, 0, b"txn"))
        wait_until(
            lambda: _lso_and_hw(client, address_of(cluster, follower), 0) == (0, 1),
            10,
            "the follower seeing the transaction open",
        )
        cluster.kill(follower)
        assert markers(client, address_of(cluster, leader), ("snap", 950, 1, True)) == [""]
        for _ in range(60):
            client.produce("snap", 0, plain(b"x" * 1000))
        wait_until(
            lambda: client.list_offsets("snap", 0, position=pb.EARLIEST).offset > 1,
            30,
            "retention cutting the log past the marker",
        )
        hw = client.list_offsets("snap", 0, position=pb.LATEST).high_watermark
        cluster.start(follower)
        back = address_of(cluster, follower)
        wait_until(
            lambda: _lso_and_hw_or_none(client, back, hw) == (hw, hw),
            30,
            "the follower's last stable offset reaching its high watermark",
        )


def _lso_and_hw(client: LowLevelClient, address: str, offset: int) -> tuple[int, int]:
    answer = fetch(client, address, "snap", committed=True, offset=offset)
    return answer.last_stable_offset, answer.high_watermark


def _lso_and_hw_or_none(
    client: LowLevelClient, address: str, offset: int
) -> tuple[int, int] | None:
    try:
        return _lso_and_hw(client, address, offset)
    except grpc.RpcError:
        return None
