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
  survivor. The broker is then restarted and the topic deleted before the next size;
  ``moved_in_failover`` counts replicas healing moved off it meanwhile (0 unless the
  restart outlasted the session timeout plus ``--heal-delay-ms``);
- heal, after both sizes above: a fourth broker is added (``LocalCluster.add_broker``), a
  topic of the same size is created on the four (the controller places it: the new broker
  holds about 3/4 of the partitions), ``--heal-mb`` of acks=all data is written evenly over
  its partitions, and the new broker is SIGKILLed for good. Timed from the kill: until
  ``ClusterStatus`` shows it fenced, until the first move, and until every partition is
  back at 3 voters on live brokers with no learner, no move and nothing under-replicated.
  "MB moved" is what the dead broker held of the topic on disk (each of its replicas is
  copied once to a survivor), "MB/s" that over first move -> healed. The move limits are
  broker flags given to every broker, printed with the figures; the largest number of
  moves seen at once is printed beside them, in all and on one broker as the per-broker
  limit counts them (the learner's broker and the partition leader's, leaders read once
  a second). The victim is the added broker, never a controller voter, so this times
  healing, not a controller election, and the next size still has its three voters; each
  size adds its own broker (the dead one stays fenced and is never a placement target).

The reference, measured in the same run on the same cluster: the same phases for a topic
of a tenth of the partitions (``--reference-divisor``). The ratio big / small then says how
each cost scales with the partition count: 10 is linear, 1 is flat (propagation and leader
election should stay nearly flat; idle CPU should be near flat once groups quiesce).

The heal reference is the same phase on the small topic with the same ``--heal-mb`` in all:
the bytes to copy are the same, the moves ten times fewer, so the ratio says how much of
healing is per-move cost (10: all of it) rather than copying (1).

Usage: ``python -m benchmarks.controller_bench [--quick] [--json] [--partitions N]``;
``--quick`` (60 partitions, short windows, 8 MiB to heal) takes about a minute, most of
it the heal phase (two fence timeouts, two heal delays, ~50 moves);
``--json`` prints every figure as one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

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
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import AdminClient, LowLevelClient, Producer
from raftmq.controller.healing import MOVES_PER_BROKER, MOVES_TOTAL
from raftmq.devtools.local_cluster import LocalCluster, local_spec

PROBE = "probe"
REPLICATION = 3
LEADER_POLL_S = 0.25
"""How often leaders are polled (the times' resolution). Each poll asks every broker for
the whole Metadata, which costs a broker ~24 ms of CPU with 1,000 partitions: polled every
50 ms, as at first, the bench itself took half of each broker's core while timing the
re-election, and ten times less of it for the reference topic."""
HEAL_POLL_S = 0.25
"""How often ClusterStatus is polled while healing (the heal times' resolution)."""
HEAL_LEADERS_POLL_S = 1.0
"""How often, while moves are under way, the partitions' leaders are read to count each
broker's moves as the limit does (as learner's broker or as leader): less often than
ClusterStatus, since each read costs every broker a whole Metadata answer."""
HEAL_RECORD_BYTES = 16 * 1024
MIB = 1024 * 1024
Json = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    partitions: int
    reference: int  # partitions of the reference topic
    settle_s: float  # after leaders, before the idle window
    window_s: float  # idle CPU measurement
    probes: int  # metadata changes timed per size
    timeout_s: float  # for any one wait
    heal_bytes: int  # written to each heal topic before its broker dies
    heal_timeout_s: float  # kill -> healed, before the phase is reported stalled
    heal_delay_ms: int
    max_moves_per_broker: int
    max_moves: int
    move_bytes_per_s: int

    @property
    def broker_args(self) -> list[str]:
        """The healing flags every broker (every controller voter) runs with."""
        return [
            "--heal-delay-ms",
            str(self.heal_delay_ms),
            "--max-moves-per-broker",
            str(self.max_moves_per_broker),
            "--max-moves",
            str(self.max_moves),
            "--move-bytes-per-s",
            str(self.move_bytes_per_s),
        ]

    @classmethod
    def make(cls, args: argparse.Namespace) -> Plan:
        quick = args.quick
        partitions = args.partitions or (60 if quick else 1000)
        return cls(
            partitions=partitions,
            reference=max(1, partitions // args.reference_divisor),
            settle_s=2.0 if quick else 5.0,
            window_s=3.0 if quick else 8.0,
            probes=5 if quick else 15,
            timeout_s=120.0 if quick else 300.0,
            heal_bytes=int((args.heal_mb or (8 if quick else 64)) * MIB),
            heal_timeout_s=args.heal_timeout_s or (180.0 if quick else 1200.0),
            heal_delay_ms=args.heal_delay_ms,
            max_moves_per_broker=args.max_moves_per_broker,
            max_moves=args.max_moves,
            move_bytes_per_s=args.move_bytes_per_s,
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
        cluster.start(victim)
        cluster.wait_ready(victim, timeout=plan.timeout_s)
        # Healing runs (its delay is short here): had the restart outlasted the session
        # timeout plus the heal delay, replicas would have moved off the victim meanwhile.
        out["moved_in_failover"] = sum(
            victim not in p.replicas for p in admin.describe_topic(topic).partitions
        )
        say(f"{topic}: broker {victim} back; deleting the topic")
        delete(client, admin, topic, plan)
    return out


def delete(client: LowLevelClient, admin: AdminClient, topic: str, plan: Plan) -> None:
    admin.delete_topic(topic)
    wait_until(
        f"{topic}: deleted on every broker",
        plan.timeout_s,
        lambda: not any(t == topic for t, _ in client.refresh_leaders(timeout=5.0)),
        poll_s=LEADER_POLL_S,
    )


def write(cluster: LocalCluster, topic: str, partitions: int, total_bytes: int) -> Json:
    """``total_bytes`` of acks=all records spread evenly over the partitions, in records of
    at most ``HEAL_RECORD_BYTES``."""
    partition_bytes = max(1, total_bytes // partitions)
    per_partition = -(-partition_bytes // HEAL_RECORD_BYTES)
    value = os.urandom(max(1, partition_bytes // per_partition))
    t0 = time.monotonic()
    with Producer(cluster.addresses, linger_ms=5, retries=20) as producer:
        futures = [
            producer.send(topic, value, partition=p)
            for _ in range(per_partition)
            for p in range(partitions)
        ]
        producer.flush(timeout=600)
        for f in futures:
            f.result(timeout=60)  # every record acknowledged, or the bench stops here
    written = per_partition * partitions * len(value)
    return {"heal_written_mb": written / MIB, "heal_write_s": time.monotonic() - t0}


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def heal(
    cluster: LocalCluster, admin: AdminClient, topic: str, partitions: int, plan: Plan
) -> Json:
    """The heal phase (module docstring) for one topic of ``partitions`` x 3 on the three
    voters and one broker added for it, which is then SIGKILLed for good."""
    victim = cluster.add_broker()
    cluster.wait_ready(victim, timeout=plan.timeout_s)
    wait_until(
        f"broker {victim} registered",
        plan.timeout_s,
        lambda: any(
            b.id == victim and b.state == apb.BROKER_STATE_ALIVE
            for b in admin.describe_cluster().brokers
        ),
        poll_s=LEADER_POLL_S,
    )
    live = set(cluster.procs)
    out: Json = {}
    with cluster.client() as client:
        say(f"{topic}: creating {partitions} partitions x {REPLICATION} on brokers {sorted(live)}")
        admin.create_topic(topic, partitions, REPLICATION)
        wait_until(
            f"{topic}: every partition led",
            plan.timeout_s,
            lambda: all_led(client, topic, partitions, live),
            poll_s=LEADER_POLL_S,
        )
        out.update(write(cluster, topic, partitions, plan.heal_bytes))
        held = [p.partition for p in admin.describe_topic(topic).partitions if victim in p.replicas]
        say(
            f"{topic}: wrote {out['heal_written_mb']:.1f} MiB in {out['heal_write_s']:.1f} s; "
            f"SIGKILL broker {victim} for good, holding {len(held)} replicas"
        )
        cluster.kill(victim)
        out.update(watch_healing(cluster, admin, client, topic, victim, plan))
        folder = cluster.data / f"broker-{victim}"
        moved = sum(disk_bytes(folder / f"{topic}-{p}") for p in held)
        out["heal_moves"] = len(held)
        out["heal_moved_mb"] = moved / MIB
        if out.get("heal_moving_s"):
            out["heal_mb_per_s"] = moved / MIB / out["heal_moving_s"]
            out["heal_moves_per_s"] = len(held) / out["heal_moving_s"]
        if "heal_s" in out:
            say(
                f"{topic}: fenced after {out['heal_fenced_s']:.1f} s, healed after "
                f"{out['heal_s']:.1f} s ({len(held)} moves, {moved / MIB:.1f} MiB, "
                f"{out.get('heal_mb_per_s', float('nan')):.1f} MiB/s while moving)"
            )
            delete(client, admin, topic, plan)
    return out


def healed(admin: AdminClient, topic: str, live: set[int]) -> bool:
    """Every partition at the full factor of voters on live brokers, no learner."""
    return all(
        len(p.replicas) == REPLICATION and set(p.replicas) <= live and not p.learners
        for p in admin.describe_topic(topic).partitions
    )


def moves_per_broker(client: LowLevelClient, moves: list[apb.MoveDescription]) -> Counter[int]:
    """Moves each broker takes part in, as ``--max-moves-per-broker`` counts them: on the
    learner's broker, and on the partition's leader's when that is another broker."""
    leaders = client.refresh_leaders(timeout=5.0)
    out: Counter[int] = Counter()
    for m in moves:
        out[m.learner] += 1
        leader = leaders.get((m.topic, m.partition))
        if leader is not None and leader.broker_id != m.learner:
            out[leader.broker_id] += 1
    return out


def watch_healing(
    cluster: LocalCluster,
    admin: AdminClient,
    client: LowLevelClient,
    topic: str,
    victim: int,
    plan: Plan,
) -> Json:
    """Poll ClusterStatus from the kill until healed (or ``plan.heal_timeout_s``: then the
    answer says where healing stood, ``heal_stalled``, instead of a time)."""
    live = set(cluster.procs)
    out: Json = {"heal_max_moves": 0, "heal_max_moves_per_broker": 0, "heal_stuck": 0}
    leaders_read_at = -HEAL_LEADERS_POLL_S
    progress: list[tuple[float, int, int]] = []  # (s, under-replicated, moves), every ~5 s
    t0 = time.monotonic()
    while True:
        now = time.monotonic() - t0
        status = admin.cluster_status()
        fenced = any(
            b.id == victim and b.state == apb.BROKER_STATE_FENCED for b in status.cluster.brokers
        )
        if fenced and "heal_fenced_s" not in out:
            out["heal_fenced_s"] = now
        if status.moves and "heal_first_move_s" not in out:
            out["heal_first_move_s"] = now
        out["heal_max_moves"] = max(out["heal_max_moves"], len(status.moves))
        if status.moves and now - leaders_read_at >= HEAL_LEADERS_POLL_S:
            leaders_read_at = now
            per_broker = moves_per_broker(client, list(status.moves))
            out["heal_max_moves_per_broker"] = max(
                out["heal_max_moves_per_broker"], max(per_broker.values())
            )
        out["heal_stuck"] = max(out["heal_stuck"], len(status.stuck))
        if not progress or now - progress[-1][0] >= 5.0:
            progress.append((round(now, 1), len(status.under_replicated), len(status.moves)))
        if (
            fenced
            and not status.under_replicated
            and not status.moves
            and healed(admin, topic, live)
        ):
            out["heal_s"] = now
            out["heal_moving_s"] = now - out.get("heal_first_move_s", now)
            break
        if now > plan.heal_timeout_s:
            out["heal_stalled"] = (
                f"not healed {now:.0f} s after the kill: {len(status.under_replicated)} "
                f"partitions under-replicated, {len(status.moves)} moves under way "
                f"({', '.join(f'{m.partition}->{m.learner}' for m in status.moves[:5])}), "
                f"{len(status.stuck)} stuck"
            )
            say(f"{topic}: {out['heal_stalled']}")
            break
        time.sleep(HEAL_POLL_S)
    out["heal_progress"] = progress
    return out


def run(plan: Plan) -> Json:
    data = disk_tempdir("raftmq-controller-bench-")
    cluster = LocalCluster(data, local_spec(REPLICATION, {}), broker_args=plan.broker_args)
    add_cleanup(cluster.close)  # also on SIGTERM (kill_on_exit)
    out: Json = {
        "replicas": REPLICATION,
        "loadavg_1m_at_start": os.getloadavg()[0],  # the machine may be shared
        "heal_limits": {
            "heal_delay_ms": plan.heal_delay_ms,
            "max_moves_per_broker": plan.max_moves_per_broker,
            "max_moves": plan.max_moves,
            "move_bytes_per_s": plan.move_bytes_per_s,
        },
    }
    try:
        say(f"starting {REPLICATION} brokers in {data}")
        cluster.start()
        cluster.wait_ready(timeout=plan.timeout_s)
        cluster.create_topics(timeout=plan.timeout_s)  # none: waits for registration
        with cluster.admin() as admin:
            admin.create_topic(PROBE, 1, REPLICATION)
            out["reference"] = measure(cluster, admin, "reference", plan.reference, plan)
            out["big"] = measure(cluster, admin, "big", plan.partitions, plan)
            for label, partitions in (("reference", plan.reference), ("big", plan.partitions)):
                out[label].update(heal(cluster, admin, f"heal-{label}", partitions, plan))
                if "heal_stalled" in out[label]:
                    break  # moves left over would skew the next size
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
    ("  replicas moved meanwhile", "moved_in_failover", ""),
    ("heal: MB written", "heal_written_mb", "MiB"),
    ("heal: fenced after SIGKILL", "heal_fenced_s", "s"),
    ("heal: first move after", "heal_first_move_s", "s"),
    ("heal: healed after SIGKILL", "heal_s", "s"),
    ("  replicas moved", "heal_moves", ""),
    ("  MB moved", "heal_moved_mb", "MiB"),
    ("  first move -> healed", "heal_moving_s", "s"),
    ("  MB/s while moving", "heal_mb_per_s", "MiB/s"),
    ("  moves/s while moving", "heal_moves_per_s", ""),
    ("  most moves at once", "heal_max_moves", ""),
    ("  most on one broker", "heal_max_moves_per_broker", ""),
)


def table(out: Json) -> list[tuple[str, float, float, float]]:
    """(figure with unit, reference value, big value, ratio big / reference) per row."""
    ref, big = out["reference"], out["big"]
    nan = float("nan")  # a heal figure of a phase that stalled or did not run
    rows = [
        (f"{name} ({unit})" if unit else name, ref.get(key, nan), big.get(key, nan))
        for name, key, unit in ROWS
    ]
    for b in sorted(big["idle_cpu"]):
        rows.append(
            (f"broker {b} idle CPU (%)", 100 * ref["idle_cpu"][b], 100 * big["idle_cpu"][b])
        )
        rows.append((f"broker {b} open fds", ref["fds"][b], big["fds"][b]))
    return [(name, r, g, g / r if r else float("nan")) for name, r, g in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(ap, "200 partitions, short windows")
    ap.add_argument("--partitions", type=int, default=0, help="default 1000 (60 with --quick)")
    ap.add_argument(
        "--heal-mb",
        type=float,
        default=0,
        help="MiB written to each heal topic before its broker dies (default 64, 8 with --quick)",
    )
    ap.add_argument(
        "--heal-timeout-s",
        type=float,
        default=0,
        help="kill -> healed before the phase is reported stalled (default 1200, 180 quick)",
    )
    ap.add_argument(
        "--heal-delay-ms",
        type=int,
        default=5000,
        help="brokers' --heal-delay-ms (default 5000: longer than a failover restart takes, "
        "so that phase stays a restart; the broker default is 60 s)",
    )
    ap.add_argument(
        "--max-moves-per-broker",
        type=int,
        default=MOVES_PER_BROKER,
        help=f"brokers' flag (default {MOVES_PER_BROKER}, theirs)",
    )
    ap.add_argument(
        "--max-moves",
        type=int,
        default=MOVES_TOTAL,
        help=f"brokers' flag (default {MOVES_TOTAL}, theirs)",
    )
    ap.add_argument(
        "--move-bytes-per-s", type=int, default=0, help="brokers' flag (default 0: no cap, theirs)"
    )
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
    out["loadavg_1m_at_end"] = os.getloadavg()[0]
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
    limits = ", ".join(f"{k} {v}" for k, v in out["heal_limits"].items())
    print(f"\nheal limits: {limits}")
    for label in ("reference", "big"):
        if "heal_stalled" in out[label]:
            print(f"heal STALLED on the {label} topic: {out[label]['heal_stalled']}")
    print(
        f"whole run {out['seconds']} s; load average (1 min) {out['loadavg_1m_at_start']:.1f} "
        f"at the start, {out['loadavg_1m_at_end']:.1f} at the end"
    )
    if args.json:
        print_json_last(out, sort_keys=True)


if __name__ == "__main__":
    main()
