"""The controller at scale: a topic of 1,000 partitions x 3 replicas on the 3-broker local
cluster (combined mode: every broker is a controller voter), created through the admin API.

Per topic size it measures, in this order:

- leaders: time from the CreateTopic call to every partition reporting a leader;
- idle CPU of each broker process (schedstat, every thread) over a window with no traffic,
  and its open descriptors;
- metadata propagation: a config change on a one-partition probe topic, committed (the
  admin call answered with its metadata version) -> seen by every broker (each broker's
  Metadata answers that version or a newer one); p50 and max over a few changes. Each
  version carries the whole state, so this is where the controller's cost per version
  (encode, stream, decode, reconcile) shows as the metadata grows;
- failover: time from a broker's SIGKILL (one that does not lead the controller quorum, so
  this times partition elections, not a controller election) to every partition led by a
  survivor. The broker is then restarted and the topic deleted before the next size.

The reference, measured in the same run on the same cluster: the same phases for a topic
of a tenth of the partitions (``--reference-divisor``). The ratio big / small then says how
each cost scales with the partition count: 10 is linear, 1 is flat (propagation and leader
election should stay nearly flat; idle CPU should be near flat once groups quiesce).

Not measured yet: the issue's "time to heal back to full replication with a given amount of
data" needs the controller to replace a fenced broker's replicas, which is being built; it
belongs after ``failover`` (kill, produce N bytes, time until every partition has its full
replication factor of caught-up replicas on the survivors) and is left out, not faked.

Usage: ``python benchmarks/controller_bench.py [--quick] [--json] [--partitions N]``;
``--quick`` (200 partitions, short windows) finishes in about a minute; ``--json`` prints
every figure as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    add_cleanup,
    add_run_options,
    disk_tempdir,
    idle_cpu,
    kill_on_exit,
    print_json_last,
    remove_cleanup,
    say,
)
from raftmq.api.v1 import broker_pb2 as pb  # noqa: E402
from raftmq.client.admin import AdminClient  # noqa: E402
from raftmq.client.lowlevel import LowLevelClient  # noqa: E402
from raftmq.devtools.local_cluster import LocalCluster, local_spec  # noqa: E402

PROBE = "probe"
REPLICATION = 3
LEADER_POLL_S = 0.25
"""How often leaders are polled (the times' resolution). Each poll asks every broker for
the whole Metadata, which costs a broker ~24 ms of CPU with 1,000 partitions: polled every
50 ms, as at first, the bench itself took half of each broker's core while timing the
re-election, and ten times less of it for the reference topic."""
Json = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    partitions: int
    reference: int  # partitions of the reference topic
    settle_s: float  # after leaders, before the idle window
    window_s: float  # idle CPU measurement
    probes: int  # metadata changes timed per size
    timeout_s: float  # for any one wait

    @classmethod
    def make(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        partitions = args.partitions or (200 if quick else 1000)
        return cls(
            partitions=partitions,
            reference=max(1, partitions // args.reference_divisor),
            settle_s=2.0 if quick else 5.0,
            window_s=3.0 if quick else 8.0,
            probes=5 if quick else 15,
            timeout_s=120.0 if quick else 300.0,
        )


def wait_until(what: str, timeout_s: float, check: Any, poll_s: float = 0.05) -> float:
    """Call ``check()`` until it is true; seconds it took. Raises naming ``what``."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(poll_s)
    return time.monotonic() - t0


def all_led(client: LowLevelClient, topic: str, partitions: int, among: set[int]) -> bool:
    leaders = client.refresh_leaders(timeout=5.0)
    return all(
        (topic, p) in leaders and leaders[(topic, p)].broker_id in among for p in range(partitions)
    )


def broker_version(client: LowLevelClient, address: str) -> int:
    """The metadata version ``address`` answers Metadata from (0: none, or no answer)."""
    try:
        md = client.stub(address).Metadata(pb.MetadataRequest(topics=[PROBE]), timeout=2.0)
    except grpc.RpcError:
        return 0
    return md.metadata_version


def propagation(cluster: LocalCluster, admin: AdminClient, plan: Plan) -> Json:
    """Seconds from a change's commit (the admin call's answer) to every broker's Metadata
    answering its version, and the admin call's own latency, over ``plan.probes`` changes."""
    addresses = [cluster.spec.brokers[b].address for b in sorted(cluster.procs)]
    seen, commit = [], []
    with LowLevelClient(addresses, retries=1) as client:
        for k in range(plan.probes):
            t0 = time.monotonic()
            version = admin.alter_topic_config(
                PROBE, {"retention.ms": str(3_600_000 + k)}
            ).metadata_version
            t1 = time.monotonic()
            pending = set(addresses)
            while pending:
                pending = {a for a in pending if broker_version(client, a) < version}
                if time.monotonic() - t1 > plan.timeout_s:
                    raise TimeoutError(f"metadata version {version} never reached {pending}")
                if pending:
                    time.sleep(0.002)
            seen.append(time.monotonic() - t1)
            commit.append(t1 - t0)
    return {
        "propagation_p50_ms": statistics.median(seen) * 1000,
        "propagation_max_ms": max(seen) * 1000,
        "commit_p50_ms": statistics.median(commit) * 1000,
    }


def controller_leader(admin: AdminClient) -> int:
    return admin.describe_cluster().controller_leader_id


def measure(
    cluster: LocalCluster, admin: AdminClient, topic: str, partitions: int, plan: Plan
) -> Json:
    """Every phase for one topic of ``partitions`` x 3; the topic is deleted at the end."""
    out: Json = {"partitions": partitions}
    brokers = set(cluster.procs)
    with cluster.client() as client:
        say(f"{topic}: creating {partitions} partitions x {REPLICATION}")
        t0 = time.monotonic()
        admin.create_topic(topic, partitions, REPLICATION)
        out["create_call_s"] = time.monotonic() - t0
        wait_until(
            f"{topic}: every partition led",
            plan.timeout_s,
            lambda: all_led(client, topic, partitions, brokers),
            poll_s=LEADER_POLL_S,
        )
        out["leaders_s"] = time.monotonic() - t0
        say(f"{topic}: every partition led after {out['leaders_s']:.1f} s; settling")

        time.sleep(plan.settle_s)
        pids = {b: p.pid for b, p in cluster.procs.items()}
        cpu = idle_cpu(pids, plan.window_s)
        out["idle_cpu"] = {b: share for b, (share, _ticks) in cpu.items()}
        out["fds"] = {b: len(os.listdir(f"/proc/{pid}/fd")) for b, pid in pids.items()}
        say(f"{topic}: idle CPU {', '.join(f'{100 * c:.1f}%' for c in out['idle_cpu'].values())}")

        out.update(propagation(cluster, admin, plan))
        say(f"{topic}: propagation p50 {out['propagation_p50_ms']:.0f} ms")

        # The broker leading most of the topic's partitions, other than the controller
        # leader: killing one that leads none would time nothing.
        led = Counter(
            leader.broker_id
            for (t, _), leader in client.refresh_leaders(timeout=5.0).items()
            if t == topic
        )
        ruling = controller_leader(admin)
        victim = max((b for b in brokers if b != ruling), key=lambda b: (led[b], b))
        out["killed_led"] = led[victim]
        survivors = brokers - {victim}
        say(
            f"{topic}: SIGKILL broker {victim}, leader of {led[victim]} partitions "
            "(not the controller leader)"
        )
        cluster.kill(victim)
        out["failover_s"] = wait_until(
            f"{topic}: every partition led by a survivor",
            plan.timeout_s,
            lambda: all_led(client, topic, partitions, survivors),
            poll_s=LEADER_POLL_S,
        )
        out["killed"] = victim
        say(f"{topic}: every partition led again after {out['failover_s']:.2f} s")
        # Here belongs the heal phase (see the module docstring), once healing exists.

        cluster.start(victim)
        cluster.wait_ready(victim, timeout=plan.timeout_s)
        say(f"{topic}: broker {victim} back; deleting the topic")
        admin.delete_topic(topic)
        wait_until(
            f"{topic}: deleted on every broker",
            plan.timeout_s,
            lambda: not any(t == topic for t, _ in client.refresh_leaders(timeout=5.0)),
            poll_s=LEADER_POLL_S,
        )
    return out


def run(plan: Plan) -> Json:
    data = disk_tempdir("raftmq-controller-bench-")
    cluster = LocalCluster(data, local_spec(REPLICATION, {}))
    add_cleanup(cluster.close)  # also on SIGTERM (kill_on_exit)
    out: Json = {"replicas": REPLICATION}
    try:
        say(f"starting {REPLICATION} brokers in {data}")
        cluster.start()
        cluster.wait_ready(timeout=plan.timeout_s)
        cluster.create_topics(timeout=plan.timeout_s)  # none: waits for registration
        with cluster.admin() as admin:
            admin.create_topic(PROBE, 1, REPLICATION)
            out["reference"] = measure(cluster, admin, "reference", plan.reference, plan)
            out["big"] = measure(cluster, admin, "big", plan.partitions, plan)
    finally:
        cluster.close()
        remove_cleanup(cluster.close)
        shutil.rmtree(data, ignore_errors=True)
    return out


ROWS = (
    # (figure, key, unit)
    ("create call", "create_call_s", "s"),
    ("all partitions led", "leaders_s", "s"),
    ("metadata commit p50", "commit_p50_ms", "ms"),
    ("propagation p50", "propagation_p50_ms", "ms"),
    ("propagation max", "propagation_max_ms", "ms"),
    ("led again after SIGKILL", "failover_s", "s"),
    ("  partitions it had led", "killed_led", ""),
)


def table(out: Json) -> list[tuple[str, float, float, float]]:
    """(figure with unit, reference value, big value, ratio big / reference) per row."""
    ref, big = out["reference"], out["big"]
    rows = [(f"{name} ({unit})" if unit else name, ref[key], big[key]) for name, key, unit in ROWS]
    for b in sorted(big["idle_cpu"]):
        rows.append(
            (f"broker {b} idle CPU (%)", 100 * ref["idle_cpu"][b], 100 * big["idle_cpu"][b])
        )
        rows.append((f"broker {b} open fds", ref["fds"][b], big["fds"][b]))
    return [(name, r, g, g / r if r else float("nan")) for name, r, g in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(ap, "200 partitions, short windows")
    ap.add_argument("--partitions", type=int, default=0, help="default 1000 (200 with --quick)")
    ap.add_argument(
        "--reference-divisor",
        type=int,
        default=10,
        help="the reference topic has partitions / this many partitions (default 10)",
    )
    args = ap.parse_args()
    plan = Plan.make(args)
    kill_on_exit()
    started = time.monotonic()
    out = run(plan)
    out["seconds"] = round(time.monotonic() - started, 1)
    rows = table(out)
    out["rows"] = [{"figure": n, "reference": r, "big": g, "ratio": x} for n, r, g, x in rows]
    scale = plan.partitions / plan.reference
    print(
        f"\n{REPLICATION} brokers (combined mode), topics of {plan.reference} and "
        f"{plan.partitions} partitions x {REPLICATION}; ratio = big / reference "
        f"({scale:.0f} would be linear in partitions)"
    )
    print(f"{'figure':<28} {'reference':>10} {'big':>10} {'ratio':>7}")
    for name, r, g, x in rows:
        print(f"{name:<28} {r:>10.2f} {g:>10.2f} {x:>7.2f}")
    print(f"\nwhole run {out['seconds']} s; not measured: time to heal (see the docstring)")
    if args.json:
        print_json_last(out, sort_keys=True)


if __name__ == "__main__":
    main()
