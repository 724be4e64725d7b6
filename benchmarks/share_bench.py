"""Share groups benchmark: what queues on the log buy, against a consumer group in the same
run, so each figure is a ratio (issue 26's targets: with 10 ms of processing per record,
16 share consumers on a 1-partition topic reach at least 10x the records/s of one
consumer-group member; plain share consumption at least 0.5x a consumer group's).

Phases, on a 3-broker local cluster (acks=all, 3 replicas, 100 B records):

1. processing: every record costs its consumer 10 ms (a sleep: I/O-bound work, as most
   queue consumers' is). One consumer-group member on the 1-partition topic ``work``
   (the most a consumer group can put on one partition), then 16 share consumers of one
   share group on the same topic, each for the same time; records processed (and, for
   the share group, accepted) per second.
2. plain throughput: the topic ``flow`` (1 partition) read from the start with no
   processing, by one consumer-group member and by one share consumer (implicit
   acknowledgement: each poll accepts the one before), each to the last record.

Share consumers run as threads of this process (each ShareConsumer has its own I/O
thread); the brokers are processes of their own.

Usage: ``python -m benchmarks.share_bench [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from typing import Any

from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    kill_on_exit,
    print_json_last,
    say,
)
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client import AcknowledgeType, AdminClient, Consumer, Producer, ShareConsumer
from raftmq.devtools.local_cluster import LocalCluster, local_spec

WORK, FLOW = "work", "flow"
RECORD_BYTES = 100
PROCESS_S = 0.010
SHARE_MEMBERS = 16
TARGET_PROCESSING = 10.0
TARGET_PLAIN = 0.5


def produce(bootstrap: tuple[str, ...], topic: str, count: int) -> None:
    value = os.urandom(RECORD_BYTES)
    with Producer(bootstrap, linger_ms=5) as producer:
        for _ in range(count):
            producer.send(topic, value, partition=0)
        producer.flush()


def share_group(bootstrap: tuple[str, ...]) -> str:
    """A fresh share group that starts at the log start."""
    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    setting = spb.ShareGroupSetting(name="share.auto.offset.reset", value="earliest")
    with AdminClient(bootstrap) as admin:
        admin._call(
            "AlterShareGroupConfig",
            spb.AlterShareGroupConfigRequest(group_id=group, settings=[setting]),
            spb_grpc.ShareGroupsStub,
        )
    return group


def group_processing(bootstrap: tuple[str, ...], seconds: float) -> int:
    """Records one consumer-group member processes in ``seconds`` (from its first)."""
    group = f"bench-cg-{uuid.uuid4().hex[:8]}"
    done = 0
    with Consumer(bootstrap, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.subscribe([WORK])
        records = []
        while not records:
            records = consumer.poll(0.5)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in records:
                if time.monotonic() >= end:
                    break
                time.sleep(PROCESS_S)
                done += 1
            records = consumer.poll(0.1)
    return done


def share_processing(bootstrap: tuple[str, ...], seconds: float, members: int) -> int:
    """Records ``members`` share consumers process (and accept) in ``seconds``, counted
    from the first record any of them got."""
    group = share_group(bootstrap)
    started = threading.Event()
    end_at: list[float] = []
    counts = [0] * members
    ready = threading.Barrier(members + 1)

    def member(i: int) -> None:
        with ShareConsumer(
            bootstrap, group, acknowledgement_mode="explicit", max_poll_records=10
        ) as consumer:
            consumer.subscribe(WORK)
            ready.wait()
            while not started.is_set() or time.monotonic() < end_at[0]:
                records = consumer.poll(0.1)
                if records and not started.is_set():
                    end_at.append(time.monotonic() + seconds)
                    started.set()
                for r in records:
                    if end_at and time.monotonic() >= end_at[0]:
                        consumer.acknowledge(r, AcknowledgeType.RELEASE)
                        continue
                    time.sleep(PROCESS_S)
                    consumer.acknowledge(r)
                    counts[i] += 1

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    ready.wait()
    for t in threads:
        t.join()
    return sum(counts)


def group_read(bootstrap: tuple[str, ...], count: int) -> float:
    """Seconds for one consumer-group member to read ``count`` records of FLOW."""
    group = f"bench-cg-{uuid.uuid4().hex[:8]}"
    got = 0
    with Consumer(
        bootstrap, group_id=group, auto_offset_reset="earliest", max_poll_records=500
    ) as consumer:
        consumer.subscribe([FLOW])
        while not (records := consumer.poll(0.5)):
            pass
        t0 = time.perf_counter()
        got = len(records)
        while got < count:
            got += len(consumer.poll(0.5))
        return time.perf_counter() - t0


def share_read(bootstrap: tuple[str, ...], count: int) -> float:
    """Seconds for one share consumer to read (and accept) ``count`` records of FLOW."""
    group = share_group(bootstrap)
    with ShareConsumer(bootstrap, group, max_poll_records=500) as consumer:
        consumer.subscribe(FLOW)
        while not (records := consumer.poll(0.5)):
            pass
        t0 = time.perf_counter()
        got = len(records)
        while got < count:
            got += len(consumer.poll(0.5))
        consumer.commit_sync()
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_options(parser, "6 s per processing run, 20,000 records read; under a minute")
    parser.add_argument("--dir", help="where the brokers keep data (default: a real disk)")
    args = parser.parse_args(argv)
    kill_on_exit()
    seconds = 6.0 if args.quick else 20.0
    plain = 20_000 if args.quick else 200_000
    work_records = int(SHARE_MEMBERS / PROCESS_S * seconds * 1.5)
    data = disk_tempdir("share-bench-", args.dir)
    cluster = LocalCluster(data, local_spec(3, {WORK: 1, FLOW: 1}))
    add_cleanup(cluster.close)
    cluster.start()
    cluster.wait_for_leaders(timeout=60, preferred=True)
    bootstrap = tuple(cluster.addresses)
    print(f"data: {data}; {RECORD_BYTES} B records, acks=all, 3 replicas")
    say(f"producing {work_records:,} records to {WORK} and {plain:,} to {FLOW}")
    produce(bootstrap, WORK, work_records)
    produce(bootstrap, FLOW, plain)

    say(f"processing, {PROCESS_S * 1000:.0f} ms per record: one consumer-group member")
    cg_done = group_processing(bootstrap, seconds)
    say(f"processing: {SHARE_MEMBERS} share consumers")
    share_done = share_processing(bootstrap, seconds, SHARE_MEMBERS)
    say("plain throughput: a consumer-group member, then a share consumer")
    cg_s = group_read(bootstrap, plain)
    share_s = share_read(bootstrap, plain)

    cg_rate, share_rate = cg_done / seconds, share_done / seconds
    processing_ratio = share_rate / cg_rate if cg_rate else 0.0
    plain_ratio = cg_s / share_s
    figures: dict[str, Any] = {
        "quick": args.quick,
        "seconds": seconds,
        "process_ms": PROCESS_S * 1000,
        "share_members": SHARE_MEMBERS,
        "group_processing_rec_per_s": cg_rate,
        "share_processing_rec_per_s": share_rate,
        "processing_ratio": processing_ratio,
        "processing_ok": processing_ratio >= TARGET_PROCESSING,
        "plain_records": plain,
        "group_read_rec_per_s": plain / cg_s,
        "share_read_rec_per_s": plain / share_s,
        "plain_ratio": plain_ratio,
        "plain_ok": plain_ratio >= TARGET_PLAIN,
    }
    print(f"\n{'phase':<34} {'consumer group':>15} {'share group':>12} {'ratio':>7}")
    print(
        f"{'processing, 10 ms/record, 1 part.':<34} {cg_rate:>13,.0f}/s {share_rate:>10,.0f}/s "
        f"{processing_ratio:>6.1f}x"
    )
    print(
        f"{'plain read, 1 partition':<34} {plain / cg_s:>13,.0f}/s {plain / share_s:>10,.0f}/s "
        f"{plain_ratio:>6.2f}x"
    )
    print(
        f"(records per second; processing: 1 consumer-group member vs {SHARE_MEMBERS} share "
        "consumers, each for the same time; plain: one reader each)"
    )
    for name, ratio, target in (
        ("processing", processing_ratio, TARGET_PROCESSING),
        ("plain read", plain_ratio, TARGET_PLAIN),
    ):
        verdict = "met" if ratio >= target else "MISSED"
        print(f"target: {name} share >= {target}x consumer group: {ratio:.2f}x ({verdict})")
    print(f"machine load average: {os.getloadavg()[0]:.2f}")
    print_json_last(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
