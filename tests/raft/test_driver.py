"""The asyncio driver with real segmented logs on disk, over the in-memory network and over
real TCP sockets on loopback: election, commit everywhere, leader loss, quiescence."""

import asyncio
import dataclasses
import itertools
import threading
from pathlib import Path

from raftmq.format import entry
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.raft.errors import NotLeaderError, ProposalDroppedError
from raftmq.raft.host import repair as repair_mod
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.state_store import Kind
from raftmq.raft.host.tcp import TcpTransport
from raftmq.raft.host.transport import MemoryNetwork
from raftmq.raft.membership import ConfigHistory, Membership
from raftmq.raft.messages import Message, MsgType
from tests.raft import stored

MEMBERS = Membership(frozenset({1, 2, 3}))
SMALL = LogConfig(segment_bytes=256 * 1024)  # small segments: these tests roll too
# 10 ms ticks, elections after 300-600 ms: quick, yet calm on a loaded 2-core machine.
FAST = {"tick_s": 0.01, "election_tick": 30, "heartbeat_tick": 2}


def batch(i: int) -> bytes:
    return entry.encode(f"value-{i}".encode(), record_count=1, first_timestamp=i, max_timestamp=i)


class Applied:
    """What one node applied, as (index, entry bytes) in order."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []

    def __call__(self, buf: bytes, applied_to: int) -> None:
        for h in entry.iter_headers(buf):
            self.entries.append(bytes(buf[h.position : h.end]))


async def wait_for(cond, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def leader_of(hosts: dict[int, RaftHost], group: str = "g") -> RaftHost | None:
    leaders = [h for h in hosts.values() if h.groups[group].is_leader]
    return leaders[0] if len(leaders) == 1 else None


async def propose_to_leader(hosts: dict[int, RaftHost], payload: bytes, count: int) -> None:
    """Propose through whichever node leads now, retrying after a leader change."""
    for _ in range(50):
        leader = leader_of(hosts)
        if leader is not None:
            try:
                await asyncio.gather(*(leader.propose("g", payload).done for _ in range(count)))
                return
            except (NotLeaderError, ProposalDroppedError):
                pass
        await asyncio.sleep(0.05)
    raise AssertionError("no leader took the proposals")


async def start_memory_cluster(tmp: Path, groups: list[str]):
    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    applied: dict[tuple[int, str], Applied] = {}
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, **FAST)
        for g in groups:
            applied[node, g] = Applied()
            host.open_group(
                g, tmp / f"n{node}" / g, MEMBERS, log_config=SMALL, apply=applied[node, g]
            )
        await host.start()
        hosts[node] = host
    return net, hosts, applied


async def test_commit_reaches_every_node_and_survives_leader_loss(tmp_path):
    net, hosts, applied = await start_memory_cluster(tmp_path, ["g"])
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        leader = leader_of(hosts)
        assert leader is not None
        proposed = [leader.propose("g", batch(i)) for i in range(49)]
        # Several records in one proposal, and several entries: the offsets span them all.
        proposed.append(leader.propose("g", entry.encode(b"abc", record_count=3) + batch(49)))
        indexes = await asyncio.gather(*(p.done for p in proposed))
        assert indexes == [p.index for p in proposed] == sorted(indexes)
        # The offsets each proposal was given are where the core stamped its records.
        assert proposed[0].base_offset == 0
        for before, p in itertools.pairwise(proposed):
            assert p.base_offset == before.last_offset + 1
        assert [p.last_offset - p.base_offset for p in proposed] == [0] * 49 + [3]
        await wait_for(lambda: all(len(applied[n, "g"].entries) >= 52 for n in hosts), what="apply")
        # Every node applied the same bytes at the same positions (state machine safety).
        assert applied[1, "g"].entries == applied[2, "g"].entries == applied[3, "g"].entries
        stamped = [entry.parse_header(e) for e in applied[1, "g"].entries[1:]]  # after the NOOP
        assert [h.base_offset for h in stamped[-2:]] == [proposed[-1].base_offset, 52]
        assert [h.index for h in stamped[-2:]] == [proposed[-1].index - 1, proposed[-1].index]

        old = leader.node_id
        for peer in hosts:
            if peer != old:
                net.cut(old, peer)
        survivors = {n: h for n, h in hosts.items() if n != old}
        await wait_for(lambda: leader_of(survivors) is not None, what="a new leader")
        new = leader_of(survivors)
        assert new is not None and new.node_id != old
        await new.propose("g", batch(1000)).done
        net.heal()
        await wait_for(
            lambda: all(
                len(applied[n, "g"].entries) == len(applied[new.node_id, "g"].entries)
                for n in hosts
            ),
            what="the old leader to catch up",
        )
        assert applied[old, "g"].entries == applied[new.node_id, "g"].entries
    finally:
        for h in hosts.values():
            await h.stop()


async def test_idle_groups_quiesce_and_wake_on_proposal(tmp_path):
    groups = [f"g{i}" for i in range(20)]
    net, hosts, applied = await start_memory_cluster(tmp_path, groups)
    try:
        for g in groups:
            await wait_for(lambda g=g: leader_of(hosts, g) is not None, what=f"leader of {g}")
        await wait_for(
            lambda: all(grp.quiesced for h in hosts.values() for grp in h.groups.values()),
            what="every group to quiesce",
        )
        leader = leader_of(hosts, "g7")
        assert leader is not None
        index = await asyncio.wait_for(leader.propose("g7", batch(1)).done, 5)
        assert index > 0
        await wait_for(lambda: all(len(applied[n, "g7"].entries) >= 2 for n in hosts), what="apply")
        # A quiesced group whose leader becomes unreachable wakes up and elects another.
        old = leader.node_id
        await wait_for(
            lambda: all(h.groups["g7"].quiesced for h in hosts.values()), what="requiesce"
        )
        for peer in hosts:
            if peer != old:
                net.cut(old, peer)
        survivors = {n: h for n, h in hosts.items() if n != old}
        await wait_for(lambda: leader_of(survivors, "g7") is not None, what="re-election")
    finally:
        for h in hosts.values():
            await h.stop()


async def test_a_follower_that_missed_the_last_commit_takes_it_from_the_quiesce_notice(
    tmp_path,
):
    """The leader's heartbeats carrying the last commit to one follower are lost; the
    quiesce notice then arrives with that commit, and the follower must take it, not go
    quiet (or wait for an election) with its applied entries behind. The chaos client
    schedule once ended with a follower's high watermark two behind its leader's."""
    net, hosts, applied = await start_memory_cluster(tmp_path, ["g"])
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        leader = leader_of(hosts)
        assert leader is not None
        await wait_for(lambda: all(h.groups["g"].quiesced for h in hosts.values()), what="quiesce")
        lossy = next(n for n in hosts if n != leader.node_id)

        def commit_lost(src: int, dst: int, m: object) -> bool:
            # Entries arrive; every message that would only move the commit is lost.
            return (
                src == leader.node_id
                and dst == lossy
                and isinstance(m, Message)
                and (m.type == MsgType.HEARTBEAT or (m.type == MsgType.APP and not m.entries))
            )

        net.drop = commit_lost
        await asyncio.wait_for(leader.propose("g", batch(7)).done, 5)
        want = len(applied[leader.node_id, "g"].entries)
        await wait_for(
            lambda: len(applied[lossy, "g"].entries) == want and hosts[lossy].groups["g"].quiesced,
            what="the follower to apply the last entry and go quiet",
        )
        assert hosts[lossy].groups["g"].core.term == leader.groups["g"].core.term
    finally:
        for h in hosts.values():
            await h.stop()


async def test_a_restarted_cluster_keeps_every_committed_entry(tmp_path):
    _, hosts, applied = await start_memory_cluster(tmp_path, ["g"])
    await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
    leader = leader_of(hosts)
    assert leader is not None
    await asyncio.gather(*(leader.propose("g", batch(i)).done for i in range(30)))
    committed = list(applied[leader.node_id, "g"].entries)
    for h in hosts.values():
        await h.stop()
    for _round in range(3):
        _, hosts, applied = await start_memory_cluster(tmp_path, ["g"])
        try:
            await wait_for(
                lambda hosts=hosts: leader_of(hosts) is not None, what="a leader after restart"
            )
            leader = leader_of(hosts)
            assert leader is not None
            await leader.propose("g", batch(99)).done
            got = applied[leader.node_id, "g"].entries
            data = [e for e in got if entry.parse_header(e).type == entry.EntryType.DATA]
            want = [e for e in committed if entry.parse_header(e).type == entry.EntryType.DATA]
            assert data[: len(want)] == want
            committed = list(got)
        finally:
            for h in hosts.values():
                await h.stop()


def tcp_transports(nodes: tuple[int, ...]) -> dict[int, TcpTransport]:
    """Transports that bind port 0 and know no peer address yet: :func:`tell_ports`, once
    they started, gives each the ports the others got, so none is picked before its
    listener holds it."""
    return {
        n: TcpTransport(
            n,
            ("127.0.0.1", 0),
            {p: None for p in nodes if p != n},
            ping_interval_s=0.05,
            dead_after_s=0.5,
        )
        for n in nodes
    }


def tell_ports(transports: dict[int, TcpTransport]) -> None:
    for n, t in transports.items():
        for p, other in transports.items():
            if p != n:
                t.set_peer_address(p, ("127.0.0.1", other.port))


async def test_three_nodes_over_real_tcp(tmp_path):
    hosts: dict[int, RaftHost] = {}
    applied: dict[int, Applied] = {}
    transports = tcp_transports((1, 2, 3))
    for node, transport in transports.items():
        host = RaftHost(node, transport, seed=node, **FAST)
        applied[node] = Applied()
        host.open_group("g", tmp_path / f"n{node}", MEMBERS, log_config=SMALL, apply=applied[node])
        hosts[node] = host
    for h in hosts.values():
        await h.start()  # binds port 0
    tell_ports(transports)
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader over TCP")
        leader = leader_of(hosts)
        assert leader is not None
        big = entry.encode(b"x" * 200_000, record_count=1)
        await asyncio.wait_for(
            asyncio.gather(*(leader.propose("g", big).done for _ in range(20))), 20
        )
        await wait_for(lambda: all(len(a.entries) >= 21 for a in applied.values()), what="apply")
        assert applied[1].entries == applied[2].entries == applied[3].entries
    finally:
        for h in hosts.values():
            await h.stop()


async def test_a_follower_behind_the_log_start_catches_up_by_snapshot(tmp_path):
    """The leader deletes segments the follower never got; the follower restarts its log at
    the leader's start point and then receives every later entry byte for byte."""
    net = MemoryNetwork()
    config = LogConfig(segment_bytes=4096, retention_bytes=0)
    hosts: dict[int, RaftHost] = {}
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, **FAST)
        host.open_group("g", tmp_path / f"n{node}", MEMBERS, log_config=config)
        await host.start()
        hosts[node] = host
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        leader = leader_of(hosts)
        assert leader is not None
        lagging = next(n for n in hosts if n != leader.node_id)
        for peer in hosts:
            if peer != lagging:
                net.cut(lagging, peer)
        payload = entry.encode(b"p" * 600, record_count=2)
        for _ in range(12):  # small rounds, so the appends spread over many segments
            await propose_to_leader(hosts, payload, 5)
        leader = leader_of(hosts)
        assert leader is not None and leader.node_id != lagging
        for n, h in hosts.items():
            if n != lagging:
                await wait_for(
                    lambda h=h: h.groups["g"].core.log.applied >= leader.groups["g"].log.last_index,
                    what="apply on the majority",
                )
                assert h.compact("g") > 0
        start = leader.groups["g"].log.start_index
        assert start > 2
        net.heal()
        lag_log = hosts[lagging].groups["g"].log
        await wait_for(
            lambda: lag_log.last_index == leader.groups["g"].log.last_index, what="catch-up"
        )
        assert lag_log.start_index >= start
        lo = lag_log.start_index
        ours = lag_log.read_by_index(lo, 1 << 24).data
        theirs = leader.groups["g"].log.read_by_index(lo, 1 << 24).data
        assert ours == theirs and ours
        assert lag_log.start_offset == leader.groups["g"].log.start_offset or lo > start
    finally:
        for h in hosts.values():
            await h.stop()


async def test_many_groups_started_together_elect_and_spread_their_leaders(tmp_path):
    """Each group draws its own election timeouts: with one seed per node every group
    campaigned on the same tick and split votes forever (found with 1000 groups)."""
    groups = [f"g{i}" for i in range(60)]
    _, hosts, _ = await start_memory_cluster(tmp_path, groups)
    try:
        await wait_for(
            lambda: all(leader_of(hosts, g) is not None for g in groups),
            timeout=30,
            what="a leader for every group",
        )
        per_node = {n: sum(h.groups[g].is_leader for g in groups) for n, h in hosts.items()}
        assert min(per_node.values()) >= 5, per_node  # not all on one node
    finally:
        for h in hosts.values():
            await h.stop()


class _Inbox:
    """A transport handler that only records what arrives."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, str, object]] = []

    def on_messages(self, peer: int, batch) -> None:
        self.messages += [(peer, group, m) for group, m in batch]

    def on_peer_state(self, peer: int, alive: bool) -> None:
        pass

    def on_unreachable(self, peer: int) -> None:
        pass


async def test_transport_flush_puts_queued_messages_on_the_socket_at_once():
    """The driver flushes before it blocks on an fsync: the append must already be in the
    kernel then, not waiting for the writer task's next turn."""
    from raftmq.raft.messages import Message, MsgType

    inbox = {1: _Inbox(), 2: _Inbox()}
    transports = tcp_transports((1, 2))
    for node, transport in transports.items():
        transport.set_handler(inbox[node])
        await transport.start()
    tell_ports(transports)
    try:
        await wait_for(lambda: transports[1].peer_alive(2), what="a connection")
        peer = transports[1]._peers[2]
        message = Message(MsgType.APP, src=1, dst=2, term=1, index=7, entries=b"x" * 1000)
        transports[1].send(2, "g", message, urgent=False)
        assert peer.bulk, "queued until someone writes it"
        transports[1].flush()
        assert not peer.bulk
        assert peer.writer is not None and peer.writer.transport.get_write_buffer_size() == 0
        await wait_for(lambda: any(m == message for _, _, m in inbox[2].messages), what="it")
    finally:
        for t in transports.values():
            await t.close()


async def test_an_interval_group_writes_through_to_the_page_cache(tmp_path):
    """An INTERVAL group acknowledges after the write, not the fsync: what it acknowledged
    must be in the file (the page cache survives this process dying), never held back in
    the process by write-behind. EVERY_BATCH groups keep write-behind: a round's flush
    writes everything out before anything is acknowledged."""
    from raftmq.log.config import FlushPolicy

    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    interval = LogConfig(segment_bytes=256 * 1024, flush_policy=FlushPolicy.INTERVAL)
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, **FAST)
        host.open_group("g", tmp_path / f"n{node}" / "g", MEMBERS, log_config=interval)
        host.open_group("s", tmp_path / f"n{node}" / "s", MEMBERS, log_config=SMALL)
        await host.start()
        hosts[node] = host
    try:
        for host in hosts.values():
            assert host.groups["g"].log.config.write_behind_bytes == 0
            assert host.groups["s"].log.config.write_behind_bytes > 0
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        await propose_to_leader(hosts, batch(1), 5)
        for host in hosts.values():
            log = host.groups["g"].log
            await wait_for(lambda log=log: log.next_index > 5, what="the entries everywhere")
            files = sorted(log.directory.glob("*.log"))
            assert sum(f.stat().st_size for f in files) == log.size_bytes
    finally:
        for host in hosts.values():
            await host.stop()


async def test_a_restart_reads_only_the_log_after_the_saved_configurations(tmp_path, monkeypatch):
    """Groups whose state is their log save their committed configurations with the commit
    hint, so a restart finds the configuration in force without reading the whole log for
    CONFIG entries; a saved point past the log's end (a torn tail) is clamped to it."""
    from raftmq.raft.core import RaftCore

    def open_cluster() -> dict[int, RaftHost]:
        hosts = {}
        for node in (1, 2, 3):
            host = RaftHost(node, net.transport(node), seed=node, **FAST)
            host.open_group(
                "g", tmp_path / f"n{node}" / "g", MEMBERS, log_config=SMALL, replay=False
            )
            hosts[node] = host
        return hosts

    net = MemoryNetwork()
    hosts = open_cluster()
    for host in hosts.values():
        await host.start()
    new = Membership(frozenset({1, 2, 3}), frozenset({4}))  # a learner that never shows up
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        leader = leader_of(hosts)
        assert leader is not None
        conf_index = await leader.propose_membership("g", new)
        await propose_to_leader(hosts, batch(1), 40)
        last = leader.groups["g"].core.log.last_index
        for host in hosts.values():
            g = host.groups["g"]
            # Committed and stored: a hint never claims entries not handed to storage yet
            # (RaftCore.config_history), and a loaded machine can stop a node between.
            await wait_for(
                lambda g=g: g.core.commit == last and g.core.log.unstable_offset > last,
                what="the commit, stored, everywhere",
            )
    finally:
        for host in hosts.values():
            await host.stop()
    saved = stored.commit_hint(tmp_path / "n2" / "g")
    assert saved is not None and saved.through == last
    assert saved.changes == ((0, MEMBERS), (conf_index, new))
    # Node 3's hint claims more than its log holds, as after losing an unsynced tail.
    bigger = ConfigHistory(last + 1000, saved.changes)
    stored.put(tmp_path / "n3" / "g", Kind.HINT, bigger.encode())  # as the host writes hints

    scans: list[int] = []
    original = RaftCore._replay_configs

    def spy(self, storage, lo):
        scans.append(lo)
        return original(self, storage, lo)

    monkeypatch.setattr(RaftCore, "_replay_configs", spy)
    hosts = open_cluster()
    try:
        # Never the whole log: at most what followed the saved point. A leader stopped
        # with entries committed by its followers' acks before its own write was marked
        # stable saves a lower point (config_history's "through"), never a higher one.
        assert len(scans) == 3 and all(conf_index < lo <= last + 1 for lo in scans), scans
        for host in hosts.values():
            core = host.groups["g"].core
            assert core.membership == new and core.commit == last
    finally:
        for host in hosts.values():
            await host.stop()
    # A hint of another format is no hint: the whole log is read.
    stored.put(tmp_path / "n2" / "g", Kind.HINT, saved.encode()[:-1])
    scans.clear()
    hosts = open_cluster()
    try:
        assert scans[1] == 1
        assert hosts[2].groups["g"].core.membership == new
    finally:
        for host in hosts.values():
            await host.stop()


async def test_a_group_restarts_from_the_configuration_it_was_created_with(tmp_path):
    """A partition's replica set changes with moves, so a broker reopening a replica may
    pass another configuration than the one the group was created with: the group keeps
    its own (the log's CONFIG entries say what changed since), so its saved history still
    matches and nothing is re-read."""
    for membership in (MEMBERS, Membership(frozenset({1, 2, 4}), frozenset({5}))):
        host = RaftHost(1, MemoryNetwork().transport(1), seed=1, **FAST)
        host.open_group("g", tmp_path / "g", membership, log_config=SMALL, replay=False)
        await host.start()
        try:
            assert host.groups["g"].core.membership == MEMBERS
            await asyncio.sleep(0.05)  # let the loops start before they are stopped
        finally:
            await host.stop()


async def test_groups_with_a_dead_follower_quiesce_and_catch_it_up_later(tmp_path):
    """A node's death used to keep every group it shared ticking on the survivors (each
    leader waited for the dead follower's match): 15% of a core per broker at 1,000
    partitions. They now quiesce, and catch the node up when it is back."""
    groups = [f"g{i}" for i in range(12)]
    net, hosts, _ = await start_memory_cluster(tmp_path, groups)
    survivors = {n: h for n, h in hosts.items() if n != 3}
    try:
        for g in groups:
            await wait_for(lambda g=g: leader_of(hosts, g) is not None, what=f"leader of {g}")
        net.cut(3, 1)
        net.cut(3, 2)
        await hosts[3].stop()
        for g in groups:
            await wait_for(lambda g=g: leader_of(survivors, g) is not None, what=f"{g} led")

        def all_quiet() -> bool:
            return all(grp.quiesced for h in survivors.values() for grp in h.groups.values())

        await wait_for(all_quiet, what="every group on the survivors to quiesce")
        assert all(
            h.groups[g].probe_peers == (3,)
            for g in groups
            for h in survivors.values()
            if h.groups[g].is_leader
        )
        rounds = {n: h.rounds for n, h in survivors.items()}
        await asyncio.sleep(1.0)  # 100 ticks: ticking groups would run a round or more each
        assert all(h.rounds - rounds[n] <= 2 for n, h in survivors.items()), (
            rounds,
            {n: h.rounds for n, h in survivors.items()},
        )
        assert all_quiet()

        # The dead node comes back behind: the transport's word wakes its groups.
        leader = leader_of(survivors, "g5")
        assert leader is not None
        await asyncio.wait_for(leader.propose("g5", batch(7)).done, 5)
        back = RaftHost(3, net.transport(3), seed=3, **FAST)
        for g in groups:
            back.open_group(g, tmp_path / "n3" / g, MEMBERS, log_config=SMALL)
        await back.start()
        hosts[3] = back
        net.heal()
        target = leader.groups["g5"].log.last_index
        await wait_for(
            lambda: back.groups["g5"].log.last_index == target,
            what="the returning node to catch up",
        )
    finally:
        for h in hosts.values():
            if not h._stopping:
                await h.stop()


async def test_a_quiesced_leader_that_loses_its_quorum_steps_down(tmp_path):
    """Quiescing past a dead follower must not keep a leader that lost its majority."""
    net, hosts, _ = await start_memory_cluster(tmp_path, ["g"])
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        leader = leader_of(hosts)
        assert leader is not None
        others = [n for n in hosts if n != leader.node_id]
        net.cut(leader.node_id, others[0])
        await wait_for(lambda: leader.groups["g"].quiesced, what="quiesce past a dead follower")
        net.cut(leader.node_id, others[1])
        await wait_for(lambda: not leader.groups["g"].is_leader, what="the leader to step down")
    finally:
        for h in hosts.values():
            await h.stop()


async def scrubbed_cluster_with_sealed_segments(tmp: Path):
    """Three hosts scrubbing fast, one group with several sealed segments replicated
    everywhere: (hosts, leader, a follower, the follower's second segment file, the
    leader's copy of its bytes). Callers stop the hosts."""
    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    config = LogConfig(segment_bytes=16 * 1024)
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, scrub_bytes_per_s=1 << 30, **FAST)
        host.open_group("g", tmp / f"n{node}" / "g", MEMBERS, log_config=config)
        await host.start()
        hosts[node] = host
    await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
    for _ in range(12):  # one append per round: a batch never straddles segments
        await propose_to_leader(hosts, entry.encode(b"x" * 2000, record_count=1), 4)
    leader = leader_of(hosts)
    assert leader is not None
    victim = next(h for n, h in hosts.items() if n != leader.node_id)
    await wait_for(
        lambda: victim.groups["g"].core.commit >= leader.groups["g"].core.commit,
        what="the follower to catch up",
    )
    folder = tmp / f"n{victim.node_id}" / "g"
    seg = sorted(folder.glob("*.log"))[1]
    assert seg.with_suffix(".index").exists(), sorted(p.name for p in folder.iterdir())
    good = (tmp / f"n{leader.node_id}" / "g" / seg.name).read_bytes()
    return hosts, leader, victim, seg, good


async def test_scrubber_finds_a_flipped_bit_and_the_range_is_restored(tmp_path, monkeypatch):
    """Bit rot in a sealed segment that nobody reads: the scrubber finds it and the
    replica restores the bytes from a peer, byte-identical again."""
    monkeypatch.setattr(repair_mod, "SCRUB_PASS_PAUSE_S", 0.05)
    hosts, _, _, seg, good = await scrubbed_cluster_with_sealed_segments(tmp_path)
    try:
        with open(seg, "r+b") as f:
            f.seek(300)
            byte = f.read(1)
            f.seek(300)
            f.write(bytes([byte[0] ^ 0x04]))
        assert seg.read_bytes() != good
        await wait_for(lambda: seg.read_bytes() == good, timeout=20, what="the repair")
    finally:
        for host in hosts.values():
            await host.stop()


async def test_replica_audit_finds_and_replaces_a_copy_that_differs_with_valid_crcs(
    tmp_path, monkeypatch
):
    """A follower's sealed segment holds a different entry with a valid CRC (no scrub
    can see it): the leader's audit finds that the copies differ and the follower
    replaces its bytes with the leader's."""
    monkeypatch.setattr(repair_mod, "SCRUB_PASS_PAUSE_S", 0.05)
    hosts, leader, _, seg, good = await scrubbed_cluster_with_sealed_segments(tmp_path)
    try:
        h = next(entry.iter_headers(good))
        other = entry.stamp(
            entry.encode(b"y" * 2000, record_count=1),
            index=h.index,
            term=h.term,
            base_offset=h.base_offset,
        )
        assert len(other) == h.size
        with open(seg, "r+b") as f:
            f.seek(h.position)
            f.write(other)
        await wait_for(lambda: seg.read_bytes() == good, timeout=20, what="the audit's repair")
        assert leader.audited_ranges > 0
    finally:
        for host in hosts.values():
            await host.stop()


async def test_log_settings_change_live_under_load_without_failing_a_round(tmp_path, caplog):
    """A topic's altered config reaches a running group (RaftHost.reconfigure_log): the
    flush policy flips between rounds (a change arriving mid-round waits for its end, as a
    round decides from it whether its entries need an fsync before their acks), and the
    log takes the rest in place; proposals keep committing, no group is quarantined."""
    _net, hosts, applied = await start_memory_cluster(tmp_path, ["g"])
    try:
        await wait_for(lambda: leader_of(hosts) is not None, what="a leader")
        every_batch = dataclasses.replace(SMALL, flush_policy=FlushPolicy.EVERY_BATCH)
        interval = dataclasses.replace(SMALL, flush_policy=FlushPolicy.INTERVAL)
        stop = asyncio.Event()

        async def load() -> None:
            i = 0
            while not stop.is_set():
                await propose_to_leader(hosts, batch(i), 5)
                i += 1

        loader = asyncio.create_task(load())
        for k in range(20):
            for host in hosts.values():
                host.reconfigure_log("g", interval if k % 2 else every_batch)
            await asyncio.sleep(0.02)
        final = dataclasses.replace(every_batch, segment_bytes=SMALL.segment_bytes * 2)
        for host in hosts.values():
            host.reconfigure_log("g", final)
        stop.set()
        await loader
        await wait_for(
            lambda: all(h.groups["g"].parked_config is None for h in hosts.values()),
            what="parked configs taken",
        )
        for host in hosts.values():
            group = host.groups["g"]
            assert group.failure is None and not host.quarantined
            assert group.sync  # EVERY_BATCH, the last one set
            assert group.log.config.segment_bytes == final.segment_bytes
            assert group.opened_with is not None and group.opened_with[1] == final
        assert "quarantined" not in caplog.text  # not even for a moment
        count = len(applied[1, "g"].entries)
        assert count > 20
        await wait_for(
            lambda: all(len(applied[n, "g"].entries) >= count for n in hosts), what="apply"
        )
    finally:
        for h in hosts.values():
            await h.stop()


async def test_a_priority_group_commits_while_a_bulk_round_waits_on_its_fsync(tmp_path):
    """A group opened with ``priority`` has its own ready loop and fsync thread: a bulk
    round stuck in slow fsyncs (a thousand groups saving their terms, as in a large
    topic's creation) does not hold its proposals back."""
    net = MemoryNetwork()
    host = RaftHost(1, net.transport(1), seed=1, **FAST)
    solo = Membership(frozenset({1}))
    bulk = [
        host.open_group(f"bulk{i}", tmp_path / f"bulk{i}", solo, log_config=SMALL) for i in range(2)
    ]
    host.open_group("meta", tmp_path / "meta", solo, log_config=SMALL, priority=True)
    await host.start()
    release = threading.Event()
    try:
        await wait_for(lambda: all(g.is_leader for g in host.groups.values()))
        for group in bulk:
            group.log.flush = _held(group.log.flush, release)  # type: ignore[method-assign]
        # Two groups in one round: their fsyncs go to the pool, where they wait.
        stuck = [host.propose(group.name, batch(0)) for group in bulk]
        await asyncio.sleep(0.05)
        await asyncio.wait_for(host.propose("meta", batch(1)).done, 2.0)
        assert not any(p.done.done() for p in stuck)
        release.set()
        await asyncio.wait_for(asyncio.gather(*(p.done for p in stuck)), 5.0)
    finally:
        release.set()
        await host.stop()


def _held(flush, release: threading.Event):
    def held() -> None:
        release.wait(10)
        flush()

    return held


async def test_a_connection_that_never_says_hello_is_closed(monkeypatch):
    """A link that connects and then passes nothing (a hung proxy) must not hold a
    descriptor for good: only greeted connections are pinged and closed when silent."""
    from raftmq.raft.host import tcp

    monkeypatch.setattr(tcp, "HELLO_TIMEOUT_S", 0.3)
    transports = tcp_transports((1, 2))
    for transport in transports.values():
        await transport.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", transports[2].port)
        hello = await asyncio.wait_for(reader.read(1 << 16), 5)
        assert hello, "the acceptor speaks first"
        tail = await asyncio.wait_for(reader.read(1 << 16), 5)  # we say nothing back
        assert tail == b"", "closed for want of a HELLO"
        writer.close()
    finally:
        for t in transports.values():
            await t.close()


STOP_WITH_A_PEER_CONNECTED = """
import asyncio
from raftmq.raft.host.tcp import TcpTransport

async def main():
    a = TcpTransport(1, ("127.0.0.1", 0), {2: None}, ping_interval_s=0.05, dead_after_s=0.5)
    b = TcpTransport(2, ("127.0.0.1", 0), {1: None}, ping_interval_s=0.05, dead_after_s=0.5)
    await a.start()
    await b.start()
    a.set_peer_address(2, ("127.0.0.1", b.port))
    while not b.peer_alive(1):
        await asyncio.sleep(0.01)
    # return without closing: asyncio.run cancels the inbound connection's handler

asyncio.run(main())
"""


def test_a_process_that_stops_with_peers_connected_logs_no_traceback() -> None:
    """Every broker stop logged one asyncio traceback per inbound Raft connection (the
    cancelled handler's exception read by asyncio's own callback): noise that hides real
    errors in a chaos run's logs."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", STOP_WITH_A_PEER_CONNECTED],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
