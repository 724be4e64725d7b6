"""Raft replication benchmark: three real processes on loopback, fsync on every commit.

Why real processes: a Raft group's cost is the network round, the fsync and the Python work
around them, and three nodes in one interpreter would share a GIL the real deployment does
not share. Why pysyncobj in the same run: absolute numbers depend on the machine and its
disk, a ratio against a known Python Raft measured a minute earlier mostly does not.

Phases:

1. throughput of one group, 64 KiB and 1 KiB entries, load generated inside the leader with a
   bounded number of proposals in flight;
2. commit latency with one proposal in flight (1 KiB);
3. the same throughput work on pysyncobj (skipped, with install instructions, if missing);
4. idle cost: N groups on the same 3 processes, CPU per process once every group has a
   leader and has quiesced. The groups are first opened all at once (a cluster restart);
   if that does not settle in time it is reported and they are opened 100 at a time.

raftmq and pysyncobj are measured alternately per entry size, each on a fresh cluster, and
every window records how much CPU the rest of the machine used: on a shared box that figure
says how far the absolute numbers can be trusted.

Usage: ``python -m benchmarks.raft_bench [--quick] [--json]``; ``--json`` prints every
figure as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from benchmarks.harness import (
    REPO,
    add_run_options,
    disk_tempdir,
    kill_all,
    kill_group,
    kill_on_exit,
    print_json_last,
    track,
    untrack,
)
from raftmq.devtools.ports import PortReservations, Reuse

KIB = 1024
MIB = 1024 * 1024
NODES = (1, 2, 3)
TARGET_MB_RATIO = 20.0
TARGET_IDLE_CPU_PCT = 5.0

Reply = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """Durations and sizes of one run; ``--quick`` trades precision for a ~1 minute run."""

    quick: bool
    warmup: float
    seconds: float
    inflight: int
    latency_count: int
    latency_max_seconds: float
    ref_latency_count: int
    idle_groups: int
    idle_settle: float
    idle_measure: float
    idle_timeout: float
    idle_batch: int

    @classmethod
    def make(cls, quick: bool, inflight: int, groups: int | None) -> Plan:
        if quick:
            return cls(True, 1.0, 3.0, inflight, 1000, 5.0, 100, groups or 300, 3.0, 5.0, 45.0, 100)
        return cls(
            False, 2.0, 10.0, inflight, 5000, 30.0, 300, groups or 1000, 12.0, 10.0, 90.0, 100
        )


# --- processes ------------------------------------------------------------------------------


class NodeProc:
    """One member process and its stdout, read by a thread so every wait has a timeout."""

    def __init__(
        self,
        impl: str,
        node: int,
        ports: dict[int, int],
        directory: Path,
        groups: int,
        segment_bytes: int,
    ) -> None:
        self.node = node
        self.impl = impl
        spec = ",".join(f"{n}:{p}" for n, p in ports.items())
        directory.mkdir(parents=True, exist_ok=True)
        self.stderr_path = directory.parent / f"{impl}-{node}.stderr"
        self._stderr: TextIO = open(self.stderr_path, "w")  # noqa: SIM115 - closed in kill()
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.raft_bench_node",
                "--impl",
                impl,
                "--node",
                str(node),
                "--ports",
                spec,
                "--dir",
                str(directory),
                "--groups",
                str(groups),
                "--segment-bytes",
                str(segment_bytes),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=REPO,
            env=env,
            text=True,
            start_new_session=True,
        )
        track(self.proc)
        self.pid = self.proc.pid
        self._lines: queue.Queue[Reply | None] = queue.Queue()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    self._lines.put(json.loads(line))
        self._lines.put(None)

    def wait_event(self, event: str, timeout: float, id_: int | None = None) -> Reply:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.impl} node {self.node}: no {event!r} in {timeout}s{self._stderr_tail()}"
                )
            try:
                msg = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                raise RuntimeError(
                    f"{self.impl} node {self.node} exited "
                    f"(rc={self.proc.poll()}){self._stderr_tail()}"
                )
            if msg.get("event") == event and (id_ is None or msg.get("id") == id_):
                if "error" in msg:
                    raise RuntimeError(f"{self.impl} node {self.node}: {msg['error']}")
                return msg

    def request(self, cmd: str, timeout: float, **kw: Any) -> Reply:
        self._next_id += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, "id": self._next_id, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.wait_event(cmd, timeout, self._next_id)

    def cpu_ticks(self) -> int:
        """utime + stime of the process (all threads), in clock ticks, from /proc."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            tail = self.stderr_path.read_text()[-2000:]
            if tail.strip():
                return f"\n--- stderr of {self.impl} node {self.node} ---\n{tail}"
        return ""

    def ask_to_quit(self) -> None:
        """Send ``quit`` without waiting, so that all members shut down in parallel."""
        with contextlib.suppress(Exception):
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()

    def stop(self, grace: float = 10) -> None:
        """Ask politely, then kill the whole session; never leaves a process behind."""
        self.ask_to_quit()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=grace)
        if self.proc.poll() is None:
            kill_group(self.proc)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
        untrack(self.proc)
        self._stderr.close()


@contextlib.contextmanager
def cluster(
    impl: str, root: Path, *, groups: int = 1, segment_bytes: int = 128 * MIB, tag: str = ""
) -> Iterator[dict[int, NodeProc]]:
    """Three fresh members with their own data directories; always torn down (the data is
    removed with the run's root directory)."""
    # Held until the members are gone (raftmq.devtools.ports); SO_REUSEADDR is what both
    # implementations' listeners set (asyncio's default; pysyncobj's own).
    reserved = PortReservations(reuse=Reuse.ADDR)
    ports = {n: reserved.take() for n in NODES}
    base = root / f"{impl}-{groups}{tag}"
    nodes: dict[int, NodeProc] = {}
    try:
        for n in NODES:
            nodes[n] = NodeProc(impl, n, ports, base / f"n{n}", groups, segment_bytes)
        for node in nodes.values():
            node.wait_event("started", timeout=120)
        yield nodes
    finally:
        for node in nodes.values():
            node.ask_to_quit()
        for node in nodes.values():
            node.stop()
        reserved.close()
        # The data stays until the end of the run: deleting thousands of files on a disk
        # mounted with online discard takes seconds of I/O that would disturb the next phase.


def find_leader(nodes: dict[int, NodeProc], timeout: float = 30) -> NodeProc:
    """Poll the members until exactly one says it leads the (single) group."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders = [n for n in nodes.values() if n.request("status", timeout=10)["leading"]]
        if len(leaders) == 1:
            return leaders[0]
        time.sleep(0.2)
    raise TimeoutError(f"no single leader within {timeout}s")


# --- phases ---------------------------------------------------------------------------------


def system_busy_ticks() -> int:
    """CPU ticks spent busy by the whole machine (every core), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle_, iowait = fields[3], fields[4] if len(fields) > 4 else 0
    return sum(fields[:8]) - idle_ - iowait


class Contention:
    """What the rest of the machine did during a window, in % of one core: a benchmark on
    a shared 2-core box is only as good as this figure is small."""

    def __init__(self, nodes: dict[int, NodeProc]) -> None:
        self.nodes = nodes
        self.t0 = time.monotonic()
        self.sys0 = system_busy_ticks()
        self.ours0 = sum(n.cpu_ticks() for n in nodes.values())

    def finish(self) -> Reply:
        elapsed = time.monotonic() - self.t0
        hz = os.sysconf("SC_CLK_TCK")
        ours = sum(n.cpu_ticks() for n in self.nodes.values()) - self.ours0
        others = system_busy_ticks() - self.sys0 - ours
        return {
            "cluster_cpu_pct": round(ours / hz / elapsed * 100, 1),
            "other_cpu_pct": round(max(0, others) / hz / elapsed * 100, 1),
            "loadavg_1m": float(Path("/proc/loadavg").read_text().split()[0]),
            "cores": os.cpu_count(),
        }


def throughput(impl: str, label: str, size: int, root: Path, plan: Plan, log: TextIO) -> Reply:
    """One entry size on a fresh cluster, so that one run's aftermath (pysyncobj loses
    leadership under 64 KiB load) cannot leak into the next; 1 KiB latency is measured on
    the 1 KiB cluster before its load."""
    out: Reply = {}
    with cluster(impl, root, tag=label) as nodes:
        leader = find_leader(nodes)
        if label == "1k":
            if impl == "raftmq":
                count, cap, warm = plan.latency_count, plan.latency_max_seconds, 50
            else:
                count, cap, warm = plan.ref_latency_count, plan.latency_max_seconds / 2, 5
            busy = Contention(nodes)
            lat = leader.request(
                "latency", timeout=cap + 120, size=KIB, count=count, max_seconds=cap, warmup=warm
            )
            lat["machine"] = busy.finish()
            out["latency_1k"] = lat
            print(
                f"  {impl} latency 1k: p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms"
                f" (rest of machine {lat['machine']['other_cpu_pct']:.0f}% of a core)",
                file=log,
                flush=True,
            )
        busy = Contention(nodes)
        r = leader.request(
            "load",
            timeout=plan.warmup + plan.seconds + 90,
            size=size,
            inflight=plan.inflight,
            seconds=plan.seconds,
            warmup=plan.warmup,
        )
        r["machine"] = busy.finish()
        r["leader_node"] = leader.node
        out[f"throughput_{label}"] = r
        print(
            f"  {impl} {label}: {r['entries_per_s']:.0f} entries/s {r['mb_per_s']:.2f} MB/s"
            f" (leader node {leader.node}, {r['error_count']} failed, rest of machine "
            f"{r['machine']['other_cpu_pct']:.0f}% of a core)",
            file=log,
            flush=True,
        )
    return out


def wait_settled(nodes: dict[int, NodeProc], n: int, timeout: float) -> tuple[bool, list[Reply]]:
    """Until each of the first ``n`` groups has one leader and every member has quiesced
    it; False with the last statuses when ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        sts = [node.request("status", timeout=60) for node in nodes.values()]
        if sum(s["leading"] for s in sts) == n and all(
            s["with_leader"] == n and s["quiesced"] == n for s in sts
        ):
            return True, sts
        if time.monotonic() > deadline:
            return False, sts
        time.sleep(0.5)


def _terms(sts: list[Reply]) -> dict[int, list[int]]:
    return {s["node"]: [s["term_min"], s["term_max"]] for s in sts}


def _measure_idle(nodes: dict[int, NodeProc], sts: list[Reply], plan: Plan) -> Reply:
    """CPU of each member over a quiet window, after a settling pause."""
    time.sleep(plan.idle_settle)
    hz = os.sysconf("SC_CLK_TCK")
    busy = Contention(nodes)
    before = {k: node.cpu_ticks() for k, node in nodes.items()}
    m0 = time.monotonic()
    time.sleep(plan.idle_measure)
    after = {k: node.cpu_ticks() for k, node in nodes.items()}
    elapsed = time.monotonic() - m0
    machine = busy.finish()
    cpu = {k: round((after[k] - before[k]) / hz / elapsed * 100, 2) for k in nodes}
    end = [node.request("status", timeout=60) for node in nodes.values()]
    return {
        "leaders_per_node": {s["node"]: s["leading"] for s in sts},
        "cpu_pct": cpu,
        "cpu_pct_max": max(cpu.values()),
        "quiesced_after": {s["node"]: s["quiesced"] for s in end},
        "rounds_during_settle_and_measure": {
            s["node"]: s["rounds"] - b["rounds"] for s, b in zip(end, sts, strict=True)
        },
        "measure_s": round(elapsed, 1),
        "machine": machine,
    }


def idle(root: Path, plan: Plan, log: TextIO) -> Reply:
    """N groups on the 3 members, all quiesced, then CPU per process over a quiet window.

    First every group is opened at once (a whole-cluster restart). If that does not settle
    within the timeout - all groups of a host then campaign in lockstep and each election
    round costs N hard-state fsyncs - the attempt is reported and the groups are opened in
    batches instead, so that the idle cost is still measured.
    """
    n = plan.idle_groups
    out: Reply = {"groups": n}
    t0 = time.monotonic()
    with cluster("raftmq", root, groups=n, segment_bytes=1 * MIB, tag="-at-once") as nodes:
        started = time.monotonic() - t0
        ok, sts = wait_settled(nodes, n, plan.idle_timeout)
        attempt: Reply = {
            "settled": ok,
            "startup_s": round(started, 1),
            "settle_s": round(time.monotonic() - t0, 1) if ok else None,
            "timeout_s": plan.idle_timeout,
            "terms": _terms(sts),
            "hardstate_and_log_fsyncs": {s["node"]: s["fsyncs"] for s in sts},
            "groups_led": sum(s["leading"] for s in sts),
        }
        out["at_once"] = attempt
        print(
            f"  {n} groups opened at once: processes up in {started:.1f}s, "
            + (
                f"all led and quiesced after {attempt['settle_s']}s"
                if ok
                else f"NOT settled after {plan.idle_timeout:.0f}s more: "
                f"{attempt['groups_led']} led, terms {attempt['terms']}"
            ),
            file=log,
            flush=True,
        )
        if ok:
            out.update(_measure_idle(nodes, sts, plan))
            out["opened"] = "at once"
            return out
    return _idle_staggered(root, plan, log, out)


def _idle_staggered(root: Path, plan: Plan, log: TextIO, out: Reply) -> Reply:
    """Open the groups ``plan.idle_batch`` at a time, each batch settled before the next."""
    n = plan.idle_groups
    batch = plan.idle_batch
    t0 = time.monotonic()
    with cluster("raftmq", root, groups=0, segment_bytes=1 * MIB, tag="-staggered") as nodes:
        for start in range(0, n, batch):
            count = min(batch, n - start)
            for node in nodes.values():
                node.request("open", timeout=120, start=start, count=count)
            ok, sts = wait_settled(nodes, start + count, plan.idle_timeout)
            if not ok:
                out["staggered"] = {"settled": False, "groups": start + count, "terms": _terms(sts)}
                print(
                    f"  staggered open did not settle at {start + count} groups",
                    file=log,
                    flush=True,
                )
                return out
        settled = round(time.monotonic() - t0, 1)
        out["staggered"] = {"settled": True, "batch": batch, "settle_s": settled}
        print(
            f"  {n} groups opened {batch} at a time: all led and quiesced after {settled}s",
            file=log,
            flush=True,
        )
        out.update(_measure_idle(nodes, sts, plan))
        out["opened"] = f"{batch} at a time"
    return out


# --- report ---------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def _throughput_lines(rm: Reply, ref: Reply | None) -> list[str]:
    lines = [f"{'throughput':<24}{'raftmq':>20}{'pysyncobj':>20}{'ratio':>10}"]
    for label in ("64k", "1k"):
        a = rm[f"throughput_{label}"]
        b = ref[f"throughput_{label}"] if ref else None
        for key, unit, fmt in (
            ("entries_per_s", "entries/s", "{:.0f}"),
            ("mb_per_s", "MB/s", "{:.2f}"),
        ):
            bv = b[key] if b else None
            r = ratio(a[key], bv)
            lines.append(
                f"{label + ' ' + unit:<24}{fmt.format(a[key]):>20}"
                f"{(fmt.format(bv) if bv is not None else 'skipped'):>20}"
                f"{(f'{r:.1f}x' if r is not None else '-'):>10}"
            )
        la, lb = a["latency"], (b["latency"] if b else None)
        lines.append(
            f"{label + ' p50/p99 under load':<24}{_pair(la):>20}"
            + (f"{_pair(lb):>20}" if lb is not None else "")
        )
        lines.append(
            f"{label + ' leader CPU %':<24}{a['leader_cpu_pct']:>20.0f}"
            + (f"{b['leader_cpu_pct']:>20.0f}" if b else "")
        )
        lines.append(
            f"{label + ' other procs CPU %':<24}{a['machine']['other_cpu_pct']:>20.0f}"
            + (f"{b['machine']['other_cpu_pct']:>20.0f}" if b else "")
        )
        if b and (b["error_count"] or b["stuck_workers"]):
            lines.append(
                f"{label + ' failed proposals':<24}{a['error_count']:>20}"
                f"{b['error_count']:>20}   (pysyncobj codes {sorted(set(b['errors']))})"
            )
    lines.append(
        f"{'raftmq rounds/fsyncs/s':<24}"
        f"{'64k ' + _rf(rm['throughput_64k']):>20}{'1k ' + _rf(rm['throughput_1k']):>20}"
    )
    return lines


def _pair(lat: Reply) -> str:
    if not lat.get("n"):
        return "-"
    return f"{lat['p50_ms']:.1f} / {lat['p99_ms']:.1f} ms"


def _rf(r: Reply) -> str:
    return f"{r['rounds_per_s']:.0f}/{r['fsyncs_per_s']:.0f}"


def _latency_lines(rm: Reply, ref: Reply | None) -> list[str]:
    la, lb = rm["latency_1k"], (ref["latency_1k"] if ref else None)
    lines = [
        f"{'commit latency, 1 KiB, 1 in flight':<36}{'p50':>8}{'p99':>8}{'p999':>8}"
        f"{'max':>8}{'n':>7}  (ms)"
    ]
    for name, lat in (("raftmq", la), ("pysyncobj", lb)):
        if lat and lat.get("n"):
            lines.append(
                f"{name:<36}{lat['p50_ms']:>8.2f}{lat['p99_ms']:>8.2f}"
                f"{lat['p999_ms']:>8.2f}{lat['max_ms']:>8.2f}{lat['n']:>7}"
            )
    if lb and lb.get("n"):
        lines.append(f"{'p50 ratio pysyncobj/raftmq':<36}{ratio(lb['p50_ms'], la['p50_ms']):>7}x")
    return lines


def _idle_lines(idle_r: Reply) -> list[str]:
    n, once = idle_r["groups"], idle_r["at_once"]
    lines = [f"idle: {n} groups on each of 3 processes"]
    if once["settled"]:
        lines.append(
            f"  opened at once: every group led and quiesced {once['settle_s']}s after start "
            f"(processes up in {once['startup_s']}s)"
        )
    else:
        lines.append(
            f"  opened at once: NO SETTLE - {once['groups_led']} of {n} groups led after "
            f"{once['timeout_s']:.0f}s (processes up in {once['startup_s']}s); terms per node "
            f"[min, max] {once['terms']}, hard-state+log fsync calls "
            f"{once['hardstate_and_log_fsyncs']}"
        )
        st = idle_r.get("staggered")
        if st and st["settled"]:
            lines.append(
                f"  opened {st['batch']} at a time instead: all led and quiesced after "
                f"{st['settle_s']}s"
            )
        elif st:
            lines.append(f"  staggered open also failed at {st['groups']} groups")
    if "cpu_pct" not in idle_r:
        lines.append("  CPU not measured (no settled cluster)")
        return lines
    ok = idle_r["cpu_pct_max"] < TARGET_IDLE_CPU_PCT
    lines += [
        f"  leaders per node {idle_r['leaders_per_node']}",
        f"  CPU % of one core over {idle_r['measure_s']}s: "
        + ", ".join(f"node {k}: {v:.2f}%" for k, v in idle_r["cpu_pct"].items())
        + f"   (target < {TARGET_IDLE_CPU_PCT:.0f}%: {'met' if ok else 'MISSED'}; "
        f"other processes meanwhile: {idle_r['machine']['other_cpu_pct']:.0f}% of a core)",
        "  Raft rounds per node during settle+measure: "
        f"{idle_r['rounds_during_settle_and_measure']}",
    ]
    return lines


def table(results: Reply, plan: Plan) -> str:
    """The human summary; every figure is also in the JSON object."""
    rm, ref = results.get("raftmq"), results.get("pysyncobj")
    mode = (
        f"QUICK run: {plan.seconds:.0f}s windows, {plan.idle_groups} idle groups"
        if plan.quick
        else f"full run: {plan.seconds:.0f}s windows, {plan.idle_groups} idle groups"
    )
    lines = [
        f"raft_bench - {mode}; 3 processes on 127.0.0.1, one group, "
        f"{plan.inflight} proposals in flight, {plan.warmup:.0f}s warm-up, raftmq fsyncs "
        "every round",
        "",
    ]
    busiest = max(
        (
            w["machine"]["other_cpu_pct"]
            for impl in (rm, ref)
            if impl
            for w in impl.values()
            if isinstance(w, dict) and "machine" in w
        ),
        default=0.0,
    )
    if busiest > 25:
        lines += [
            f"WARNING: other processes used up to {busiest:.0f}% of a core during the "
            f"windows ({os.cpu_count()} cores): absolute figures are depressed and noisy, "
            "and columns measured at different moments compare unevenly.",
            "",
        ]
    if rm:
        lines += [*_throughput_lines(rm, ref), "", *_latency_lines(rm, ref), ""]
    if results.get("idle"):
        lines += [*_idle_lines(results["idle"]), ""]
    r64 = results["ratios"].get("mb_per_s_64k")
    if r64 is not None:
        lines.append(
            f"target raftmq >= {TARGET_MB_RATIO:.0f}x pysyncobj MB/s at 64 KiB: {r64:.1f}x -> "
            + ("met" if r64 >= TARGET_MB_RATIO else "MISSED")
        )
    elif rm:
        lines.append("target vs pysyncobj: not measured (pysyncobj skipped)")
    if ref:
        lines.append(
            "pysyncobj config: " + results.get("pysyncobj_config", "?") + ". Its journal is an "
            "mmap'd file it never fsyncs, raftmq fsyncs every round: the comparison favours "
            "pysyncobj."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, "short run (~1 minute)")
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--groups", type=int, default=None, help="idle groups (300/1000)")
    parser.add_argument("--skip", default="", help="comma list of: raftmq,pysyncobj,idle")
    parser.add_argument(
        "--ref-tick",
        type=float,
        default=0.05,
        help="pysyncobj autoTickPeriod (its default 0.05 s bounds its commit latency)",
    )
    parser.add_argument(
        "--ref-append-period",
        type=float,
        default=0.1,
        help="pysyncobj appendEntriesPeriod (its default 0.1 s)",
    )
    args = parser.parse_args(argv)
    plan = Plan.make(args.quick, args.inflight, args.groups)
    skip = set(filter(None, args.skip.split(",")))
    kill_on_exit()
    log = sys.stderr if args.json else sys.stdout

    # The children read these (see raft_bench_node._pysyncobj_main).
    os.environ["RAFT_BENCH_REF_TICK"] = str(args.ref_tick)
    os.environ["RAFT_BENCH_REF_APPEND_PERIOD"] = str(args.ref_append_period)
    root = disk_tempdir("raft_bench-")
    print(f"data in {root} ({'quick' if plan.quick else 'full'} run)", file=log, flush=True)
    results: Reply = {
        "quick": plan.quick,
        "plan": plan.__dict__,
        "ratios": {},
        "pysyncobj_config": (
            f"autoTickPeriod={args.ref_tick}, appendEntriesPeriod={args.ref_append_period}, "
            "appendEntriesBatchSizeBytes=1 MiB, journalFile + fullDumpFile"
        ),
    }
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    results["phase_s"] = phases
    try:
        impls = [] if "raftmq" in skip else ["raftmq"]
        if "pysyncobj" in skip:
            pass
        elif importlib.util.find_spec("pysyncobj") is None:
            print(
                "pysyncobj is not installed: its column is skipped. Install it with\n"
                "  .venv/bin/pip install pysyncobj",
                file=log,
                flush=True,
            )
            results["pysyncobj_skipped"] = "not installed (.venv/bin/pip install pysyncobj)"
        else:
            impls.append("pysyncobj")
        # Interleaved (64k raftmq, 64k pysyncobj, 1k raftmq, ...) so that both columns see
        # the same background load on a shared machine.
        for label, size in (("64k", 64 * KIB), ("1k", KIB)):
            for impl in impls:
                print(f"{impl} {label}...", file=log, flush=True)
                results.setdefault(impl, {}).update(throughput(impl, label, size, root, plan, log))
        if impls:
            phases["throughput"] = round(time.monotonic() - t0 - sum(phases.values()), 1)
        if "idle" not in skip:
            print(f"idle groups ({plan.idle_groups})...", file=log, flush=True)
            results["idle"] = idle(root, plan, log)
            phases["idle"] = round(time.monotonic() - t0 - sum(phases.values()), 1)
    finally:
        kill_all()
        c0 = time.monotonic()
        shutil.rmtree(root, ignore_errors=True)
        phases["cleanup"] = round(time.monotonic() - c0, 1)
    results["elapsed_s"] = round(time.monotonic() - t0, 1)
    rm, ref = results.get("raftmq"), results.get("pysyncobj")
    if rm and ref:
        for label in ("64k", "1k"):
            for key, short in (("mb_per_s", "mb_per_s"), ("entries_per_s", "entries_per_s")):
                results["ratios"][f"{short}_{label}"] = ratio(
                    rm[f"throughput_{label}"][key], ref[f"throughput_{label}"][key]
                )
        results["ratios"]["latency_p50_ref_over_raftmq"] = ratio(
            ref["latency_1k"].get("p50_ms"), rm["latency_1k"].get("p50_ms")
        )
        results["targets"] = {
            "mb_ratio_64k": TARGET_MB_RATIO,
            "mb_ratio_64k_met": (results["ratios"]["mb_per_s_64k"] or 0) >= TARGET_MB_RATIO,
        }
    if results.get("idle"):
        idle_r = results["idle"]
        targets = results.setdefault("targets", {})
        targets["idle_cpu_pct_met"] = (
            "cpu_pct_max" in idle_r and idle_r["cpu_pct_max"] < TARGET_IDLE_CPU_PCT
        )
        targets["idle_groups_elect_at_once"] = idle_r["at_once"]["settled"]
    print("", file=log)
    print(table(results, plan), file=log)
    print(f"\nwhole run: {results['elapsed_s']}s (phases: {phases})", file=log)
    if args.json:
        print_json_last(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
