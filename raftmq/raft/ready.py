"""One batch of work the core hands its driver, and the order in which to do it.

The contract, which the simulator enforces:

1. ``send_now`` may be sent at once, in parallel with the write below. They are the
   leader's AppendEntries/heartbeats/snapshots/TimeoutNow: none of them promises
   anything about this node's durable state (the leader counts its own copy toward
   commit only after step 4).
2. Persist: install ``snapshot`` if set, then write ``entries`` (truncating storage from
   ``first_index`` if it overlaps), fsync, then save ``hard_state`` durably.
   :func:`write_to_storage` does the storage half.
3. Only then send ``messages``: votes and append acks promise durable state.
4. Apply ``committed_entries`` and serve ``read_states`` whose index is applied, then call
   ``core.advance(ready)`` - which is also the "local append is durable" signal.

``ready()`` may not be called again until the previous Ready was advanced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from raftmq.raft.hardstate import HardState
from raftmq.raft.messages import Message, SnapshotMeta
from raftmq.raft.storage import Storage


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile facts the driver reacts to (routing clients); never persisted."""

    leader: int
    role: Role


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the applied index reaches ``index``."""

    index: int
    context: bytes


@dataclass(slots=True)
class Ready:
    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    entries: bytes = b""
    first_index: int = 0
    """Index of the first entry in ``entries``: storage is truncated from here if needed."""
    last_index: int = 0
    last_term: int = 0
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    committed_entries: bytes = b""
    applied_to: int = 0
    """Index of the last entry in ``committed_entries`` (or of the snapshot; or, with
    ``Config.apply_entries`` off, of the last committed entry, whose bytes are not read)."""
    send_now: list[Message] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    sync: bool = False
    """Set by the core: see :meth:`must_sync`."""

    def must_sync(self) -> bool:
        """Whether step 2 needs an fsync before ``messages`` go out.

        True for entries, a snapshot, or a new term or vote. A hard state that changes
        only the commit index may be written without an fsync: losing it merely makes a
        restarted node learn its commit index again from the leader.
        """
        return self.sync


def write_to_storage(storage: Storage, rd: Ready) -> None:
    """Apply the storage half of step 2 (without the fsync, which is the caller's)."""
    snap = rd.snapshot
    if snap is not None:
        # The follower's log disagrees with the snapshot point, so nothing after its own
        # commit (which is below the snapshot) is trustworthy: restart the log empty.
        if storage.last_index > snap.index:
            storage.truncate_suffix(max(snap.index + 1, storage.start_index))
        storage.truncate_prefix(snap.index + 1, offset=snap.next_offset, prev_term=snap.term)
        assert storage.start_index == snap.index + 1 and storage.last_index == snap.index
    if rd.entries:
        if rd.first_index <= storage.last_index:
            storage.truncate_suffix(rd.first_index)
        assert rd.first_index == storage.last_index + 1, "Ready entries are contiguous"
        # Every entry of a Ready passed a trust boundary already: the client edge (then the
        # leader stamped it) or the peer edge (RaftCore._handle_append); no second CRC pass.
        storage.append(rd.entries, crc_checked=True)
