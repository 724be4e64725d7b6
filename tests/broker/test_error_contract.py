"""The error contract against real brokers: whatever a client sends, the answer is a
documented status with a ``raftmq-error`` code and a sentence, never UNKNOWN, and the
broker's log holds no traceback for it. Also a corrupt stored entry (DATA_LOSS, and the
broker keeps serving the rest), and the unit checks of the table itself.

Topics come from the shared cluster (a fresh one for this module); each test uses its own.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftmq.api.error_codes import PREFIX, RULES, ErrorCode, code_of, name_of
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.broker.refusals import Refusal
from raftmq.client.errors import ClientError, error_of
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.partition import errors as partition_errors
from tests.broker.conftest import LEADER_TIMEOUT, REBALANCE_ARGS, cluster_spec, log_tails
from tests.broker.test_broker_cluster import (
    RPC_TIMEOUT,
    _stream,
    address_of,
    assert_error,
    batch,
    leader_of,
    offsets,
    read_all,
    rpc_error,
    wait_until,
)

PROTO = Path(__file__).resolve().parents[2] / "raftmq" / "api" / "v1" / "broker.proto"
ECHO_LIMIT = 1000
"""No message of these tests may be longer: long client strings are echoed shortened."""


@pytest.fixture
def client(shared_cluster: LocalCluster) -> Iterator[LowLevelClient]:
    with shared_cluster.client() as c:
        yield c


class BrokerLogs:
    """What the brokers of a cluster log from now on: client mistakes must leave no
    traceback and nothing at ERROR."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.marks = {
            bid: cluster.log_path(bid).stat().st_size if cluster.log_path(bid).exists() else 0
            for bid in cluster.spec.brokers
        }

    def new(self) -> str:
        out = []
        for bid, mark in self.marks.items():
            with open(self.cluster.log_path(bid), "rb") as f:
                f.seek(mark)
                out.append(f.read().decode(errors="replace"))
        return "".join(out)

    def assert_quiet(self, settle_s: float = 0.3) -> str:
        time.sleep(settle_s)  # let the broker write what it would write about it
        text = self.new()
        assert "Traceback" not in text, f"a traceback in the broker log:\n{text}"
        bad = [line for line in text.splitlines() if re.search(r" (ERROR|CRITICAL) ", line)]
        assert not bad, "ERROR lines in the broker log:\n" + "\n".join(bad)
        return text


def at_leader(
    cluster: LocalCluster, client: LowLevelClient, topic: str, partition: int = 0
) -> tuple[str, pb_grpc.BrokerStub, BrokerLogs]:
    """The address and a stub of the partition's leader, and a watch on the brokers' logs."""
    leader = address_of(cluster, leader_of(client, topic, partition))
    return leader, client.stub(leader), BrokerLogs(cluster)


def raw_call(address: str, method: str, data: bytes) -> grpc.RpcError:
    """Call ``method`` with ``data`` as the request bytes, whatever they are."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/raftmq.v1.Broker/{method}")  # identity (de)serializers
        try:
            call(data, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            return exc
    raise AssertionError(f"{method} accepted {data!r}")


def assert_short(err: object) -> None:
    assert len(str(err)) < ECHO_LIMIT, f"message of {len(str(err))} chars: {str(err)[:200]}..."


# --- the table ------------------------------------------------------------------------------


def documented_codes() -> dict[str, str]:
    """Each value of broker.proto's ``enum ErrorCode`` -> the comment just above it."""
    found = re.search(r"\nenum ErrorCode \{\n(.*?)\n\}", PROTO.read_text(), re.S)
    assert found, "broker.proto has no enum ErrorCode"
    comments: list[str] = []
    documented: dict[str, str] = {}
    for line in found.group(1).splitlines():
        text = line.strip()
        if text.startswith("//"):
            comments.append(text.removeprefix("//").strip())
        elif value := re.fullmatch(r"(ERROR_CODE_\w+) = \d+;", text):
            documented[value.group(1)] = " ".join(comments)
            comments = []
    return documented


def test_every_error_code_has_a_rule_and_its_comment_states_it() -> None:
    """The enum, the table (RULES) and the proto's documentation of each code cannot drift:
    a code added without a rule, or a rule changed without its comment, fails here."""
    documented = documented_codes()
    assert set(documented) == set(ErrorCode.keys())
    assert set(RULES) == set(ErrorCode.values()) - {ErrorCode.ERROR_CODE_UNSPECIFIED}
    for code, rule in RULES.items():
        name = ErrorCode.Name(code)
        said = f"{rule.status.name}, {'retriable' if rule.retriable else 'not retriable'}. "
        assert documented[name].startswith(said), (
            f"broker.proto's comment on {name} should start {said!r}: {documented[name]!r}"
        )
        assert len(documented[name]) > len(said) + 20, f"{name}: say what a client does"
        assert code_of(name_of(code)) == code and not name_of(code).startswith(PREFIX)
    assert grpc.StatusCode.UNKNOWN not in {rule.status for rule in RULES.values()}
    assert RULES[ErrorCode.ERROR_CODE_CORRUPT_DATA].status == grpc.StatusCode.DATA_LOSS


def test_every_code_a_partition_raises_is_an_error_code() -> None:
    """The partition floor names its codes as strings (it is below the API): each must be
    an ErrorCode's wire name with a rule."""
    classes = [
        cls
        for cls in vars(partition_errors).values()
        if isinstance(cls, type) and issubclass(cls, partition_errors.PartitionError)
    ]
    assert len(classes) >= 10
    for cls in classes:
        assert code_of(cls.code) in RULES, f"{cls.__name__}.code {cls.code!r} is no ErrorCode"


def test_the_trailer_and_the_stream_carry_the_name_without_prefix() -> None:
    refusal = Refusal(ErrorCode.ERROR_CODE_NOT_LEADER, "not the leader", leader_id=2)
    assert refusal.status == grpc.StatusCode.FAILED_PRECONDITION
    assert refusal.trailers() == (("raftmq-error", "NOT_LEADER"), ("raftmq-leader-id", "2"))
    assert refusal.to_pb().code == "NOT_LEADER"
    with pytest.raises(AssertionError):
        Refusal(ErrorCode.ERROR_CODE_UNSPECIFIED, "never sent")


class _Context:
    """The part of grpc.aio.ServicerContext the wrappers use: abort raises, as gRPC's does."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str, tuple] | None = None

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple) -> None:
        self.aborted = (code, details, trailing_metadata)
        raise grpc.aio.AbortError()

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    def invocation_metadata(self) -> tuple:
        return ()

    def auth_context(self) -> dict:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"


async def test_a_bug_is_internal_with_one_logged_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No client input reaches this (so no broker-level test can): a handler that raises
    something unexpected answers INTERNAL with the INTERNAL code, and logs it once."""
    from raftmq.broker.rpc import unary

    async def buggy(request: object, context: object) -> pb.MetadataResponse:
        raise KeyError("oops")

    context = _Context()
    with caplog.at_level(logging.INFO), pytest.raises(grpc.aio.AbortError):
        await unary("Metadata", buggy)(pb.MetadataRequest(), context)  # type: ignore[arg-type]
    assert context.aborted is not None
    status, details, trailers = context.aborted
    assert status == grpc.StatusCode.INTERNAL
    assert ("raftmq-error", "INTERNAL") in trailers
    assert "bug" in details and "KeyError" in details
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(logged) == 1 and logged[0].exc_info is not None


# --- malformed requests ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_malformed_request_bytes_are_refused_not_internal(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader, _, logs = at_leader(shared_cluster, client, "bad")
    bad_utf8_topic = b"\x0a\x02\xff\xfe"  # field 1 (topic): two bytes that are not UTF-8
    for method in ("Produce", "Fetch", "ListOffsets", "Metadata"):
        for data in (b"\xff\xff\xff", bad_utf8_topic, b"\x0a\x05ab"):
            err = error_of(raw_call(leader, method, data))
            assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST", "protobuf")
    logs.assert_quiet()


@pytest.mark.timeout(60)
def test_a_malformed_stream_message_ends_the_stream_with_a_code(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader, _, logs = at_leader(shared_cluster, client, "stream", 0)
    good = pb.ProduceStreamRequest(
        requests=[pb.ProduceRequest(topic="stream", partition=0, entries=batch([b"m"]))]
    ).SerializeToString()
    with grpc.insecure_channel(leader) as channel:
        call = channel.stream_stream("/raftmq.v1.Broker/ProduceStream")
        answers: list[pb.ProduceStreamResponse] = []
        with pytest.raises(grpc.RpcError) as caught:
            for raw in call(iter([good, b"\xff\xff\xff"]), timeout=RPC_TIMEOUT):
                answers.append(pb.ProduceStreamResponse.FromString(raw))
    err = error_of(caught.value)
    assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST", "protobuf")
    # The request before the bad message was answered before the stream ended.
    assert [a.HasField("error") for m in answers for a in m.responses] == [False]
    logs.assert_quiet()


# --- names ----------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_names_need_a_true_end_anchor_and_are_echoed_short(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    _, stub, logs = at_leader(shared_cluster, client, "bad")
    huge = "x" * (1 << 20)
    for name in ("bad\n", "bad\n\n", "\nbad", huge + "!"):
        for call in (
            lambda n=name: stub.Fetch(pb.FetchRequest(topic=n), timeout=RPC_TIMEOUT),
            lambda n=name: stub.Produce(
                pb.ProduceRequest(topic=n, entries=batch([b"v"])), timeout=RPC_TIMEOUT
            ),
            lambda n=name: stub.ListOffsets(
                pb.ListOffsetsRequest(topic=n, position=pb.LATEST), timeout=RPC_TIMEOUT
            ),
        ):
            err = rpc_error(call)
            assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "topic name")
            assert_short(err)
    err = rpc_error(lambda: stub.Fetch(pb.FetchRequest(topic="y" * 200), timeout=RPC_TIMEOUT))
    assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC", "200 chars")
    assert_short(err)
    # Metadata for many long unknown names: one short answer, not a 20 kB message.
    names = [f"{i:03}-" + "z" * 196 for i in range(100)]
    err = rpc_error(lambda: stub.Metadata(pb.MetadataRequest(topics=names), timeout=RPC_TIMEOUT))
    assert_error(err, grpc.StatusCode.NOT_FOUND, "UNKNOWN_TOPIC", "95 more", "200 chars")
    assert_short(err)
    for topics in ([huge], ["bad\n"], ["bad", "ok", "x" * 300]):
        err = rpc_error(
            lambda t=topics: stub.Metadata(pb.MetadataRequest(topics=t), timeout=RPC_TIMEOUT)
        )
        assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "topic name")
        assert_short(err)
    logs.assert_quiet()


# --- ListOffsets ----------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_list_offsets_refuses_an_unknown_position_or_no_spec(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("lo", 0, batch([b"a"]))
    _, stub, logs = at_leader(shared_cluster, client, "lo")
    for fields in ({"position": 7}, {"position": -1}, {}):
        request = pb.ListOffsetsRequest(topic="lo", partition=0, **fields)  # type: ignore[arg-type]
        err = rpc_error(lambda r=request: stub.ListOffsets(r, timeout=RPC_TIMEOUT))
        assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "position")
    ok = stub.ListOffsets(
        pb.ListOffsetsRequest(topic="lo", partition=0, position=pb.EARLIEST), timeout=RPC_TIMEOUT
    )
    assert ok.offset == 0
    logs.assert_quiet()


# --- limits and the producer's language ------------------------------------------------------


@pytest.mark.timeout(60)
def test_messages_name_the_limit_and_speak_the_clients_language(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader, stub, logs = at_leader(shared_cluster, client, "bad")
    err = rpc_error(
        lambda: stub.Fetch(pb.FetchRequest(topic="bad", max_bytes=70_000_000), timeout=RPC_TIMEOUT)
    )
    assert_error(
        err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "70000000", "limit of 67108864"
    )
    err = rpc_error(
        lambda: stub.Produce(
            pb.ProduceRequest(topic="bad", entries=batch([b"v"]), timeout_ms=300_001),
            timeout=RPC_TIMEOUT,
        )
    )
    assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "limit of 300000")
    _, before = offsets(client, leader, "bad")
    for index, term in ((5, 0), (0, 3), (7, 7)):
        restamped = entry.stamp(batch([b"s"]), index=index, term=term, base_offset=0)
        err = rpc_error(
            lambda b=restamped: stub.Produce(
                pb.ProduceRequest(topic="bad", entries=b), timeout=RPC_TIMEOUT
            )
        )
        assert err.status == grpc.StatusCode.INVALID_ARGUMENT, err
        assert err.code == ErrorCode.ERROR_CODE_INVALID_BATCH, err
        for word in ("proposal", "Raft", "over the cap"):
            assert word not in str(err), f"{word!r} in a producer's message: {err}"
    assert offsets(client, leader, "bad")[1] == before, "a refused entry was appended"
    logs.assert_quiet()


@pytest.mark.timeout(60)
def test_a_default_fetch_fits_a_4_mib_client(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    """gRPC clients in most languages receive at most 4 MiB unless told otherwise: a Fetch
    with max_bytes 0 over entries of the largest size still fits."""
    limit = (1 << 20) - 200
    for i in range(6):
        client.produce("multi", 0, batch([bytes([65 + i]) * limit]))
    leader = address_of(shared_cluster, leader_of(client, "multi"))
    with grpc.insecure_channel(leader) as channel:  # gRPC's default receive limit
        fetch = channel.unary_unary(
            "/raftmq.v1.Broker/Fetch",
            request_serializer=pb.FetchRequest.SerializeToString,
            response_deserializer=pb.FetchResponse.FromString,
        )
        offset, seen = 0, 0
        while True:
            answer = fetch(pb.FetchRequest(topic="multi", offset=offset), timeout=RPC_TIMEOUT)
            if not answer.entries:
                break
            seen += len(answer.entries)
            offset = answer.next_offset
    assert seen > 6 * limit


# --- ProduceStream --------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_duplicate_request_id_in_progress_is_refused(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader = address_of(shared_cluster, leader_of(client, "stream", 1))
    _, before = offsets(client, leader, "stream", 1)
    logs = BrokerLogs(shared_cluster)
    answers = _stream(
        leader,
        [
            pb.ProduceRequest(topic="stream", partition=1, entries=batch([b"one"]), request_id=9),
            pb.ProduceRequest(topic="stream", partition=1, entries=batch([b"two"]), request_id=9),
        ],
        bunches=(),
    )
    assert [a.request_id for a in answers] == [9, 9]
    refused = [a for a in answers if a.HasField("error")]
    kept = [a for a in answers if not a.HasField("error")]
    assert len(refused) == 1 and len(kept) == 1, answers
    assert refused[0].error.code == "DUPLICATE_REQUEST_ID"
    assert "request_id 9" in refused[0].error.message
    records, _ = read_all(client, "stream", 1, start=before)
    assert [r.value for r in records] == [b"one"]
    # Once answered, the id may be used again.
    (again,) = _stream(
        leader,
        [pb.ProduceRequest(topic="stream", partition=1, entries=batch([b"3"]), request_id=9)],
    )
    assert not again.HasField("error")
    logs.assert_quiet()


@pytest.mark.timeout(60)
def test_a_refused_stream_answer_carries_the_partitions_offsets(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    client.produce("stream", 0, batch([b"x", b"y"]))
    leader_id = leader_of(client, "stream", 0)
    leader = address_of(shared_cluster, leader_id)
    start, hw = offsets(client, leader, "stream", 0)
    assert hw >= 2
    answers = _stream(
        leader,
        [
            pb.ProduceRequest(topic="stream", partition=0, entries=b"\x00" * 10, request_id=1),
            pb.ProduceRequest(
                topic="stream", partition=0, entries=batch([b"v"]), timeout_ms=400_000, request_id=2
            ),
            pb.ProduceRequest(topic="nope", partition=0, entries=batch([b"v"]), request_id=3),
        ],
        bunches=(),
    )
    by_id = {a.request_id: a for a in answers}
    for rid in (1, 2):
        assert by_id[rid].error.code in ("INVALID_BATCH", "INVALID_ARGUMENT")
        assert (by_id[rid].high_watermark, by_id[rid].log_start_offset) == (hw, start)
    assert by_id[3].error.code == "UNKNOWN_TOPIC"
    assert (by_id[3].high_watermark, by_id[3].log_start_offset) == (-1, -1)


@pytest.mark.timeout(60)
def test_a_client_cancelling_its_stream_leaves_no_error_in_the_log(
    shared_cluster: LocalCluster, client: LowLevelClient
) -> None:
    leader, _, logs = at_leader(shared_cluster, client, "stream", 0)
    for round_ in range(3):
        answered = threading.Event()
        hold = threading.Event()

        def requests(
            r: int = round_, hold: threading.Event = hold
        ) -> Iterator[pb.ProduceStreamRequest]:
            for i in range(20):
                yield pb.ProduceStreamRequest(
                    requests=[
                        pb.ProduceRequest(
                            topic="stream",
                            partition=0,
                            entries=batch([f"c{r}-{i}".encode()]),
                            request_id=i,
                        )
                    ]
                )
            hold.wait(10)  # keep the stream open until the client cancels it

        with grpc.insecure_channel(leader) as channel:
            stream = channel.stream_stream(
                "/raftmq.v1.Broker/ProduceStream",
                request_serializer=pb.ProduceStreamRequest.SerializeToString,
                response_deserializer=pb.ProduceStreamResponse.FromString,
            )(requests(), timeout=30)
            for _ in stream:
                answered.set()
                break
            stream.cancel()
            hold.set()
        assert answered.is_set()
    time.sleep(1.0)
    text = logs.assert_quiet()
    assert "ProduceStream" not in text or "DEBUG" in text


# --- corrupt stored data ----------------------------------------------------------------------


def _flip_a_payload_byte(segment: Path, nth_entry: int) -> None:
    data = bytearray(segment.read_bytes())
    headers = list(entry.iter_headers(bytes(data), verify=False))
    assert len(headers) > nth_entry, f"{segment} holds only {len(headers)} entries"
    h = headers[nth_entry]
    data[h.position + h.size - 1] ^= 0x40  # the last payload byte: framing stays intact
    segment.write_bytes(bytes(data))


@pytest.mark.timeout(180)
def test_a_corrupt_stored_entry_is_data_loss_and_the_broker_serves_on(tmp_path: Path) -> None:
    args = ["--tick-ms", "20", "--election-ticks", "10", "--segment-bytes", "4096"]
    cluster = LocalCluster(
        tmp_path, cluster_spec({"cd": 1, "other": 1}), broker_args=args + REBALANCE_ARGS
    )
    spec = cluster.spec  # with the ports the cluster reserved
    try:
        cluster.start()
        cluster.wait_for_leaders(timeout=LEADER_TIMEOUT, preferred=True)
        with cluster.client() as c:
            for i in range(40):
                c.produce("cd", 0, batch([f"cd-{i}-".encode() + b"p" * 300]))
            c.produce("other", 0, batch([b"other"]))
            hw = c.produce("cd", 0, batch([b"last"])).last_offset + 1
            for b in spec.brokers.values():  # every replica holds all of it
                for _ in range(200):
                    if offsets(c, b.address, "cd")[1] == hw:
                        break
                    time.sleep(0.05)
        cluster.stop()
        preferred = spec.topics["cd"].replicas[0][0]
        victim = spec.topics["cd"].replicas[0][1]
        assert victim != preferred
        folder = tmp_path / f"broker-{victim}" / "cd-0"
        segments = sorted(folder.glob("*.log"))
        assert len(segments) >= 3, f"want sealed segments, got {segments}"
        _flip_a_payload_byte(segments[0], 3)
        cluster.start()
        cluster.wait_for_leaders(timeout=LEADER_TIMEOUT, preferred=True)
        logs = BrokerLogs(cluster)
        address = spec.brokers[victim].address
        with cluster.client() as c:
            # Leaders may be known before the victim's own gRPC port answers a new channel.
            deadline = time.monotonic() + LEADER_TIMEOUT
            while True:
                try:
                    offsets(c, address, "other")
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

            # The refusal names the leader when the victim knows it: wait until it does (the
            # cluster's leaders can be known before the victim heard from its own).
            def victim_knows_leader() -> bool:
                answer = c.stub(address).Metadata(pb.MetadataRequest(topics=["cd"]), timeout=5)
                return answer.topics[0].partitions[0].leader_id == preferred

            wait_until(victim_knows_leader, LEADER_TIMEOUT, "the victim to know its leader")
            err = rpc_error(lambda: c.fetch("cd", 0, 0, address=address))
            assert_error(
                err, grpc.StatusCode.DATA_LOSS, "CORRUPT_DATA", "checksum", f"broker {victim}"
            )
            assert re.search(r"offsets from \d+", str(err)), err
            assert err.meta.get("raftmq-leader-id") == str(preferred)
            assert "leader" in str(err)
            # Again: refused without a second warning (logged once, not on every retry),
            # unless the repair the first read asked for has already restored the range.
            try:
                c.fetch("cd", 0, 0, address=address)
            except ClientError as again:
                assert again.code == ErrorCode.ERROR_CODE_CORRUPT_DATA, again
            # The leader serves the range; the damaged broker serves everything else.
            records, _ = read_all(c, "cd", 0, address=spec.brokers[preferred].address)
            assert len(records) == 41
            other, _ = read_all(c, "other", 0, address=address)
            assert [r.value for r in other] == [b"other"]
            c.produce("other", 0, batch([b"more"]))
            assert [r.value for r in read_all(c, "other", 0)[0]] == [b"other", b"more"]
        text = logs.assert_quiet()
        warnings = [
            line for line in text.splitlines() if " WARNING " in line and "checksum" in line
        ]
        assert len(warnings) == 1, text
    except BaseException:
        print(log_tails(cluster))
        raise
    finally:
        cluster.close()
