"""Many partitions on a local 3-broker cluster: what they cost a broker when idle.

Why: 1,000 partitions x 3 replicas once held ~2,000 open files per broker (drivers died of
EMFILE at a soft limit of 1,024), reserved ~47 GB of disk for 13 MB of data (16 MiB ahead
of every active segment), and after one broker's death the survivors idled at ~15% of a
core instead of ~2% (groups with a dead follower never quiesced). This measures each of
those, per broker, against the targets of issue 10:

- open files: descriptors of segment files <= the broker's segment handle cap, whatever
  the partition count (and all descriptors under the open-file limit);
- disk: allocated (st_blocks * 512) <= 2 x written (st_size) + the fixed per-broker
  reserve (the reservation budget, raftmq/log/preallocate.py), for segment files;
- idle CPU (utime + stime from /proc) over a window after one broker's SIGKILL <= 2 x the
  same before it.

The brokers start with the open-file limit ``--nofile`` (default 1,024, a common default:
soft and hard, so they cannot raise it) to show the cap at work; 0 keeps this shell's.

Usage: ``python -m benchmarks.partitions_bench [--quick] [--json] [--partitions N]``;
``--quick`` (300 partitions, short windows) finishes in under a minute; ``--json`` prints
every figure as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    add_cleanup,
    add_run_options,
    disk_tempdir,
    idle_cpu,
    kill_on_exit,
    print_json_last,
    remove_cleanup,
    say,
)
from raftmq.client import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from raftmq.format.records import Record, build_batch
from raftmq.log.handles import cap_for_limit
from raftmq.log.preallocate import DEFAULT_BUDGET_BYTES
from raftmq.log.segment import LOG_SUFFIX, parse_segment_name

TOPIC = "many"
KILLED = 3
TARGET_DISK_FACTOR = 2.0
TARGET_CPU_RATIO = 2.0
Json = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    partitions: int
    records: int  # per partition, 1 KiB each
    settle_s: float  # after a change, before a measurement
    window_s: float  # idle CPU measurement
    nofile: int

    @classmethod
    def make(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        return cls(
            partitions=args.partitions or (300 if quick else 1000),
            records=4,
            settle_s=3.0 if quick else 6.0,
            window_s=4.0 if quick else 10.0,
            nofile=args.nofile,
        )


def produce_everywhere(cluster: LocalCluster, plan: Plan, threads: int = 8) -> int:
    """A few 1 KiB records to every partition, acks=all; returns the records' bytes."""
    value = os.urandom(1024)
    errors: list[BaseException] = []

    def work(parts: range) -> None:
        try:
            with LowLevelClient(cluster.addresses) as client:
                for p in parts:
                    now = int(time.time() * 1000)
                    batch = build_batch([Record(None, value, now)] * plan.records)
                    client.produce(TOPIC, p, batch)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [
        threading.Thread(target=work, args=(range(k, plan.partitions, threads),))
        for k in range(threads)
    ]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    return plan.partitions * plan.records * len(value)


def open_files(pid: int) -> Json:
    """Descriptors of a process by kind: segment files of its data folder, sockets, other."""
    segments = sockets = other = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        path = Path(target)
        if path.suffix == LOG_SUFFIX and parse_segment_name(path.stem) is not None:
            segments += 1  # (the brokers' own output files end in .log too)
        elif target.startswith("socket:"):
            sockets += 1
        else:
            other += 1
    return {"total": segments + sockets + other, "segments": segments, "sockets": sockets}


def nofile_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return resource.RLIM_INFINITY if soft == "unlimited" else int(soft)
    raise RuntimeError(f"no open-file limit for pid {pid}")


def disk_usage(directory: Path) -> Json:
    """Allocated and written bytes of segment files, and of every file, under ``directory``."""
    seg_alloc = seg_size = all_alloc = all_size = files = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            files += 1
            all_alloc += st.st_blocks * 512
            all_size += st.st_size
            if name.endswith(LOG_SUFFIX):
                seg_alloc += st.st_blocks * 512
                seg_size += st.st_size
    return {
        "segments_allocated": seg_alloc,
        "segments_written": seg_size,
        "all_allocated": all_alloc,
        "all_written": all_size,
        "files": files,
    }


def cap_note(cluster: LocalCluster, broker: int) -> str:
    """What the broker said at start about its open files (one line)."""
    text = cluster.log_path(broker).read_text(errors="replace")
    found = re.findall(rf"broker {broker}: (open files: .*)", text)
    return found[-1] if found else "(no open-files line in the broker's output)"


def run(plan: Plan) -> Json:
    data = disk_tempdir("raftmq-partitions-bench-")
    spec = local_spec(3, {TOPIC: plan.partitions})
    cluster = LocalCluster(data, spec, nofile=plan.nofile or None)
    add_cleanup(cluster.close)  # also on SIGTERM (kill_on_exit)
    out: Json = {"partitions": plan.partitions, "replicas": 3, "nofile": plan.nofile}
    try:
        t0 = time.monotonic()
        say(f"starting 3 brokers with {plan.partitions} partitions x 3 replicas in {data}")
        cluster.start()
        cluster.wait_for_leaders(timeout=300, preferred=True)
        out["start_s"] = round(time.monotonic() - t0, 1)
        say(f"every partition led by its preferred replica after {out['start_s']} s")
        pids = {b: p.pid for b, p in cluster.procs.items()}
        t1 = time.monotonic()
        out["produced_bytes"] = produce_everywhere(cluster, plan)
        say(
            f"produced {plan.records} x 1 KiB to each partition in "
            f"{time.monotonic() - t1:.1f} s; settling {plan.settle_s:.0f} s"
        )
        time.sleep(plan.settle_s)
        brokers: dict[int, Json] = {}
        for b, pid in pids.items():
            limit = nofile_limit(pid)
            brokers[b] = {
                "note": cap_note(cluster, b),
                "limit": limit,
                "cap": cap_for_limit(limit),
                "files": open_files(pid),
                "disk": disk_usage(data / f"broker-{b}"),
            }
        say(f"idle CPU of each broker over {plan.window_s:.0f} s")
        for b, (share, ticks) in idle_cpu(pids, plan.window_s).items():
            brokers[b]["cpu_before"], brokers[b]["cpu_before_stat"] = share, ticks
        say(f"SIGKILL broker {KILLED}; waiting for leaders on the others")
        cluster.kill(KILLED)
        survivors = {b: pid for b, pid in pids.items() if b != KILLED}
        t2 = time.monotonic()
        cluster.wait_for_leaders(timeout=120, among=set(survivors))
        out["reelect_s"] = round(time.monotonic() - t2, 1)
        say(f"all partitions led after {out['reelect_s']} s; settling {plan.settle_s:.0f} s")
        time.sleep(plan.settle_s)
        say(f"idle CPU of the survivors over {plan.window_s:.0f} s")
        for b, (share, ticks) in idle_cpu(survivors, plan.window_s).items():
            brokers[b]["cpu_after"], brokers[b]["cpu_after_stat"] = share, ticks
            brokers[b]["files_after"] = open_files(survivors[b])
        out["brokers"] = brokers
    finally:
        cluster.close()
        remove_cleanup(cluster.close)
        shutil.rmtree(data, ignore_errors=True)
    return out


def figures(out: Json) -> list[tuple[str, str, float, str, float | None, bool]]:
    """(broker, what, value, target text, ratio to the target, met) per row."""
    rows = []
    reserve = DEFAULT_BUDGET_BYTES
    for b, r in sorted(out["brokers"].items()):
        files, cap = r["files"], r["cap"]
        seg_files = max(files["segments"], r.get("files_after", files)["segments"])
        rows.append(
            (b, "segment files open", seg_files, f"<= cap {cap}", seg_files / cap, seg_files <= cap)
        )
        total = max(files["total"], r.get("files_after", files)["total"])
        rows.append(
            (
                b,
                "all files open",
                total,
                f"< limit {r['limit']}",
                total / r["limit"],
                total < r["limit"],
            )
        )
        disk = r["disk"]
        bound = TARGET_DISK_FACTOR * disk["segments_written"] + reserve
        rows.append(
            (
                b,
                "segment MB allocated",
                disk["segments_allocated"] / 1e6,
                f"<= 2 x {disk['segments_written'] / 1e6:.1f} + {reserve / 1e6:.0f}",
                disk["segments_allocated"] / bound,
                disk["segments_allocated"] <= bound,
            )
        )
        rows.append(
            (
                b,
                "  (vs written)",
                disk["segments_allocated"] / 1e6,
                f"{disk['segments_written'] / 1e6:.1f} MB written",
                disk["segments_allocated"] / max(1, disk["segments_written"]),
                True,
            )
        )
        before = r["cpu_before"]
        rows.append(
            (
                b,
                "idle CPU % before",
                100 * before,
                f"(stat: {100 * r['cpu_before_stat']:.1f})",
                None,
                True,
            )
        )
        if "cpu_after" in r:
            after = r["cpu_after"]
            limit = TARGET_CPU_RATIO * before
            rows.append(
                (
                    b,
                    "idle CPU % after kill",
                    100 * after,
                    f"<= 2 x before = {100 * limit:.2f} (stat: {100 * r['cpu_after_stat']:.1f})",
                    after / limit,
                    after <= limit,
                )
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(ap, "300 partitions, short windows")
    ap.add_argument("--partitions", type=int, default=0, help="default 1000 (300 with --quick)")
    ap.add_argument(
        "--nofile",
        type=int,
        default=1024,
        help="open-file limit (soft and hard) the brokers start with; 0 keeps this shell's",
    )
    args = ap.parse_args()
    plan = Plan.make(args)
    kill_on_exit()
    started = time.monotonic()
    out = run(plan)
    out["seconds"] = round(time.monotonic() - started, 1)
    rows = figures(out)
    print(
        f"\n{plan.partitions} partitions x 3 replicas, 3 brokers, {plan.records} x 1 KiB "
        f"per partition; broker {KILLED} SIGKILLed; brokers' open-file limit "
        f"{plan.nofile or 'inherited'}"
    )
    for b, r in sorted(out["brokers"].items()):
        print(f"broker {b}: {r['note']}")
    print(f"\n{'broker':>6}  {'figure':<22} {'value':>10}  {'target':<36} {'ratio':>6}  ok")
    for b, what, value, target, ratio, met in rows:
        ratio_text = f"{ratio:.2f}" if ratio is not None else ""
        print(
            f"{b:>6}  {what:<22} {value:>10.2f}  {target:<36} {ratio_text:>6}  "
            f"{'ok' if met else 'MISSED'}"
        )
    out["targets_met"] = all(met for *_, met in rows)
    print(
        f"\nstart {out['start_s']} s, re-election after the kill {out['reelect_s']} s, "
        f"whole run {out['seconds']} s; targets {'met' if out['targets_met'] else 'MISSED'}"
    )
    if args.json:
        print_json_last(out, sort_keys=True)


if __name__ == "__main__":
    main()
