"""Accepted means consumable, against real brokers: each header lie of issue 10 finding 1
(an entry whose CRC is right but whose header does not match its records, or breaks a
bound) is refused with INVALID_ARGUMENT, ``raftmq-error: INVALID_BATCH`` and a sentence in
the producer's language; nothing is appended; and every broker keeps serving afterwards.
Before the client-edge checks each of these was acknowledged, and the record count near
2^31 stopped the Raft driver of every replica."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry
from raftmq.format.compression import Codec
from raftmq.format.records import Record, build_batch, decode_records, encode_records, iter_records
from tests.broker.test_broker_cluster import (
    RPC_TIMEOUT,
    address_of,
    assert_error,
    batch,
    client,  # noqa: F401  (fixture)
    leader_of,
    offsets,
    read_all,
    rpc_error,
    wait_until,
)

TOPIC = "bad"
HOUR_MS = 3_600_000


def honest_fields() -> tuple[bytes, dict[str, int]]:
    """Two records (one with a key and a header, one without) and the header fields that
    describe them truthfully."""
    now = int(time.time() * 1000)
    records = [Record(b"k", b"first", now, (("src", b"t"),)), Record(None, b"second", now + 3)]
    fields = {"record_count": 2, "first_timestamp": now, "max_timestamp": now + 3}
    return encode_records(records, base_timestamp=now), fields


def lying(**lies: int) -> Callable[[], bytes]:
    """An entry over the honest payload with ``lies`` in its header and a valid CRC."""

    def make() -> bytes:
        payload, fields = honest_fields()
        return entry.encode(payload, **{**fields, **lies})  # type: ignore[arg-type]

    return make


LIES: dict[str, tuple[Callable[[], bytes], tuple[str, ...]]] = {
    "record-count-mismatch": (lying(record_count=3), ("record_count is 3", "holds 2 records")),
    "record-count-near-2^31": (lying(record_count=(1 << 31) - 1), ("record_count is 2147483647",)),
    "max-timestamp-far-future": (
        lambda: lying(max_timestamp=int(time.time() * 1000) + 100 * 24 * HOUR_MS)(),
        ("max_timestamp", "ahead of the broker's clock", "message.timestamp.after.max.ms"),
    ),
    "max-below-first": (
        lambda: lying(max_timestamp=honest_fields()[1]["first_timestamp"] - 1)(),
        ("below first_timestamp",),
    ),
    "gzip-bit-uncompressed": (lying(attributes=1), ("not valid gzip data",)),
    "snappy-bit": (lying(attributes=2), ("snappy (codec 2) is not supported",)),
    "log-append-time-bit": (lying(attributes=8), ("log-append-time", "broker")),
    "non-zero-index": (lying(index=7), ("index is 7", "broker assigns offsets")),
    "non-zero-term": (lying(term=2), ("term is 2", "broker assigns offsets")),
    "non-zero-base-offset": (lying(base_offset=5), ("base_offset is 5", "send base_offset 0")),
    "producer-id-with-epoch-minus-1": (lying(producer_id=5), ("producer_id 5", "epoch -1")),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(LIES))
def test_each_header_lie_is_refused_and_nothing_is_appended(
    shared_cluster: LocalCluster,
    client: LowLevelClient,  # noqa: F811
    case: str,
) -> None:
    make, words = LIES[case]
    leader = address_of(shared_cluster, leader_of(client, TOPIC))
    _, before = offsets(client, leader, TOPIC)
    # After a good entry, so the refusal must name entry 1 and still keep entry 0 out.
    entries = batch([b"good entry before the lie"]) + make()
    request = pb.ProduceRequest(topic=TOPIC, partition=0, entries=entries)
    err = rpc_error(lambda: client.stub(leader).Produce(request, timeout=RPC_TIMEOUT))
    assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_BATCH", "entry 1", *words)
    for jargon in ("proposal", "raft"):
        assert jargon not in str(err).lower(), f"{jargon!r} in {err}"
    assert offsets(client, leader, TOPIC)[1] == before, "the high watermark moved"
    r = client.produce(TOPIC, 0, batch([f"after-{case}".encode()]))
    assert r.base_offset == before, f"{case}: the log end moved from {before} to {r.base_offset}"
    records, _ = read_all(client, TOPIC, 0, start=before)
    assert [x.value for x in records] == [f"after-{case}".encode()]


@pytest.mark.timeout(60)
def test_every_broker_keeps_serving_after_the_lies(
    shared_cluster: LocalCluster,
    client: LowLevelClient,  # noqa: F811
) -> None:
    for make, _ in LIES.values():  # each lie once more, as its own request
        request = pb.ProduceRequest(topic=TOPIC, partition=0, entries=make())
        leader = address_of(shared_cluster, leader_of(client, TOPIC))
        rpc_error(lambda r=request, a=leader: client.stub(a).Produce(r, timeout=RPC_TIMEOUT))
    leaders = {leader_of(client, "rt", p) for p in range(3)}
    assert leaders == set(shared_cluster.spec.brokers), "rt's partitions should span every broker"
    for p in range(3):
        r = client.produce("rt", p, batch([b"still serving"]), timeout_ms=10_000)
        records, _ = read_all(client, "rt", p, start=r.base_offset)
        assert [x.value for x in records] == [b"still serving"]
    # And what the topic holds reads back whole, on every replica.
    for address in shared_cluster.addresses:
        _, raw = read_all(client, TOPIC, 0, address=address)
        list(iter_records(raw))


@pytest.mark.timeout(60)
def test_compressed_batches_are_stored_as_sent_and_read_back_on_every_replica(
    shared_cluster: LocalCluster,
    client: LowLevelClient,  # noqa: F811
) -> None:
    """The broker inflates a compressed entry only to check it: the log keeps the bytes
    the producer sent, and every replica serves records a consumer decodes."""
    now = int(time.time() * 1000)
    sent: dict[Codec, tuple[int, bytes, list[bytes]]] = {}
    for codec in (Codec.GZIP, Codec.LZ4, Codec.ZSTD):
        values = [f"{codec.name}-{i}".encode() * 40 for i in range(300)]
        entry_bytes = build_batch(
            [Record(None, v, now + i) for i, v in enumerate(values)], compression_codec=codec
        )
        r = client.produce(TOPIC, 0, entry_bytes, timeout_ms=10_000)
        sent[codec] = (r.base_offset, entry_bytes, values)
    leader = address_of(shared_cluster, leader_of(client, TOPIC))
    hw = offsets(client, leader, TOPIC)[1]
    for address in shared_cluster.addresses:
        wait_until(
            lambda a=address: offsets(client, a, TOPIC)[1] >= hw, 10, f"{address} to catch up"
        )
        _, raw = read_all(
            client, TOPIC, 0, address=address, start=min(base for base, _, _ in sent.values())
        )
        stored = {h.base_offset: h for h in entry.iter_headers(raw)}
        for codec, (base, entry_bytes, values) in sent.items():
            h = stored[base]
            assert h.attributes & entry.CODEC_MASK == codec
            assert raw[h.position + entry.HEADER_SIZE : h.end] == entry_bytes[entry.HEADER_SIZE :]
            assert [x.value for x in decode_records(raw, h)] == values
