"""Executor-side reading for the Spark source: one offset range of one partition, fetched in
large batches over gRPC and turned into Arrow record batches in the Kafka source's layout.

Runs in Spark's Python workers: it may depend only on the range and the options it is
given, never on state built on the driver. gRPC channels are opened lazily and kept per
worker process (workers are reused between tasks), never pickled.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator

import pyarrow as pa

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import ClientError, ErrorCode, LowLevelClient
from raftmq.format import entry, tag_filter
from raftmq.format.entry import EntryType
from raftmq.format.records import Record, decode_records
from raftmq.format.tag_filter import TagFilter
from raftmq.format.tags import record_tags
from raftmq.spark.options import ReadOptions, SourceError
from raftmq.spark.planning import OffsetRange, data_lost

STALL_S = 60.0
"""How long a range may make no progress (no replica serving it) before the task fails."""
REPLICA_WAIT_MS = 500
"""Long poll on a follower that has not yet learnt the commit point the range ends at."""

_CLIENTS: dict[tuple[tuple[str, ...], tuple[str | None, ...]], LowLevelClient] = {}


def client_for(options: ReadOptions) -> LowLevelClient:
    """One client (one channel per broker) per worker process, cluster and TLS setting."""
    found = (options.bootstrap, options.tls)
    client = _CLIENTS.get(found)
    if client is None:
        client = _CLIENTS[found] = LowLevelClient(
            list(options.bootstrap), retries=20, **options.client_tls()
        )
    return client


def arrow_schema(include_headers: bool) -> pa.Schema:
    """Exactly what Spark's ``to_arrow_schema(schema, timezone="UTC")`` makes of the source's
    schema (tests/spark checks it): Spark refuses batches that differ in any type."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(header)))
    return pa.schema(fields)


def read_range(rng: OffsetRange, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Every record of ``rng`` in offset order, as Arrow batches of one fetch answer each.

    With readFromReplicas the range is read from one of its replicas (chosen by the range,
    so tasks spread over them); a follower that errs or lags is left for the leader. The
    leader has every offset below the end (it is at most the high watermark it reported),
    so only a failover or retention can interrupt it: the first is waited out for STALL_S,
    the second is data loss (failOnDataLoss decides).
    """
    client = client_for(options)
    schema = arrow_schema(options.include_headers)
    target: str | None = None
    if options.read_from_replicas and rng.replicas:
        pick = zlib.crc32(f"{rng.topic}/{rng.partition}/{rng.start}".encode())
        target = rng.replicas[pick % len(rng.replicas)]
    cur = rng.start
    stalled_since = time.monotonic()
    flt = tag_filter.parse(options.tag_filter) if options.tag_filter else None
    while cur < rng.end:
        try:
            resp = client.fetch(
                rng.topic,
                rng.partition,
                cur,
                max_bytes=options.fetch_max_bytes,
                max_wait_ms=REPLICA_WAIT_MS if target else 0,
                min_bytes=1,
                address=target,
                read_committed=options.read_committed,
                tag_filter=options.tag_filter,
            )
        except ClientError as err:
            log_start = int(err.meta.get("raftmq-log-start-offset", -1))
            out_of_range = err.code == ErrorCode.ERROR_CODE_OFFSET_OUT_OF_RANGE
            if out_of_range and cur < log_start:
                if options.fail_on_data_loss:
                    raise SourceError(
                        data_lost((rng.topic, rng.partition), cur, log_start)
                    ) from None
                cur = min(log_start, rng.end)
                continue
            if target is not None:
                target = None  # this replica cannot serve it now: the leader can
                continue
            # Worth waiting for: an election or a broker restart (retriable codes, or no
            # answer at all), or a new leader that has not yet committed in its term
            # (out of range above its high watermark).
            passing = out_of_range or err.retriable or err.unreachable
            if time.monotonic() - stalled_since > STALL_S or not passing:
                raise SourceError(
                    f"reading {rng.topic}/{rng.partition} at offset {cur} (for [{rng.start}, "
                    f"{rng.end})) failed: {err}"
                ) from None
            time.sleep(0.1)
            continue
        batch, after = decode_batch(resp.entries, rng, cur, schema, aborted_of(resp), flt)
        if flt is not None:
            after = max(after, min(resp.next_offset, rng.end))  # past what the broker looked at
        if batch is not None:
            yield batch
        if after > cur:
            cur = after
            stalled_since = time.monotonic()
        elif target is not None:
            target = None  # a follower that has not learnt of these commits: ask the leader
        elif time.monotonic() - stalled_since > STALL_S:
            raise SourceError(
                f"no replica of {rng.topic}/{rng.partition} served offset {cur} within "
                f"{STALL_S:.0f} s (the range ends at {rng.end}); is the partition led?"
            )
        else:
            time.sleep(0.05)  # e.g. a new leader that has not yet committed in its term


def aborted_of(resp: pb.FetchResponse) -> dict[int, list[tuple[int, int]]]:
    """read_committed: per producer id, the [first, last) offsets of its aborted
    transactions in the answer's range."""
    out: dict[int, list[tuple[int, int]]] = {}
    for txn in resp.aborted_transactions:
        out.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
    return out


def decode_batch(
    entries: bytes,
    rng: OffsetRange,
    cur: int,
    schema: pa.Schema,
    aborted: dict[int, list[tuple[int, int]]] | None = None,
    flt: TagFilter | None = None,
) -> tuple[pa.RecordBatch | None, int]:
    """The records of ``entries`` with offsets in [cur, rng.end) as one Arrow batch (None if
    there are none), and the offset to fetch next. Offsets must run on from ``cur`` without a
    gap, except over the entries of an aborted transaction (``aborted``, read_committed),
    which are skipped: any other gap means the answer is not what was asked for, and the
    task fails. Markers take no offset, so they leave no gap. With a tag filter ``flt``
    the broker skips batches (gaps are expected) and the records that do not match are
    dropped here."""
    recs: list[Record] = []
    types: list[int] = []
    nxt = cur
    for header in entry.iter_headers(entries):
        if header.type != EntryType.DATA or header.next_offset <= nxt:
            continue
        if header.base_offset >= rng.end:
            break
        if header.base_offset > nxt and flt is not None:
            nxt = header.base_offset  # the broker skipped batches that cannot match
        if header.base_offset > nxt:
            raise SourceError(
                f"{rng.topic}/{rng.partition}: expected offset {nxt}, the broker "
                f"sent {header.base_offset}; [{rng.start}, {rng.end}) cannot be read in order"
            )
        if aborted and header.attributes & entry.TRANSACTIONAL:
            ranges = aborted.get(header.producer_id, ())
            if any(lo <= header.base_offset < hi for lo, hi in ranges):
                nxt = min(header.next_offset, rng.end)  # an aborted write: never yielded
                continue
        # Offsets within an entry run on from its base (check_records proves it).
        first = nxt - header.base_offset
        taken = decode_records(entries, header)[first : rng.end - header.base_offset]
        nxt += len(taken)
        if flt is not None:
            taken = [r for r in taken if flt.matches(record_tags(r))]
        recs += taken
        types += [1 if header.attributes & entry.TIMESTAMP_LOG_APPEND else 0] * len(taken)
    if not recs:
        # Nothing committed there yet, only control entries, or only aborted writes.
        return None, nxt
    n = len(recs)
    columns = [
        pa.array([r.key for r in recs], pa.binary()),
        pa.array([r.value for r in recs], pa.binary()),
        pa.array([rng.topic] * n, pa.string()),
        pa.array([rng.partition] * n, pa.int32()),
        pa.array([r.offset for r in recs], pa.int64()),
        pa.array([r.timestamp * 1000 for r in recs], pa.timestamp("us", tz="UTC")),
        pa.array(types, pa.int32()),
    ]
    if len(schema) > len(columns):
        headers = [[{"key": k, "value": v} for k, v in r.headers] for r in recs]
        columns.append(pa.array(headers, schema.field("headers").type))
    assert recs[-1].offset == nxt - 1 or flt is not None, "offsets out of order"
    return pa.RecordBatch.from_arrays(columns, schema=schema), nxt
