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
from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import controller_pb2 as cpb
from raftmq.api.v1 import controller_pb2_grpc as cpb_grpc
from raftmq.broker.metadata_cache import CACHE_FILE
from raftmq.client import AdminClient, ClientError, LowLevelClient
from raftmq.controller.quorum import GROUP as CONTROLLER_GROUP
from raftmq.format import entry
from raftmq.log.checkpoints import START_CHECKPOINT
from raftmq.log.durability_markers import DURABLE_SUFFIX
from raftmq.log.segment import INDEX_SUFFIX, LOG_SUFFIX
from raftmq.partition.producer_tracking import CHECKPOINT_FILE as PRODUCER_STATE_FILE
from raftmq.raft.host.state_store import STORE_FILE

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
    "corrupt-config",
    "corrupt-hardstate",
    "corrupt-producer-state",
    "corrupt-log-start",
    "corrupt-index",
    "corrupt-metadata-cache",
    "corrupt-controller-log",
    "disk-loss",
    "fd-pressure",
    "controller",
    "decommission",
)

CORRUPT_FILES = {
    "corrupt-hardstate": "the Raft state store (every group's hard state)",
    "corrupt-producer-state": "a producer-state checkpoint",
    "corrupt-log-start": "a log-start checkpoint",
    "corrupt-index": "an offset index",
    "corrupt-metadata-cache": "the metadata cache",
}
"""The bit-rot faults that flip a bit in one small CRC-framed file a replica or broker reads
at open (``find_files`` says where each lives), and what their descriptions call it."""

CONFIG_FILE_WHAT = (
    "the Raft state store (with each group's snapshot meta: the configuration it starts "
    "from; no CONFIG entry yet)"
)
"""What ``corrupt-config`` flips when no sealed segment holds a CONFIG entry."""

STORE_FAULTS = frozenset({"corrupt-config", "corrupt-hardstate"})
"""The bit-rot faults that flip a bit in a broker's Raft state store (``corrupt-config``
only when no sealed segment holds a CONFIG entry)."""

SEALED_SEGMENT_FAULTS = frozenset({"corrupt", "corrupt-config", "corrupt-index", "fd-pressure"})
"""Fault kinds that need partitions to seal segments within seconds: runs with one of them
(and no aggressive retention) use small segments (``ChaosOptions.sealed_segment_bytes``)."""

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
    idle: bool = False
    """The fault found nothing to do (no sealed segment to flip yet, no file of its kind):
    its kind goes back into the deck, to be drawn again later in the round."""


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
        self.direct = LowLevelClient(
            [chaos.direct_address(i) for i in chaos.nodes],
            retries=1,
            **chaos.client_settings,  # type: ignore[arg-type]
        )
        self.killed: set[int] = set()
        self.paused: set[int] = set()
        self._decommissioned = False
        self._decks: dict[str, list[str]] = {}
        """Per choice (the fault kind; a kind's shapes), what is still to be dealt in this
        round: each option once per round, in a shuffled order, so a short run with few
        faults still sees every kind it was given and every shape of a kind."""
        self.gone: set[int] = set()
        """The broker the ``decommission`` fault killed for good (at most one): no other
        fault picks it, and no heal restarts it."""
        self.corrupted: set[tuple[str, int]] = set()
        """(group directory name, Raft index) of every entry a bit-rot fault (``corrupt``,
        ``corrupt-config``, ``corrupt-controller-log``) flipped a bit in, on whichever
        replica: never a second replica's copy."""
        self.corrupted_files: set[tuple[str, str]] = set()
        """(file name, group directory name) of every replicated group's file a bit-rot
        fault flipped a bit in: never the same file of a second replica of that group, so
        a majority always holds a sound copy to repair from."""

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
        with AdminClient(
            addresses,
            attempts=10,
            backoff_s=0.1,
            timeout_s=2.0,
            **self.chaos.client_settings,
        ) as admin:
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
        category = self._deal("kind", [c for c in self.categories if c != "decommission"])
        if category in CORRUPT_FILES:
            fault = self._start_corrupt_file(category)
        else:
            fault = getattr(self, f"_start_{category.replace('-', '_')}")()
        deck = self._decks["kind"]
        if fault.idle and deck:
            deck.insert(0, category)  # drawn again last in this round
        return fault

    def _deal(self, choice: str, options: list[str]) -> str:
        """The next of ``options`` for ``choice``, from its shuffled deck (dealt anew
        when empty)."""
        deck = self._decks.setdefault(choice, [])
        if not deck:
            deck += options
            self.rng.shuffle(deck)
        return deck.pop()

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
        shape = self._deal("kill", ["kill-one", "kill-leader", "kill-majority", "kill-all"])
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
        shape = self._deal(
            "controller", ["kill-controller", "isolate-controller", "isolate-controller-fully"]
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
        shape = self._deal("unsynced", ["unsynced-one", "unsynced-leader"])
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
        return Fault(
            "corrupt", f"bit rot on node {victim}: {what}", heal, targets=[victim], idle=not flipped
        )

    def _start_corrupt_file(self, kind: str) -> Fault:
        """Bit rot in one file a replica (or the broker) reads when it opens, on a node
        that holds one: SIGKILL it, flip one bit in the file, restart it at heal. The
        files are small and CRC-framed, so the restarted broker finds the flip at open and
        must rebuild the file, repair the replica from a peer, or report it failed; it must
        never serve from the damaged file, nor drop the replica from its reports.

        A node without such a file (a producer-state checkpoint is written only every few
        thousand entries; a replicated group's file already flipped on another replica is
        not taken) is passed over for another; with none anywhere the fault does nothing
        and says so."""
        what = CORRUPT_FILES.get(kind) or CONFIG_FILE_WHAT
        if kind in STORE_FAULTS and self._wait_in_sync() is None:
            return Fault(
                kind,
                f"bit rot in {what} skipped: some replica is still catching up",
                lambda: None,
                idle=True,
            )
        found = self._flip_while_down(
            kind,
            what,
            self.live_nodes,
            lambda broker_dir: bool(find_files(broker_dir, kind, self.corrupted_files)),
            lambda broker_dir: flip_file_bit(
                find_files(broker_dir, kind, self.corrupted_files), self.rng, self.corrupted_files
            ),
        )
        return found or Fault(
            kind,
            f"bit rot in {what} skipped: no node holds one that may be flipped yet",
            lambda: None,
            idle=True,
        )

    def _flip_while_down(
        self,
        kind: str,
        what: str,
        nodes: list[int],
        holds: Callable[[Path], bool],
        flip: Callable[[Path], str],
    ) -> Fault | None:
        """SIGKILL the first of ``nodes`` (in a seeded order) whose data folder ``holds``
        something to flip, ``flip`` one bit there (looked for again: the broker may have
        deleted it before it stopped), and restart it at heal; None when no node holds any."""
        for victim in self.rng.sample(nodes, len(nodes)):
            broker_dir = self.chaos.data / f"broker-{victim}"
            if not holds(broker_dir):
                continue
            self.chaos.cluster.kill(victim)
            self.killed.add(victim)
            flipped = flip(broker_dir)

            def heal(victim: int = victim) -> None:
                self.chaos.cluster.start(victim)
                self.killed.discard(victim)

            said = flipped or "none left once it stopped: nothing flipped"
            return Fault(
                kind, f"bit rot in {what} on node {victim}: {said}", heal, targets=[victim]
            )
        return None

    def _start_corrupt_config(self) -> Fault:
        """Bit rot in a Raft configuration one replica reads at open, while its broker is
        down; like ``corrupt`` otherwise. A replica that reads its membership from damaged
        bytes must not elect or vote on a guess: it repairs them from a peer first.

        A group's log holds a CONFIG entry only once its membership changed (a move, a
        decommission, a rebalance); until then the configuration it starts from is in its
        snapshot meta (in the broker's state store, with the log's start point). So: a
        CONFIG entry of a sealed segment when some node holds one, else the state store
        (the snapshot metas of the partitions' and, on a voter, the controller group's)."""
        if any(
            config_entries(self.chaos.data / f"broker-{i}", self.corrupted) for i in self.live_nodes
        ):
            return self._start_entry_flip(
                "corrupt-config",
                "a CONFIG entry",
                lambda broker_dir: config_entries(broker_dir, self.corrupted),
                self.live_nodes,
            )
        return self._start_corrupt_file("corrupt-config")

    def _start_corrupt_controller_log(self) -> Fault:
        """Bit rot in the controller's metadata log on one voter (the ``__cluster_metadata``
        group's segments), while it is down: an entry of a sealed segment, or, since that
        log rolls rarely, one of its active segment that another entry follows (so the log
        cannot take it for a torn write at its end)."""
        if self._wait_in_sync() is None:
            return Fault(
                "corrupt-controller-log",
                "bit rot in the controller's metadata log skipped: some replica or voter is "
                "still catching up",
                lambda: None,
                idle=True,
            )
        voters = [v for v in self.chaos.voters if v in self.live_nodes]
        return self._start_entry_flip(
            "corrupt-controller-log",
            "an entry of the controller's metadata log",
            lambda broker_dir: controller_entries(broker_dir, self.corrupted),
            voters,
        )

    def _start_entry_flip(
        self,
        kind: str,
        what: str,
        find: Callable[[Path], list[tuple[Path, entry.EntryHeader]]],
        nodes: list[int],
    ) -> Fault:
        """SIGKILL the first of ``nodes`` (in a seeded order) on which ``find`` finds an
        entry, flip one bit in that entry's payload, restart it at heal."""
        found = self._flip_while_down(
            kind,
            what,
            nodes,
            lambda broker_dir: bool(find(broker_dir)),
            lambda broker_dir: flip_entry_bit(find(broker_dir), self.rng, self.corrupted),
        )
        return found or Fault(
            kind, f"bit rot in {what} skipped: no node holds one yet", lambda: None
        )

    def _start_disk_loss(self) -> Fault:
        """A follower comes back with a wiped or truncated data directory (a replaced or
        restored disk): it lost entries it had acknowledged, and must catch up without
        voting or counting toward a commit until it holds them again.

        The victim is a node whose partitions' other replicas are all in sync (each answers
        the leader's high watermark), so at most one replica of a partition is ever behind
        for this reason: a majority that lost its disks has lost data in any system."""
        victim = self._wait_in_sync()
        if victim is None:
            return Fault(
                "disk-loss", "disk loss skipped: some replica is still catching up", lambda: None
            )
        shape = self._deal("disk-loss", ["wipe-broker", "wipe-partition", "truncate-partition"])
        self.chaos.cluster.kill(victim)
        self.killed.add(victim)
        broker_dir = self.chaos.data / f"broker-{victim}"
        if shape == "wipe-broker":
            self._lost_state(_group_dirs(broker_dir))
            shutil.rmtree(broker_dir, ignore_errors=True)
            what = f"data directory {broker_dir.name} wiped"
        else:
            partition = self.rng.randrange(self.chaos.partitions)
            directory = broker_dir / f"{TOPIC}-{partition}"
            self._lost_state([directory])
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

    def _lost_state(self, group_dirs: list[Path]) -> None:
        """A disk loss takes these groups' replicated state from one replica, which then
        rejoins without a vote: count it as that replica's flip of each such file, so no
        bit-rot fault takes another replica's vote or start point too. Two of three
        replicas unable to vote is a lost majority, which no system survives (seed 7002
        wiped a voter and then flipped another's metadata hard state: the controller
        could never elect again)."""
        for directory in group_dirs:
            for name in _REPLICATED_STATE:
                self.corrupted_files.add((name, directory.name))

    def _wait_in_sync(self) -> int | None:
        """:meth:`_in_sync_victim`, waited for: replicas catch up within seconds of a heal,
        slower on a loaded machine, so wait a while for one rather than skip the fault (a
        schedule that meant it would not test it)."""
        deadline = time.monotonic() + DISK_LOSS_WAIT_S
        victim = self._in_sync_victim()
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.5)
            victim = self._in_sync_victim()
        return victim

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
        if not self._controller_in_sync():
            return None
        return self.rng.choice(self.live_nodes)

    def _controller_in_sync(self) -> bool:
        """Every controller voter answers and none is rejoining (after a disk loss or a
        flipped entry of its metadata log, it gives no vote until it holds the leader's
        log again). Damaging a second voter's state meanwhile would leave two of three
        without their data: past what a 3-voter quorum tolerates, so the quorum rightly
        stalls, and the run would test nothing but that."""
        for voter in self.chaos.voters:
            if voter in self.gone:
                continue
            if voter in self.killed or voter in self.paused:
                return False
            try:
                address = self.chaos.direct_address(voter)
                with net.channel(address, security=self.chaos.security) as channel:
                    status = cpb_grpc.ControllerStub(channel).DescribeVoter(
                        cpb.DescribeVoterRequest(), timeout=2
                    )
            except Exception:
                return False
            if status.rejoining:
                return False
        return True

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
        data = _read_live(seg)
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


def _group_dirs(broker_dir: Path) -> list[Path]:
    """The replicated groups' directories of one broker: its partitions' and, on a
    controller voter, the metadata group's."""
    dirs = sorted(broker_dir.glob(f"{TOPIC}-*"))
    controller = broker_dir / CONTROLLER_GROUP
    return [*dirs, controller] if controller.is_dir() else dirs


_REPLICATED_STATE = frozenset({STORE_FILE, PRODUCER_STATE_FILE, START_CHECKPOINT})
"""Files whose loss a replica may have to repair from a peer: flipped on one replica of a
group at most (see ``Nemesis.corrupted_files``). The state store holds every group of its
broker: a bit flipped anywhere in it makes each of them rejoin (docs/raft.md), so it
counts as that broker's flip of every group's state."""


def find_files(broker_dir: Path, kind: str, corrupted: set[tuple[str, str]]) -> list[Path]:
    """The files of one broker that the bit-rot fault ``kind`` (a key of CORRUPT_FILES)
    may flip a bit in, sorted; none that is empty, and none of a group whose same file was
    flipped on another replica (``corrupted``: (file name, group directory name)).

    - ``corrupt-config`` (its fallback when no sealed segment holds a CONFIG entry) and
      ``corrupt-hardstate``: the broker's state store (``raft-state.wal``: every group's
      snapshot meta, with the membership a new group starts from, and its term, vote and
      commit), unless one of its groups' state was flipped or lost on another replica;
    - ``corrupt-producer-state``: each partition's ``producer_state.json`` checkpoint;
    - ``corrupt-log-start``: each group's ``log-start.checkpoint`` (the log writes it when
      it is created, and again whenever retention or a snapshot moves its start);
    - ``corrupt-index``: the offset index (``.index``) of each sealed segment;
    - ``corrupt-metadata-cache``: the broker's ``metadata.cache``.

    The last two are never excluded: an index is rebuilt from its own segment, and the
    cache is the broker's own (the controller has the truth), so no replica's copy
    depends on another's."""
    if kind == "corrupt-metadata-cache":
        found = [broker_dir / CACHE_FILE]
    elif kind == "corrupt-index":
        found = [
            seg.with_suffix(INDEX_SUFFIX)
            for d in _group_dirs(broker_dir)
            for seg in sealed_segments(d)
        ]
    elif kind in STORE_FAULTS:
        # Partitions: the fault waits until every replica is in sync (_wait_in_sync), so no
        # other replica of theirs is still rejoining. The metadata group's catching up is
        # not watched: once its state was lost or flipped anywhere, no voter's store is.
        store = broker_dir / STORE_FILE
        voter = (broker_dir / CONTROLLER_GROUP).is_dir()
        hit = voter and (STORE_FILE, CONTROLLER_GROUP) in corrupted
        return [] if hit or _size_live(store) == 0 else [store]
    else:
        name = {
            "corrupt-producer-state": PRODUCER_STATE_FILE,
            "corrupt-log-start": START_CHECKPOINT,
        }[kind]
        found = [d / name for d in _group_dirs(broker_dir)]
    return [
        path
        for path in found
        if _size_live(path) > 0 and (path.name, path.parent.name) not in corrupted
    ]


def flip_file_bit(paths: list[Path], rng: random.Random, corrupted: set[tuple[str, str]]) -> str:
    """Flip one bit anywhere in one of ``paths`` (the broker must be dead) and note the
    file (``corrupted``), so the same file of the same group is never flipped on another
    replica; say what was flipped ("" when ``paths`` is empty). Every such file is framed
    with a CRC (``raftmq.log.atomic_file``), so any bit of it is one the reader checks."""
    if not paths:
        return ""
    path = rng.choice(paths)
    data = path.read_bytes()
    if not data:
        return ""
    position = rng.randrange(len(data))
    bit = rng.randrange(8)
    _flip(path, position, bit)
    if path.name == STORE_FILE:
        corrupted.update((STORE_FILE, d.name) for d in _group_dirs(path.parent))
    elif path.name in _REPLICATED_STATE:
        corrupted.add((path.name, path.parent.name))
    return f"bit {bit} of byte {position} of {len(data)} flipped in {path.parent.name}/{path.name}"


def _flip(path: Path, position: int, bit: int) -> None:
    """Flip one bit in place and fsync it: what a bad sector read back as."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())


def _read_live(path: Path) -> bytes:
    """A file of a broker that may be running: retention or a compaction may delete it
    between the listing and the read; gone reads as empty (nothing to flip there)."""
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return b""


def _size_live(path: Path) -> int:
    """As :func:`_read_live`, the size of a regular file (0 when gone or not one)."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:
        return 0


def config_entries(
    broker_dir: Path, corrupted: set[tuple[str, int]]
) -> list[tuple[Path, entry.EntryHeader]]:
    """The CONFIG entries (Raft configurations) of sealed segments of one broker's
    partitions, as (segment, header), leaving out those flipped on another replica before.
    Sealed only, as for ``corrupt``: a damaged entry in the active segment's tail reads as
    a torn write, a different fault."""
    return [
        (seg, h)
        for d in sorted(broker_dir.glob(f"{TOPIC}-*"))
        for seg in sealed_segments(d)
        for h in entry.iter_headers(_read_live(seg), verify=False)
        if h.type == entry.EntryType.CONFIG
        and h.payload_length > 0
        and (d.name, h.index) not in corrupted
    ]


def controller_entries(
    broker_dir: Path, corrupted: set[tuple[str, int]]
) -> list[tuple[Path, entry.EntryHeader]]:
    """The entries with a payload of the controller's metadata log on one voter, as
    (segment, header): those of sealed segments, and of the active one all but the last
    (another entry follows each, so a flip there is bit rot, not a torn tail); none
    flipped on another voter before. Empty on a node that is not a voter."""
    directory = broker_dir / CONTROLLER_GROUP
    if not directory.is_dir():
        return []
    sealed = set(sealed_segments(directory))
    found: list[tuple[Path, entry.EntryHeader]] = []
    for seg in sorted(directory.glob(f"*{LOG_SUFFIX}")):
        headers = list(entry.iter_headers(_read_live(seg), verify=False))
        if seg not in sealed:
            headers = headers[:-1]
        found += [
            (seg, h)
            for h in headers
            if h.payload_length > 0 and (directory.name, h.index) not in corrupted
        ]
    return found


def flip_entry_bit(
    candidates: list[tuple[Path, entry.EntryHeader]],
    rng: random.Random,
    corrupted: set[tuple[str, int]],
) -> str:
    """Flip one bit in the payload of one of ``candidates`` (the broker must be dead), note
    it in ``corrupted``, and say what was flipped ("" when there is no candidate)."""
    if not candidates:
        return ""
    seg, h = rng.choice(candidates)
    position = h.position + entry.HEADER_SIZE + rng.randrange(h.payload_length)
    bit = rng.randrange(8)
    _flip(seg, position, bit)
    corrupted.add((seg.parent.name, h.index))
    return (
        f"bit {bit} of byte {position} flipped in {seg.parent.name}/{seg.name} "
        f"({entry.EntryType(h.type).name} entry at index {h.index})"
    )


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
