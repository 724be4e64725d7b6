"""A structured fuzzer on the produce path, from request bytes to stored entry, against a real
single-broker cluster (replication 1, started once per module).

Hypothesis builds valid batches from random records, then maybe mutates them: header lies
(record count, timestamps, attributes, index/term/base_offset, producer triples), byte flips
with the CRC recomputed and without, truncations, concatenations and garbage. The property
(issue 10, "accepted means consumable"):

- every accepted request is stored as sent (only index, term, base_offset and the CRC are
  the broker's), served by Fetch from the offsets it answered, and decodes with
  ``iter_records`` to exactly the records meant: the originals for an unmutated batch, and
  ``record_count`` records without error for an accepted mutation;
- every refused request changes nothing (the high watermark stays) and is refused with
  INVALID_ARGUMENT and a ``raftmq-error`` code.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.errors import ErrorCode, error_of
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.records import Record, encode_records, iter_records
from tests.broker.conftest import LEADER_TIMEOUT, log_tails

TOPIC = "fuzz"
RPC_TIMEOUT = 10.0
REFUSAL_CODES = {
    ErrorCode.ERROR_CODE_INVALID_BATCH,
    ErrorCode.ERROR_CODE_CORRUPT_BATCH,
    ErrorCode.ERROR_CODE_BATCH_TOO_LARGE,
}
SEQUENCE_CODES = {
    ErrorCode.ERROR_CODE_OUT_OF_ORDER_SEQUENCE,
    ErrorCode.ERROR_CODE_PRODUCER_FENCED,
    ErrorCode.ERROR_CODE_UNKNOWN_PRODUCER_ID,
}
"""A well-formed batch of an idempotent producer (a fuzzed but valid producer triple) may
be refused for its place in that producer's sequence: FAILED_PRECONDITION, not a lie."""
I64 = st.integers(-(1 << 63), (1 << 63) - 1)
I32 = st.integers(-(1 << 31), (1 << 31) - 1)
I16 = st.integers(-(1 << 15), (1 << 15) - 1)
NOW_MS = int(time.time() * 1000)


@dataclass
class Broker:
    client: LowLevelClient
    address: str

    def high_watermark(self) -> int:
        r = self.client.stub(self.address).ListOffsets(
            pb.ListOffsetsRequest(topic=TOPIC, partition=0, position=pb.LATEST),
            timeout=RPC_TIMEOUT,
        )
        return r.high_watermark


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    spec = local_spec(1, {TOPIC: 1}, replication=1, name="raftmq-fuzz")
    cluster = LocalCluster(tmp_path_factory.mktemp("fuzz"), spec, broker_args=["--tick-ms", "20"])
    try:
        cluster.start()
        cluster.wait_for_leaders(timeout=LEADER_TIMEOUT)
        with cluster.client() as client:
            yield Broker(client, cluster.addresses[0])
    except BaseException:
        print(log_tails(cluster))
        raise
    finally:
        cluster.close()


# --- the strategy ------------------------------------------------------------------------------

records_st = st.lists(
    st.builds(
        Record,
        key=st.none() | st.binary(max_size=20),
        value=st.none() | st.binary(max_size=200),
        timestamp=st.integers(NOW_MS - 10**9, NOW_MS + 1000),
        headers=st.lists(
            st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=10)), max_size=3
        ).map(tuple),
    ),
    min_size=1,
    max_size=12,
)


@dataclass
class Draft:
    """One entry before encoding: its records, payload and header fields (honest unless
    mutated)."""

    records: list[Record]
    payload: bytes
    fields: dict[str, int]

    @classmethod
    def of(cls, records: list[Record]) -> Draft:
        first = records[0].timestamp
        fields = {
            "record_count": len(records),
            "first_timestamp": first,
            "max_timestamp": max(r.timestamp for r in records),
        }
        return cls(records, encode_records(records, base_timestamp=first), fields)

    def encode(self) -> bytes:
        return entry.encode(self.payload, **self.fields)  # type: ignore[arg-type]


HEADER_LIES = {
    "record_count": st.integers(1, (1 << 31) - 1),
    "first_timestamp": I64,
    "max_timestamp": I64 | st.integers(NOW_MS, NOW_MS + 10 * 3_600_000),
    "attributes": st.integers(0, 15),
    "index": I64,
    "term": I64,
    "base_offset": I64,
    "producer_id": I64 | st.integers(-1, 10),
    "producer_epoch": I16 | st.integers(-1, 3),
    "base_sequence": I32 | st.integers(-1, 10),
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, list[list[Record]] | None]:
    """(request entries, the records meant when no mutation was applied, else None)."""
    drafts = [Draft.of(draw(records_st)) for _ in range(draw(st.integers(1, 3)))]
    mutation = draw(
        st.sampled_from(
            ["none", "none", "header", "payload", "producer", "raw-flip", "truncate", "concat"]
        )
    )
    target = draw(st.sampled_from(drafts))
    if mutation == "header":
        for name in draw(st.lists(st.sampled_from(sorted(HEADER_LIES)), min_size=1, max_size=3)):
            target.fields[name] = draw(HEADER_LIES[name])
    elif mutation == "payload":  # bytes changed, CRC recomputed: only the record rules catch it
        payload = bytearray(target.payload)
        for _ in range(draw(st.integers(1, 3))):
            payload[draw(st.integers(0, len(payload) - 1))] = draw(st.integers(0, 255))
        cut = draw(st.sampled_from([len(payload), draw(st.integers(0, len(payload)))]))
        target.payload = bytes(payload[:cut]) + draw(st.binary(max_size=3))
    elif mutation == "producer":
        target.fields.update(
            producer_id=draw(HEADER_LIES["producer_id"]),
            producer_epoch=draw(HEADER_LIES["producer_epoch"]),
            base_sequence=draw(HEADER_LIES["base_sequence"]),
        )
    raw = bytearray(b"".join(d.encode() for d in drafts))
    if mutation == "raw-flip":  # no CRC recomputed: anything past byte 8 must fail the CRC
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(raw) - 1))
            raw[at] ^= draw(st.integers(1, 255))
    elif mutation == "truncate":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif mutation == "concat":
        raw += draw(st.sampled_from([bytes(raw), draw(st.binary(min_size=1, max_size=80))]))
    meant = [d.records for d in drafts] if mutation == "none" else None
    return bytes(raw), meant


# --- the property ------------------------------------------------------------------------------


def check_one(broker: Broker, entries: bytes, meant: list[list[Record]] | None) -> None:
    before = broker.high_watermark()
    request = pb.ProduceRequest(topic=TOPIC, partition=0, entries=entries, timeout_ms=10_000)
    try:
        answer = broker.client.stub(broker.address).Produce(request, timeout=RPC_TIMEOUT)
    except grpc.RpcError as exc:
        err = error_of(exc)
        event(f"refused {err.label}")
        assert meant is None, f"an honest batch was refused: {err.label}: {err}"
        if err.code in SEQUENCE_CODES:
            assert _producer_id(entries) >= 0, f"{err.label} without a producer: {err}"
            assert err.status == grpc.StatusCode.FAILED_PRECONDITION, f"{err.status}: {err}"
        else:
            assert err.status == grpc.StatusCode.INVALID_ARGUMENT, f"{err.status}: {err}"
            assert err.code in REFUSAL_CODES, f"raftmq-error {err.label}: {err}"
        assert len(str(err)) >= 15
        assert broker.high_watermark() == before, "a refused request moved the high watermark"
        return
    event("accepted" if meant is not None else "accepted mutation")
    sent = list(entry.iter_headers(entries))
    count = sum(h.record_count for h in sent)
    if answer.base_offset < before:
        # A resend of an idempotent producer's batch (the fuzzer drew its triple before):
        # acknowledged with the first copy's offsets, and not stored again.
        event("accepted duplicate")
        assert len(sent) == 1 and sent[0].producer_id >= 0, "a duplicate answer for a new batch"
        assert broker.high_watermark() == before, "a duplicate moved the high watermark"
        first = fetch_entries(broker, answer.base_offset, answer.last_offset + 1)
        h = next(entry.iter_headers(first))
        triple = (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count)
        assert h.base_offset == answer.base_offset
        s0 = sent[0]
        assert triple == (s0.producer_id, s0.producer_epoch, s0.base_sequence, s0.record_count)
        return
    assert (answer.base_offset, answer.last_offset) == (before, before + count - 1)
    stored = fetch_entries(broker, before, answer.last_offset + 1)
    data = [h for h in entry.iter_headers(stored) if h.type == EntryType.DATA]
    assert len(data) == len(sent)
    for h, s in zip(data, sent, strict=True):
        # Stored as sent: only the fields the broker assigns (and so the CRC) differ.
        mine = entries[s.position : s.end]
        theirs = stored[h.position : h.end]
        assert entry.stamp(mine, index=h.index, term=h.term, base_offset=h.base_offset) == theirs
    got = list(iter_records(stored))
    assert len(got) == count
    assert [r.offset for r in got] == list(range(before, before + count))
    if meant is not None:
        want = [(r.key, r.value, r.timestamp, r.headers) for rs in meant for r in rs]
        assert [(r.key, r.value, r.timestamp, r.headers) for r in got] == want


def _producer_id(entries: bytes) -> int:
    try:
        return next(entry.iter_headers(entries)).producer_id
    except Exception:  # not even one readable header
        return -1


def fetch_entries(broker: Broker, start: int, end: int) -> bytes:
    """The stored entries holding offsets [start, end), fetched as a consumer does."""
    out = bytearray()
    offset = start
    while offset < end:
        r = broker.client.fetch(TOPIC, 0, offset, address=broker.address)
        assert r.entries, f"fetch at {offset} returned nothing below {end}"
        out += r.entries
        offset = r.next_offset
    return bytes(out)


SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@pytest.mark.timeout(120)
@settings(max_examples=150, **SETTINGS)  # type: ignore[arg-type]
@given(request=requests())
def test_produce_fuzz_short(broker: Broker, request: tuple[bytes, list[list[Record]] | None]):
    check_one(broker, *request)


@pytest.mark.long
@pytest.mark.timeout(3600)
@settings(max_examples=5000, **SETTINGS)  # type: ignore[arg-type]
@given(request=requests())
def test_produce_fuzz_long(broker: Broker, request: tuple[bytes, list[list[Record]] | None]):
    check_one(broker, *request)


def test_the_broker_still_serves_after_the_fuzzing(broker: Broker) -> None:
    honest = Draft.of([Record(None, b"after the fuzzing", NOW_MS)]).encode()
    r = broker.client.produce(TOPIC, 0, honest)
    got = list(iter_records(fetch_entries(broker, r.base_offset, r.last_offset + 1)))
    assert [x.value for x in got] == [b"after the fuzzing"]
