"""Deterministic simulator for the Raft core: one seed, one exact history.

The simulator plays every part the real driver and network would: it takes Ready
batches, writes them to :class:`MemoryStorage`, decides *when* the fsync completes (a
crash before that loses the write), sends messages through a network that drops,
duplicates, delays, reorders and partitions, crashes and restarts nodes, and pauses
them, and wipes or truncates a node's disk (log and hard state) before it restarts. After
every event it checks Raft's safety properties; at the end it heals everything and checks
liveness. Replay a failure with ``python -m tests.raft.sim --seed N``.

With ``Params.metadata`` the replicated application is the controller's own metadata state
machine (raftmq.controller): proposals are metadata commands (consumer-group offset
commits, topic creations), each node applies them to a :class:`MetadataStateMachine`
and snapshots it as the controller does, and the state's canonical encoding is the
node's application state. A command is acknowledged when the leader that proposed it
applies it in the term it proposed it (when the controller answers its caller). Checked:
a group's committed offset never goes back on any node (commits are proposed with ever
larger offsets, and committed entries keep the order they were proposed in), and after
healing every member holds every acknowledged commit and topic.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import heapq
import random
import sys
from dataclasses import dataclass, field

from raftmq.controller.commands import (
    CommitOffsets,
    CommitsApplied,
    CreateTopic,
    OffsetCommit,
    OffsetEntry,
    TopicCreated,
    decode_result,
    encode,
)
from raftmq.controller.model import MetadataState
from raftmq.controller.state_machine import MetadataStateMachine, encode_snapshot
from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.raft import (
    Config,
    HardState,
    Membership,
    MemoryStorage,
    Message,
    MsgType,
    NotLeaderError,
    ProposalDroppedError,
    RaftCore,
    Ready,
    Role,
    SnapshotMeta,
    write_to_storage,
)
from raftmq.raft.core import starts_rejoining
from raftmq.raft.log_view import split
from raftmq.raft.membership import ConfigHistory


class SafetyViolation(AssertionError):
    pass


EARLY_TYPES = frozenset({MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP, MsgType.TIMEOUT_NOW})
"""The messages a Ready may send before its write is durable: they promise nothing about
the sender's disk (docs/raft.md, "The persistence order")."""


DIGEST_BYTES = 16


def chain(prev: bytes, data: bytes) -> bytes:
    """Digest of an applied history: the simulated application's whole state."""
    return hashlib.blake2b(prev + data, digest_size=DIGEST_BYTES).digest()


@dataclass
class DurableSnap:
    meta: SnapshotMeta
    state: bytes  # chain digest of everything applied up to meta.index


@dataclass
class Node:
    id: int
    storage: MemoryStorage
    cfg: Config
    base: Membership
    durable_hs: HardState = field(default_factory=HardState)
    snap: DurableSnap | None = None
    core: RaftCore | None = None
    pending: Ready | None = None
    durable_at: int = 0
    paused_until: int = 0
    app_index: int = 0
    app_state: bytes = b""
    verified_to: int = 0
    complete_term: int = 0
    complete_to: int = 0
    histories: list[ConfigHistory] = field(default_factory=list)
    """Configuration histories saved (unsynced, as the driver's commit hint) since start."""
    saved_history: ConfigHistory | None = None
    """The one a crash left on disk."""
    promised: bool = False
    """A hard state with a term was durable here once (the driver's record of it lives
    outside the data directory, so a disk loss keeps it)."""
    machine: MetadataStateMachine | None = None
    """Params.metadata: the controller's state machine, in step with app_state."""
    boot: int = 0
    """Starts so far: a proposal is answered only by the process that made it."""

    @property
    def up(self) -> bool:
        return self.core is not None


@dataclass
class Params:
    nodes: int = 3
    ticks: int = 300
    drop: float = 0.05
    dup: float = 0.02
    max_delay: int = 2
    crash: float = 0.01
    partition: float = 0.01
    pause: float = 0.01
    propose: float = 0.5
    transfer: float = 0.005
    read: float = 0.05
    compact: float = 0.02
    membership: bool = False
    fsync_delay: int = 2
    heal_ticks: int = 250
    cold_restarts: int = 0
    torn: bool = True
    """A crash keeps a random prefix of the unsynced writes, not necessarily none."""
    disk_loss: float = 0.0
    """Chance per tick that a node restarts with its log wiped or truncated and its hard
    state gone (a replaced or restored disk). At most one node is rejoining at a time:
    Raft survives up to a minority of failed members, and a node that lost its disk
    counts as failed until it has caught up (docs/raft.md). Static groups only."""
    metadata: bool = False
    """The application is the controller's metadata state machine (the module says how
    it is driven and checked)."""
    crash_after_send: float = 0.0
    """Chance, per Ready of a leader that sent appends with entries before its own write
    (``Ready.send_now``), that it crashes right then: its followers may have the entries,
    it loses the unsynced ones (all, or a torn prefix with ``torn``)."""

    @staticmethod
    def random(rng: random.Random) -> Params:
        return Params(
            nodes=rng.choice([1, 3, 3, 5, 5]),
            ticks=rng.randint(100, 300),
            drop=rng.choice([0.0, 0.02, 0.1, 0.3]),
            dup=rng.choice([0.0, 0.02, 0.1]),
            max_delay=rng.choice([0, 1, 3, 8]),
            crash=rng.choice([0.0, 0.005, 0.02]),
            partition=rng.choice([0.0, 0.01, 0.03]),
            pause=rng.choice([0.0, 0.01]),
            propose=rng.choice([0.2, 0.6, 1.0]),
            transfer=rng.choice([0.0, 0.01]),
            read=rng.choice([0.0, 0.05]),
            compact=rng.choice([0.0, 0.01, 0.05]),
            membership=rng.random() < 0.3,
            fsync_delay=rng.choice([0, 1, 3]),
            torn=rng.random() < 0.7,
            cold_restarts=rng.choice([0, 0, 0, 1, 2]),
            disk_loss=rng.choice([0.0, 0.0, 0.005, 0.02]),
            crash_after_send=rng.choice([0.0, 0.0, 0.0, 0.02]),
        )


class Sim:
    def __init__(self, seed: int, params: Params | None = None, *, trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.p = params or Params.random(random.Random(seed ^ 0x5EED))
        self.trace = trace
        self.time = 0
        self.events = 0
        ids = list(range(1, self.p.nodes + 1))
        self.spare_ids = [self.p.nodes + 1, self.p.nodes + 2]
        self.base = Membership(frozenset(ids))
        self.base_machine = encode_snapshot(base_metadata()) if self.p.metadata else b""
        """Params.metadata: the encoded metadata state before index 1."""
        self.nodes: dict[int, Node] = {}
        for i in ids:
            self._create(i, self.base)
        self.net: list[tuple[int, int, Message]] = []  # heap: (deliver_at, seq, msg)
        self.pool: list[Message] = []  # due, delivered in random order
        self.seq = 0
        self.group: dict[int, int] = {}
        self.cut: set[tuple[int, int]] = set()
        self.lossy = True
        # checker state
        self.leaders: dict[int, int] = {}
        self.committed: dict[int, bytes] = {}
        self.committed_top = 0
        """The highest index in ``committed``."""
        self.commit_hi = 0
        self.commit_term: dict[int, int] = {}
        self.applied: dict[int, bytes] = {}
        self.chain_at: dict[int, bytes] = {0: b""}
        self.proposed = 0
        self.reads: dict[bytes, int] = {}
        self.read_seq = 0
        self.config_changes = 0
        self.lost: set[int] = set()
        """Nodes that lost their disk and have not finished rejoining."""
        self.disk_losses = 0
        self.early_crashes = 0
        """Leaders crashed between sending appends and their own fsync."""
        # Params.metadata: the proposals awaiting their answer, and what was answered.
        self.asked: dict[tuple[int, int, int], tuple[int, CommitOffsets | CreateTopic]] = {}
        """(node, its boot, index): the term proposed in and the command."""
        self.acked_offsets: dict[tuple[str, str, int], int] = {}
        self.acked_topics: set[str] = set()
        self.acks = 0

    # ------------------------------------------------------------------ plumbing
    def _create(self, i: int, base: Membership) -> None:
        cfg = Config(
            id=i,
            election_tick=10,
            heartbeat_tick=1,
            max_append_bytes=400,
            max_inflight_msgs=8,
            max_inflight_bytes=3000,
            max_apply_bytes=1000,
            seed=self.seed,
        )
        node = Node(i, MemoryStorage(), cfg, base)
        self.nodes[i] = node
        self._start(node)

    def _start(self, node: Node) -> None:
        """What a real driver does on boot: finish a half-done snapshot install, then
        rebuild the core from the durable log, hard state and snapshot metadata."""
        st = node.storage
        base = node.base
        hs = node.durable_hs
        if node.snap is not None:
            meta = node.snap.meta
            if st.start_index - 1 != meta.index:
                # The snapshot was saved but the crash came before the log was cut.
                write_to_storage(st, Ready(snapshot=meta))
                st.sync()
            base = meta.membership
            self._restore(node, node.snap.state)
            hs = dataclasses.replace(hs, commit=max(hs.commit, meta.index))
        else:
            assert st.start_index == 1
            self._restore(node, self._snapshot_data(b"", self.base_machine))
        node.boot += 1
        node.app_index = st.start_index - 1
        node.verified_to = node.complete_to = 0
        # As the driver: a saved history, clamped to the log, skips reading it for CONFIG
        # entries and vouches for a commit index up to its end.
        history = None
        if node.saved_history is not None:
            with contextlib.suppress(ValueError):
                history = node.saved_history.for_log(st.start_index - 1, st.last_index, base)
        if history is not None:
            hs = dataclasses.replace(hs, commit=max(hs.commit, history.through))
        node.histories = []
        rejoining = starts_rejoining(hs, st.last_index, hs.commit, promised=node.promised)
        node.core = RaftCore(
            node.cfg,
            st,
            hard_state=hs,
            membership=base,
            history=history,
            rejoining=rejoining,
            incarnation=self.rng.getrandbits(62) + 1,
        )
        node.pending = None

    def fail(self, what: str) -> None:
        raise SafetyViolation(
            f"seed {self.seed} time {self.time} event {self.events}: {what}\n"
            f"replay: python -m tests.raft.sim --seed {self.seed} --trace\nparams: {self.p}"
        )

    def log(self, what: str) -> None:
        if self.trace:
            print(f"[t={self.time} e={self.events}] {what}")

    def send(self, src: Node, m: Message, *, after_persist: bool) -> None:
        if after_persist:
            self._check_promise(src, m)
        if m.type == MsgType.SNAP:
            snap = src.snap
            assert snap is not None and m.snapshot is not None
            if snap.meta.index != m.snapshot.index:
                self.fail(f"snapshot meta {m.snapshot} does not match stored {snap.meta}")
            m.data = snap.state
        delay = self.rng.randint(0, self.p.max_delay)
        self._enqueue(self.time + delay, m)

    def _check_promise(self, node: Node, m: Message) -> None:
        """Messages sent after persistence promise durable state: verify the promise."""
        if m.type == MsgType.VOTE_RESP and not m.reject:
            hs = node.durable_hs
            if hs.term != m.term or hs.vote != m.dst:
                self.fail(f"node {node.id} granted a vote {m} not durable in {hs}")
        if m.type == MsgType.APP_RESP and not m.reject and m.index:
            st = node.storage
            dur = st._durable
            last = dur.start_index + len(dur.entries) - 1
            if m.index > last:
                self.fail(f"node {node.id} acked {m.index} but durable log ends at {last}")

    # ------------------------------------------------------------------ node work
    def process(self, node: Node) -> bool:
        """Advance one node's Ready pipeline by one stage; False if nothing to do."""
        core = node.core
        if core is None or node.paused_until > self.time:
            return False
        if node.pending is not None:
            if self.time < node.durable_at:
                return False
            self._finish(node)
            return True
        if not core.has_ready():
            return False
        rd = core.ready()
        for m in rd.send_now:
            self._check_early(node, m)
            self.send(node, m, after_persist=False)
        if rd.snapshot is not None:
            # The application saves the snapshot durably before the log is cut.
            meta = rd.snapshot
            want = self.chain_at.get(meta.index)
            if want is not None and want != rd.snapshot_data[:DIGEST_BYTES]:
                self.fail(f"node {node.id} installs a snapshot at {meta.index} that differs")
            node.snap = DurableSnap(meta, rd.snapshot_data)
        write_to_storage(node.storage, rd)
        node.pending = rd
        node.durable_at = self.time + self.rng.randint(0, self.p.fsync_delay)
        crash_now = self.p.crash_after_send and self._sent_entries(rd)
        if crash_now and self.rng.random() < self.p.crash_after_send:
            # The appends are on the wire, the leader's own copy is not durable yet.
            self.early_crashes += 1
            self.log(f"leader {node.id} crashes after sending {rd.first_index}..")
            self.crash(node)
            return True
        if not rd.must_sync():
            self._finish(node)
        return True

    @staticmethod
    def _sent_entries(rd: Ready) -> bool:
        """Whether ``rd`` sent entries ahead of its own write of them."""
        return bool(rd.entries) and any(m.type == MsgType.APP and m.entries for m in rd.send_now)

    def _check_early(self, node: Node, m: Message) -> None:
        """What may go out before the Ready's write: leader messages only, and only in the
        term this node holds durably (a term or vote change holds every message back)."""
        if m.type not in EARLY_TYPES:
            self.fail(f"node {node.id} sends {m.type} before its write is durable: {m}")
        if m.term != node.durable_hs.term:
            self.fail(
                f"node {node.id} sends {m.type} of term {m.term} before its write, its "
                f"durable term being {node.durable_hs.term}"
            )

    def _finish(self, node: Node) -> None:
        rd = node.pending
        core = node.core
        assert rd is not None and core is not None
        node.storage.sync()
        if rd.hard_state is not None and (rd.must_sync() or self.rng.random() < 0.5):
            # A commit-only hard state is written without fsync: it may or may not last.
            node.durable_hs = rd.hard_state
            node.promised = node.promised or rd.hard_state.term > 0
        if rd.snapshot is not None:
            meta = rd.snapshot
            node.app_index = meta.index
            self._restore(node, rd.snapshot_data)
            self.log(f"node {node.id} installed snapshot at {meta.index}")
        for m in rd.messages:
            self.send(node, m, after_persist=True)
        for e in split(rd.committed_entries):
            self._apply(node, e.index, e.data)
        for rs in rd.read_states:
            floor = self.reads.pop(rs.context, None)
            if floor is not None and rs.index < floor:
                self.fail(f"read index {rs.index} below commit {floor} seen before the read")
        node.pending = None
        core.advance(rd)
        if self.rng.random() < 0.2:
            saved = core.config_history()
            if saved is not None:
                node.histories = [*node.histories[-2:], saved]

    def _apply(self, node: Node, index: int, data: bytes) -> None:
        if index != node.app_index + 1:
            self.fail(f"node {node.id} applies {index} after {node.app_index}")
        seen = self.applied.setdefault(index, data)
        if seen != data:
            self.fail(f"state machine safety: node {node.id} applied different entry at {index}")
        node.app_index = index
        node.app_state = chain(node.app_state, data)
        if node.machine is not None:
            self._apply_metadata(node, index, data)
        want = self.chain_at.setdefault(index, node.app_state)
        if want != node.app_state:
            self.fail(f"node {node.id} state diverged at {index}")

    def _snapshot_data(self, digest: bytes, machine: bytes) -> bytes:
        """A snapshot's bytes: the applied history's digest, and with Params.metadata
        the metadata state machine's own snapshot after it."""
        return digest.ljust(DIGEST_BYTES, b"\0") + machine if self.p.metadata else digest

    def _restore(self, node: Node, data: bytes) -> None:
        """The application from a snapshot's bytes (:meth:`_snapshot_data`)."""
        if not self.p.metadata:
            node.app_state = data
            return
        digest = data[:DIGEST_BYTES]
        node.app_state = b"" if digest == bytes(DIGEST_BYTES) else digest
        node.machine = MetadataStateMachine("sim")
        node.machine.restore(data[DIGEST_BYTES:])

    def _apply_metadata(self, node: Node, index: int, data: bytes) -> None:
        """One entry into the node's metadata state machine (Raft's own NOOP and CONFIG
        entries skipped, as the controller does); checks offsets never go back and
        notes what the proposer's answer acknowledged."""
        machine = node.machine
        assert machine is not None
        header = entry.parse_header(data)
        if header.type != EntryType.METADATA:
            return
        before = group_offsets(machine.state)
        result = decode_result(machine.apply(index, bytes(entry.payload_of(data, header))))
        after = group_offsets(machine.state)
        for key, offset in before.items():
            if after.get(key, -1) < offset:
                self.fail(
                    f"node {node.id} applying {index}: the committed offset of {key} went "
                    f"back from {offset} to {after.get(key)}"
                )
        asked = self.asked.pop((node.id, node.boot, index), None)
        if asked is None or asked[0] != header.term:
            return  # not proposed by this process, or replaced after a leader change
        command = asked[1]
        if isinstance(command, CommitOffsets) and isinstance(result, CommitsApplied):
            for commit, outcome in zip(command.commits, result.outcomes, strict=True):
                if outcome.code:
                    continue
                for o in commit.offsets:
                    key = (commit.group_id, o.topic, o.partition)
                    self.acked_offsets[key] = max(self.acked_offsets.get(key, -1), o.offset)
                    self.acks += 1
        elif isinstance(command, CreateTopic) and isinstance(result, TopicCreated):
            self.acked_topics.add(command.name)
            self.acks += 1

    def _check_acknowledged(self) -> None:
        """After healing: every member holds every acknowledged commit and topic."""
        for n in self.members():
            assert n.machine is not None
            offsets = group_offsets(n.machine.state)
            for key, offset in sorted(self.acked_offsets.items()):
                if offsets.get(key, -1) < offset:
                    self.fail(
                        f"node {n.id} lost an acknowledged commit: {key} is at "
                        f"{offsets.get(key)}, acknowledged {offset}"
                    )
            missing = self.acked_topics - set(n.machine.state.topics)
            if missing:
                self.fail(f"node {n.id} lost acknowledged topics {sorted(missing)}")
        states: dict[int, bytes] = {}
        for n in self.members():
            assert n.machine is not None
            if states.setdefault(n.app_index, n.machine.snapshot()) != n.machine.snapshot():
                self.fail(f"node {n.id}'s metadata differs from another's at {n.app_index}")

    def _enqueue(self, at: int, m: Message) -> None:
        self.seq += 1
        heapq.heappush(self.net, (at, self.seq, m))

    def deliver(self) -> bool:
        while self.net and self.net[0][0] <= self.time:
            self.pool.append(heapq.heappop(self.net)[2])
        if not self.pool:
            return False
        k = self.rng.randrange(len(self.pool))
        self.pool[k], self.pool[-1] = self.pool[-1], self.pool[k]
        m = self.pool.pop()
        dst = self.nodes.get(m.dst)
        src = self.nodes.get(m.src)
        if dst is not None and dst.up and dst.paused_until > self.time:
            # A paused process (GC, VM stall) finds its socket buffers full when it wakes.
            self._enqueue(dst.paused_until, m)
            return True
        lost = (
            dst is None
            or not dst.up
            or self.group.get(m.src, 0) != self.group.get(m.dst, 0)
            or (m.src, m.dst) in self.cut
            or (self.lossy and self.rng.random() < self.p.drop)
        )
        if m.type == MsgType.SNAP and src is not None and src.core is not None:
            src.core.report_snapshot(m.dst, ok=not lost)
        if lost:
            return True
        if self.lossy and self.rng.random() < self.p.dup:
            self._enqueue(self.time + self.rng.randint(0, self.p.max_delay), m)
        assert dst is not None and dst.core is not None
        dst.core.step(m)
        return True

    # ------------------------------------------------------------------ chaos
    def crash(self, node: Node) -> None:
        keep = self.rng.randint(0, node.storage.unsynced_ops) if self.p.torn else 0
        self.log(f"crash {node.id} keeping {keep} of {node.storage.unsynced_ops} unsynced writes")
        node.storage.crash(keep)
        # Unsynced in-place writes: any version written may be the one on disk, or a torn
        # one (no history), or none of them reached the disk (the older file stays).
        node.saved_history = self.rng.choice([None, node.saved_history, *node.histories])
        node.core = None
        node.pending = None

    def lose_disk(self, node: Node) -> None:
        """The node stops and comes back with its log wiped, or cut at a random index, and
        no hard state: everything it acknowledged or voted may be forgotten."""
        if node.up:
            self.crash(node)
        st = node.storage
        if self.rng.random() < 0.5 and st.last_index >= st.start_index:
            cut = self.rng.randint(st.start_index, st.last_index)
            self.log(f"disk loss on {node.id}: log cut at {cut}, hard state gone")
            st.truncate_suffix(cut)
            st.sync()
        else:
            self.log(f"disk loss on {node.id}: wiped")
            node.storage = MemoryStorage()
            node.snap = None
        node.durable_hs = HardState()
        node.saved_history = None
        node.histories = []
        # Its connections died with its process: nothing sent by or to the old process
        # arrives later (TCP), which the leader's reset relies on (docs/raft.md).
        gone = [x[2] for x in self.net] + self.pool
        self.net = [x for x in self.net if node.id not in (x[2].src, x[2].dst)]
        heapq.heapify(self.net)
        self.pool = [m for m in self.pool if node.id not in (m.src, m.dst)]
        for m in gone:
            src = self.nodes.get(m.src)
            if m.type == MsgType.SNAP and m.dst == node.id and src is not None and src.core:
                src.core.report_snapshot(m.dst, ok=False)  # as the transport would
        self.lost.add(node.id)
        self.disk_losses += 1
        self._start(node)

    def restart(self, node: Node) -> None:
        self.log(f"restart {node.id}")
        self._start(node)

    def leader(self) -> Node | None:
        best = None
        for n in self.nodes.values():
            c = n.core
            if c is None or c.role != Role.LEADER or n.paused_until > self.time:
                continue
            if best is None or c.term > best.core.term:  # type: ignore[union-attr]
                best = n
        return best

    def propose(self) -> None:
        ld = self.leader()
        if ld is None or ld.core is None:
            return
        self.proposed += 1
        if self.p.metadata:
            command = self._metadata_command()
            with contextlib.suppress(NotLeaderError, ProposalDroppedError):
                index = ld.core.propose(entry.encode(encode(command), type=EntryType.METADATA))
                self.asked[(ld.id, ld.boot, index)] = (ld.core.term, command)
            return
        batch = b"".join(
            entry.encode(
                f"seed{self.seed}-p{self.proposed}-{k}".encode() * self.rng.randint(1, 6),
                record_count=self.rng.randint(1, 5),
            )
            for k in range(self.rng.randint(1, 3))
        )
        with contextlib.suppress(NotLeaderError, ProposalDroppedError):
            ld.core.propose(batch)

    def _metadata_command(self) -> CommitOffsets | CreateTopic:
        """Mostly offset commits of two groups, each at a larger offset than any before
        (the proposal count), sometimes a topic."""
        if self.rng.random() < 0.1:
            return CreateTopic(f"s{self.proposed}", 1, 1)
        commits = tuple(
            OffsetCommit(
                group,
                "",
                0,
                (OffsetEntry(BASE_TOPIC, self.rng.randrange(BASE_PARTITIONS), self.proposed, ""),),
            )
            for group in sorted(self.rng.sample(SIM_GROUPS, self.rng.randint(1, 2)))
        )
        return CommitOffsets(commits, now_ms=self.time)

    def compact(self, node: Node) -> None:
        core = node.core
        if core is None or node.pending is not None or node.app_index < node.storage.start_index:
            return
        st = node.storage
        index = self.rng.randint(max(st.start_index, node.app_index - 8), node.app_index)
        if self.p.metadata:
            index = node.app_index  # the controller snapshots what it applied
        if index > st.last_index:
            return
        meta = SnapshotMeta(
            index, st.term_at(index), st.offset_at(index + 1), core.membership_at(index)
        )
        st.truncate_prefix(index + 1)
        st.sync()
        machine = node.machine.snapshot() if node.machine is not None else b""
        node.snap = DurableSnap(meta, self._snapshot_data(self.chain_at[index], machine))
        self.log(f"node {node.id} compacted to {index}")

    def change_membership(self) -> None:
        ld = self.leader()
        if ld is None or ld.core is None:
            return
        m = ld.core.membership
        choice = self.rng.random()
        if choice < 0.4 and self.spare_ids and not m.learners:
            new_id = self.spare_ids.pop(0)
            target = Membership(m.voters, m.learners | {new_id})
            self.nodes_to_create = new_id
        elif choice < 0.7 and m.learners:
            learner = min(m.learners)
            pr = ld.core.progress.get(learner)
            if pr is None or pr.match + 5 < ld.core.log.last_index:
                return  # promote only a learner that caught up
            target = Membership(m.voters | {learner}, m.learners - {learner})
        elif len(m.voters) > 1:
            victim = self.rng.choice(sorted(m.voters | m.learners))
            target = Membership(m.voters - {victim}, m.learners - {victim})
        else:
            return
        try:
            ld.core.propose_membership(target)
        except (NotLeaderError, ProposalDroppedError):
            return
        self.config_changes += 1
        self.log(f"leader {ld.id} proposes {target}")
        for new in target.members - set(self.nodes):
            self._create(new, Membership(frozenset()))
            self.group[new] = self.group.get(ld.id, 0)

    def chaos(self) -> None:
        p, rng = self.p, self.rng
        ids = sorted(self.nodes)
        if rng.random() < p.crash:
            self.crash(self.nodes[rng.choice(ids)])
        self.lost = {i for i in self.lost if not self._rejoined(self.nodes[i])}
        # Only in a static group of 3 or more: with 2 voters (after a removal) one lost
        # disk is already more than Raft tolerates, and the group rightly stalls.
        static = not p.membership and len(ids) >= 3
        if p.disk_loss and static and not self.lost and rng.random() < p.disk_loss:
            self.lose_disk(self.nodes[rng.choice(ids)])
        for n in self.nodes.values():
            if not n.up and rng.random() < 0.1:
                self.restart(n)
        if rng.random() < p.partition:
            if rng.random() < 0.5:
                self.group = {i: rng.randint(0, 1) for i in ids}
                self.log(f"partition {self.group}")
            else:
                # One-way link failures: a hears b but b does not hear a.
                self.cut = {(a, b) for a in ids for b in ids if a != b and rng.random() < 0.2}
                self.log(f"one-way cuts {sorted(self.cut)}")
        elif (self.group or self.cut) and rng.random() < 0.05:
            self.group = {}
            self.cut = set()
            self.log("heal")
        if rng.random() < p.pause:
            n = self.nodes[rng.choice(ids)]
            n.paused_until = self.time + rng.randint(1, 30)
        if rng.random() < p.propose:
            self.propose()
        if rng.random() < p.transfer:
            ld = self.leader()
            if ld is not None and ld.core is not None:
                to = rng.choice(sorted(ld.core.membership.voters))
                with contextlib.suppress(NotLeaderError, ProposalDroppedError):
                    ld.core.transfer_leadership(to)
        if rng.random() < p.read:
            self.read()
        if rng.random() < p.compact:
            ld = self.leader()
            # Leaders' compactions are the ones that force InstallSnapshot on laggards.
            self.compact(
                ld if ld is not None and rng.random() < 0.6 else self.nodes[rng.choice(ids)]
            )
        if p.membership and rng.random() < 0.02:
            self.change_membership()

    @staticmethod
    def _rejoined(node: Node) -> bool:
        hs = node.durable_hs
        return (
            node.core is not None and not node.core.rejoining and hs.term > 0 and not hs.rejoining
        )

    def read(self) -> None:
        ups = [n for n in self.nodes.values() if n.core is not None]
        if not ups:
            return
        n = self.rng.choice(ups)
        self.read_seq += 1
        ctx = f"r{self.read_seq}".encode()
        try:
            n.core.read_index(ctx)  # type: ignore[union-attr]
        except NotLeaderError:
            return
        self.reads[ctx] = self.commit_hi

    # ------------------------------------------------------------------ checks
    def view(self, node: Node) -> tuple[int, list[int], list[bytes]]:
        """The node's whole in-memory log: (first index, terms, entries), without parsing."""
        core = node.core
        assert core is not None
        lg = core.log
        st = node.storage._s
        if lg.pending_snapshot is not None:
            first = lg.pending_snapshot.index + 1
            terms: list[int] = []
            datas: list[bytes] = []
        else:
            first = st.start_index
            keep = lg.unstable_offset - st.start_index
            terms, datas = st.terms[:keep], st.entries[:keep]
        terms = terms + [e.term for e in lg.unstable]
        datas = datas + [e.data for e in lg.unstable]
        return first, terms, datas

    def check(self, full: bool) -> None:
        self.events += 1
        ups = [n for n in self.nodes.values() if n.core is not None]
        for n in ups:
            c = n.core
            assert c is not None
            if c.role == Role.LEADER:
                prev = self.leaders.setdefault(c.term, n.id)
                if prev != n.id:
                    self.fail(f"two leaders in term {c.term}: {prev} and {n.id}")
            # Record newly committed entries; every node must agree on each of them.
            if c.commit > n.verified_to:
                first, _, datas = self.view(n)
                for index in range(max(first, n.verified_to + 1), c.commit + 1):
                    data = datas[index - first]
                    seen = self.committed.setdefault(index, data)
                    self.committed_top = max(self.committed_top, index)
                    self.commit_term.setdefault(index, c.term)
                    if seen != data:
                        self.fail(f"node {n.id} committed a different entry at {index}")
                n.verified_to = c.commit
                self.commit_hi = max(self.commit_hi, c.commit)
        self._check_durable()
        if not full:
            return
        views = {n.id: self.view(n) for n in ups}
        # Log matching: equal (index, term) means equal entries and equal prefixes.
        items = sorted(views.items())
        for a in range(len(items)):
            for b in range(a + 1, len(items)):
                (ia, (fa, ta, la)), (ib, (fb, tb, lb)) = items[a], items[b]
                lo = max(fa, fb)
                hi = min(fa + len(la), fb + len(lb)) - 1
                top = 0
                for i in range(hi, lo - 1, -1):
                    if ta[i - fa] == tb[i - fb]:
                        top = i
                        break
                if top and la[lo - fa : top - fa + 1] != lb[lo - fb : top - fb + 1]:
                    self.fail(f"log matching broken between {ia} and {ib} below {top}")
        # Leader completeness: a leader holds every committed entry (not compacted away).
        for n in ups:
            c = n.core
            assert c is not None
            if c.role != Role.LEADER:
                continue
            first, _, ents = views[n.id]
            if n.complete_term != c.term:
                n.complete_term, n.complete_to = c.term, 0
            # A leader never loses entries, so each committed index is checked once a term.
            for index in range(max(first, n.complete_to + 1), self.commit_hi + 1):
                data = self.committed.get(index)
                if data is None or self.commit_term[index] >= c.term:
                    continue  # a stale leader need not know what later terms committed
                n.complete_to = index
                if index >= first and (index >= first + len(ents) or ents[index - first] != data):
                    self.fail(f"leader {n.id} of term {c.term} lacks committed entry {index}")

    def _check_durable(self) -> None:
        """With a static configuration a quorum holds the newest committed entry on disk,
        after every event: a leader that counted its own copy before its fsync (its
        appends go out first) would commit on one durable copy too few."""
        if self.p.membership or not self.committed:
            return
        top = self.committed_top
        holders = 0
        for n in self.nodes.values():
            d = n.storage._durable
            last = d.start_index + len(d.entries) - 1
            if d.start_index - 1 >= top or (
                d.start_index <= top <= last
                and d.entries[top - d.start_index] == self.committed[top]
            ):
                holders += 1
        # A node that lost its disk may have been one of the holders.
        if holders + len(self.lost) < self.base.quorum():
            self.fail(f"committed entry {top} durable on only {holders} nodes")

    # ------------------------------------------------------------------ run
    def run_tick(self, chaos: bool) -> None:
        self.time += 1
        if chaos:
            self.chaos()
        for n in list(self.nodes.values()):
            if n.core is not None and n.paused_until <= self.time:
                if chaos and self.rng.random() < 0.1:
                    continue  # clocks drift: this node's tick comes late
                n.core.tick()
        # Within a tick: deliver due messages and process nodes in random order.
        for _ in range(2000):
            ids = sorted(self.nodes)
            self.rng.shuffle(ids)
            progressed = False
            if self.rng.random() < 0.5:
                progressed = self.deliver()
            if not progressed:
                for i in ids:
                    if self.process(self.nodes[i]):
                        progressed = True
                        break
            if not progressed:
                progressed = self.deliver()
            if not progressed:
                break
            self.check(full=False)
        self.check(full=True)

    def heal(self) -> None:
        self.group = {}
        self.cut = set()
        self.lossy = False
        self.p.max_delay = min(self.p.max_delay, 1)
        self.p.crash_after_send = 0.0  # a fault like the others: over once healed
        for n in self.nodes.values():
            n.paused_until = 0
            if not n.up:
                self.restart(n)

    def cold_restart(self) -> None:
        """Crash every node at once (power loss), then bring them all back."""
        self.log("cold restart of every node")
        for n in self.nodes.values():
            if n.up:
                self.crash(n)
        self.net.clear()
        self.pool.clear()
        for n in self.nodes.values():
            self.restart(n)

    def members(self) -> list[Node]:
        ld = self.leader()
        m = ld.core.membership if ld is not None and ld.core is not None else self.base
        return [self.nodes[i] for i in sorted(m.members) if i in self.nodes]

    def run(self) -> Sim:
        try:
            return self._run()
        except SafetyViolation:
            raise
        except AssertionError as exc:  # a core's own invariant: report it with the replay
            self.fail(f"a core assertion failed: {exc!r}")
            raise  # unreachable: fail raises

    def _run(self) -> Sim:
        chaos_ticks = self.p.ticks
        rounds = self.p.cold_restarts + 1
        for r in range(rounds):
            for _ in range(chaos_ticks // rounds):
                self.run_tick(chaos=True)
            if r + 1 < rounds:
                self.cold_restart()
        self.heal()
        self._liveness()
        if self.p.metadata:
            self._check_acknowledged()
        return self

    def _liveness(self) -> None:
        deadline = self.time + self.p.heal_ticks
        marker = None
        while self.time < deadline:
            self.run_tick(chaos=False)
            ld = self.leader()
            if ld is None or ld.core is None:
                continue
            if marker is None:
                try:
                    marker = ld.core.propose(
                        entry.encode(f"seed{self.seed}-final".encode(), record_count=1)
                    )
                except (NotLeaderError, ProposalDroppedError):
                    continue
                marker_term = ld.core.term
                continue
            if self.leaders.get(marker_term) != ld.id or ld.core.term != marker_term:
                marker = None  # leadership moved: propose again
                continue
            if all(n.app_index >= marker for n in self.members()):
                if self.applied_term(marker) == marker_term:
                    return
                marker = None
        self.fail(
            f"liveness: no proposal committed on all members within {self.p.heal_ticks} "
            f"ticks after healing; leader={self.leader() and self.leader().id}"  # type: ignore[union-attr]
        )

    def applied_term(self, index: int) -> int:
        return _term(self.applied[index])


BASE_TOPIC = "t"
BASE_PARTITIONS = 4
SIM_GROUPS = ["g1", "g2"]


def base_metadata() -> MetadataState:
    """The state every node starts from in Params.metadata: three brokers and a topic,
    as though applied before index 1 (version 0)."""
    from tests.controller.machine import Driver  # the controller tests' typed driver

    driver = Driver(MetadataStateMachine("sim"))
    for b in (1, 2, 3):
        driver.register(b)
    assert driver(CreateTopic(BASE_TOPIC, BASE_PARTITIONS, 3)).ok
    return dataclasses.replace(driver.machine.state, version=0)


def group_offsets(state: MetadataState) -> dict[tuple[str, str, int], int]:
    """Every group's committed offsets: (group, topic, partition) -> offset."""
    return {
        (g.group_id, topic, partition): c.offset
        for g in state.consumer_groups.values()
        for topic, parts in g.committed_offsets.items()
        for partition, c in parts.items()
    }


def _term(data: bytes) -> int:
    return entry.parse_header(data).term


def run_seed(seed: int, params: Params | None = None, *, trace: bool = False) -> Sim:
    return Sim(seed, params, trace=trace).run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--count", type=int, default=1, help="run seeds seed..seed+count-1")
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args(argv)
    for s in range(args.seed, args.seed + args.count):
        sim = run_seed(s, trace=args.trace)
        print(
            f"seed {s}: ok, {sim.time} ticks, commit {sim.commit_hi}, "
            f"leaders {len(sim.leaders)}, params {sim.p}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
