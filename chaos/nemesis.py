"""What the harness injects: network faults through toxiproxy and process faults by signal,
on a schedule drawn from a seed.

The seed fixes the sequence of fault kinds, their parameters and timings; targets named
by role ("the leader of partition 2") are resolved against the live cluster when the fault
starts, so a replay injects the same faults at the same moments into whatever the cluster
looks like then.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos.cluster import TOPIC, ChaosCluster
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.format import entry
from raftmq.log.durability_markers import DURABLE_SUFFIX
from raftmq.log.segment import INDEX_SUFFIX, LOG_SUFFIX

CATEGORIES = (
    "partition",
    "kill",
    "pause",
    "latency",
    "bandwidth",
    "reset",
    "hung",
    "snapshot",
    "unsynced",
    "corrupt",
    "disk-loss",
    "fd-pressure",
    "controller",
    "decommission",
)

"""Sidecar of a segment file holding the size its last fsync covered (8 bytes, big-endian),
written by brokers started with ``--durability-markers`` (see ``raftmq.broker.server``)."""
_DURABLE = struct.Struct(">q")

SNAPSHOT_HOLD = (8.0, 10.0)
"""How long a ``snapshot`` fault keeps its follower cut off: long enough for the others'
retention (aggressive in runs with this fault, see ``chaos.run``) to delete what it lacks."""


FD_PRESSURE_LIMIT = 128
"""RLIMIT_NOFILE (soft and hard) of a broker restarted by the ``fd-pressure`` fault: below
the 1,024 many hosts default to, and far below what a file per segment would need once
its partitions have rolled a few segments each (the chaos runs with ``corrupt`` or
``fd-pressure`` use small segments)."""


DECOMMISSION_HOLD_S = 1.0
"""The ``decommission`` fault heals nothing, so it holds only briefly: the schedule's next
faults run while the controller fences the dead broker and moves its replicas away."""


DISK_LOSS_WAIT_S = 15.0
"""How long a disk-loss fault waits for every replica to be in sync before it is skipped."""
IN_SYNC_OFFSETS = 500
"""How far apart the replicas' high watermarks may be for the ``disk-loss`` fault to count
them in sync: far more than a follower lags under the workload (tens of records), far less
than a replica rejoining after a wipe is behind."""


@dataclass
class Fault:
    kind: str
    description: str
    heal: Callable[[], None]
    started: float = 0.0
    ended: float = 0.0
    targets: list[int] = field(default_factory=list)
    hold: float | None = None
    """How long to hold this fault, when its kind needs other than the usual duration."""


class Nemesis:
    def __init__(self, chaos: ChaosCluster, seed: int, categories: list[str]) -> None:
        unknown = set(categories) - set(CATEGORIES)
        if unknown:
            raise ValueError(
                f"unknown fault kinds {sorted(unknown)}; choose from {', '.join(CATEGORIES)}"
            )
        if set(categories) == {"decommission"}:
            raise ValueError("decommission needs another fault kind to run while it heals")
        self.chaos = chaos
        self.rng = random.Random(seed)
        self.categories = categories
        self.direct = LowLevelClient([chaos.direct_address(i) for i in chaos.nodes], retries=1)
        self.killed: set[int] = set()
        self.paused: set[int] = set()
        self._decommissioned = False
        self.gone: set[int] = set()
        """The broker the ``decommission`` fault killed for good (at most one): no other
        fault picks it, and no heal restarts it."""
        self.corrupted: set[tuple[str, int]] = set()
        """(partition directory name, Raft index) of every entry the ``corrupt`` fault
        flipped a bit in, on whichever replica: never a second replica's copy."""

    # --- helpers -----------------------------------------------------------------------

    def leader_of(self, partition: int) -> int | None:
        leaders = self.direct.refresh_leaders(timeout=0.5)
        leader = leaders.get((TOPIC, partition))
        if leader is None:
            return None
        # Leaders are reported with advertised (proxy) addresses; the id is what we need.
        return leader.broker_id

    def controller_leader(self) -> int | None:
        """The active controller (the controller quorum's leader) as the admin API says:
        DescribeCluster, a read the leader confirms with a quorum; None when there is none
        or no voter answers in time."""
        addresses = [self.chaos.direct_address(i) for i in self.live_nodes]
        with AdminClient(addresses, attempts=10, backoff_s=0.1, timeout_s=2.0) as admin:
            try:
                return admin.describe_cluster().controller_leader_id or None
            except ClientError:
                return None

    @property
    def live_nodes(self) -> list[int]:
        """The nodes a fault may pick: all but the one killed for good, if any."""
        return [i for i in self.chaos.nodes if i not in self.gone]

    def _some_leader(self) -> int:
        partition = self.rng.randrange(self.chaos.partitions)
        leader = self.leader_of(partition)
        # A broker's metadata may still name the dead one as a leader for a while.
        if leader is not None and leader not in self.gone:
            return leader
        return self.rng.choice(self.live_nodes)

    def _cut(self, groups: list[set[int]]) -> list[tuple[int, int]]:
        """Disable every Raft link between nodes of different groups."""
        cut = []
        for link in self.chaos.links:
            ga = next(i for i, g in enumerate(groups) if link.a in g)
            gb = next(i for i, g in enumerate(groups) if link.b in g)
            if ga != gb:
                self.chaos.proxies[link.name].disable()
                cut.append((link.a, link.b))
        return cut

    def _enable_links(self, pairs: list[tuple[int, int]]) -> Callable[[], None]:
        def heal() -> None:
            for a, b in pairs:
                self.chaos.link(a, b).enable()

        return heal

    def _toxic_everywhere(
        self, kind: str, attributes: dict, names: list[str]
    ) -> Callable[[], None]:
        added = []
        for name in names:
            for stream in ("upstream", "downstream"):
                toxic = f"{kind}-{stream}"
                self.chaos.proxies[name].add_toxic(
                    type=kind, stream=stream, name=toxic, attributes=attributes
                )
                added.append((name, toxic))

        def heal() -> None:
            for name, toxic in added:
                self.chaos.proxies[name].destroy_toxic(toxic)

        return heal

    # --- faults ------------------------------------------------------------------------

    def next_fault(self) -> Fault:
        """Draw and start the next fault. With ``decommission`` among the kinds, it is the
        first fault and only that once (one broker killed for good per run), so the others
        drawn after it run while the cluster heals."""
        if "decommission" in self.categories and not self._decommissioned:
            self._decommissioned = True
            return self._start_decommission()
        categories = [c for c in self.categories if c != "decommission"]
        category = self.rng.choice(categories)
        return getattr(self, f"_start_{category.replace('-', '_')}")()

    def _start_decommission(self) -> Fault:
        """A broker dies for good: SIGKILL, never restarted. The controller must fence it,
        wait its heal delay, and move each of its replicas to a live broker (a learner
        added through the partition's Raft group, promoted once caught up, the dead voter
        removed), while the faults drawn after this one run.

        The victim is a broker-only node when the cluster has one (the controller voters
        are a fixed list: a voter lost for good would leave the quorum one failure from
        stalling for the rest of the run), else any node but the active controller."""
        voters = set(self.chaos.voters)
        candidates = [i for i in self.live_nodes if i not in voters]
        if not candidates:
            leader = self.controller_leader()
            candidates = [i for i in self.live_nodes if i != leader]
        victim = self.rng.choice(candidates)
        self.chaos.cluster.kill(victim)
        self.paused.discard(victim)
        self.killed.discard(victim)
        self.gone.add(victim)
        return Fault(
            "decommission",
            f"broker {victim} SIGKILLed for good (its replicas must move to live brokers)",
            lambda: None,
            targets=[victim],
            hold=DECOMMISSION_HOLD_S,
        )

    def _start_partition(self) -> Fault:
        nodes = self.chaos.nodes
        shape = self.rng.choice(
            [
                "isolate-one",
                "isolate-leader",
                "majority-minority",
                "ring",
                "client-leader",
                "one-way",
            ]
        )
        if shape in ("isolate-one", "isolate-leader"):
            victim = (
                self._some_leader()
                if shape == "isolate-leader"
                else self.rng.choice(self.live_nodes)
            )
            pairs = self._cut([{victim}, set(nodes) - {victim}])
            return Fault(
                shape,
                f"{shape}: node {victim} cut off",
                self._enable_links(pairs),
                targets=[victim],
            )
        if shape == "majority-minority":
            shuffled = self.rng.sample(nodes, len(nodes))
            minority = set(shuffled[: (len(nodes) - 1) // 2])
            pairs = self._cut([minority, set(nodes) - minority])
            return Fault(shape, f"{shape}: {sorted(minority)} | rest", self._enable_links(pairs))
        if shape == "ring":
            # Each node keeps only its neighbours: every majority overlaps, no node sees all.
            n = len(nodes)
            keep = {frozenset((nodes[i], nodes[(i + 1) % n])) for i in range(n)}
            pairs = []
            for link in self.chaos.links:
                if frozenset((link.a, link.b)) not in keep or (
                    n == 3 and (link.a, link.b) == (1, n)
                ):
                    self.chaos.proxies[link.name].disable()
                    pairs.append((link.a, link.b))
            return Fault(shape, f"ring: links {pairs} cut", self._enable_links(pairs))
        if shape == "client-leader":
            victim = self._some_leader()
            proxy = self.chaos.proxies[f"client-{victim}"]
            proxy.disable()
            return Fault(shape, f"clients cut from node {victim}", proxy.enable, targets=[victim])
        # one-way: a link stops delivering in one direction only (timeout toxic holds data).
        link = self.rng.choice(self.chaos.links)
        stream = self.rng.choice(["upstream", "downstream"])
        proxy = self.chaos.proxies[link.name]
        proxy.add_toxic(type="timeout", stream=stream, name="one-way", attributes={"timeout": 0})
        direction = f"{link.a}->{link.b}" if stream == "upstream" else f"{link.b}->{link.a}"
        return Fault(shape, f"one-way cut {direction}", lambda: proxy.destroy_toxic("one-way"))

    def _start_kill(self) -> Fault:
        nodes = self.live_nodes
        shape = self.rng.choice(["kill-one", "kill-leader", "kill-majority", "kill-all"])
        if shape == "kill-one":
            victims = [self.rng.choice(nodes)]
        elif shape == "kill-leader":
            victims = [self._some_leader()]
        elif shape == "kill-majority":
            victims = self.rng.sample(nodes, len(nodes) // 2 + 1)
        else:
            victims = list(nodes)
        for v in victims:
            self.chaos.cluster.kill(v)
            self.killed.add(v)

        def heal() -> None:
            for v in victims:
                self.chaos.cluster.start(v)
                self.killed.discard(v)

        return Fault(shape, f"SIGKILL {victims}", heal, targets=victims)

    def _start_controller(self) -> Fault:
        """A fault aimed at the active controller, found through the admin API when the
        fault starts: SIGKILL it (restarted at heal), cut its Raft links (the metadata
        group's and its partitions': the other voters must elect a controller while it may
        still believe it leads, and take the brokers' heartbeats from it), or cut its
        client proxy too (brokers' heartbeats and registrations reach it through that
        proxy, as clients do)."""
        shape = self.rng.choice(
            ["kill-controller", "isolate-controller", "isolate-controller-fully"]
        )
        found = self.controller_leader()
        victim = found if found is not None else self.rng.choice(self.live_nodes)
        known = "" if found is not None else " (no controller leader known: a random node)"
        if shape == "kill-controller":
            self.chaos.cluster.kill(victim)
            self.killed.add(victim)

            def heal() -> None:
                self.chaos.cluster.start(victim)
                self.killed.discard(victim)

            return Fault(shape, f"SIGKILL controller {victim}{known}", heal, targets=[victim])
        pairs = self._cut([{victim}, set(self.chaos.nodes) - {victim}])
        heal_links = self._enable_links(pairs)
        if shape == "isolate-controller":
            return Fault(
                shape,
                f"controller {victim} cut off from its peers{known}",
                heal_links,
                targets=[victim],
            )
        proxy = self.chaos.proxies[f"client-{victim}"]
        proxy.disable()

        def heal_all() -> None:
            heal_links()
            proxy.enable()

        return Fault(
            shape,
            f"controller {victim} cut off from its peers and clients{known}",
            heal_all,
            targets=[victim],
        )

    def _start_unsynced(self) -> Fault:
        """A power loss on one node: SIGKILL it, then cut every segment file back to the size
        its last fsync covered. A SIGKILL alone keeps the page cache, so it never loses an
        un-fsynced write; this does, and acks=all records must survive it anyway (the
        broker acknowledges only what an fsync covered, on a majority)."""
        shape = self.rng.choice(["unsynced-one", "unsynced-leader"])
        victim = (
            self._some_leader() if shape == "unsynced-leader" else self.rng.choice(self.live_nodes)
        )
        self.chaos.cluster.kill(victim)
        self.killed.add(victim)
        dropped, files = lose_unsynced(self.chaos.data / f"broker-{victim}")

        def heal() -> None:
            self.chaos.cluster.start(victim)
            self.killed.discard(victim)

        return Fault(
            shape,
            f"power loss on node {victim}: SIGKILL, {dropped} un-fsynced bytes dropped "
            f"from {files} segment files",
            heal,
            targets=[victim],
        )

    def _start_pause(self) -> Fault:
        victim = self._some_leader()
        self.chaos.cluster.signal(victim, signal.SIGSTOP)
        self.paused.add(victim)

        def heal() -> None:
            self.chaos.cluster.signal(victim, signal.SIGCONT)
            self.paused.discard(victim)

        return Fault(
            "pause-leader", f"SIGSTOP node {victim} (a zombie leader)", heal, targets=[victim]
        )

    def _start_latency(self) -> Fault:
        latency = self.rng.choice([20, 50, 100])
        jitter = latency // 2
        names = [link.name for link in self.chaos.links]
        heal = self._toxic_everywhere("latency", {"latency": latency, "jitter": jitter}, names)
        return Fault("latency", f"latency {latency}±{jitter} ms on every Raft link", heal)

    def _start_bandwidth(self) -> Fault:
        rate = self.rng.choice([64, 256, 1024])
        names = [link.name for link in self.chaos.links]
        heal = self._toxic_everywhere("bandwidth", {"rate": rate}, names)
        return Fault("bandwidth", f"bandwidth {rate} KB/s on every Raft link", heal)

    def _start_reset(self) -> Fault:
        link = self.rng.choice(self.chaos.links)
        proxy = self.chaos.proxies[link.name]
        proxy.add_toxic(
            type="reset_peer", stream="upstream", name="reset", attributes={"timeout": 0}
        )
        return Fault(
            "reset", f"connections {link.a}<->{link.b} reset", lambda: proxy.destroy_toxic("reset")
        )

    def _start_hung(self) -> Fault:
        link = self.rng.choice(self.chaos.links)
        heal = self._toxic_everywhere("timeout", {"timeout": 0}, [link.name])
        return Fault("hung", f"connection {link.a}<->{link.b} hangs (no data, no close)", heal)

    def _start_snapshot(self) -> Fault:
        """Cut one follower of a partition off from every Raft peer for long enough that
        the leader's retention deletes entries it still needs: after healing it can only
        catch up by a snapshot (its log restarts at the leader's log start)."""
        partition = self.rng.randrange(self.chaos.partitions)
        replicas = self.chaos.replicas(partition)
        leader = self.leader_of(partition)
        followers = [r for r in replicas if r != leader] or list(replicas)
        victim = self.rng.choice(followers)
        hold = self.rng.uniform(*SNAPSHOT_HOLD)
        pairs = self._cut([{victim}, set(self.chaos.nodes) - {victim}])
        return Fault(
            "snapshot",
            f"snapshot: follower {victim} of partition {partition} cut off for {hold:.1f} s",
            self._enable_links(pairs),
            targets=[victim],
            hold=hold,
        )

    def _start_corrupt(self) -> Fault:
        """Bit rot on one replica: SIGKILL a node, flip one bit in the payload of an entry of
        a sealed segment of one partition, restart it. Only ever one replica's copy of an
        entry: the others hold it, so it can be (and must be) repaired from them. The
        restart matters: a running broker has already checked its closed segments' CRCs
        once, so the flip is found by the next read after the restart, or by the scrubber."""
        victim = self.rng.choice(self.live_nodes)
        self.chaos.cluster.kill(victim)
        self.killed.add(victim)
        flipped = flip_bit(self.chaos.data / f"broker-{victim}", self.rng, self.corrupted)

        def heal() -> None:
            self.chaos.cluster.start(victim)
            self.killed.discard(victim)

        what = flipped or "nothing to corrupt yet (no sealed segment)"
        return Fault("corrupt", f"bit rot on node {victim}: {what}", heal, targets=[victim])

    def _start_disk_loss(self) -> Fault:
        """A follower comes back with a wiped or truncated data directory (a replaced or
        restored disk): it lost entries it had acknowledged, and must catch up without
        voting or counting toward a commit until it holds them again.

        The victim is a node whose partitions' other replicas are all in sync (each answers
        the leader's high watermark), so at most one replica of a partition is ever behind
        for this reason: a majority that lost its disks has lost data in any system."""
        # Replicas catch up within seconds of a heal, slower on a loaded machine: wait a
        # while for one rather than skip the fault (a schedule that meant it would not test it).
        deadline = time.monotonic() + DISK_LOSS_WAIT_S
        victim = self._in_sync_victim()
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.5)
            victim = self._in_sync_victim()
        if victim is None:
            return Fault(
                "disk-loss", "disk loss skipped: some replica is still catching up", lambda: None
            )
        shape = self.rng.choice(["wipe-broker", "wipe-partition", "truncate-partition"])
        self.chaos.cluster.kill(victim)
        self.killed.add(victim)
        broker_dir = self.chaos.data / f"broker-{victim}"
        if shape == "wipe-broker":
            shutil.rmtree(broker_dir, ignore_errors=True)
            what = f"data directory {broker_dir.name} wiped"
        else:
            partition = self.rng.randrange(self.chaos.partitions)
            directory = broker_dir / f"{TOPIC}-{partition}"
            if shape == "wipe-partition":
                shutil.rmtree(directory, ignore_errors=True)
                what = f"partition {partition}'s directory wiped"
            else:
                kept = truncate_log(directory, self.rng)
                what = f"partition {partition}'s log cut back to its first {kept} bytes"

        def heal() -> None:
            self.chaos.cluster.start(victim)
            self.killed.discard(victim)

        return Fault(shape, f"disk loss on node {victim}: {what}", heal, targets=[victim])

    def _in_sync_victim(self) -> int | None:
        """A node to take a disk from, chosen only when every replica of every partition
        answers a high watermark within IN_SYNC_OFFSETS of the others (so no replica is
        still rejoining after an earlier disk loss; followers learn the commit a little
        after the leader, so under load they never all answer the same)."""
        for p in range(self.chaos.partitions):
            marks = []
            for r in self.chaos.replicas(p):
                if r in self.killed or r in self.paused:
                    return None
                try:
                    resp = self.direct.stub(self.chaos.direct_address(r)).ListOffsets(
                        pb.ListOffsetsRequest(topic=TOPIC, partition=p, position=pb.LATEST),
                        timeout=2,
                    )
                except Exception:
                    return None
                marks.append(resp.high_watermark)
            if max(marks) - min(marks) > IN_SYNC_OFFSETS:
                return None
        return self.rng.choice(self.live_nodes)

    def _start_fd_pressure(self) -> Fault:
        """Restart one node with a low open-file limit (soft and hard): a broker must bound
        its open files by what the limit allows and go on serving every partition, or say
        clearly why it cannot; it must never live on half-dead. It keeps that limit until a
        later fault restarts it."""
        victim = self.rng.choice(self.live_nodes)
        self.chaos.cluster.stop(victim)
        self.chaos.cluster.start(victim, open_files_limit=FD_PRESSURE_LIMIT)
        return Fault(
            "fd-pressure",
            f"node {victim} restarted with an open-file limit of {FD_PRESSURE_LIMIT}",
            lambda: None,
            targets=[victim],
        )

    # --- schedule ----------------------------------------------------------------------

    def durations(self, fault: Fault | None = None) -> tuple[float, float]:
        """(how long ``fault`` lasts, the quiet gap after it). Both are always drawn, so a
        fault carrying its own hold does not shift the seed's later draws."""
        hold, gap = self.rng.uniform(2.0, 5.0), self.rng.uniform(1.0, 2.5)
        if fault is not None and fault.hold is not None:
            hold = fault.hold
        return hold, gap

    def heal_everything(self) -> None:
        self.chaos.heal_network()
        for v in list(self.paused):
            self.chaos.cluster.signal(v, signal.SIGCONT)
        self.paused.clear()
        for v in list(self.killed):
            self.chaos.cluster.start(v)
        self.killed.clear()

    def close(self) -> None:
        self.direct.close()


def lose_unsynced(broker_dir: Path) -> tuple[int, int]:
    """Truncate every segment under ``broker_dir`` that has a durability marker to the size
    in it, as a power loss would: (bytes dropped, files cut). The broker must be dead.

    The simulation errs only towards keeping bytes, never towards inventing a loss: a
    segment without a marker (rolled, written, not yet fsynced) is left whole, and so is
    one whose marker exceeds its size (the log cut a suffix after that fsync)."""
    dropped = files = 0
    for segment in sorted(broker_dir.rglob("*.log")):
        marker = segment.with_name(segment.name + DURABLE_SUFFIX)
        try:
            raw = marker.read_bytes()
            size = segment.stat().st_size
        except FileNotFoundError:
            continue
        if len(raw) != _DURABLE.size:
            continue
        (durable,) = _DURABLE.unpack(raw)
        if 0 <= durable < size:
            os.truncate(segment, durable)
            dropped += size - durable
            files += 1
    return dropped, files


def sealed_segments(directory: Path) -> list[Path]:
    """The segment files of one partition directory that have index files (sealed: fsynced
    and closed), oldest first."""
    return sorted(
        seg for seg in directory.glob(f"*{LOG_SUFFIX}") if seg.with_suffix(INDEX_SUFFIX).exists()
    )


def flip_bit(broker_dir: Path, rng: random.Random, corrupted: set[tuple[str, int]]) -> str:
    """Flip one bit inside the payload of one entry of a sealed segment under
    ``broker_dir`` (the broker must be dead), skipping entries whose copy on another
    replica was flipped before; say what was flipped ("" when nothing could be).

    The payload, not the header: a flipped length would make the rest of the segment
    unreadable, which is a different fault (a torn segment) than bit rot in one entry."""
    candidates = [seg for d in sorted(broker_dir.glob(f"{TOPIC}-*")) for seg in sealed_segments(d)]
    rng.shuffle(candidates)
    for seg in candidates:
        data = seg.read_bytes()
        headers = [
            h
            for h in entry.iter_headers(data, verify=False)
            if h.payload_length > 0 and (seg.parent.name, h.index) not in corrupted
        ]
        if not headers:
            continue
        h = rng.choice(headers)
        position = h.position + entry.HEADER_SIZE + rng.randrange(h.payload_length)
        bit = rng.randrange(8)
        with open(seg, "r+b") as f:
            f.seek(position)
            byte = f.read(1)[0]
            f.seek(position)
            f.write(bytes([byte ^ (1 << bit)]))
            f.flush()
            os.fsync(f.fileno())
        corrupted.add((seg.parent.name, h.index))
        return (
            f"bit {bit} of byte {position} flipped in {seg.parent.name}/{seg.name} "
            f"(entry at index {h.index}, offsets {h.base_offset}-{h.last_offset})"
        )
    return ""


def truncate_log(directory: Path, rng: random.Random) -> int:
    """Cut one partition's log back to a random earlier entry boundary, as a disk restored
    from an old backup would leave it: later segments are deleted, the one holding the
    cut is truncated and loses its index files (recovery rebuilds them). Returns the
    bytes kept in the segment that was cut."""
    segments = sorted(directory.glob(f"*{LOG_SUFFIX}"))
    if not segments:
        return 0
    cut = rng.randrange(len(segments))
    for seg in segments[cut + 1 :]:
        for path in directory.glob(seg.stem + ".*"):
            path.unlink()
    seg = segments[cut]
    data = seg.read_bytes()
    ends = [h.end for h in entry.iter_headers(data, verify=False)]
    boundaries = [0, *ends[:-1]]
    keep = rng.choice(boundaries)
    os.truncate(seg, keep)
    for suffix in (INDEX_SUFFIX, ".timeindex"):
        seg.with_suffix(suffix).unlink(missing_ok=True)
    return keep


def now() -> float:
    return time.monotonic()
