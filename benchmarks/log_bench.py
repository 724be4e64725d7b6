"""Segmented-log benchmark: ``raftmq.log.Log`` against a plain ``os.write``/``os.pread`` loop
on the same disk, with the same fsync policy, in one run.

Why a reference in the same run: absolute MB/s depend on the disk, the page cache and
whoever else shares the machine; the ratio ours / plain-file, measured seconds apart on the
same file system, mostly does not. The plain loop does one syscall per batch with no
validation and no index, so 1.0 means "free"; the log can beat it on small appends
without fsync because it hands up to 64 KiB of them to the kernel in one ``pwritev``
(``LogConfig.write_behind_bytes``).

Phases:

1. append: 1 KiB records in 16 KiB and 64 KiB batches, each batch one entry built with
   ``entry.encode`` before the timed loop, appended as the Raft host appends them:
   ``crc_checked=True``, because a broker checks each batch's CRC once at its trust
   boundary (the produce edge, or a follower's check of its leader's append) and the log
   then checks framing, contiguity and terms but does not recompute it. With fsync per
   batch (the log under ``FlushPolicy.EVERY_BATCH``, the reference calling
   ``os.fdatasync`` after each write) and without (``FlushPolicy.INTERVAL`` with no timer,
   the reference never syncing).
2. sequential read (over two segments): ``log.read`` from offset 0 to the end with
   ``max_bytes`` = 1 MiB, against
   ``os.pread`` of 1 MiB chunks of a plain file of the same size; for the log just written
   (its bytes were CRC-checked on append) and after a reopen (the first read of closed
   segments verifies CRCs, so its reference is ``os.pread`` plus one ``crc32c`` pass over
   each chunk: the least a reader that checks what it reads must do; the ratio to a plain
   ``os.pread`` is printed beside it).
3. group commit: 1000 threads append one entry each under ``EVERY_BATCH`` (racing for the
   end, so appends and fsyncs overlap), and, separately, 1000 threads that appended under
   ``INTERVAL`` all calling ``flush()`` at once; how many fdatasyncs served them.

Targets: append and read >= 0.8x the reference; 1000 waiters served by a handful of fsyncs.

Usage: ``python -m benchmarks.log_bench [--quick] [--json] [--dir DIR]``. ``--quick`` keeps
the run under a minute; ``--json`` prints every figure and ratio as one JSON object on the
last line; ``--dir`` picks where the files go (default: a temporary folder on a real disk,
chosen by ``benchmarks.harness.disk_tempdir``: /tmp is often tmpfs, where fsync costs nothing
and the comparison lies).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

import raftmq.log.log as log_module
from benchmarks.harness import (
    add_run_options,
    disk_tempdir,
    filesystem_of,
    print_json_last,
)
from raftmq.broker.runtime import tune_malloc
from raftmq.format import entry
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import NotContiguousError
from raftmq.log.log import Log

KIB = 1024
MIB = 1024 * KIB
RECORD = 1 * KIB
TARGET_RATIO = 0.8


# --- building input ----------------------------------------------------------------------


def build_batches(total_bytes: int, batch_bytes: int) -> list[bytes]:
    """Entries of ``batch_bytes // 1 KiB`` records each, stamped for an empty log."""
    records = batch_bytes // RECORD
    payload = os.urandom(records * RECORD)
    count = max(1, total_bytes // len(payload))
    out = []
    offset = 0
    for i in range(count):
        out.append(
            entry.encode(
                payload,
                index=i + 1,
                term=1,
                base_offset=offset,
                record_count=records,
                first_timestamp=1,
                max_timestamp=1,
            )
        )
        offset += records
    return out


# --- timing ------------------------------------------------------------------------------


class Timing(NamedTuple):
    wall: float  # seconds
    cpu: float  # seconds of this process's CPU (all threads)


def timed(fn: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


@dataclass
class Row:
    """One comparison; MB/s by wall clock and by CPU time (CPU is steadier on a shared box,
    wall is what a user gets and the only meaningful one when fsync dominates)."""

    name: str
    nbytes: int
    ours: Timing
    ref: Timing
    detail: str = ""

    def mb_s(self, t: float) -> float:
        return self.nbytes / t / 1e6 if t > 0 else float("inf")

    @property
    def ratio(self) -> float:
        return self.ref.wall / self.ours.wall if self.ours.wall else 0.0

    @property
    def cpu_ratio(self) -> float:
        return self.ref.cpu / self.ours.cpu if self.ours.cpu else 0.0


def best_of_interleaved(runs: int, *fns: Callable[[], Timing]) -> list[Timing]:
    """Run the candidates in turn ``runs`` times so a burst of neighbours' I/O or writeback
    hits each alike; keep each one's fastest wall and CPU time (noise only adds time)."""
    results: list[list[Timing]] = [[] for _ in fns]
    for _ in range(runs):
        for acc, fn in zip(results, fns, strict=True):
            acc.append(fn())
    return [Timing(min(t.wall for t in acc), min(t.cpu for t in acc)) for acc in results]


def time_log_append(directory: Path, batches: list[bytes], fsync: bool) -> Timing:
    path = directory / "log"
    shutil.rmtree(path, ignore_errors=True)
    policy = FlushPolicy.EVERY_BATCH if fsync else FlushPolicy.INTERVAL
    log = Log.open(path, LogConfig(flush_policy=policy, max_message_bytes=1 * MIB))

    def loop() -> None:
        for b in batches:
            log.append(b, crc_checked=True)

    result = timed(loop)
    log.close()  # untimed flush: no dirty pages carried into the next run
    return result


def time_ref_append(directory: Path, batches: list[bytes], fsync: bool) -> Timing:
    path = directory / "plain.bin"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def loop() -> None:
        for b in batches:
            os.write(fd, b)
            if fsync:
                os.fdatasync(fd)

    result = timed(loop)
    os.fdatasync(fd)  # untimed, like the log's close: no dirty pages carried into the next run
    os.close(fd)
    return result


def read_log(log: Log) -> int:
    offset, total = 0, 0
    while offset < log.next_offset:
        result = log.read(offset, 1 * MIB)
        total += len(result.data)
        offset = result.next_offset
    return total


def read_ref(path: Path, *, checksum: bool = False) -> int:
    """Plain 1 MiB reads; with ``checksum``, also one CRC32C pass over each read, the least
    that any reader which checks what it reads from disk must add."""
    fd = os.open(path, os.O_RDONLY)
    position = 0
    try:
        while True:
            chunk = os.pread(fd, 1 * MIB, position)
            if not chunk:
                return position
            if checksum:
                crc32c(chunk)
            position += len(chunk)
    finally:
        os.close(fd)


# --- group commit ------------------------------------------------------------------------


class FsyncCounter:
    def __init__(self) -> None:
        self.calls = 0
        self.real = os.fdatasync
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls += 1
        self.real(fd)


def group_commit(directory: Path, waiters: int, policy: FlushPolicy) -> dict[str, float]:
    """``waiters`` threads each get one 1 KiB entry durable; count the fdatasyncs."""
    path = directory / f"gc-{policy.value}"
    log = Log.open(path, LogConfig(flush_policy=policy))
    counter = FsyncCounter()
    log_module.os.fdatasync = counter  # type: ignore[assignment]  # os is shared: restored below
    barrier = threading.Barrier(waiters)
    appended = threading.Barrier(waiters)
    order = threading.Lock()
    payload = os.urandom(RECORD)

    def one() -> None:
        barrier.wait()
        if policy is FlushPolicy.INTERVAL:
            with order:
                log.append(
                    entry.encode(
                        payload,
                        index=log.next_index,
                        term=1,
                        base_offset=log.next_offset,
                        record_count=1,
                    )
                )
            appended.wait()  # then all 1000 ask for durability at once
            log.flush()
            return
        while True:  # race for the end; a lost race is refused before any write
            with log._lock:
                index, offset = log.next_index, log.next_offset
            e = entry.encode(payload, index=index, term=1, base_offset=offset, record_count=1)
            try:
                log.append(e)
                return
            except NotContiguousError:
                continue

    threads = [threading.Thread(target=one) for _ in range(waiters)]
    try:
        for t in threads:
            t.start()
        start = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        log_module.os.fdatasync = counter.real  # type: ignore[assignment]
    assert log.durable_index == waiters == log.last_index
    log.close()
    return {"waiters": waiters, "fsyncs": counter.calls, "seconds": elapsed}


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, "smaller sizes; under a minute")
    parser.add_argument("--dir", help="where to write (default: a temp folder on a real disk)")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's malloc defaults instead of the broker's settings",
    )
    args = parser.parse_args(argv)
    # Both sides run under the allocator settings a broker runs with (keep freed buffers in
    # the heap): with glibc's defaults, reads that keep one 1 MiB result alive while the
    # next is allocated fault fresh pages in each time, which measures malloc, not the log.
    malloc = "glibc defaults" if args.default_malloc or not tune_malloc() else "broker settings"

    nosync_total = 32 * MIB if args.quick else 256 * MIB
    sync_total = 2 * MIB if args.quick else 16 * MIB
    runs = 3 if args.quick else 5
    # fsync latency on a shared disk swings 10x from one second to the next: more, shorter
    # rounds give each side a fair chance at a quiet moment.
    sync_runs = 7 if args.quick else 9
    work = disk_tempdir("log-bench-", args.dir)
    mount, fstype, device = filesystem_of(work)
    print(f"directory: {work}")
    print(f"file system: {fstype} on {device} (mounted at {mount}); malloc: {malloc}")
    print(
        f"sizes: {nosync_total // MIB} MiB without fsync, {sync_total // MIB} MiB with fsync "
        f"per batch; best of {runs} ({sync_runs} with fsync); "
        f"log segment.bytes = {LogConfig().segment_bytes // MIB} MiB"
    )
    rows: list[Row] = []
    figures: dict[str, object] = {
        "directory": str(work),
        "filesystem": fstype,
        "device": device,
        "quick": args.quick,
        "malloc": malloc,
    }
    try:
        for batch in (16 * KIB, 64 * KIB):
            for fsync in (True, False):
                total = sync_total if fsync else nosync_total
                batches = build_batches(total, batch)
                nbytes = sum(len(b) for b in batches)
                ours, ref = best_of_interleaved(
                    sync_runs if fsync else runs,
                    lambda b=batches, f=fsync: time_log_append(work, b, f),
                    lambda b=batches, f=fsync: time_ref_append(work, b, f),
                )
                label = f"append {batch // KIB} KiB batches, " + (
                    "fsync each" if fsync else "no fsync"
                )
                policy = "EVERY_BATCH vs write+fdatasync" if fsync else "INTERVAL vs write"
                rows.append(Row(label, nbytes, ours, ref, f"{len(batches)} x {policy}"))

        # Sequential reads: a log and a plain file of the same bytes (64 KiB batches).
        batches = build_batches(nosync_total, 64 * KIB)
        nbytes = sum(len(b) for b in batches)
        time_ref_append(work, batches, fsync=False)
        shutil.rmtree(work / "log", ignore_errors=True)
        # Two segments (the default 128 MiB in a full run), so that half the bytes sit in a
        # closed segment in both modes: open checks only the active segment's CRCs, the
        # first read checks the closed one's.
        read_segment = max(MIB, nosync_total // 2)
        config = LogConfig(flush_policy=FlushPolicy.INTERVAL, segment_bytes=read_segment)
        writer = Log.open(work / "log", config)
        for b in batches:
            writer.append(b)
        writer.flush()
        # just written: the handle that appended (its bytes were CRC-checked on append)
        assert read_log(writer) == nbytes

        def reopened() -> Timing:
            start = time.perf_counter()
            fresh = Log.open(work / "log", config)
            figures.setdefault("reopen_open_seconds", time.perf_counter() - start)
            result = timed(lambda: read_log(fresh))
            fresh.close()
            return result

        # A quick run reads 32 MiB in a few ms: more rounds, so that one quiet moment each
        # is likely (the best time of each side counts).
        warm, reopen, ref, ref_checked = best_of_interleaved(
            15 if args.quick else runs,
            lambda: timed(lambda: read_log(writer)),
            reopened,
            lambda: timed(lambda: read_ref(work / "plain.bin")),
            lambda: timed(lambda: read_ref(work / "plain.bin", checksum=True)),
        )
        writer.close()
        rows.append(
            Row(
                "read 1 MiB, log just written",
                nbytes,
                warm,
                ref,
                f"{nbytes // MIB} MiB in {read_segment // MIB} MiB segments, from page cache "
                "vs os.pread",
            )
        )
        rows.append(
            Row(
                "read 1 MiB, first read after reopen",
                nbytes,
                reopen,
                ref_checked,
                "open excluded; checks each entry's CRC once, vs os.pread + crc32c "
                f"({reopen.wall and ref.wall / reopen.wall:.2f}x plain os.pread)",
            )
        )

        gc_batch = group_commit(work, 1000, FlushPolicy.EVERY_BATCH)
        gc_flush = group_commit(work, 1000, FlushPolicy.INTERVAL)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    width = max(len(r.name) for r in rows)
    print()
    print(
        f"{'phase':<{width}}  {'ours MB/s':>9}  {'plain MB/s':>10}  {'ratio':>6}  "
        f"{'target':<6}  {'cpu ratio':>9}  detail"
    )
    for r in rows:
        ok = "ok" if r.ratio >= TARGET_RATIO else "BELOW"
        print(
            f"{r.name:<{width}}  {r.mb_s(r.ours.wall):>9.1f}  {r.mb_s(r.ref.wall):>10.1f}  "
            f"{r.ratio:>5.2f}x  {ok:<6}  {r.cpu_ratio:>8.2f}x  {r.detail}"
        )
    print(
        "ratio = ours / plain by wall clock (target >= 0.8); cpu ratio = the same by this "
        "process's CPU time, steadier on a shared machine."
    )
    print()
    for name, gc in (
        ("append, EVERY_BATCH", gc_batch),
        ("append, then 1000 x flush(), INTERVAL", gc_flush),
    ):
        print(
            f"group commit ({name}): {gc['waiters']:.0f} waiters served by {gc['fsyncs']:.0f} "
            f"fdatasyncs in {gc['seconds'] * 1000:.0f} ms "
            f"({gc['waiters'] / max(gc['fsyncs'], 1):.0f} waiters per fsync)"
        )
    for r in rows:
        key = r.name.replace(",", "").replace(" ", "_")
        figures[key] = {
            "ours_mb_s": r.mb_s(r.ours.wall),
            "ref_mb_s": r.mb_s(r.ref.wall),
            "ratio": r.ratio,
            "ours_cpu_s": r.ours.cpu,
            "ref_cpu_s": r.ref.cpu,
            "cpu_ratio": r.cpu_ratio,
        }
    figures["group_commit_every_batch"] = gc_batch
    figures["group_commit_flush"] = gc_flush
    if args.json:
        print_json_last(figures, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
