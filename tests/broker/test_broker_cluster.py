"""Integration tests against real broker processes on 127.0.0.1: produce/fetch, failover after
SIGKILL, follower catch-up, whole-cluster restart, long polls, redirects, the error contract
for bad input, ListOffsets and the three acks levels.

Tests that kill brokers get their own cluster (``make_cluster``); the others share one
(``shared_cluster``) and each writes only to its own topic.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from raftmq.api.error_codes import PREFIX, ErrorCode
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.errors import ClientError, error_of
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.records import Record, build_batch, iter_records
from tests.broker.conftest import ClusterFactory

RPC_TIMEOUT = 10.0
MIB = 1 << 20

# --- helpers -------------------------------------------------------------------------------------


def batch(values: list[bytes], ts: int = 1_000) -> bytes:
    return build_batch([Record(None, v, ts + i) for i, v in enumerate(values)])


def wait_until(cond: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def wait_for_broker_state(
    admin: AdminClient, broker_id: int, state: apb.BrokerState.ValueType, timeout: float
) -> None:
    """Until the controller reports broker ``broker_id`` in ``state`` (ALIVE, FENCED...)."""
    wait_until(
        lambda: any(
            b.id == broker_id and b.state == state for b in admin.describe_cluster().brokers
        ),
        timeout,
        f"broker {broker_id} {apb.BrokerState.Name(state)}",
    )


@pytest.fixture
def client(shared_cluster: LocalCluster) -> Iterator[LowLevelClient]:
    with shared_cluster.client() as c:
        yield c


def address_of(cluster: LocalCluster, broker_id: int) -> str:
    return cluster.spec.brokers[broker_id].address


def leader_of(client: LowLevelClient, topic: str, partition: int = 0) -> int:
    leaders = client.refresh_leaders()
    assert (topic, partition) in leaders, f"no leader known for {topic}/{partition}"
    return leaders[topic, partition].broker_id


def offsets(
    client: LowLevelClient, address: str, topic: str, partition: int = 0
) -> tuple[int, int]:
    """(log start offset, high watermark) as the broker at ``address`` sees them."""
    r = client.stub(address).ListOffsets(
        pb.ListOffsetsRequest(topic=topic, partition=partition, position=pb.LATEST),
        timeout=RPC_TIMEOUT,
    )
    return r.log_start_offset, r.high_watermark


def high_watermark(client: LowLevelClient, address: str, topic: str, partition: int = 0) -> int:
    return offsets(client, address, topic, partition)[1]


def read_all(
    client: LowLevelClient,
    topic: str,
    partition: int = 0,
    *,
    address: str | None = None,
    start: int = 0,
    max_bytes: int = MIB,
) -> tuple[list[Record], bytes]:
    """Every committed record from ``start`` to the high watermark (of the replica at
    ``address``, or the leader), and the raw entries read."""
    records: list[Record] = []
    raw = bytearray()
    offset = start
    for _ in range(100_000):
        r = client.fetch(topic, partition, offset, max_bytes=max_bytes, address=address)
        if not r.entries:
            assert r.next_offset == offset
            assert offset == r.high_watermark, f"empty at {offset} below hw {r.high_watermark}"
            return records, bytes(raw)
        raw += r.entries
        got = list(iter_records(r.entries))
        records += got
        assert r.next_offset > offset, f"fetch at {offset} made no progress"
        assert r.next_offset <= r.high_watermark
        offset = r.next_offset
    raise AssertionError("read_all did not reach the high watermark")


def check_contiguous(records: list[Record], start: int = 0) -> None:
    assert [r.offset for r in records] == list(range(start, start + len(records))), (
        "offsets are not contiguous"
    )


def rpc_error(call: Callable[[], object]) -> ClientError:
    """The ClientError raised by ``call`` (a raw stub call or a client method)."""
    try:
        call()
    except grpc.RpcError as exc:
        return error_of(exc)
    except ClientError as exc:
        return exc
    raise AssertionError("the call succeeded; an error was expected")


def assert_error(err: ClientError, status: grpc.StatusCode, code: str, *words: str) -> None:
    """``code``: the raftmq-error name, which must be an ErrorCode's."""
    assert err.status == status, f"status {err.status}, want {status}: {err}"
    want = ErrorCode.Value(PREFIX + code)
    assert (err.code, err.code_name) == (want, code), (
        f"raftmq-error {err.label}, want {code}: {err}"
    )
    message = str(err)
    assert len(message) >= 15, f"message too terse: {message!r}"
    for w in words:
        assert w.lower() in message.lower(), f"{w!r} not in message {message!r}"


class DuplicateWrite(AssertionError):
    """An acknowledged record is in the log twice (known client bug, xfail below)."""


class OutsideErrorContract(AssertionError):
    """A broker answered with a status the API's error contract does not allow."""


# Tests that kill brokers come first: the shared cluster is started lazily by the first
# test that asks for it, so it does not compete for the CPU while brokers fail over.

# --- 2. leader kill ------------------------------------------------------------------------------


@dataclass
class ProducerLog:
    acked: list[tuple[int, list[bytes]]]
    unknown: list[tuple[list[bytes], ClientError]]


def produce_continuously(
    cluster: LocalCluster, topic: str, stop: threading.Event, log: ProducerLog
) -> None:
    with cluster.client() as c:
        i = 0
        while not stop.is_set():
            values = [f"b{i}-r{k}".encode() for k in range(3)]
            try:
                r = c.produce(topic, 0, batch(values, ts=10_000 + i), timeout_ms=5_000)
            except ClientError as exc:  # outcome unknown (timeout, no leader for a while)
                log.unknown.append((values, exc))
            else:
                assert r.last_offset - r.base_offset + 1 == len(values)
                log.acked.append((r.base_offset, values))
            i += 1


def wait_replicas_equal(
    cluster: LocalCluster, client: LowLevelClient, topic: str, at_least: int, timeout: float
) -> int:
    def converged() -> int:
        try:
            hws = {high_watermark(client, a, topic) for a in cluster.addresses}
        except grpc.RpcError:
            return 0
        (hw,) = hws if len(hws) == 1 else (0,)
        return hw if hw >= at_least else 0

    what = f"every replica of {topic}/0 at one hw >= {at_least}"
    return int(wait_until(converged, timeout, what))


def check_acked_on_every_replica(
    cluster: LocalCluster, client: LowLevelClient, topic: str, log: ProducerLog
) -> None:
    expected_end = max((b + len(v) for b, v in log.acked), default=0)
    hw = wait_replicas_equal(cluster, client, topic, expected_end, 20)
    allowed = {v for _, vs in log.acked for v in vs} | {v for vs, _ in log.unknown for v in vs}
    raws = {}
    for address in cluster.addresses:
        records, raws[address] = read_all(client, topic, 0, address=address)
        check_contiguous(records)
        assert len(records) == hw
        values = [r.value for r in records]
        for base, vs in log.acked:
            assert values[base : base + len(vs)] == vs, (
                f"{address}: acked batch at {base} is not there: {values[base : base + len(vs)]}"
            )
        dupes = {v for v in values if values.count(v) > 1}
        # The client raises (never retries) a produce whose connection broke mid-call, so
        # no batch can be written twice.
        assert not dupes, f"{address}: records present more than once: {sorted(dupes)[:10]}"
        stray = set(values) - allowed
        assert not stray, f"{address}: records nobody produced: {sorted(stray)[:10]}"
    assert len(set(raws.values())) == 1, "replicas hold different bytes"
    # One entry per fetch: the new leaders' NOOP entries (no offsets) must not stall a reader.
    paged, _ = read_all(client, topic, 0, max_bytes=1)
    assert paged == records


@pytest.mark.timeout(90)
def test_leader_kill_fails_over_and_keeps_every_acked_record(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"k": 1})
    log = ProducerLog([], [])
    stop = threading.Event()
    with cluster.client() as client:
        old = leader_of(client, "k")
        thread = threading.Thread(
            target=produce_continuously, args=(cluster, "k", stop, log), daemon=True
        )
        thread.start()
        try:
            wait_until(lambda: len(log.acked) >= 40, 20, "40 acked batches before the kill")
            cluster.kill(old)
            at_kill = len(log.acked)
            survivors = set(cluster.spec.brokers) - {old}
            leaders = cluster.wait_for_leaders(timeout=15, among=survivors)
            assert leaders["k", 0].broker_id in survivors
            wait_until(
                lambda: len(log.acked) >= at_kill + 40, 30, "40 acked batches after the kill"
            )
        finally:
            stop.set()
            thread.join(timeout=40)
        assert not thread.is_alive(), "the producer thread hung"
        assert len(log.acked) >= at_kill + 40
        cluster.start(old)
        cluster.wait_for_leaders(timeout=15)
        check_acked_on_every_replica(cluster, client, "k", log)


@pytest.mark.timeout(90)
def test_produce_in_flight_when_the_leader_dies_is_not_duplicated(
    make_cluster: ClusterFactory,
) -> None:
    # A 1 s election timeout: the leader keeps leading (no check-quorum step-down) while the
    # followers are frozen long enough for the produce to surely be in flight.
    cluster = make_cluster({"d": 1}, election_ticks=50)
    with cluster.client() as client, cluster.client() as producer:
        client.produce("d", 0, batch([b"before"]))
        leader = leader_of(client, "d")
        followers = sorted(set(cluster.spec.brokers) - {leader})
        producer.refresh_leaders()  # no Metadata to paused brokers once the produce is sent
        # Freeze the followers: the leader appends the batch and sends it to them (their
        # kernels buffer it) but cannot commit, so the produce stays in flight.
        for f in followers:
            cluster.signal(f, signal.SIGSTOP)
        outcome: list[object] = []

        def produce() -> None:
            try:
                outcome.append(producer.produce("d", 0, batch([b"once"]), timeout_ms=20_000))
            except ClientError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=produce, daemon=True)
        try:
            thread.start()
            time.sleep(0.3)  # the batch reaches the leader and its sockets to the followers
            cluster.kill(leader)
            time.sleep(0.2)
        finally:
            for f in followers:
                cluster.signal(f, signal.SIGCONT)
        thread.join(timeout=60)
        assert not thread.is_alive(), "the produce hung"
        cluster.wait_for_leaders(timeout=15, among=set(followers))
        (result,) = outcome
        acked_end = result.last_offset + 1 if isinstance(result, pb.ProduceResponse) else 1
        wait_until(
            lambda: (
                (_hw_or_none(client, address_of(cluster, leader_of(client, "d")), "d") or 0)
                >= acked_end
            ),
            10,
            "the new leader's high watermark to cover the acked write",
        )
        records, _ = read_all(client, "d", 0)
        values = [r.value for r in records]
        if isinstance(result, pb.ProduceResponse):
            assert values[result.base_offset] == b"once", "the acked record is not at its offset"
        if values.count(b"once") > 1:
            raise DuplicateWrite(f"written {values.count(b'once')} times: {values}, {result}")


@pytest.mark.timeout(60)
def test_produce_during_a_graceful_hand_over_gets_a_retryable_error(
    make_cluster: ClusterFactory,
) -> None:
    # A 1 s election timeout: the transfer, and so the window, lasts up to a second.
    cluster = make_cluster({"g": 1}, election_ticks=50)
    with cluster.client() as client:
        client.produce("g", 0, batch([b"before"]))
        leader = leader_of(client, "g")
        stub = client.stub(address_of(cluster, leader))
        followers = sorted(set(cluster.spec.brokers) - {leader})
        # Frozen followers cannot finish the hand-over, so the leader stays in its
        # transfer state for a while: produce requests land in that window.
        for f in followers:
            cluster.signal(f, signal.SIGSTOP)
        errors: list[ClientError] = []
        try:
            cluster.signal(leader, signal.SIGTERM)
            started = time.monotonic()
            while time.monotonic() - started < 0.6:
                request = pb.ProduceRequest(
                    topic="g", partition=0, entries=batch([b"during"]), timeout_ms=100
                )
                err = rpc_error(lambda r=request: stub.Produce(r, timeout=5))
                errors.append(err)
                time.sleep(0.02)
        finally:
            for f in followers:
                cluster.signal(f, signal.SIGCONT)
    assert errors
    for err in errors:
        if err.status != grpc.StatusCode.UNAVAILABLE and "raftmq-error" not in err.meta:
            raise OutsideErrorContract(f"{err.status}: {err}")


# --- 3. follower kill and catch-up ---------------------------------------------------------------


@pytest.mark.timeout(90)
def test_killed_follower_catches_up(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster({"f": 1})
    with cluster.client() as client:
        leader = leader_of(client, "f")
        follower = min(set(cluster.spec.brokers) - {leader})
        sent: list[bytes] = []
        for i in range(20):
            values = [f"before-{i}".encode()]
            client.produce("f", 0, batch(values))
            sent += values
        cluster.kill(follower)
        for i in range(100):
            values = [f"during-{i}-{k}".encode() for k in range(5)]
            r = client.produce("f", 0, batch(values), timeout_ms=10_000)
            assert r.base_offset == len(sent)
            sent += values
        cluster.start(follower)
        follower_address = address_of(cluster, follower)
        wait_until(
            lambda: _hw_or_none(client, follower_address, "f") == len(sent),
            20,
            "the restarted follower to reach the leader's high watermark",
        )
        # (Under CPU pressure an election may have moved the leadership meanwhile.)
        leader_address = address_of(cluster, leader_of(client, "f"))
        assert high_watermark(client, leader_address, "f") == len(sent)
        leader_records, leader_raw = read_all(client, "f", 0, address=leader_address)
        records, raw = read_all(client, "f", 0, address=follower_address)
        assert [r.value for r in leader_records] == sent
        check_contiguous(records)
        assert [r.value for r in records] == sent
        assert raw == leader_raw
        # Without a majority an acks=all write is never confirmed: TIMEOUT, or, once the
        # leader has noticed it lost its quorum, LEADER_NOT_AVAILABLE. Never an ack.
        leader = leader_of(client, "f")
        for bid in set(cluster.spec.brokers) - {leader}:
            cluster.kill(bid)
        request = pb.ProduceRequest(
            topic="f", partition=0, entries=batch([b"no-quorum"]), timeout_ms=200
        )
        err = rpc_error(
            lambda: client.stub(address_of(cluster, leader)).Produce(request, timeout=10)
        )
        assert (err.status, err.code_name) in {
            (grpc.StatusCode.DEADLINE_EXCEEDED, "TIMEOUT"),
            (grpc.StatusCode.UNAVAILABLE, "LEADER_NOT_AVAILABLE"),
            (grpc.StatusCode.FAILED_PRECONDITION, "NOT_LEADER"),
        }, err


def _hw_or_none(client: LowLevelClient, address: str, topic: str) -> int | None:
    try:
        return high_watermark(client, address, topic)
    except grpc.RpcError:
        return None


# --- 4. whole-cluster restart --------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_whole_cluster_sigkill_and_restart_loses_no_acked_record(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"w": 1})
    log = ProducerLog([], [])
    end = 0
    with cluster.client() as client:
        for i in range(40):
            values = [f"w{i}-{k}".encode() for k in range(i % 3 + 1)]
            r = client.produce("w", 0, batch(values))
            assert r.base_offset == end
            log.acked.append((r.base_offset, values))
            end += len(values)
    # Then SIGKILL all three while a producer is writing, and start them again.
    stop = threading.Event()
    thread = threading.Thread(
        target=produce_continuously, args=(cluster, "w", stop, log), daemon=True
    )
    thread.start()
    try:
        wait_until(lambda: len(log.acked) >= 60, 20, "20 acked batches from the producer")
        for bid in list(cluster.spec.brokers):
            cluster.kill(bid)
        at_kill = len(log.acked)
        cluster.start()
        cluster.wait_for_leaders(timeout=20)
        wait_until(lambda: len(log.acked) >= at_kill + 20, 30, "20 acked batches after restart")
    finally:
        stop.set()
        thread.join(timeout=40)
    assert not thread.is_alive(), "the producer thread hung"
    with cluster.client() as client:
        check_acked_on_every_replica(cluster, client, "w", log)
        hw = high_watermark(client, address_of(cluster, leader_of(client, "w")), "w")
        r = client.produce("w", 0, batch([b"after-restart"]))
        assert r.base_offset == hw, "offsets do not continue after the restart"


# --- 1. produce/fetch round trip -----------------------------------------------------------------


@pytest.mark.timeout(60)
def test_round_trip_acks_all_keeps_order_and_contiguous_offsets(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    sent: dict[int, list[bytes]] = {p: [] for p in range(3)}
    for i in range(40):
        for p in range(3):
            n = i % 5 + 1
            values = [f"p{p}-b{i}-r{k}-".encode() + b"x" * (i * 7 % 300) for k in range(n)]
            r = client.produce("rt", p, batch(values, ts=1_000 + i), acks=pb.ACKS_ALL)
            assert r.base_offset == len(sent[p]), f"partition {p}: batch {i} not contiguous"
            assert r.last_offset == r.base_offset + n - 1
            assert r.high_watermark >= r.last_offset + 1, "acks=all answered before commit"
            sent[p] += values
    for p in range(3):
        # Small pages so the read crosses many fetches; then once in one fetch.
        records, raw = read_all(client, "rt", p, max_bytes=2_000)
        check_contiguous(records)
        assert [r.value for r in records] == sent[p]
        assert all(r.key is None for r in records)
        whole = client.fetch("rt", p, 0, max_bytes=8 * MIB)
        assert whole.entries == raw
        assert whole.next_offset == whole.high_watermark == len(sent[p])
        # A fetch from the middle starts at the entry holding the offset.
        mid = client.fetch("rt", p, 7)
        head = next(entry.iter_headers(mid.entries))
        assert head.base_offset <= 7 < head.next_offset
        # max_bytes smaller than an entry: still one whole entry, and progress.
        tiny = client.fetch("rt", p, 7, max_bytes=1)
        (only,) = entry.iter_headers(tiny.entries)
        assert only == head and tiny.next_offset == head.next_offset
        # Every replica serves the same bytes once it has caught up.
        for address in shared_cluster.addresses:
            wait_until(
                lambda a=address, p=p: high_watermark(client, a, "rt", p) == len(sent[p]),
                10,
                f"replica {address} of rt/{p} to catch up",
            )
            _, replica_raw = read_all(client, "rt", p, address=address)
            assert replica_raw == raw, f"replica {address} of rt/{p} differs from the leader"
            answer = client.fetch("rt", p, 0, address=address)
            assert shared_cluster.spec.brokers[answer.broker_id].address == address


def test_leaders_settle_on_the_preferred_replicas(make_cluster: ClusterFactory) -> None:
    """Each partition's first replica campaigns as soon as it can reach a peer, and a leader
    that an election put elsewhere (the preferred broker started late, or came back after a
    crash) hands the partition back once that broker is in sync: leaders spread over the
    brokers instead of piling up where elections happened to fire first."""
    cluster = make_cluster({"spread": 6})  # hand-backs checked every 500 ms
    replicas = cluster.spec.topics["spread"].replicas
    preferred = {p: replicas[p][0] for p in range(6)}

    def leaders() -> dict[int, int]:
        with cluster.client() as c:
            found = c.refresh_leaders()
        return {p: found["spread", p].broker_id for p in range(6) if ("spread", p) in found}

    wait_until(lambda: leaders() == preferred, 15, "leaders on the preferred replicas")
    # Broker 1 crashes: its partitions move to brokers 2 and 3, and come back once it
    # has restarted and caught up.
    cluster.kill(1)
    wait_until(
        lambda: len(got := leaders()) == 6 and 1 not in got.values(), 15, "leaders without 1"
    )
    cluster.start(1)
    wait_until(lambda: leaders() == preferred, 20, "leaders back on the preferred replicas")


@pytest.mark.timeout(60)
def test_concurrent_producers_each_keep_their_order(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    acked: dict[int, list[tuple[int, bytes]]] = {t: [] for t in range(4)}
    failures: list[BaseException] = []

    def produce(t: int) -> None:
        try:
            with shared_cluster.client() as c:
                for i in range(30):
                    v = f"t{t}-{i}".encode()
                    r = c.produce("conc", 0, batch([v]), timeout_ms=10_000)
                    acked[t].append((r.base_offset, v))
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=produce, args=(t,), daemon=True) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=40)
    assert not any(th.is_alive() for th in threads), "a producer thread hung"
    assert not failures, failures
    records, _ = read_all(client, "conc", 0)
    check_contiguous(records)
    assert len(records) == 120
    by_offset = {r.offset: r.value for r in records}
    for t, acks in acked.items():
        assert [o for o, _ in acks] == sorted(o for o, _ in acks), f"thread {t} out of order"
        for o, v in acks:
            assert by_offset[o] == v


@pytest.mark.timeout(60)
def test_one_request_with_several_entries_and_an_entry_of_exactly_the_limit(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    r = client.produce("multi", 0, batch([b"a", b"b"]) + batch([b"c"]) + batch([b"d", b"e"]))
    assert (r.base_offset, r.last_offset, r.high_watermark) == (0, 4, 5)
    # An entry of exactly max.message.bytes (1 MiB, header included) is accepted.
    n = MIB - 200
    while len(batch([b"x" * n])) < MIB:
        n += 1
    exact = batch([b"x" * n])
    assert len(exact) == MIB
    r = client.produce("multi", 0, exact)
    assert (r.base_offset, r.last_offset) == (5, 5)
    err = rpc_error(lambda: client.produce("multi", 0, batch([b"x" * (n + 1)])))
    assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "BATCH_TOO_LARGE", str(MIB + 1))
    records, _ = read_all(client, "multi", 0)
    assert [x.value for x in records] == [b"a", b"b", b"c", b"d", b"e", b"x" * n]
    check_contiguous(records)


# --- 5. long polls -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_parked_fetch_wakes_up_soon_after_a_produce(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("poll", 0, batch([b"first"]))
    leader = address_of(shared_cluster, leader_of(client, "poll"))
    for round_ in range(3):
        end = high_watermark(client, leader, "poll")
        request = pb.FetchRequest(topic="poll", partition=0, offset=end, max_wait_ms=5_000)
        parked = client.stub(leader).Fetch.future(request, timeout=15)
        time.sleep(0.3)
        assert not parked.done(), "the long poll answered with no new data"
        client.produce("poll", 0, batch([f"wake-{round_}".encode()]))
        landed = time.monotonic()
        answer = parked.result(timeout=10)
        latency = time.monotonic() - landed
        assert latency < 1.0, f"parked fetch woke {latency * 1000:.0f} ms after the produce"
        assert [r.value for r in iter_records(answer.entries)] == [f"wake-{round_}".encode()]
        assert answer.next_offset == end + 1


@pytest.mark.timeout(60)
def test_parked_fetch_on_a_follower_wakes_up_too(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("poll", 0, batch([b"sync"]))
    leader_id = leader_of(client, "poll")
    follower = address_of(shared_cluster, min(set(shared_cluster.spec.brokers) - {leader_id}))
    hw = high_watermark(client, address_of(shared_cluster, leader_id), "poll")
    wait_until(lambda: high_watermark(client, follower, "poll") == hw, 10, "follower hw")
    request = pb.FetchRequest(topic="poll", partition=0, offset=hw, max_wait_ms=5_000)
    parked = client.stub(follower).Fetch.future(request, timeout=15)
    time.sleep(0.3)
    assert not parked.done()
    client.produce("poll", 0, batch([b"to-follower"]))
    landed = time.monotonic()
    answer = parked.result(timeout=10)
    latency = time.monotonic() - landed
    assert latency < 1.0, f"parked follower fetch woke {latency * 1000:.0f} ms after the produce"
    assert [r.value for r in iter_records(answer.entries)] == [b"to-follower"]


@pytest.mark.timeout(60)
def test_long_poll_waits_for_min_bytes(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("poll", 0, batch([b"start"]))
    leader = address_of(shared_cluster, leader_of(client, "poll"))
    end = high_watermark(client, leader, "poll")
    request = pb.FetchRequest(
        topic="poll", partition=0, offset=end, max_wait_ms=5_000, min_bytes=5_000
    )
    parked = client.stub(leader).Fetch.future(request, timeout=15)
    client.produce("poll", 0, batch([b"small"]))
    time.sleep(0.3)
    assert not parked.done(), "answered before min_bytes were there"
    client.produce("poll", 0, batch([b"y" * 6_000]))
    landed = time.monotonic()
    answer = parked.result(timeout=10)
    assert time.monotonic() - landed < 1.0
    assert [r.value for r in iter_records(answer.entries)] == [b"small", b"y" * 6_000]
    assert answer.next_offset == end + 2


@pytest.mark.timeout(60)
def test_long_poll_with_nothing_new_returns_empty_after_max_wait(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("poll", 0, batch([b"x"]))
    leader = address_of(shared_cluster, leader_of(client, "poll"))
    end = high_watermark(client, leader, "poll")
    started = time.monotonic()
    r = client.fetch("poll", 0, end, max_wait_ms=300, address=leader)
    elapsed = time.monotonic() - started
    assert r.entries == b""
    assert r.next_offset == end
    assert r.high_watermark == end
    assert 0.28 <= elapsed < 1.0, f"empty long poll took {elapsed * 1000:.0f} ms, want ~300"
    # max_wait_ms=0 answers at once.
    started = time.monotonic()
    r = client.fetch("poll", 0, end, max_wait_ms=0, address=leader)
    assert r.entries == b"" and time.monotonic() - started < 0.5


# --- 6. NOT_LEADER redirect ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_produce_to_a_follower_is_refused_with_the_leaders_address(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader_id = leader_of(client, "redirect")
    leader = address_of(shared_cluster, leader_id)
    before = high_watermark(client, leader, "redirect")
    for follower_id in sorted(set(shared_cluster.spec.brokers) - {leader_id}):
        follower = address_of(shared_cluster, follower_id)
        for acks in (pb.ACKS_ALL, pb.ACKS_LEADER, pb.ACKS_NONE):
            err = rpc_error(_produce(client, follower, topic="redirect", partition=0, acks=acks))
            assert_error(err, grpc.StatusCode.FAILED_PRECONDITION, "NOT_LEADER", "leader")
            assert err.meta.get("raftmq-leader-address") == leader
            assert err.meta.get("raftmq-leader-id") == str(leader_id)
            assert f"broker {leader_id}" in str(err)
    assert high_watermark(client, leader, "redirect") == before
    # Following the hint works.
    r = client.stub(leader).Produce(
        pb.ProduceRequest(topic="redirect", partition=0, entries=batch([b"yes"])),
        timeout=RPC_TIMEOUT,
    )
    assert r.base_offset == before


# --- 7. bad input --------------------------------------------------------------------------------


def corrupt(entry_bytes: bytes) -> bytes:
    """Flip one payload bit: the header stays well-formed, the CRC no longer matches."""
    out = bytearray(entry_bytes)
    out[-1] ^= 0x01
    return bytes(out)


BAD_PRODUCE: dict[str, tuple[Callable[[], bytes], grpc.StatusCode, str, tuple[str, ...]]] = {
    "oversized": (
        lambda: batch([b"z" * (MIB + 10)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "BATCH_TOO_LARGE",
        ("max.message.bytes",),
    ),
    "bad-crc": (
        lambda: corrupt(batch([b"good value"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "CORRUPT_BATCH",
        ("crc",),
    ),
    "good-then-bad-crc": (
        lambda: batch([b"ok"]) + corrupt(batch([b"not ok"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "CORRUPT_BATCH",
        ("crc",),
    ),
    "empty": (lambda: b"", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_BATCH", ("no entries",)),
    "noop-entry": (
        lambda: entry.encode(b"", type=EntryType.NOOP),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_BATCH",
        ("NOOP",),
    ),
    "good-then-noop": (
        lambda: batch([b"ok"]) + entry.encode(b"", type=EntryType.NOOP),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_BATCH",
        ("NOOP",),
    ),
    "truncated": (
        lambda: batch([b"cut short"])[:-3],
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_BATCH",
        ("malformed",),
    ),
    "too-many-entries": (
        lambda: batch([b"v"]) * 10_001,
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_BATCH",
        ("10000 entries",),
    ),
    "garbage": (
        lambda: b"\x00" * 10,
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_BATCH",
        ("malformed",),
    ),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("acks", [pb.ACKS_ALL, pb.ACKS_NONE], ids=["acks_all", "acks_none"])
@pytest.mark.parametrize("case", list(BAD_PRODUCE))
def test_bad_batch_is_refused_and_nothing_is_appended(
    shared_cluster: LocalCluster, client: LowLevelClient, case: str, acks: int
) -> None:
    """Even with acks=0 a batch is validated before the answer, and refused whole."""
    make, status, code, words = BAD_PRODUCE[case]
    leader = address_of(shared_cluster, leader_of(client, "bad"))
    _, before = offsets(client, leader, "bad")
    request = pb.ProduceRequest(topic="bad", partition=0, entries=make(), acks=acks)
    err = rpc_error(lambda: client.stub(leader).Produce(request, timeout=RPC_TIMEOUT))
    assert_error(err, status, code, *words)
    # Nothing was appended, not even uncommitted: the next good batch takes the old end.
    assert offsets(client, leader, "bad")[1] == before
    r = client.produce("bad", 0, batch([f"after-{case}".encode()]))
    assert r.base_offset == before, f"{case}: the log end moved from {before} to {r.base_offset}"
    records, _ = read_all(client, "bad", 0, start=before)
    assert [x.value for x in records] == [f"after-{case}".encode()]


def _produce(client: LowLevelClient, address: str, **fields: object) -> Callable[[], object]:
    fields.setdefault("entries", batch([b"v"]))
    request = pb.ProduceRequest(**fields)  # type: ignore[arg-type]
    return lambda: client.stub(address).Produce(request, timeout=RPC_TIMEOUT)


def _fetch(client: LowLevelClient, address: str, **fields: object) -> Callable[[], object]:
    request = pb.FetchRequest(**fields)  # type: ignore[arg-type]
    return lambda: client.stub(address).Fetch(request, timeout=RPC_TIMEOUT)


def _list(client: LowLevelClient, address: str, **fields: object) -> Callable[[], object]:
    request = pb.ListOffsetsRequest(**fields)  # type: ignore[arg-type]
    return lambda: client.stub(address).ListOffsets(request, timeout=RPC_TIMEOUT)


@pytest.mark.timeout(60)
def test_unknown_topic_partition_and_invalid_names(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader = address_of(shared_cluster, leader_of(client, "bad"))
    _, before = offsets(client, leader, "bad")
    for call in (_produce, _fetch, _list):
        err = rpc_error(call(client, leader, topic="no-such-topic", partition=0))
        assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC", "no-such-topic")
        err = rpc_error(call(client, leader, topic="bad", partition=7))
        assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_PARTITION", "partition 7")
        for name in ("bad topic!", "", "x" * 201, "a/b"):
            err = rpc_error(call(client, leader, topic=name, partition=0))
            assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "topic name")
    err = rpc_error(
        lambda: client.stub(leader).Metadata(
            pb.MetadataRequest(topics=["no-such-topic"]), timeout=RPC_TIMEOUT
        )
    )
    assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC", "no-such-topic")
    assert offsets(client, leader, "bad")[1] == before


@pytest.mark.timeout(60)
def test_bad_fields_are_invalid_arguments(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader = address_of(shared_cluster, leader_of(client, "bad"))
    _, before = offsets(client, leader, "bad")
    cases: list[tuple[Callable[[], object], str]] = [
        (_fetch(client, leader, topic="bad", partition=0, offset=-1), "negative"),
        (_fetch(client, leader, topic="bad", partition=0, offset=-(1 << 62)), "negative"),
        (_fetch(client, leader, topic="bad", partition=0, max_bytes=(64 << 20) + 1), "max_bytes"),
        (_fetch(client, leader, topic="bad", partition=0, max_wait_ms=60_001), "max_wait_ms"),
        (_produce(client, leader, topic="bad", partition=0, timeout_ms=300_001), "timeout_ms"),
        (_produce(client, leader, topic="bad", partition=0, acks=7), "acks"),
    ]
    for call, word in cases:
        err = rpc_error(call)
        assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", word)
    assert offsets(client, leader, "bad")[1] == before
    r = client.produce("bad", 0, batch([b"after-bad-fields"]))
    assert r.base_offset == before


@pytest.mark.timeout(60)
def test_fetch_out_of_range_names_the_valid_range(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("bad", 0, batch([b"a", b"b"]))
    leader = address_of(shared_cluster, leader_of(client, "bad"))
    start, hw = offsets(client, leader, "bad")
    for offset in (hw + 1, hw + 1000, 1 << 62):
        err = rpc_error(_fetch(client, leader, topic="bad", partition=0, offset=offset))
        assert_error(err, grpc.StatusCode.OUT_OF_RANGE, "OFFSET_OUT_OF_RANGE", str(offset))
        assert err.meta.get("raftmq-log-start-offset") == str(start)
        assert err.meta.get("raftmq-high-watermark") == str(hw)
        assert str(hw) in str(err)
    # The high watermark itself is in range: an empty answer, not an error.
    r = client.fetch("bad", 0, hw, address=leader)
    assert r.entries == b"" and r.next_offset == hw


@pytest.mark.timeout(60)
def test_fetch_from_a_broker_without_a_replica_is_not_hosted(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    spec = shared_cluster.spec.topics["solo"]
    for p, replicas in enumerate(spec.replicas):
        (owner,) = replicas
        r = client.produce("solo", p, batch([f"solo-{p}".encode()]))
        assert r.base_offset >= 0
        for bid in sorted(set(shared_cluster.spec.brokers) - {owner}):
            address = address_of(shared_cluster, bid)
            err = rpc_error(_fetch(client, address, topic="solo", partition=p, offset=0))
            assert_error(err, grpc.StatusCode.NOT_FOUND, "NOT_HOSTED", "no replica", f"solo/{p}")
            assert str(owner) in str(err), "the message should name the brokers that host it"
            err = rpc_error(_produce(client, address, topic="solo", partition=p))
            assert_error(err, grpc.StatusCode.NOT_FOUND, "NOT_HOSTED", "no replica", f"solo/{p}")
        records, _ = read_all(client, "solo", p, address=address_of(shared_cluster, owner))
        assert [x.value for x in records][-1] == f"solo-{p}".encode()


@pytest.mark.timeout(60)
def test_metadata_describes_brokers_topics_replicas_and_leaders(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    spec = shared_cluster.spec
    leaders = client.refresh_leaders()
    assert set(leaders) == {(t, p) for t, ts in spec.topics.items() for p in range(ts.partitions)}
    for bid in spec.brokers:
        md = client.stub(address_of(shared_cluster, bid)).Metadata(
            pb.MetadataRequest(), timeout=RPC_TIMEOUT
        )
        assert md.broker_id == bid
        assert md.cluster == spec.name
        assert {b.id: f"{b.host}:{b.port}" for b in md.brokers} == {
            b.id: b.address for b in spec.brokers.values()
        }
        assert sorted(t.name for t in md.topics) == sorted(spec.topics)
        for t in md.topics:
            count = spec.topics[t.name].partitions
            assert [p.partition for p in t.partitions] == list(range(count))
            for p in t.partitions:
                replicas = spec.topics[t.name].replicas[p.partition]
                assert tuple(p.replicas) == replicas
                if bid in replicas:
                    assert p.leader_id in replicas and p.leader_term > 0
                    assert p.high_watermark >= 0
                else:
                    assert p.high_watermark == -1, "a broker without a replica reports no hw"
    only = client.metadata(["solo"])
    assert [t.name for t in only.topics] == ["solo"]


# --- 8. ListOffsets ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_list_offsets_earliest_latest_and_by_timestamp(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader = address_of(shared_cluster, leader_of(client, "lo"))

    def list_offsets(address: str = leader, **spec: int) -> pb.ListOffsetsResponse:
        return client.stub(address).ListOffsets(
            pb.ListOffsetsRequest(topic="lo", partition=0, **spec), timeout=RPC_TIMEOUT
        )

    empty = list_offsets(position=pb.LATEST)
    assert (empty.offset, empty.log_start_offset, empty.high_watermark) == (0, 0, 0)
    assert list_offsets(position=pb.EARLIEST).offset == 0
    assert list_offsets(timestamp_ms=0).offset == 0
    # Entries with timestamps [1000, 1001], [2000, 2001], [3000, 3001] at offsets 0, 2, 4.
    for i in range(3):
        r = client.produce("lo", 0, batch([b"a", b"b"], ts=(i + 1) * 1000))
        assert r.base_offset == 2 * i
    assert list_offsets(position=pb.EARLIEST).offset == 0
    latest = list_offsets(position=pb.LATEST)
    assert (latest.offset, latest.high_watermark, latest.log_start_offset) == (6, 6, 0)
    expected = {0: 0, 999: 0, 1000: 0, 1001: 0, 1002: 2, 1500: 2, 2001: 2, 2500: 4, 3001: 4}
    for ts, offset in expected.items():
        assert list_offsets(timestamp_ms=ts).offset == offset, f"timestamp {ts}"
    assert list_offsets(timestamp_ms=3002).offset == 6, "past the last timestamp: the hw"
    assert list_offsets(timestamp_ms=1 << 60).offset == 6
    # A follower answers the same once caught up.
    for address in shared_cluster.addresses:
        wait_until(lambda a=address: list_offsets(a, position=pb.LATEST).offset == 6, 10, "hw")
        assert list_offsets(address, timestamp_ms=1500).offset == 2
        assert list_offsets(address, position=pb.EARLIEST).offset == 0


# --- 9. acks=1 and acks=0 ------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_acks_leader_and_acks_none(shared_cluster: LocalCluster, client: LowLevelClient) -> None:
    r = client.produce("acks", 0, batch([b"all"]), acks=pb.ACKS_ALL)
    assert (r.base_offset, r.last_offset) == (0, 0)
    r = client.produce("acks", 0, batch([b"leader-1", b"leader-2"]), acks=pb.ACKS_LEADER)
    assert (r.base_offset, r.last_offset) == (1, 2)
    r = client.produce("acks", 0, batch([b"none-1", b"none-2", b"none-3"]), acks=pb.ACKS_NONE)
    assert (r.base_offset, r.last_offset) == (-1, -1)
    # The data shows up: long-poll until all six records are committed.
    got: list[Record] = []
    deadline = time.monotonic() + 10
    while len(got) < 6 and time.monotonic() < deadline:
        f = client.fetch("acks", 0, len(got), max_wait_ms=1_000)
        got += list(iter_records(f.entries))
    assert [x.value for x in got] == [
        b"all",
        b"leader-1",
        b"leader-2",
        b"none-1",
        b"none-2",
        b"none-3",
    ]
    check_contiguous(got)
    # And the next acknowledged write continues after them.
    r = client.produce("acks", 0, batch([b"after"]), acks=pb.ACKS_ALL)
    assert r.base_offset == 6


# --- 9. ProduceStream ----------------------------------------------------------------------------


def _stream(
    address: str, requests: list[pb.ProduceRequest], bunches: tuple[int, ...] = (1, 7)
) -> list[pb.ProduceResponse]:
    """Send every request on one ProduceStream, in messages of ``bunches`` requests then
    one with the rest, and an empty message (all written before any answer is read, so
    they are in flight together); return the answers as they came."""
    messages = []
    rest = list(requests)
    for n in bunches:
        messages.append(pb.ProduceStreamRequest(requests=rest[:n]))
        rest = rest[n:]
    messages += [pb.ProduceStreamRequest(requests=rest), pb.ProduceStreamRequest()]
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            "/raftmq.v1.Broker/ProduceStream",
            request_serializer=pb.ProduceStreamRequest.SerializeToString,
            response_deserializer=pb.ProduceStreamResponse.FromString,
        )
        return [a for message in call(iter(messages), timeout=30) for a in message.responses]


def test_produce_stream_answers_every_request_by_id(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    """Sixty requests in flight on one stream per leader, most of them several to a
    message: one answer each, matched by id; the answers' offset ranges tile each
    partition, and the log holds each request's records exactly at its range."""
    leaders = client.refresh_leaders()
    by_leader: dict[str, list[int]] = {}
    for p in range(2):
        by_leader.setdefault(leaders["stream", p].address, []).append(p)
    placed: dict[int, list[tuple[int, list[bytes]]]] = {0: [], 1: []}
    for address, parts in by_leader.items():
        requests = {}
        for i in range(60):
            p = parts[i % len(parts)]
            values = [f"s{p}-{i}-{k}".encode() for k in range(i % 3 + 1)]
            requests[1000 + i] = (p, values)
        answers = _stream(
            address,
            [
                pb.ProduceRequest(topic="stream", partition=p, entries=batch(v), request_id=rid)
                for rid, (p, v) in requests.items()
            ],
        )
        assert sorted(a.request_id for a in answers) == sorted(requests)
        assert not any(a.HasField("error") for a in answers)
        for a in answers:
            p, values = requests[a.request_id]
            assert a.last_offset - a.base_offset + 1 == len(values)
            placed[p].append((a.base_offset, values))
    for p in range(2):
        placed[p].sort()
        expect = 0
        for base, values in placed[p]:
            assert base == expect, f"stream/{p}: a gap or overlap at offset {expect}"
            expect += len(values)
        records, _ = read_all(client, "stream", p)
        assert [r.value for r in records] == [v for _, vs in placed[p] for v in vs]


def test_produce_stream_refuses_one_request_and_goes_on(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader_id = leader_of(client, "stream", 0)
    leader = address_of(shared_cluster, leader_id)
    follower = address_of(shared_cluster, min(set(shared_cluster.spec.brokers) - {leader_id}))
    good = batch([b"good"])
    answers = _stream(
        leader,
        [
            pb.ProduceRequest(topic="nope", partition=0, entries=good, request_id=1),
            pb.ProduceRequest(topic="stream", partition=0, entries=corrupt(good), request_id=2),
            pb.ProduceRequest(topic="stream", partition=9, entries=good, request_id=3),
            pb.ProduceRequest(topic="stream", partition=0, entries=b"", request_id=4),
            pb.ProduceRequest(topic="stream", partition=0, entries=good, request_id=5),
        ],
    )
    by_id = {a.request_id: a for a in answers}
    assert sorted(by_id) == [1, 2, 3, 4, 5]
    assert by_id[1].error.code == "UNKNOWN_TOPIC" and "does not exist" in by_id[1].error.message
    assert by_id[2].error.code == "CORRUPT_BATCH" and "CRC" in by_id[2].error.message
    assert by_id[3].error.code == "UNKNOWN_PARTITION"
    assert by_id[4].error.code == "INVALID_BATCH"
    assert not by_id[5].HasField("error") and by_id[5].last_offset >= by_id[5].base_offset >= 0
    for refused in (1, 2, 3, 4):
        assert (by_id[refused].base_offset, by_id[refused].last_offset) == (-1, -1)
    # A follower answers each request with the leader to go to.
    (redirect,) = _stream(
        follower, [pb.ProduceRequest(topic="stream", partition=0, entries=good, request_id=7)]
    )
    assert redirect.request_id == 7 and redirect.error.code == "NOT_LEADER"
    assert redirect.error.leader_id == leader_id
    assert redirect.error.leader_address == leader
