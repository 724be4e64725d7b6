"""What a group's folder holds in its state store (raftmq/raft/host/state_store.py), read
and written the way a test needs it: the host must not run on that folder meanwhile."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from raftmq.raft.hardstate import HardState
from raftmq.raft.host import group_storage, state_store
from raftmq.raft.membership import ConfigHistory
from raftmq.raft.messages import SnapshotMeta


@contextlib.contextmanager
def store_of(directory: Path) -> Iterator[state_store.StateStore]:
    store = state_store.acquire(directory.parent)
    try:
        yield store
    finally:
        state_store.release(store)


def hard_state(directory: Path) -> HardState | None:
    with store_of(directory) as store:
        return group_storage.hard_state_of(store, directory)


def snapshot_meta(directory: Path) -> SnapshotMeta | None:
    with store_of(directory) as store:
        return group_storage.decode_snapshot_meta(store.group(directory.name).meta)


def commit_hint(directory: Path) -> ConfigHistory | None:
    with store_of(directory) as store:
        return group_storage.decode_commit_hint(store.group(directory.name).hint)


def put(directory: Path, kind: state_store.Kind, payload: bytes) -> None:
    with store_of(directory) as store:
        store.put(directory.name, kind, payload)


def forget(directory: Path, kind: state_store.Kind) -> None:
    """Drop one kind of the group's records, keeping the others."""
    with store_of(directory) as store:
        state = store.group(directory.name)
        kept = {
            state_store.Kind.HARD: state.hard,
            state_store.Kind.META: state.meta,
            state_store.Kind.HINT: state.hint,
        }
        store.forget(directory.name)
        if state.promised:
            store.put(directory.name, state_store.Kind.PROMISED)
        for k, payload in kept.items():
            if payload is not None and k is not kind:
                store.put(directory.name, k, payload)


def store_path(directory: Path) -> Path:
    return directory.parent / state_store.STORE_FILE
