"""The bit-rot faults' file finding and flipping, on broker directories written by the
real writers (a Log, the state store, the checkpoints, the metadata cache): each fault must
find its file where a broker keeps it, flip exactly one bit in it (which the file's own
check then catches), and never touch a second replica's copy of a replicated file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaos.cluster import TOPIC
from chaos.nemesis import (
    CATEGORIES,
    CORRUPT_FILES,
    config_entries,
    controller_entries,
    find_files,
    flip_entry_bit,
    flip_file_bit,
)
from raftmq.broker.metadata_cache import MetadataCache
from raftmq.controller.model import MetadataState
from raftmq.controller.quorum import GROUP
from raftmq.format import entry
from raftmq.format.records import Record, build_batch
from raftmq.log.atomic_file import read_atomic
from raftmq.log.checkpoints import read_start, write_start
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.log import Log
from raftmq.partition.producer_tracking import ProducerTracking
from raftmq.raft.hardstate import HardState
from raftmq.raft.host import state_store
from raftmq.raft.host.group_storage import save_hard_state_in, save_snapshot_meta
from raftmq.raft.host.state_store import STORE_FILE, StateStore
from raftmq.raft.membership import Membership
from raftmq.raft.messages import SnapshotMeta
from tests.raft import stored

MEMBERS = Membership(frozenset({1, 2, 3}))
START = SnapshotMeta(0, 0, 0, MEMBERS)


def _save_state(directory: Path, put) -> None:
    """Records of one group, durable in its folder's state store (as a host leaves them)."""
    store = state_store.acquire(directory.parent)
    try:
        put(store)
    finally:
        state_store.release(store)


def _write_log(directory: Path, entries: int, *, config_at: int | None = None) -> None:
    """A group's log as Raft writes it: the configuration it starts from in its snapshot
    meta, a leader's NOOP first, then data entries (and, at index ``config_at``, a CONFIG
    entry, as a membership change appends one), in 1 KiB segments so that most are sealed
    (and indexed)."""
    config = LogConfig(segment_bytes=1024, flush_policy=FlushPolicy.EVERY_BATCH)
    directory.mkdir(parents=True, exist_ok=True)
    _save_state(directory, lambda store: save_snapshot_meta(store, directory, START))
    with Log.open(directory, config) as log:
        log.append(entry.encode(b"", type=entry.EntryType.NOOP, index=1, term=1))
        offset = 0
        for index in range(2, entries + 2):
            if index == config_at:
                change = Membership(frozenset({1, 2, 4})).encode()
                log.append(
                    entry.encode(
                        change,
                        type=entry.EntryType.CONFIG,
                        index=index,
                        term=1,
                        base_offset=offset,
                    )
                )
                continue
            value = f"value-{offset}".encode() * 4
            batch = build_batch([Record(None, value, 1_700_000_000_000)])
            log.append(entry.stamp(batch, index=index, term=1, base_offset=offset))
            offset += 1


def broker_dir(tmp_path: Path, broker: int = 1, *, voter: bool = True) -> Path:
    """One broker's data directory laid out as a running broker leaves it: two partitions
    (log, hard state, log-start and producer-state checkpoints), the metadata cache, and on
    a voter the controller's metadata group."""
    root = tmp_path / f"broker-{broker}"
    for p in (0, 1):
        part = root / f"{TOPIC}-{p}"
        _write_log(part, 40)
        hs = HardState(term=3, vote=broker, commit=30)
        _save_state(part, lambda store, part=part, hs=hs: save_hard_state_in(store, part, hs))
        write_start(part, 1, 0, 0)
        ProducerTracking(part, f"{TOPIC}-{p}").checkpoint()
    cache = MetadataCache(root, "raftmq-chaos")
    cache._write(MetadataState("raftmq-chaos", version=7))
    if voter:
        meta = root / GROUP
        with Log.open(meta, LogConfig(flush_policy=FlushPolicy.EVERY_BATCH)) as log:
            for i in range(1, 6):
                log.append(
                    entry.encode(f"cmd-{i}".encode(), type=entry.EntryType.METADATA, index=i)
                )
        hs = HardState(term=2, vote=1, commit=5)
        _save_state(meta, lambda store: save_hard_state_in(store, meta, hs))
    return root


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _changed_bits(before: dict[Path, bytes], root: Path) -> dict[Path, int]:
    out = {}
    for path, data in before.items():
        now = path.read_bytes()
        if now != data:
            out[path] = sum(bin(a ^ b).count("1") for a, b in zip(data, now, strict=True))
    return out


def test_every_new_kind_is_a_fault_kind() -> None:
    new = {
        "corrupt-config",
        "corrupt-hardstate",
        "corrupt-producer-state",
        "corrupt-log-start",
        "corrupt-index",
        "corrupt-metadata-cache",
        "corrupt-controller-log",
    }
    assert new <= set(CATEGORIES)
    assert set(CORRUPT_FILES) | {"corrupt-config", "corrupt-controller-log"} == new


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("corrupt-hardstate", STORE_FILE),
        ("corrupt-producer-state", "producer_state.json"),
        ("corrupt-log-start", "log-start.checkpoint"),
        ("corrupt-metadata-cache", "metadata.cache"),
        ("corrupt-config", STORE_FILE),
    ],
)
def test_a_file_fault_finds_its_file_and_flips_one_bit(
    tmp_path: Path, kind: str, name: str
) -> None:
    root = broker_dir(tmp_path)
    found = find_files(root, kind, set())
    assert found and all(p.name == name for p in found)
    before = _snapshot(root)
    said = flip_file_bit(found, random.Random(1), set())
    changed = _changed_bits(before, root)
    assert list(changed.values()) == [1]
    (path,) = changed
    assert path in found and f"{path.parent.name}/{path.name}" in said
    # Each of these files is CRC-framed: the reader sees the damage, not a wrong value.
    if name == STORE_FILE:
        assert StateStore(path.parent).damaged is not None
    else:
        assert read_atomic(path) is None


def test_the_state_store_flip_makes_every_group_of_the_broker_suspect(tmp_path: Path) -> None:
    """Whose record a flipped bit hit is not known: a group (the controller group too)
    whose hard state was not written whole after the damage no longer trusts it, and so
    rejoins (a record lost before a whole later one of the same group is superseded); and
    the flip counts as this broker's for every group, so no other replica's store is
    flipped after it."""
    groups = (f"{TOPIC}-0", f"{TOPIC}-1", GROUP)
    for seed in range(6):
        root = broker_dir(tmp_path / str(seed), 1)
        corrupted: set[tuple[str, str]] = set()
        flip_file_bit(find_files(root, "corrupt-hardstate", set()), random.Random(seed), corrupted)
        assert {(STORE_FILE, group) for group in groups} == corrupted
        with stored.store_of(root / GROUP) as store:
            assert store.damaged is not None
            for group in groups:  # suspect, or its hard state is whole and trusted
                assert store.group(group).suspect or stored.hard_state(root / group)
    other = broker_dir(tmp_path, 2)
    assert find_files(other, "corrupt-hardstate", corrupted) == []
    assert find_files(other, "corrupt-config", corrupted) == []


def test_a_replicated_file_is_never_flipped_on_a_second_replica(tmp_path: Path) -> None:
    first, second = broker_dir(tmp_path, 1), broker_dir(tmp_path, 2)
    corrupted: set[tuple[str, str]] = set()
    flip_file_bit(find_files(first, "corrupt-log-start", corrupted), random.Random(3), corrupted)
    (hit,) = corrupted
    left = find_files(second, "corrupt-log-start", corrupted)
    # The other partition's checkpoint remains on broker 2 (the controller group never
    # moved its start, so it has none).
    assert {p.parent.name for p in left} == {f"{TOPIC}-0", f"{TOPIC}-1"} - {hit[1]}
    assert len(find_files(first, "corrupt-log-start", corrupted)) == 1
    assert read_start(second / hit[1]) is not None  # the other replica's copy is untouched


def test_index_files_are_those_of_sealed_segments(tmp_path: Path) -> None:
    root = broker_dir(tmp_path)
    found = find_files(root, "corrupt-index", set())
    assert found and all(p.suffix == ".index" for p in found)
    assert all(p.with_suffix(".log").exists() for p in found)
    before = _snapshot(root)
    flip_file_bit(found, random.Random(4), set())
    assert list(_changed_bits(before, root).values()) == [1]
    # Indexes are rebuilt locally: one flipped stays eligible on every replica.
    assert len(find_files(root, "corrupt-index", set())) == len(found)


def test_a_broker_without_the_file_offers_nothing(tmp_path: Path) -> None:
    root = tmp_path / "broker-1"
    _write_log(root / f"{TOPIC}-0", 3, config_at=3)  # young: no checkpoint, nothing sealed
    for kind in ("corrupt-producer-state", "corrupt-metadata-cache", "corrupt-index"):
        assert find_files(root, kind, set()) == []
    assert config_entries(root, set()) == []  # its CONFIG entry is in the active segment
    assert flip_file_bit([], random.Random(0), set()) == ""
    assert controller_entries(root, set()) == []  # not a voter
    assert flip_entry_bit([], random.Random(0), set()) == ""


def test_a_new_groups_configuration_is_in_its_snapshot_meta(tmp_path: Path) -> None:
    # No membership change yet: no CONFIG entry; corrupt-config falls back to the store.
    root = broker_dir(tmp_path, voter=False)
    assert config_entries(root, set()) == []
    (path,) = find_files(root, "corrupt-config", set())
    assert stored.snapshot_meta(root / f"{TOPIC}-0") == START
    corrupted: set[tuple[str, str]] = set()
    flip_file_bit([path], random.Random(8), corrupted)
    assert StateStore(root).damaged is not None
    assert corrupted == {(STORE_FILE, f"{TOPIC}-0"), (STORE_FILE, f"{TOPIC}-1")}


def test_config_entries_of_sealed_segments_are_found_and_flipped_once(tmp_path: Path) -> None:
    root = tmp_path / "broker-1"
    for p in (0, 1):
        _write_log(root / f"{TOPIC}-{p}", 40, config_at=3)  # a membership change
    corrupted: set[tuple[str, int]] = set()
    found = config_entries(root, corrupted)
    assert {(seg.parent.name, h.index) for seg, h in found} == {
        (f"{TOPIC}-0", 3),
        (f"{TOPIC}-1", 3),
    }
    assert all(h.type == entry.EntryType.CONFIG for _, h in found)
    before = _snapshot(root)
    said = flip_entry_bit(found, random.Random(5), corrupted)
    assert "CONFIG entry at index 3" in said
    (seg,) = _changed_bits(before, root)
    data = seg.read_bytes()
    bad = [h for h in entry.iter_headers(data, verify=False) if not entry.crc_ok(data, h)]
    assert [(h.type, h.index) for h in bad] == [(entry.EntryType.CONFIG, 3)]
    # That entry's copy on any replica is not offered again.
    assert len(config_entries(root, corrupted)) == 1


def test_controller_log_entries_spare_the_active_segments_last_entry(tmp_path: Path) -> None:
    root = broker_dir(tmp_path)
    corrupted: set[tuple[str, int]] = set()
    found = controller_entries(root, corrupted)
    # One active segment of five entries: the last could pass for a torn write, left out.
    assert sorted(h.index for _, h in found) == [1, 2, 3, 4]
    said = flip_entry_bit(found, random.Random(6), corrupted)
    assert f"{GROUP}/" in said and "METADATA entry" in said
    (seg,) = {seg for seg, _ in found}
    data = seg.read_bytes()
    bad = [h.index for h in entry.iter_headers(data, verify=False) if not entry.crc_ok(data, h)]
    assert bad == [next(i for d, i in corrupted)]
    assert len(controller_entries(root, corrupted)) == 3


def test_all_asks_for_every_fault_kind(tmp_path: Path) -> None:
    from chaos.run import ChaosOptions

    three = ChaosOptions(out=tmp_path, faults=["all"])
    assert set(three.faults) == set(CATEGORIES) - {"decommission"}
    assert set(ChaosOptions(out=tmp_path, nodes=4, faults=["all"]).faults) == set(CATEGORIES)
    # The bit-rot faults that need sealed segments get small ones.
    assert "--segment-bytes" in three.broker_args() or three.aggressive_retention
