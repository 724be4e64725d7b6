"""Client benchmark: the Producer and the Consumer beside the raw gRPC path they are built
on, in the same run, so the client's own cost is a ratio rather than a machine-dependent
number (issue 14's target: at least 0.8x of the raw path).

Phases, on a 3-broker local cluster (one topic, 3 partitions, 3 replicas, acks=all):

1. produce throughput, 1 KiB records: the raw path builds the same batches
   (``build_batch`` of ``--batch`` records) and sends them over one ProduceStream per
   leader, one batch in flight per partition as the Producer keeps them (so both keep
   per-partition order); the Producer gets ``send`` calls, one per record, and batches
   them itself (``batch_size`` = the raw path's batch bytes, ``linger_ms`` 5).
2. consume throughput: the raw path fetches 1 MiB at a time from each leader and decodes
   every record; the Consumer polls the same records.
3. sequential latency: one record at a time, acks=all, waiting for each answer: raw
   ProduceStream request against ``Producer.send(...).result()`` (``linger_ms`` 0: with
   a linger, as in Kafka, a lone record waits for it), and ``await (await
   AsyncProducer.send(...))``, which shows what the thread-safe Producer's two thread
   hand-offs (caller -> its event loop -> caller) add. The three alternate in
   ``SEQUENTIAL_BLOCKS`` blocks (over one stream and one producer each, opened untimed),
   so a load that comes and goes on a shared machine falls on all alike; a 1 KiB
   append+fsync probe of the data disk is printed beside them, since an acks=all commit
   waits for two fsyncs (the leader's and a follower's) on that disk.

Both sides run in this one process, one after the other, on the same data sizes.

Usage: ``python -m benchmarks.client_bench [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    fsync_probe,
    kill_on_exit,
    latency_summary,
    print_json_last,
)
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import AsyncProducer, Consumer, Producer
from raftmq.client.connections import Connections
from raftmq.client.produce_stream import ProduceStream
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format.records import Record, build_batch, iter_records

TOPIC = "bench"
PARTITIONS = 3
RECORD_BYTES = 1024
FETCH_BYTES = 1 << 20
SEQUENTIAL_BLOCKS = 10


async def raw_produce(bootstrap: tuple[str, ...], records: int, batch: int, value: bytes) -> float:
    """Seconds to store ``records`` in batches of ``batch``, one batch in flight per
    partition, the batches built here as a producer would."""
    links = Connections(bootstrap)
    streams: dict[str, ProduceStream] = {}
    per_partition = records // PARTITIONS

    async def partition(p: int) -> None:
        address = await links.leader(TOPIC, p)
        stream = streams.get(address) or streams.setdefault(
            address, ProduceStream(links.channel(address), address)
        )
        left = per_partition
        while left:
            n = min(batch, left)
            now = int(time.time() * 1000)
            entry = build_batch([Record(None, value, now) for _ in range(n)])
            await stream.produce(pb.ProduceRequest(topic=TOPIC, partition=p, entries=entry))
            left -= n

    started = time.monotonic()
    await asyncio.gather(*(partition(p) for p in range(PARTITIONS)))
    elapsed = time.monotonic() - started
    for stream in streams.values():
        await stream.close()
    await links.close()
    return elapsed


def client_produce(bootstrap: tuple[str, ...], records: int, batch: int, value: bytes) -> float:
    per_partition = records // PARTITIONS
    with Producer(bootstrap, linger_ms=5, batch_size=batch * (RECORD_BYTES + 40)) as producer:
        started = time.monotonic()
        for i in range(per_partition * PARTITIONS):
            producer.send(TOPIC, value, partition=i % PARTITIONS)
        producer.flush()
        return time.monotonic() - started


def raw_consume(cluster: LocalCluster, start: dict[int, int], count: int) -> float:
    started = time.monotonic()
    got = 0
    with cluster.client() as client:
        for p in range(PARTITIONS):
            offset = start[p]
            want = count // PARTITIONS
            while want > 0:
                answer = client.fetch(TOPIC, p, offset, max_bytes=FETCH_BYTES)
                records = [r for r in iter_records(answer.entries) if r.offset >= offset]
                records = records[:want]
                want -= len(records)
                got += len(records)
                offset = answer.next_offset
    assert got == count // PARTITIONS * PARTITIONS, got
    return time.monotonic() - started


def client_consume(bootstrap: tuple[str, ...], start: dict[int, int], count: int) -> float:
    want = count // PARTITIONS * PARTITIONS
    with Consumer(bootstrap, fetch_max_bytes=FETCH_BYTES, max_poll_records=5000) as consumer:
        consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
        for p in range(PARTITIONS):
            consumer.seek((TOPIC, p), start[p])
        started = time.monotonic()
        got = {p: 0 for p in range(PARTITIONS)}
        while sum(got.values()) < want:
            for r in consumer.poll(1.0):
                if got[r.partition] < count // PARTITIONS:
                    got[r.partition] += 1
        return time.monotonic() - started


async def raw_stream(bootstrap: tuple[str, ...]) -> tuple[Connections, ProduceStream]:
    """A ProduceStream to partition 0's leader, opened by one untimed request."""
    links = Connections(bootstrap)
    address = await links.leader(TOPIC, 0)
    stream = ProduceStream(links.channel(address), address)
    await raw_sequential(stream, 1, b"")
    return links, stream


async def raw_sequential(stream: ProduceStream, samples: int, value: bytes) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.monotonic()
        entry = build_batch([Record(None, value, int(time.time() * 1000))])
        await stream.produce(pb.ProduceRequest(topic=TOPIC, partition=0, entries=entry))
        out.append(time.monotonic() - t0)
    return out


async def close_raw(links: Connections, stream: ProduceStream) -> None:
    await stream.close()
    await links.close()


async def open_async_producer(bootstrap: tuple[str, ...], value: bytes) -> AsyncProducer:
    producer = AsyncProducer(bootstrap, linger_ms=0)
    await (await producer.send(TOPIC, value, partition=0))  # warm: metadata, stream
    return producer


async def async_sequential(producer: AsyncProducer, samples: int, value: bytes) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.monotonic()
        await (await producer.send(TOPIC, value, partition=0))
        out.append(time.monotonic() - t0)
    return out


def client_sequential(producer: Producer, samples: int, value: bytes) -> list[float]:
    out = []
    for _ in range(samples):
        t0 = time.monotonic()
        producer.send(TOPIC, value, partition=0).result()
        out.append(time.monotonic() - t0)
    return out


def sequential(bootstrap: tuple[str, ...], samples: int, value: bytes) -> dict[str, list[float]]:
    """Raw, Producer and AsyncProducer latencies in alternating blocks (the order rotates
    from block to block), each over one stream or producer opened before the first block."""
    out: dict[str, list[float]] = {"raw": [], "client": [], "async": []}
    per_block = max(1, samples // SEQUENTIAL_BLOCKS)
    with asyncio.Runner() as runner, Producer(bootstrap, linger_ms=0) as producer:
        links, stream = runner.run(raw_stream(bootstrap))
        aproducer = runner.run(open_async_producer(bootstrap, value))
        producer.send(TOPIC, value, partition=0).result()  # warm: metadata, stream
        sides = list(out)
        for block in range(SEQUENTIAL_BLOCKS):
            for side in sides[block % 3 :] + sides[: block % 3]:
                if side == "raw":
                    out[side] += runner.run(raw_sequential(stream, per_block, value))
                elif side == "client":
                    out[side] += client_sequential(producer, per_block, value)
                else:
                    out[side] += runner.run(async_sequential(aproducer, per_block, value))
        runner.run(aproducer.close())
        runner.run(close_raw(links, stream))
    return out


def ends(cluster: LocalCluster) -> dict[int, int]:
    with cluster.client() as client:
        return {p: client.fetch(TOPIC, p, 0, max_bytes=1).high_watermark for p in range(PARTITIONS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, "30,000 records and 300 sequential samples; under a minute")
    parser.add_argument("--batch", type=int, default=200, help="records per batch (raw path)")
    parser.add_argument("--dir", help="where the brokers keep data (default: a real disk)")
    args = parser.parse_args(argv)
    kill_on_exit()
    records = 30_000 if args.quick else 300_000
    samples = 300 if args.quick else 2000
    work = disk_tempdir("client-bench-", args.dir)
    cluster = LocalCluster(work, local_spec(3, {TOPIC: PARTITIONS}))
    add_cleanup(cluster.close)
    cluster.start()
    cluster.wait_for_leaders(timeout=60, preferred=True)
    bootstrap = tuple(cluster.addresses)
    value = os.urandom(RECORD_BYTES)
    print(f"data: {work}; {records:,} records of {RECORD_BYTES} B over {PARTITIONS} partitions")

    figures: dict[str, Any] = {"records": records, "quick": args.quick, "batch": args.batch}
    start = ends(cluster)
    figures["raw_produce_s"] = asyncio.run(raw_produce(bootstrap, records, args.batch, value))
    raw_start, client_start = start, ends(cluster)
    figures["client_produce_s"] = client_produce(bootstrap, records, args.batch, value)
    figures["raw_consume_s"] = raw_consume(cluster, raw_start, records)
    figures["client_consume_s"] = client_consume(bootstrap, client_start, records)
    figures["disk_fsync_1k"] = fsync = fsync_probe(work)
    load_before = os.getloadavg()[0]
    for side, lats in sequential(bootstrap, samples, value).items():
        figures[f"{side}_sequential"] = latency_summary(lats)
    figures["sequential_load"] = [load_before, os.getloadavg()[0]]

    rows = []
    mib = records * RECORD_BYTES / 2**20
    for phase in ("produce", "consume"):
        raw_rate = records / figures[f"raw_{phase}_s"]
        client_rate = records / figures[f"client_{phase}_s"]
        figures[f"{phase}_ratio"] = client_rate / raw_rate
        rows.append((phase, raw_rate, client_rate, mib, figures[f"{phase}_ratio"]))
    print(f"\n{'phase':<9} {'raw rec/s':>11} {'client rec/s':>13} {'client MB/s':>12} {'ratio':>7}")
    for phase, raw_rate, client_rate, size, ratio in rows:
        mbs = size * client_rate / records
        print(f"{phase:<9} {raw_rate:>11,.0f} {client_rate:>13,.0f} {mbs:>12.1f} {ratio:>6.2f}x")
    raw_s, client_s = figures["raw_sequential"], figures["client_sequential"]
    print(
        f"\nsequential acks=all, {samples} samples each in {SEQUENTIAL_BLOCKS} alternating "
        f"blocks (load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}): p50 / p99 ms"
    )
    print(f"  raw ProduceStream    {raw_s['p50_ms']:6.2f} / {raw_s['p99_ms']:6.2f}")
    print(f"  Producer.send()      {client_s['p50_ms']:6.2f} / {client_s['p99_ms']:6.2f}")
    async_s = figures["async_sequential"]
    print(f"  AsyncProducer.send() {async_s['p50_ms']:6.2f} / {async_s['p99_ms']:6.2f}")
    print(f"  disk: 1 KiB append+fsync {fsync['p50_ms']:6.2f} / {fsync['p99_ms']:6.2f}")
    print(
        "\ntargets: produce and consume ratio >= 0.8x; send().result() p99 <= 2 ms (quiet machine)"
    )
    print(f"machine load average: {os.getloadavg()[0]:.2f}")
    print_json_last(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
