"""One member of a benchmark cluster, run as its own process by ``benchmarks/raft_bench.py``.

Each member is a real OS process so that the figures include everything a broker pays:
TCP on loopback, the kernel's fsync, and one GIL per node rather than three nodes sharing
one. The parent talks to it over a line protocol: one JSON command per stdin line, one
JSON reply per stdout line (``{"event": ..., "id": ...}``). Load is generated *inside* the
leader process, as a broker would receive produce requests, so the parent's own speed and
the pipe are never part of a measurement.

Two implementations speak the same protocol: ``raftmq`` (one :class:`RaftHost` with any
number of groups) and ``pysyncobj`` (the reference: one SyncObj with a journal file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import percentile

Reply = dict[str, Any]


def emit(obj: Reply) -> None:
    """Write one JSON line on stdout; flushed at once because the parent waits on it."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def percentiles(samples: list[float]) -> Reply:
    """p50/p99/p999/max in milliseconds of latencies given in seconds (nearest rank, as
    every bench here: :func:`benchmarks.harness.percentile`)."""
    if not samples:
        return {"n": 0}
    s = sorted(samples)
    n = len(s)

    def at(q: float) -> float:
        return round(percentile(s, q) * 1000, 3)

    return {
        "n": n,
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": round(s[-1] * 1000, 3),
        "mean_ms": round(sum(s) / n * 1000, 3),
    }


def cpu_seconds() -> float:
    """This process's user+system CPU time, all threads (fsync pool, pysyncobj's ticker)."""
    t = os.times()
    return t.user + t.system


def parse_peers(spec: str) -> dict[int, int]:
    """``1:4001,2:4002,3:4003`` -> {1: 4001, ...}."""
    out: dict[int, int] = {}
    for part in spec.split(","):
        node, port = part.split(":")
        out[int(node)] = int(port)
    return out


# --- raftmq ---------------------------------------------------------------------------------


class _Applied:
    """The state machine: counts applied entries, which is all a throughput test needs."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0

    def __call__(self, buf: bytes, applied_to: int) -> None:
        self.bytes += len(buf)
        self.calls += 1


async def _raftmq_main(args: argparse.Namespace) -> None:
    from raftmq.format import entry
    from raftmq.log.config import LogConfig
    from raftmq.raft.errors import NotLeaderError, ProposalDroppedError
    from raftmq.raft.host.host import RaftHost
    from raftmq.raft.host.tcp import TcpTransport
    from raftmq.raft.membership import Membership

    ports = parse_peers(args.ports)
    me = args.node
    peers = {p: ("127.0.0.1", port) for p, port in ports.items() if p != me}
    transport = TcpTransport(me, ("127.0.0.1", ports[me]), peers)
    host = RaftHost(me, transport, seed=me)
    members = Membership(frozenset(ports))
    log_config = LogConfig(segment_bytes=args.segment_bytes)
    applied = _Applied()
    names = [f"g{i}" for i in range(args.groups)]
    t0 = time.perf_counter()
    base = Path(args.dir)
    for name in names:
        host.open_group(name, base / name, members, log_config=log_config, apply=applied)
    opened = time.perf_counter() - t0
    await host.start()
    emit(
        {
            "event": "started",
            "impl": "raftmq",
            "node": me,
            "pid": os.getpid(),
            "open_seconds": round(opened, 3),
        }
    )

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def status() -> Reply:
        groups = host.groups.values()
        return {
            "node": me,
            "groups": len(host.groups),
            "leading": sum(1 for g in groups if g.is_leader),
            "with_leader": sum(1 for g in groups if g.leader != 0),
            "quiesced": sum(1 for g in groups if g.quiesced),
            "rounds": host.rounds,
            "fsyncs": host.fsyncs,
            "failed": repr(host.failed) if host.failed else None,
            "term_max": max((g.term for g in groups), default=0),
            "term_min": min((g.term for g in groups), default=0),
        }

    async def load(size: int, inflight: int, seconds: float, warmup: float) -> Reply:
        """``inflight`` workers each keep one proposal outstanding: a bounded window, like
        a broker with that many produce requests being served at once."""
        name = names[0]
        payload = entry.encode(os.urandom(size), record_count=1)
        completed = 0
        errors: list[str] = []
        lat: list[float] = []
        measuring = False
        stop = False

        async def worker() -> None:
            nonlocal completed
            while not stop:
                t = time.perf_counter()
                try:
                    await host.propose(name, payload).done
                except (NotLeaderError, ProposalDroppedError) as exc:
                    errors.append(repr(exc))
                    return
                completed += 1
                if measuring:
                    lat.append(time.perf_counter() - t)

        workers = [loop.create_task(worker()) for _ in range(inflight)]
        await asyncio.sleep(warmup)
        measuring = True
        c0, t0, cpu0 = completed, time.perf_counter(), cpu_seconds()
        r0, f0 = host.rounds, host.fsyncs
        await asyncio.sleep(seconds)
        c1, t1, cpu1 = completed, time.perf_counter(), cpu_seconds()
        r1, f1 = host.rounds, host.fsyncs
        measuring = False
        stop = True
        _done, pending = await asyncio.wait(workers, timeout=30)
        for task in pending:
            task.cancel()
        elapsed = t1 - t0
        n = c1 - c0
        return {
            "size": size,
            "inflight": inflight,
            "seconds": round(elapsed, 3),
            "entries": n,
            "entries_per_s": round(n / elapsed, 1),
            "mb_per_s": round(n * size / elapsed / 1e6, 3),
            "rounds_per_s": round((r1 - r0) / elapsed, 1),
            "fsyncs_per_s": round((f1 - f0) / elapsed, 1),
            "leader_cpu_pct": round((cpu1 - cpu0) / elapsed * 100, 1),
            "latency": percentiles(lat),
            "errors": errors[:5],
            "error_count": len(errors),
            "stuck_workers": len(pending),
        }

    async def latency(size: int, count: int, max_seconds: float, warmup: int) -> Reply:
        """One proposal at a time: the commit latency a lone producer with acks=all sees."""
        name = names[0]
        payload = entry.encode(os.urandom(size), record_count=1)
        lat: list[float] = []
        for _ in range(warmup):
            await asyncio.wait_for(host.propose(name, payload).done, 10)
        deadline = time.perf_counter() + max_seconds
        for _ in range(count):
            t = time.perf_counter()
            await asyncio.wait_for(host.propose(name, payload).done, 10)
            lat.append(time.perf_counter() - t)
            if t > deadline:
                break
        return {"size": size, **percentiles(lat)}

    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        reply: Reply = {"event": cmd["cmd"], "id": cmd.get("id")}
        try:
            if cmd["cmd"] == "status":
                reply.update(status())
            elif cmd["cmd"] == "load":
                reply.update(
                    await load(cmd["size"], cmd["inflight"], cmd["seconds"], cmd["warmup"])
                )
            elif cmd["cmd"] == "open":
                # More groups after start: a broker that creates partitions over time
                # rather than all in the same instant.
                t = time.perf_counter()
                for i in range(cmd["start"], cmd["start"] + cmd["count"]):
                    name = f"g{i}"
                    if name not in host.groups:
                        names.append(name)
                        host.open_group(
                            name, base / name, members, log_config=log_config, apply=applied
                        )
                        # Opening a log fsyncs its checkpoints on the event loop: yield after
                        # each one, or a batch stalls pings long enough (> dead_after_s) for the
                        # peers to declare this node dead and wake every quiesced group.
                        await asyncio.sleep(0)
                reply["open_seconds"] = round(time.perf_counter() - t, 3)
            elif cmd["cmd"] == "latency":
                reply.update(
                    await latency(
                        cmd["size"], cmd["count"], cmd["max_seconds"], cmd.get("warmup", 20)
                    )
                )
            elif cmd["cmd"] == "quit":
                emit(reply)
                break
            else:
                reply["error"] = f"unknown command {cmd['cmd']!r}"
        except Exception as exc:  # the parent must hear about it, not time out
            reply["error"] = repr(exc)
        emit(reply)
    await asyncio.wait_for(host.stop(), 10)


# --- pysyncobj ------------------------------------------------------------------------------


def _pysyncobj_main(args: argparse.Namespace) -> None:
    """The reference: pysyncobj's own threads, its journal file, its callback API."""
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

    class Counter(SyncObj):  # type: ignore[misc]
        """The replicated state: how many commands and bytes were applied."""

        def __init__(self, me: str, partners: list[str], conf: SyncObjConf) -> None:
            super().__init__(me, partners, conf)
            self.count = 0
            self.bytes = 0

        @replicated  # type: ignore[misc]
        def append(self, data: bytes) -> None:
            self.count += 1
            self.bytes += len(data)

    ports = parse_peers(args.ports)
    me = args.node
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    conf = SyncObjConf(
        journalFile=str(base / "journal"),
        fullDumpFile=str(base / "dump"),
        dynamicMembershipChange=False,
        # Up to 1 MiB of commands per AppendEntries, like raftmq's max_append_bytes. The
        # default (64 KiB) sends every 64 KiB command through pysyncobj's chunked
        # "transmission" path, which breaks under pipelining (followers die on EOFError
        # in pickle.loads and the leader stalls), so the default would not measure anything.
        appendEntriesBatchSizeBytes=1 << 20,
        # pysyncobj's defaults (0.1 s, 0.05 s) unless the bench is asked to tune them.
        appendEntriesPeriod=float(os.environ.get("RAFT_BENCH_REF_APPEND_PERIOD", "0.1")),
        autoTickPeriod=float(os.environ.get("RAFT_BENCH_REF_TICK", "0.05")),
    )
    obj = Counter(
        f"127.0.0.1:{ports[me]}",
        [f"127.0.0.1:{p}" for n, p in ports.items() if n != me],
        conf,
    )
    emit(
        {
            "event": "started",
            "impl": "pysyncobj",
            "node": me,
            "pid": os.getpid(),
            "open_seconds": 0.0,
        }
    )

    def status() -> Reply:
        return {
            "node": me,
            "groups": 1,
            "leading": int(obj._isLeader()),
            "with_leader": int(obj._getLeader() is not None),
            "quiesced": 0,
            "ready": obj.isReady(),
        }

    def load(size: int, inflight: int, seconds: float, warmup: float) -> Reply:
        """The same bounded window as raftmq's, with a semaphore released by the callback
        (which pysyncobj runs on its ticker thread)."""
        payload = os.urandom(size)
        sem = threading.BoundedSemaphore(inflight)
        state = {"completed": 0, "measuring": False}
        errors: list[int] = []
        lat: list[float] = []
        lock = threading.Lock()

        def on_done(t: float) -> Callable[[Any, int], None]:
            def cb(result: Any, err: int) -> None:
                with lock:
                    if err == FAIL_REASON.SUCCESS:
                        state["completed"] += 1
                        if state["measuring"]:
                            lat.append(time.perf_counter() - t)
                    else:
                        errors.append(err)
                sem.release()

            return cb

        start = time.perf_counter()
        measure_at = start + warmup
        end_at = measure_at + seconds
        c0 = t0 = cpu0 = 0.0
        while True:
            now = time.perf_counter()
            if not state["measuring"] and now >= measure_at:
                with lock:
                    state["measuring"] = True
                    c0, t0, cpu0 = state["completed"], now, cpu_seconds()
            if now >= end_at or len(errors) > 100:
                break
            if sem.acquire(timeout=0.1):
                obj.append(payload, callback=on_done(time.perf_counter()))
        with lock:
            state["measuring"] = False
            c1, t1, cpu1 = state["completed"], time.perf_counter(), cpu_seconds()
        # Let the window drain so the next run starts clean.
        drained = 0
        drain_deadline = time.perf_counter() + 5  # lost callbacks are reported, not awaited
        while drained < inflight and time.perf_counter() < drain_deadline:
            if sem.acquire(timeout=0.5):
                drained += 1
        for _ in range(drained):
            sem.release()
        elapsed = t1 - t0
        n = int(c1 - c0)
        return {
            "size": size,
            "inflight": inflight,
            "seconds": round(elapsed, 3),
            "entries": n,
            "entries_per_s": round(n / elapsed, 1),
            "mb_per_s": round(n * size / elapsed / 1e6, 3),
            "leader_cpu_pct": round((cpu1 - cpu0) / elapsed * 100, 1),
            "latency": percentiles(lat),
            "errors": errors[:5],
            "error_count": len(errors),
            "stuck_workers": inflight - drained,
        }

    def latency(size: int, count: int, max_seconds: float, warmup: int) -> Reply:
        payload = os.urandom(size)
        lat: list[float] = []
        for _ in range(warmup):
            obj.append(payload, sync=True, timeout=10)
        deadline = time.perf_counter() + max_seconds
        for _ in range(count):
            t = time.perf_counter()
            obj.append(payload, sync=True, timeout=10)
            lat.append(time.perf_counter() - t)
            if t > deadline:
                break
        return {"size": size, **percentiles(lat)}

    for line in sys.stdin:
        cmd = json.loads(line)
        reply: Reply = {"event": cmd["cmd"], "id": cmd.get("id")}
        try:
            if cmd["cmd"] == "status":
                reply.update(status())
            elif cmd["cmd"] == "load":
                reply.update(load(cmd["size"], cmd["inflight"], cmd["seconds"], cmd["warmup"]))
            elif cmd["cmd"] == "latency":
                reply.update(
                    latency(cmd["size"], cmd["count"], cmd["max_seconds"], cmd.get("warmup", 20))
                )
            elif cmd["cmd"] == "quit":
                emit(reply)
                break
            else:
                reply["error"] = f"unknown command {cmd['cmd']!r}"
        except Exception as exc:
            reply["error"] = repr(exc)
        emit(reply)
    obj.destroy()
    os._exit(0)  # pysyncobj's threads need not be joined: the data directory is thrown away


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", choices=("raftmq", "pysyncobj"), required=True)
    parser.add_argument("--node", type=int, required=True)
    parser.add_argument("--ports", required=True, help="1:port,2:port,3:port")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--segment-bytes", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    switch = os.environ.get("RAFT_BENCH_SWITCH_INTERVAL")
    if switch:
        # Diagnostic knob: how long a thread returning from fsync may wait for the GIL
        # while the event loop runs Python code (CPython's default is 5 ms).
        sys.setswitchinterval(float(switch))
    if args.impl == "raftmq":
        asyncio.run(_raftmq_main(args))
    else:
        _pysyncobj_main(args)


if __name__ == "__main__":
    main()
