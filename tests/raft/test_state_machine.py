"""The replicated state machine runner (raftmq/raft/host/state_machine.py) on real hosts
with real logs on disk, over the in-memory network and over TCP: proposals answered with
apply results, snapshots installed on a lagging follower and used on restart,
linearizable reads across a leader change, watchers, and a partition group beside it.

The tenant is a small key-value machine defined here: a fixture, not a mock of ours."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import pytest

from raftmq.log.atomic_file import write_atomic
from raftmq.raft.errors import (
    NotLeaderError,
    OutcomeUnknownError,
    ProposalDroppedError,
    ReadIndexError,
)
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.state_machine import (
    SNAPSHOT_FILE,
    Applied,
    CommandTooLargeError,
    ReplicatedStateMachine,
    Restored,
    WatcherDroppedError,
    encode_snapshot,
)
from raftmq.raft.host.transport import MemoryNetwork, Transport
from raftmq.raft.membership import Membership
from raftmq.raft.messages import SnapshotMeta
from tests.raft.test_driver import (
    FAST,
    MEMBERS,
    SMALL,
    batch,
    tcp_transports,
    tell_ports,
    wait_for,
)
from tests.raft.test_driver import (
    Applied as LogApplied,
)

NAME = "__meta"


def new_host(node: int, transport: Transport) -> RaftHost:
    return RaftHost(
        node,
        transport,
        seed=node,
        tick_s=FAST["tick_s"],
        election_tick=int(FAST["election_tick"]),
        heartbeat_tick=int(FAST["heartbeat_tick"]),
    )


class KV:
    """``set K V`` answers the previous value, ``incr K`` the new count, anything else
    ``error: ...`` (never an exception). Records which indexes it applied."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.indexes: list[int] = []
        self.restored_at: list[int] = []

    def apply(self, index: int, command: bytes) -> bytes:
        self.indexes.append(index)
        op, _, rest = command.decode().partition(" ")
        if op == "set":
            key, _, value = rest.partition(" ")
            before = self.data.get(key, "")
            self.data[key] = value
            return before.encode()
        if op == "incr":
            value = str(int(self.data.get(rest, "0")) + 1)
            self.data[rest] = value
            return value.encode()
        return f"error: unknown command {op!r}".encode()

    def snapshot(self) -> bytes:
        return json.dumps(self.data, sort_keys=True).encode()

    def restore(self, data: bytes) -> None:
        self.data = json.loads(data)
        self.restored_at.append(len(self.indexes))


Rsm = ReplicatedStateMachine[KV]


ALONE = Membership(frozenset({1}))


def open_alone(directory: Path, machine: KV, **options: int) -> tuple[RaftHost, Rsm]:
    """A one-node group (it elects itself): for what needs no peers."""
    host = new_host(1, MemoryNetwork().transport(1))
    return host, ReplicatedStateMachine(host, NAME, directory, ALONE, machine, **options)  # type: ignore[arg-type]


async def start_alone(directory: Path, machine: KV, **options: int) -> tuple[RaftHost, Rsm]:
    host, rsm = open_alone(directory, machine, **options)
    await host.start()
    await wait_for(lambda: rsm.is_leader, what="the lone node to lead")
    return host, rsm


class Cluster:
    """Three hosts on one in-memory network, each running the KV group."""

    def __init__(
        self, tmp: Path, *, snapshot_every_entries: int = 10_000, catch_up_entries: int = 1_000
    ) -> None:
        self.tmp = tmp
        self.net = MemoryNetwork()
        self.hosts: dict[int, RaftHost] = {}
        self.rsms: dict[int, Rsm] = {}
        self.snapshot_every_entries = snapshot_every_entries
        self.catch_up_entries = catch_up_entries

    async def start(self, node: int) -> Rsm:
        host = new_host(node, self.net.transport(node))
        rsm = ReplicatedStateMachine(
            host,
            NAME,
            self.tmp / f"n{node}" / NAME,
            MEMBERS,
            KV(),
            snapshot_every_entries=self.snapshot_every_entries,
            catch_up_entries=self.catch_up_entries,
        )
        await host.start()
        self.hosts[node], self.rsms[node] = host, rsm
        return rsm

    async def start_all(self) -> Cluster:
        for node in (1, 2, 3):
            await self.start(node)
        return self

    async def stop(self, node: int) -> None:
        host = self.hosts.pop(node)
        self.rsms.pop(node)
        await host.stop()

    async def stop_all(self) -> None:
        for node in list(self.hosts):
            await self.stop(node)

    async def leader(self, among: set[int] | None = None) -> Rsm:
        nodes = among or set(self.rsms)

        def one() -> bool:
            return sum(self.rsms[n].is_leader for n in nodes) == 1

        await wait_for(one, what="one leader")
        return next(self.rsms[n] for n in nodes if self.rsms[n].is_leader)

    def isolate(self, node: int) -> None:
        for peer in (1, 2, 3):
            if peer != node:
                self.net.cut(node, peer)

    def node_of(self, rsm: Rsm) -> int:
        return next(n for n, r in self.rsms.items() if r is rsm)


async def propose(cluster: Cluster, command: str, among: set[int] | None = None) -> bytes:
    """Through whichever node leads, retrying while a leader is being elected."""
    for _ in range(100):
        leader = await cluster.leader(among)
        try:
            return await leader.propose(command.encode())
        except (NotLeaderError, ProposalDroppedError, OutcomeUnknownError):
            await asyncio.sleep(0.05)
    raise AssertionError(f"no leader took {command!r}")


async def test_proposals_resolve_with_apply_results_everywhere_in_order(tmp_path):
    cluster = await Cluster(tmp_path).start_all()
    try:
        leader = await cluster.leader()
        watcher = cluster.rsms[1].watch()
        results = await asyncio.gather(*(leader.propose(b"incr n") for _ in range(20)))
        assert results == [str(i).encode() for i in range(1, 21)]  # in proposal order
        assert await leader.propose(b"set k v1") == b""
        assert await leader.propose(b"set k v2") == b"v1"
        assert await leader.propose(b"bogus") == b"error: unknown command 'bogus'"
        last = leader.applied_index
        await wait_for(lambda: all(r.applied_index == last for r in cluster.rsms.values()))
        for rsm in cluster.rsms.values():
            assert rsm.machine.data == {"n": "20", "k": "v2"}
            # Every command once, in index order (NOOPs and configs skip the machine).
            assert rsm.machine.indexes == sorted(set(rsm.machine.indexes))
            assert len(rsm.machine.indexes) == 23
            index, value = rsm.local_read(lambda kv: kv.data["k"])
            assert (index, value) == (last, "v2")
        seen = [await watcher.get() for _ in range(23)]
        applied = [e for e in seen if isinstance(e, Applied)]
        assert [e.index for e in applied] == cluster.rsms[1].machine.indexes
        assert applied[-1].command == b"bogus" and applied[-2].result == b"v1"
        assert watcher.start_index < seen[0].index
    finally:
        await cluster.stop_all()


async def test_a_follower_refuses_a_proposal_with_the_leader_hint(tmp_path):
    cluster = await Cluster(tmp_path).start_all()
    try:
        leader = await cluster.leader()
        await leader.propose(b"set a 1")  # every follower knows the leader by now
        follower = next(r for r in cluster.rsms.values() if r is not leader)
        await wait_for(lambda: follower.leader == cluster.node_of(leader))
        with pytest.raises(NotLeaderError) as refused:
            await follower.propose(b"set a 2")
        assert refused.value.leader == cluster.node_of(leader)
        with pytest.raises(CommandTooLargeError):
            await leader.propose(b"x" * (leader.max_command_bytes + 1))
        assert await leader.propose(b"set a 3") == b"1"  # neither was appended
    finally:
        await cluster.stop_all()


async def test_a_lagging_follower_catches_up_through_a_snapshot(tmp_path):
    cluster = await Cluster(tmp_path, snapshot_every_entries=10, catch_up_entries=0).start_all()
    try:
        leader = await cluster.leader()
        lagging = next(n for n in cluster.rsms if cluster.rsms[n] is not leader)
        behind = cluster.hosts[lagging].status(NAME).last_index
        await cluster.stop(lagging)  # down while the others go on and cut their logs
        majority = {n for n in cluster.rsms if n != lagging}
        for i in range(45):
            await propose(cluster, f"set k{i % 7} {i}", majority)
        leader = await cluster.leader(majority)
        leader_node = cluster.node_of(leader)
        # The leader's log was cut below its snapshot, past what the follower holds.
        start = cluster.hosts[leader_node].groups[NAME].log_reader.start_index
        assert leader.snapshot_index >= 40 and start == leader.snapshot_index + 1 > behind + 1
        follower = await cluster.start(lagging)
        watcher = follower.watch()
        await wait_for(
            lambda: follower.applied_index == leader.applied_index,
            what="the follower to catch up",
        )
        assert follower.machine.data == leader.machine.data
        assert follower.snapshot_index >= start - 1  # installed (and saved) the leader's
        assert follower.machine.restored_at
        event = await watcher.get()
        assert isinstance(event, Restored) and event.index >= start - 1
        # It goes on applying after the snapshot, and answers reads like any member.
        await propose(cluster, "set after snap")
        assert await follower.linearizable_read(lambda kv: kv.data["after"]) == "snap"
    finally:
        await cluster.stop_all()


async def test_a_restart_restores_the_snapshot_and_replays_only_the_tail(tmp_path):
    cluster = await Cluster(tmp_path, snapshot_every_entries=8).start_all()
    for i in range(30):
        await propose(cluster, f"incr c{i % 3}")
    leader = await cluster.leader()
    await wait_for(
        lambda: all(r.applied_index == leader.applied_index for r in cluster.rsms.values())
    )
    want = dict(leader.machine.data)
    snapshots = {n: r.snapshot_index for n, r in cluster.rsms.items()}
    assert all(s > 0 for s in snapshots.values()), snapshots
    await cluster.stop_all()

    await cluster.start_all()
    try:
        for node, rsm in cluster.rsms.items():
            # Restored from its own snapshot before anything was applied.
            assert rsm.snapshot_index == snapshots[node] == rsm.applied_index
            assert rsm.machine.restored_at == [0]
        assert await propose(cluster, "incr c0") == b"11"
        leader = await cluster.leader()
        await wait_for(
            lambda: all(r.applied_index == leader.applied_index for r in cluster.rsms.values())
        )
        want["c0"] = "11"
        for node, rsm in cluster.rsms.items():
            assert rsm.machine.data == want
            # Only the log after the snapshot was applied: never from the start.
            assert rsm.machine.indexes and min(rsm.machine.indexes) > snapshots[node]
    finally:
        await cluster.stop_all()


async def test_a_restart_redoes_a_cut_that_a_crash_interrupted(tmp_path):
    """The snapshot is written before the log is cut: a crash in between leaves a log
    starting below it, which the host cuts at open (the state is not applied twice)."""
    host, rsm = await start_alone(tmp_path / NAME, KV())
    for i in range(5):
        await rsm.propose(f"incr x{i}".encode())

    def crash_before_the_cut(name: str, *, through: int | None = None) -> int:
        return 0

    host.compact = crash_before_the_cut  # type: ignore[method-assign]
    index = rsm.take_snapshot()
    assert host.groups[NAME].log_reader.start_index == 1
    await rsm.propose(b"incr x0")
    await host.stop()

    host, rsm = open_alone(tmp_path / NAME, KV())
    assert host.groups[NAME].log_reader.start_index == index + 1
    await host.start()
    try:
        await wait_for(lambda: rsm.is_leader)
        assert await rsm.propose(b"incr x0") == b"3"
        assert min(rsm.machine.indexes) == index + 1
        assert await rsm.linearizable_read(lambda kv: kv.data["x0"]) == "3"  # quorum of one
    finally:
        await host.stop()


async def test_a_restart_after_an_install_whose_cut_was_interrupted_starts_after_it(tmp_path):
    """An installed snapshot is saved before the log restarts at it: a crash in between
    leaves the old log, which the host replaces at open (another history's tail goes)."""
    host, rsm = await start_alone(tmp_path / NAME, KV())
    await rsm.propose(b"set old 1")
    status = host.status(NAME)
    await host.stop()
    installed = SnapshotMeta(status.last_index + 10, status.term, 0, ALONE)
    write_atomic(tmp_path / NAME / SNAPSHOT_FILE, encode_snapshot(installed, b'{"new": "2"}'))

    host, rsm = open_alone(tmp_path / NAME, KV())
    assert host.groups[NAME].log_reader.start_index == installed.index + 1
    assert rsm.applied_index == installed.index and rsm.machine.data == {"new": "2"}
    await host.start()
    try:
        await wait_for(lambda: rsm.is_leader)
        assert await rsm.propose(b"set new 3") == b"2"
        assert min(rsm.machine.indexes) > installed.index
    finally:
        await host.stop()


async def test_snapshots_follow_applied_bytes_and_skip_one_too_large_to_send(tmp_path):
    host, rsm = await start_alone(
        tmp_path / NAME, KV(), snapshot_every_bytes=10_000, catch_up_entries=0
    )
    try:
        for i in range(3):
            await rsm.propose(f"set k{i} {'v' * 4_000}".encode())
        await wait_for(lambda: rsm.snapshot_index > 0, what="a snapshot by bytes")
        assert host.groups[NAME].log_reader.start_index == rsm.snapshot_index + 1
        rsm.max_snapshot_bytes = 5_000  # the state (12 KB) no longer fits one message
        before = rsm.snapshot_index
        for i in range(3):
            await rsm.propose(f"set j{i} {'w' * 4_000}".encode())
        await asyncio.sleep(0.1)
        assert rsm.take_snapshot() == before == rsm.snapshot_index  # none taken...
        assert host.groups[NAME].log_reader.start_index == before + 1  # ...nor any cut
    finally:
        await host.stop()


class BrokenOnce(KV):
    """A machine with a bug: the first ``boom`` raises after half-applying it."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = False

    def apply(self, index: int, command: bytes) -> bytes:
        if command == b"boom" and not self.raised:
            self.raised = True
            self.data["half"] = "changed"
            raise RuntimeError("a bug in the machine")
        if command == b"boom":
            self.indexes.append(index)
            return b"ok"
        return super().apply(index, command)


async def test_a_machine_that_raises_is_rebuilt_from_its_snapshot_after_the_reopen(tmp_path):
    host, rsm = await start_alone(tmp_path / NAME, BrokenOnce())
    try:
        await rsm.propose(b"set a 1")
        rsm.take_snapshot()
        await rsm.propose(b"incr n")
        watcher = rsm.watch()
        with pytest.raises(OutcomeUnknownError):  # the group is quarantined here
            await rsm.propose(b"boom")
        assert host.status(NAME).failed is not None
        await wait_for(lambda: rsm.is_leader, what="the reopened group to lead again")
        assert await rsm.propose(b"incr n") == b"2"
        # Rebuilt from the snapshot, then every later entry applied again, once.
        assert rsm.machine.data == {"a": "1", "n": "2"}
        assert rsm.machine.restored_at
        assert isinstance(await watcher.get(), Restored)
    finally:
        await host.stop()


async def test_linearizable_reads_see_every_write_through_a_leader_change(tmp_path):
    cluster = await Cluster(tmp_path).start_all()
    try:
        first = await cluster.leader()
        old = cluster.node_of(first)
        await first.propose(b"set x 1")
        for rsm in cluster.rsms.values():  # on the leader and, through it, on followers
            assert await rsm.linearizable_read(lambda kv: kv.data.get("x")) == "1"

        cluster.isolate(old)
        survivors = {n for n in cluster.rsms if n != old}
        assert await propose(cluster, "set x 2", survivors) == b"1"
        second = await cluster.leader(survivors)
        other = next(cluster.rsms[n] for n in survivors if cluster.rsms[n] is not second)
        assert await second.linearizable_read(lambda kv: kv.data["x"]) == "2"
        assert await other.linearizable_read(lambda kv: kv.data["x"]) == "2"
        # The deposed leader, cut off, cannot confirm a read point: no stale answer.
        with pytest.raises((ReadIndexError, NotLeaderError)):
            await cluster.rsms[old].linearizable_read(lambda kv: kv.data["x"], timeout_s=1.0)
        assert cluster.rsms[old].local_read(lambda kv: kv.data["x"])[1] == "1"  # stale

        cluster.net.heal()
        # Back in the group, its linearizable read waits until it applied the new write.
        assert await cluster.rsms[old].linearizable_read(lambda kv: kv.data["x"]) == "2"
    finally:
        await cluster.stop_all()


async def test_proposals_of_a_deposed_leader_fail_as_outcome_unknown(tmp_path):
    cluster = await Cluster(tmp_path).start_all()
    try:
        leader = await cluster.leader()
        old = cluster.node_of(leader)
        await leader.propose(b"set y 0")
        cluster.isolate(old)
        pending = asyncio.ensure_future(leader.propose(b"set y lost?"))
        # Appended in its log, never committed: once it steps down (check-quorum), the
        # entry may still commit under a new leader that got it, or vanish.
        with pytest.raises(OutcomeUnknownError):
            await asyncio.wait_for(pending, 10)
        assert not leader.is_leader
    finally:
        await cluster.stop_all()


async def test_a_proposal_whose_caller_gave_up_logs_no_unretrieved_error(tmp_path):
    """Found in a chaos run's broker log ("Future exception was never retrieved", a
    ProposalDroppedError): a controller command that timed out left the host's future
    of its entry to fail later with no one to take the error. The outcome of a proposal
    no one waits for any more is not an error to log."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    cluster = await Cluster(tmp_path).start_all()
    try:
        leader = await cluster.leader()
        await leader.propose(b"set y 0")
        cluster.isolate(cluster.node_of(leader))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(leader.propose(b"set y given up"), 0.05)
        await wait_for(lambda: not leader.is_leader, what="the isolated leader to step down")
    finally:
        await cluster.stop_all()
        gc.collect()
        loop.set_exception_handler(None)
    assert not [c for c in reported if "never retrieved" in str(c.get("message"))], reported


async def test_a_slow_watcher_is_dropped_not_grown(tmp_path):
    host, rsm = await start_alone(tmp_path / NAME, KV())
    try:
        slow = rsm.watch(max_pending=5)
        fast = rsm.watch(max_pending=100)
        for i in range(8):
            await rsm.propose(f"set k {i}".encode())
        assert slow.dropped and not fast.dropped
        got = [await slow.get() for _ in range(5)]  # what was queued is still read...
        assert [e.result for e in got if isinstance(e, Applied)][1:] == [b"0", b"1", b"2", b"3"]
        with pytest.raises(WatcherDroppedError):  # ...then it must resync
            await slow.get()
        assert len([await fast.get() for _ in range(8)]) == 8
    finally:
        await host.stop()


async def test_a_partition_group_and_the_state_machine_share_the_hosts(tmp_path):
    cluster = Cluster(tmp_path)
    logs: dict[int, LogApplied] = {}
    for node in (1, 2, 3):
        rsm = await cluster.start(node)
        logs[node] = LogApplied()
        host = cluster.hosts[node]
        # A partition-style group opened on the running host beside the metadata group.
        host.open_group(
            "p0", tmp_path / f"n{node}" / "p0", MEMBERS, log_config=SMALL, apply=logs[node]
        )
        assert rsm.name in host.groups
    try:
        assert await propose(cluster, "set topic demo") == b""

        def p_leader() -> RaftHost | None:
            leaders = [h for h in cluster.hosts.values() if h.groups["p0"].is_leader]
            return leaders[0] if len(leaders) == 1 else None

        await wait_for(lambda: p_leader() is not None, what="a partition leader")
        p_host = p_leader()
        assert p_host is not None
        proposed = [p_host.propose("p0", batch(i)) for i in range(10)]
        await asyncio.gather(*(p.done for p in proposed))
        assert proposed[-1].last_offset == 9  # a partition's offsets, untouched by the RSM
        await wait_for(lambda: all(len(a.entries) >= 11 for a in logs.values()))
        assert logs[1].entries == logs[2].entries == logs[3].entries
        assert await propose(cluster, "set topic demo2") == b"demo"
        for rsm in cluster.rsms.values():
            assert await rsm.linearizable_read(lambda kv: kv.data["topic"]) == "demo2"
    finally:
        await cluster.stop_all()


async def test_over_tcp_a_returning_follower_installs_the_snapshot(tmp_path):
    """Snapshot bytes cross the real wire: node 3 is down while the others cut their
    logs, then comes back on a new port and restores the leader's snapshot."""
    transports = tcp_transports((1, 2, 3))
    hosts: dict[int, RaftHost] = {}
    rsms: dict[int, Rsm] = {}

    def open_node(node: int, transport) -> None:
        hosts[node] = new_host(node, transport)
        rsms[node] = ReplicatedStateMachine(
            hosts[node],
            NAME,
            tmp_path / f"n{node}",
            MEMBERS,
            KV(),
            snapshot_every_entries=5,
            catch_up_entries=3,  # the SNAP then names the store's index, above the log start
        )

    for node, transport in transports.items():
        open_node(node, transport)
    for h in hosts.values():
        await h.start()  # binds port 0
    tell_ports(transports)
    try:
        await wait_for(lambda: sum(r.is_leader for r in rsms.values()) == 1, what="a leader")
        await hosts[3].stop()
        del hosts[3]
        value = "v" * 20_000  # a snapshot of 400 KiB: more than one frame's worth
        for i in range(20):
            await wait_for(lambda: rsms[1].is_leader or rsms[2].is_leader, what="a leader")
            leader = rsms[1] if rsms[1].is_leader else rsms[2]
            assert await leader.propose(f"set k{i} {value}".encode()) == b""
        assert leader.snapshot_index >= 15
        leader_node = next(n for n, r in rsms.items() if r is leader)
        start = hosts[leader_node].groups[NAME].log_reader.start_index
        assert 1 < start <= leader.snapshot_index - 2  # entries kept below the snapshot

        transports[3] = tcp_transports((1, 2, 3))[3]
        open_node(3, transports[3])
        await hosts[3].start()
        tell_ports(transports)
        await wait_for(
            lambda: rsms[3].applied_index >= leader.applied_index, 20, "node 3 to catch up"
        )
        assert rsms[3].machine.restored_at, "caught up by a snapshot"
        assert rsms[3].snapshot_index > start - 1  # the store's, above the leader's log start
        assert rsms[3].machine.data == leader.machine.data and len(rsms[3].machine.data) == 20
        assert (tmp_path / "n3" / SNAPSHOT_FILE).exists()
    finally:
        for h in hosts.values():
            await h.stop()
