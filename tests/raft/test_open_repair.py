"""A replica whose files are damaged while it is down, reopened on a host with real TCP
transports on loopback: open_group names damaged entries it reads (GroupDamagedError),
repair_closed_group mends them from a peer byte for byte, and the group then opens; a
corrupt hard state opens rejoining; a corrupt snapshot meta is rebuilt from the commit
hint or refused with a reason; a corrupt commit hint or promise record never stops an
open; a quarantined group whose reopen trips on damage repairs itself from its members."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.log.config import LogConfig
from raftmq.raft.errors import GroupDamagedError, GroupRepairError
from raftmq.raft.host import group_storage
from raftmq.raft.host import host as driver_mod
from raftmq.raft.host import repair as repair_mod
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.state_store import Kind
from raftmq.raft.host.tcp import TcpTransport
from raftmq.raft.membership import Membership
from tests.raft import stored
from tests.raft.test_driver import FAST, MEMBERS, propose_to_leader, tcp_transports, wait_for

CONFIG = LogConfig(segment_bytes=16 * 1024, retention_ms=-1, preallocate_bytes=0)
PAYLOAD = entry.encode(b"x" * 2000, record_count=1)


class Cluster:
    """Three hosts (nodes 1-3) running group ``g`` and a fourth (node 4) hosting nothing,
    only there to be a learner the group adds and removes (two CONFIG entries early in
    the log). Nodes stop and restart on a fresh port; the others are told the new one."""

    def __init__(self, tmp: Path, *, replay: bool, config: LogConfig = CONFIG) -> None:
        self.tmp = tmp
        self.replay = replay
        self.config = config
        self.transports = tcp_transports((1, 2, 3, 4))
        self.hosts: dict[int, RaftHost] = {}
        self.live: set[int] = set()  # nodes whose host runs

    def folder(self, node: int) -> Path:
        return self.tmp / f"n{node}" / "g"

    def open(self, node: int) -> None:
        self.hosts[node].open_group(
            "g", self.folder(node), MEMBERS, log_config=self.config, replay=self.replay
        )

    async def start(self) -> None:
        for node, transport in self.transports.items():
            self.hosts[node] = RaftHost(node, transport, seed=node, scrub_bytes_per_s=0, **FAST)
            if node != 4:
                self.open(node)
            await self.hosts[node].start()
            self.live.add(node)
        self._tell_ports()

    def _tell_ports(self) -> None:
        for n, t in self.transports.items():
            for p, other in self.transports.items():
                if p != n and p in self.live:
                    t.set_peer_address(p, ("127.0.0.1", other.port))

    def running(self) -> dict[int, RaftHost]:
        return {n: h for n, h in self.hosts.items() if n != 4 and "g" in h.groups}

    def leader(self) -> RaftHost | None:
        leaders = [h for h in self.running().values() if h.groups["g"].is_leader]
        return leaders[0] if len(leaders) == 1 else None

    async def fill(self) -> None:
        """Two CONFIG entries, then enough data for several sealed segments, committed
        and written on every member."""
        await wait_for(lambda: self.leader() is not None, what="a leader")
        for members in (Membership(MEMBERS.voters, frozenset({4})), MEMBERS):
            leader = self.leader()
            assert leader is not None
            await asyncio.wait_for(leader.propose_membership("g", members), 10)
        for _ in range(12):  # one append per round: a batch never straddles segments
            await propose_to_leader(self.running(), PAYLOAD, 4)
        leader = self.leader()
        assert leader is not None
        last = leader.groups["g"].last_index
        await wait_for(
            lambda: all(h.groups["g"].commit_index >= last for h in self.running().values()),
            what="every member to commit",
        )

    def follower(self) -> int:
        leader = self.leader()
        assert leader is not None
        return min(n for n in self.running() if n != leader.node_id)

    async def stop(self, node: int) -> None:
        """Stop ``node`` and put an unstarted host with a fresh transport in its place."""
        if node in self.live:
            await self.hosts[node].stop()
            self.live.discard(node)
        self.hosts[node] = RaftHost(
            node,
            TcpTransport(
                node,
                ("127.0.0.1", 0),
                {p: None for p in self.transports if p != node},
                ping_interval_s=0.05,
                dead_after_s=0.5,
            ),
            seed=node + 10,
            scrub_bytes_per_s=0,
            **FAST,
        )
        self.transports[node] = self.hosts[node].transport  # type: ignore[assignment]

    async def boot(self, node: int) -> None:
        """Start the restarted node's host (no group open) and wire the ports."""
        await self.hosts[node].start()
        self.live.add(node)
        self._tell_ports()

    async def close(self) -> None:
        for node in sorted(self.live):
            await self.hosts[node].stop()


def sealed(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.log"))[:-1]


def flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))


def first_entry_of_type(seg: Path, etype: EntryType) -> entry.EntryHeader:
    return next(h for h in entry.iter_headers(seg.read_bytes()) if h.type == etype)


def whole_log(folder: Path) -> bytes:
    """Every stored entry, in order (no preallocation in CONFIG: segments hold only
    entries), to compare replicas whose segment boundaries may differ."""
    return b"".join(p.read_bytes() for p in sorted(folder.glob("*.log")))


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repair_mod, "PEER_WAIT_S", 1.0)
    monkeypatch.setattr(repair_mod, "REPAIR_REPLY_TIMEOUT_S", 2.0)
    monkeypatch.setattr(driver_mod, "RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(driver_mod, "RETRY_MAX_S", 0.4)


async def _damaged_open_is_repaired(
    tmp: Path, etype: EntryType, seg_no: int, *, in_length: bool = False
) -> None:
    c = Cluster(tmp, replay=True)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        await c.stop(victim)
        folder = c.folder(victim)
        seg = sealed(folder)[seg_no]
        original = seg.read_bytes()
        h = first_entry_of_type(seg, etype)
        # The payload's last byte (the CRC catches it), or the length's low byte (the
        # framing is wrong from there to the segment's end; the file keeps its size).
        flip(seg, h.position + 3 if in_length else h.end - 1)
        await c.boot(victim)
        host = c.hosts[victim]
        with pytest.raises(GroupDamagedError) as caught:
            c.open(victim)
        assert "g" not in host.groups
        (damage,) = caught.value.damages
        assert damage.segment == seg.stem and damage.first_index <= h.index < damage.end_index
        peers = sorted(n for n in (1, 2, 3) if n != victim)
        what = await host.repair_closed_group("g", folder, peers, CONFIG)
        assert f"entries {damage.first_index}.." in what and seg.stem in what, what
        assert seg.read_bytes() == original
        c.open(victim)
        # The repaired log holds the peers' bytes. Compared as entry streams, and only as
        # a prefix: replicas may seal segments at different entries, and the peers may
        # have taken more entries while the victim was down (a new leader's first one).
        mine = whole_log(folder)
        for peer in peers:
            assert whole_log(c.folder(peer)).startswith(mine)
        await propose_to_leader(c.running(), PAYLOAD, 2)
        last = max(h.groups["g"].last_index for h in c.running().values())
        await wait_for(lambda: host.groups["g"].commit_index >= last, what="the repaired member")
    finally:
        await c.close()


async def test_a_damaged_config_entry_read_at_open_is_repaired_from_a_peer(tmp_path, quick):
    await _damaged_open_is_repaired(tmp_path, EntryType.CONFIG, 0)


async def test_a_damaged_data_entry_read_at_open_is_repaired_from_a_peer(tmp_path, quick):
    await _damaged_open_is_repaired(tmp_path, EntryType.DATA, 1)


async def test_a_flipped_length_field_read_at_open_is_patched_in_place(tmp_path, quick):
    await _damaged_open_is_repaired(tmp_path, EntryType.DATA, 1, in_length=True)


async def test_a_sealed_segment_that_shrank_is_cut_back_and_the_replica_rejoins(tmp_path, quick):
    """A sealed segment lost its last bytes: the peer's copy of the damaged range is
    longer than what is left, so it cannot be patched in place; the log is cut there
    instead, the replica rejoins, and the leader brings it back byte for byte."""
    c = Cluster(tmp_path, replay=True)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        await c.stop(victim)
        folder = c.folder(victim)
        seg = sealed(folder)[1]
        os.truncate(seg, seg.stat().st_size - 100)
        await c.boot(victim)
        host = c.hosts[victim]
        with pytest.raises(GroupDamagedError) as caught:
            c.open(victim)
        (damage,) = caught.value.damages
        peers = sorted(n for n in (1, 2, 3) if n != victim)
        what = await host.repair_closed_group("g", folder, peers, CONFIG)
        assert f"cut the log from entry {damage.first_index} on" in what, what
        saved = stored.hard_state(folder)
        assert saved is not None and saved.rejoining
        c.open(victim)
        assert host.status("g").rejoining
        assert host.groups["g"].last_index == damage.first_index - 1
        await propose_to_leader(c.running(), PAYLOAD, 2)
        leader = c.leader()
        assert leader is not None
        await wait_for(
            lambda: (
                not host.status("g").rejoining
                and host.groups["g"].commit_index >= leader.groups["g"].last_index
            ),
            timeout=20,
            what="the cut replica to rejoin",
        )
        # Its commit index can run ahead of its own writes (a quorum has the entries).
        await wait_for(
            lambda: whole_log(folder) == whole_log(c.folder(leader.node_id)),
            what="the cut replica's log to equal its leader's",
        )
    finally:
        await c.close()


async def test_no_peer_to_repair_from_is_a_repair_error_with_a_reason(tmp_path, quick):
    c = Cluster(tmp_path, replay=True)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        others = [n for n in (1, 2, 3) if n != victim]
        for node in (victim, *others):
            await c.stop(node)  # its peers stay down
        seg = sealed(c.folder(victim))[0]
        flip(seg, first_entry_of_type(seg, EntryType.CONFIG).end - 1)
        await c.boot(victim)
        host = c.hosts[victim]
        with pytest.raises(GroupDamagedError):
            c.open(victim)
        repair = asyncio.ensure_future(
            host.repair_closed_group("g", c.folder(victim), others, CONFIG)
        )
        await wait_for(lambda: host.repairing("g"), what="the repair to start")
        with pytest.raises(ValueError, match="being repaired"):
            c.open(victim)  # never while its log is open for the repair
        with pytest.raises(GroupRepairError) as caught:
            await repair
        assert not host.repairing("g")
        reason = caught.value.reason
        assert all(f"node {n} is not reachable" in reason for n in others), reason
        assert "state store" in reason, reason
        with pytest.raises(GroupDamagedError):
            c.open(victim)  # nothing was written: still damaged, still closed
    finally:
        await c.close()


async def test_a_corrupt_hard_state_opens_rejoining_and_catches_up(tmp_path, quick, caplog):
    c = Cluster(tmp_path, replay=False)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        await c.stop(victim)
        folder = c.folder(victim)
        before = stored.hard_state(folder)
        assert before is not None
        store_file = stored.store_path(folder)
        flip(store_file, store_file.stat().st_size // 2)  # bit rot: whose record, unknown
        assert stored.hard_state(folder) is None  # suspect: not trusted
        await c.boot(victim)
        host = c.hosts[victim]
        with caplog.at_level(logging.WARNING, logger="raftmq.raft.host.host"):
            c.open(victim)
        assert any("no vote, and rejoins" in r.getMessage() for r in caplog.records)
        status = host.status("g")
        assert status.rejoining and status.term <= before.term
        saved = stored.hard_state(folder)  # written again at open, flag and all
        assert saved is not None and saved.rejoining and saved.vote == 0
        await propose_to_leader(c.running(), PAYLOAD, 2)
        await wait_for(lambda: not host.status("g").rejoining, what="the rejoin to end")
        last = max(h.groups["g"].last_index for h in c.running().values())
        await wait_for(lambda: host.groups["g"].commit_index >= last, what="catch up")
    finally:
        await c.close()


async def _compacted_follower(c: Cluster) -> tuple[int, group_storage.SnapshotMeta]:
    """Fill the group, cut a follower's log prefix (retention), stop it: (node, meta)."""
    await c.fill()
    victim = c.follower()
    assert c.hosts[victim].compact("g") > 0
    meta = stored.snapshot_meta(c.folder(victim))
    assert meta is not None and meta.index > 0
    await c.stop(victim)
    stored.forget(c.folder(victim), Kind.META)
    assert stored.snapshot_meta(c.folder(victim)) is None
    return victim, meta


RETAINED = LogConfig(
    segment_bytes=16 * 1024, retention_ms=-1, retention_bytes=40 * 1024, preallocate_bytes=0
)


async def test_a_corrupt_snapshot_meta_is_rebuilt_from_the_commit_hint(tmp_path, quick, caplog):
    c = Cluster(tmp_path, replay=False, config=RETAINED)
    await c.start()
    try:
        victim, meta = await _compacted_follower(c)
        await c.boot(victim)
        with caplog.at_level(logging.WARNING, logger="raftmq.raft.host.host"):
            c.open(victim)
        assert any("rebuilt from the commit hint" in r.getMessage() for r in caplog.records)
        assert stored.snapshot_meta(c.folder(victim)) == meta
        assert c.hosts[victim].status("g").membership == MEMBERS
    finally:
        await c.close()


async def test_a_corrupt_snapshot_meta_without_a_hint_refuses_to_open(tmp_path, quick):
    c = Cluster(tmp_path, replay=False, config=RETAINED)
    await c.start()
    try:
        victim, _ = await _compacted_follower(c)
        stored.forget(c.folder(victim), Kind.HINT)
        await c.boot(victim)
        with pytest.raises(GroupDamagedError) as caught:
            c.open(victim)
        assert caught.value.damages == ()
        assert "snapshot meta" in caught.value.reason
        assert "state store" in caught.value.reason
        others = [n for n in (1, 2, 3) if n != victim]
        with pytest.raises(GroupRepairError, match="not entries a replica can supply"):
            await c.hosts[victim].repair_closed_group("g", c.folder(victim), others, RETAINED)
    finally:
        await c.close()


async def test_a_malformed_commit_hint_never_stops_an_open(tmp_path, quick):
    c = Cluster(tmp_path, replay=False)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        await c.stop(victim)
        folder = c.folder(victim)
        assert stored.commit_hint(folder) is not None
        stored.put(folder, Kind.HINT, b"garbage, not a configuration history")
        assert stored.commit_hint(folder) is None
        await c.boot(victim)
        c.open(victim)
        status = c.hosts[victim].status("g")
        # No hint is a slower open, not a lost state: the replica is whole and does not
        # rejoin; its log opened complete.
        assert not status.rejoining
        assert status.last_index >= c.running()[c.follower()].groups["g"].commit_index
    finally:
        await c.close()


async def test_a_quarantined_group_whose_reopen_finds_damage_repairs_from_its_members(
    tmp_path, quick, caplog
):
    c = Cluster(tmp_path, replay=True)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        host = c.hosts[victim]
        seg = sealed(c.folder(victim))[0]
        original = seg.read_bytes()
        host._quarantine(host.groups["g"], "a test's fault", OSError("injected"))
        await wait_for(lambda: "g" in host._recoveries, what="the recovery task")
        flip(seg, first_entry_of_type(seg, EntryType.CONFIG).end - 1)
        with caplog.at_level(logging.WARNING, logger="raftmq.raft.host.host"):
            await wait_for(lambda: "g" in host.groups, timeout=20, what="the reopen")
        assert seg.read_bytes() == original
        said = [r.getMessage() for r in caplog.records]
        assert any("reopening found damage" in m for m in said), said
        assert any("repaired entries" in m and seg.stem in m for m in said), said
    finally:
        await c.close()


async def test_a_damaged_range_every_peer_let_go_is_cut_and_the_replica_rejoins(tmp_path, quick):
    """The damaged entries lie below every peer's log start (retention let them go while
    the victim was down): nobody can supply them, but they are committed, so the victim
    lets them go too: it cuts its log from there, rejoins, and its leader brings it back
    from the group's start (a snapshot of the start point, then entries)."""
    c = Cluster(tmp_path, replay=False)
    await c.start()
    try:
        await c.fill()
        victim = c.follower()
        await c.stop(victim)
        folder = c.folder(victim)
        segs = sealed(folder)
        h = first_entry_of_type(segs[1], EntryType.DATA)
        after = next(iter(entry.iter_headers(segs[2].read_bytes()))).index
        for peer in (n for n in (1, 2, 3) if n != victim):
            c.hosts[peer].compact("g", through=after - 1)
            assert c.hosts[peer].groups["g"].log_reader.start_index == after
        flip(segs[1], h.end - 1)
        stored.forget(folder, Kind.HINT)  # the open reads the whole log
        await c.boot(victim)
        host = c.hosts[victim]
        with pytest.raises(GroupDamagedError):
            c.open(victim)
        peers = sorted(n for n in (1, 2, 3) if n != victim)
        what = await host.repair_closed_group("g", folder, peers, CONFIG)
        assert "let them go" in what and f"its log starts at {after}" in what, what
        c.open(victim)
        assert host.status("g").rejoining
        await propose_to_leader(c.running(), PAYLOAD, 2)
        leader = c.leader()
        assert leader is not None
        await wait_for(
            lambda: (
                not host.status("g").rejoining
                and host.groups["g"].commit_index >= leader.groups["g"].last_index
            ),
            timeout=20,
            what="the cut replica to rejoin from the group's start",
        )
        assert host.groups["g"].log_reader.start_index >= after
    finally:
        await c.close()
