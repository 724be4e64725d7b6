"""The state store shared by a folder's groups: group commit, torn tails, damage that is not
guessed over, tombstones, rewrites, and the move of an old data dir's files into it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from raftmq.raft.hardstate import HardState
from raftmq.raft.host import group_storage, state_store
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.state_store import Kind, StateStore
from raftmq.raft.host.transport import MemoryNetwork
from raftmq.raft.membership import ConfigHistory, Membership
from raftmq.raft.messages import SnapshotMeta
from tests.raft import stored
from tests.raft.test_driver import wait_for

ONE = Membership(frozenset({1}))


def _hard(store: StateStore, name: str) -> HardState | None:
    return group_storage.hard_state_of(store, Path(name))


def test_records_survive_a_reload_and_a_tombstone_forgets_a_group(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    for i in range(3):
        store.put(f"g{i}", Kind.HARD, group_storage.encode_hard_state(HardState(i + 1, 2, 3)))
    store.put("g1", Kind.PROMISED)
    store.forget("g2")
    store.sync()
    again = StateStore(tmp_path)
    assert _hard(again, "g0") == HardState(1, 2, 3)
    assert again.group("g1").promised
    assert again.group("g2").empty


def test_one_sync_covers_every_record_put_before_it(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    for i in range(100):
        store.put(f"g{i}", Kind.HARD, group_storage.encode_hard_state(HardState(1, 1, 0)))
    store.sync()
    store.sync()  # nothing new: no fsync
    assert store.fsyncs == 2  # the append, and the new file's name once


def test_a_torn_tail_is_cut_and_nothing_is_suspect(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.put("a", Kind.HARD, group_storage.encode_hard_state(HardState(4, 1, 0)))
    store.sync()
    size = store.path.stat().st_size
    store.put("b", Kind.HARD, group_storage.encode_hard_state(HardState(5, 1, 0)))
    store.sync()
    with open(store.path, "r+b") as f:
        f.truncate(size + 7)  # the second record cut short by a crash
    again = StateStore(tmp_path)
    assert again.damaged is None
    assert _hard(again, "a") == HardState(4, 1, 0)
    assert again.group("b").empty
    assert again.path.stat().st_size == size


def test_a_flipped_bit_anywhere_is_damage_that_makes_every_older_state_suspect(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.put("a", Kind.HARD, group_storage.encode_hard_state(HardState(4, 1, 0)))
    store.put("b", Kind.HARD, group_storage.encode_hard_state(HardState(5, 1, 0)))
    store.sync()
    data = store.path.read_bytes()
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 0x10
        store.path.write_bytes(bytes(flipped))
        again = StateStore(tmp_path)
        assert again.damaged is not None, position
        # The record that lost a bit is a's or b's; b's, written after a's, is trusted
        # when whole (it supersedes whatever of b's came before).
        hit = "a" if position < len(data) // 2 else "b"
        assert again.group(hit).suspect and again.group("a").suspect, position
    # A hard state written after the damage clears its group, across reloads and rewrites.
    again.put("a", Kind.HARD, group_storage.encode_hard_state(HardState(6, 0, 0, True)))
    again.sync()
    third = StateStore(tmp_path)
    assert not third.group("a").suspect and third.group("b").suspect
    assert third.group("unknown").suspect  # a group whose only record may have been lost


def test_the_file_is_rewritten_when_it_grows(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(state_store, "COMPACT_MIN_BYTES", 4096)
    store = StateStore(tmp_path)
    for term in range(1, 2000):
        store.put("g", Kind.HARD, group_storage.encode_hard_state(HardState(term, 1, 0)))
        store.sync()
    assert store.path.stat().st_size < 4096 * 2
    assert _hard(StateStore(tmp_path), "g") == HardState(1999, 1, 0)


async def test_an_old_data_dir_moves_its_files_into_the_store(tmp_path: Path) -> None:
    """Files of the layout before the store: read once, moved, removed."""
    directory = tmp_path / "g"
    directory.mkdir()
    group_storage.save_hard_state(directory / "raft-hardstate", HardState(7, 1, 0))
    meta = SnapshotMeta(0, 0, 0, ONE)
    from raftmq.log.atomic_file import overwrite_in_place, write_atomic
    from raftmq.log.log import Log

    write_atomic(directory / "raft-snapshot", group_storage.encode_snapshot_meta(meta))
    overwrite_in_place(directory / "raft-commit", ConfigHistory(0, ((0, ONE),)).encode())
    write_atomic(tmp_path / "g.raft-promised", b"")
    Log.open(directory).close()
    host = RaftHost(1, MemoryNetwork().transport(1), tick_s=0.01, election_tick=3)
    host.open_group("g", directory, ONE, replay=False)
    assert host.status("g").term == 7
    await host.stop()
    assert not any(p.name.startswith("raft-") for p in directory.iterdir())
    assert not (tmp_path / "g.raft-promised").exists()
    assert stored.hard_state(directory) == HardState(7, 1, 0)
    assert stored.snapshot_meta(directory) == meta
    with stored.store_of(directory) as store:
        assert store.group("g").promised


async def test_a_lost_group_directory_with_the_store_intact_rejoins(tmp_path: Path) -> None:
    import shutil

    host = RaftHost(1, MemoryNetwork().transport(1), tick_s=0.01, election_tick=3)
    host.open_group("g", tmp_path / "g", ONE, replay=False)
    host.open_group("h", tmp_path / "h", ONE, replay=False)
    await host.start()
    # Committed: its term is saved (a leader counts its own entry once persisted).
    await wait_for(lambda: host.status("g").commit > 0, what="g's first commit")
    await wait_for(lambda: host.status("h").commit > 0, what="h's first commit")
    term = host.status("g").term
    await host.stop()
    shutil.rmtree(tmp_path / "g")
    host = RaftHost(1, MemoryNetwork().transport(1), tick_s=0.01, election_tick=3)
    host.open_group("g", tmp_path / "g", ONE, replay=False)
    host.open_group("h", tmp_path / "h", ONE, replay=False)
    status = host.status("g")
    assert status.rejoining and status.term == term
    assert not host.status("h").rejoining
    await host.stop()


@pytest.mark.parametrize("n", [200, pytest.param(2000, marks=pytest.mark.long)])
async def test_creating_many_groups_costs_a_few_fsyncs(tmp_path: Path, n: int) -> None:
    """The cost the store exists for: new single-member groups open, elect and are deleted
    with a handful of store fsyncs, not several per group (-s prints the figures; with
    ``-m long``, for 2,000 groups)."""
    host = RaftHost(1, MemoryNetwork().transport(1), tick_s=0.01, election_tick=3)
    t0 = time.perf_counter()
    for i in range(n):
        host.open_group(f"g{i}", tmp_path / f"g{i}", ONE, replay=False)
    opened_s = time.perf_counter() - t0
    await host.start()
    await wait_for(
        lambda: all(g.is_leader for g in host.groups.values()), 60, "every group to lead"
    )
    elected_s = time.perf_counter() - t0 - opened_s
    store = next(iter(host._stores.values()))
    for i in range(n):
        await host.close_group(f"g{i}", discard=True)
        group_storage.forget_group(tmp_path / f"g{i}")
    await host.stop()
    print(
        f"\n{n} groups: opened in {opened_s:.2f} s, elected in {elected_s:.2f} s, "
        f"{store.fsyncs} fsyncs of the state store, {store.dir_fsyncs} of new directories"
    )
    assert store.fsyncs < n // 10 and store.dir_fsyncs <= n
    await asyncio.sleep(0)
