"""The core's view of its log: durable storage plus the tail not yet handed to it.

Entries the core has accepted but the driver has not yet reported durable live in the
*unstable* tail. The tail may start below storage's end: then it shadows a conflicting
suffix of storage, which the driver truncates when it persists the next Ready.
"""

from __future__ import annotations

from typing import NamedTuple

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.raft.membership import Membership
from raftmq.raft.messages import SnapshotMeta
from raftmq.raft.storage import Storage


class Ent(NamedTuple):
    """One encoded entry with the header fields Raft consults kept at hand."""

    # Shadows tuple.index on purpose: Raft's name for it, and a NamedTuple keeps split()
    # (run on every append) at C speed; nothing calls tuple.index on an Ent.
    index: int  # type: ignore[assignment]
    term: int
    type: int  # an EntryType value (compares equal to the member)
    next_offset: int
    data: bytes


def split(buf: bytes, *, verify: bool = False) -> list[Ent]:
    """Cut concatenated entries apart; ``verify`` checks CRCs of bytes from the network.

    Plain header tuples (:func:`entry.iter_fields`), not objects: every append a follower
    receives and every batch a leader sends passes through here."""
    view = memoryview(buf)
    return [
        Ent(f[5], f[6], f[3], f[7] + f[8], bytes(view[position : position + f[0] + 4]))
        for position, f in entry.iter_fields(view, verify=verify)
    ]


def join(ents: list[Ent]) -> bytes:
    return b"".join(e.data for e in ents)


class CompactedError(Exception):
    """The entry was truncated away by a snapshot; the caller must send the snapshot."""


class RaftLog:
    def __init__(self, storage: Storage, *, committed: int, applied: int) -> None:
        self.storage = storage
        self.unstable: list[Ent] = []
        self.unstable_offset = storage.last_index + 1
        self.pending_snapshot: SnapshotMeta | None = None
        first = storage.start_index
        assert first - 1 <= applied <= committed <= storage.last_index, (
            f"applied {applied} / commit {committed} outside log [{first}, {storage.last_index}]"
        )
        self.committed = committed
        self.applied = applied
        self.truncated_from: int | None = None
        """Lowest index cut since the core last looked: acks beyond it are now false."""
        self.configs: dict[int, Membership] = {}
        """CONFIG entries not yet committed, by index: they take effect at commit."""

    # --- bounds ------------------------------------------------------------------
    @property
    def first_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index + 1
        return self.storage.start_index

    @property
    def last_index(self) -> int:
        if self.unstable:
            return self.unstable[-1].index
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return self.storage.last_index

    @property
    def last_term(self) -> int:
        return self.term(self.last_index)

    @property
    def next_offset(self) -> int:
        if self.unstable:
            return self.unstable[-1].next_offset
        if self.pending_snapshot is not None:
            return self.pending_snapshot.next_offset
        return self.storage.next_offset

    def term(self, index: int) -> int:
        """Term of ``index``; 0 beyond the end; CompactedError below the snapshot point."""
        if index > self.last_index:
            return 0
        if index >= self.unstable_offset and self.unstable:
            return self.unstable[index - self.unstable_offset].term
        snap = self.pending_snapshot
        if snap is not None:
            if index == snap.index:
                return snap.term
            raise CompactedError(index)
        if index < self.storage.start_index - 1:
            raise CompactedError(index)
        return self.storage.term_at(index)

    def match_term(self, index: int, term: int) -> bool:
        try:
            return self.term(index) == term and index <= self.last_index
        except CompactedError:
            return False

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Election restriction (§5.4.1): only a log at least as complete gets a vote."""
        mine = self.last_term
        return last_term > mine or (last_term == mine and last_index >= self.last_index)

    # --- reads -------------------------------------------------------------------
    def entries(self, lo: int, max_bytes: int, hi: int | None = None) -> list[Ent]:
        """Whole entries from ``lo`` up to ``hi`` (exclusive), at least one if any exist."""
        hi = self.last_index + 1 if hi is None else hi
        if lo >= hi:
            return []
        if lo < self.first_index:
            raise CompactedError(lo)
        out: list[Ent] = []
        size = 0
        if lo < self.unstable_offset:
            stable_hi = min(hi, self.unstable_offset)
            out = split(self.storage.read_entries(lo, max_bytes, stable_hi))
            assert out and out[0].index == lo, "storage returned the wrong entries"
            size = sum(len(e.data) for e in out)
            if out[-1].index + 1 < stable_hi or size >= max_bytes or stable_hi == hi:
                return out
        start = max(lo, self.unstable_offset) - self.unstable_offset
        for e in self.unstable[start : hi - self.unstable_offset]:
            if out and size + len(e.data) > max_bytes:
                break
            out.append(e)
            size += len(e.data)
        return out

    # --- writes ------------------------------------------------------------------
    def append(self, ents: list[Ent]) -> None:
        """Add entries to the tail, replacing any suffix they conflict with."""
        if not ents:
            return
        first = ents[0].index
        assert first > self.committed, f"overwriting committed index {first} <= {self.committed}"
        assert first <= self.last_index + 1, "appends are contiguous"
        off = self.unstable_offset
        if first == off + len(self.unstable):
            self.unstable.extend(ents)
        elif first <= off:
            self.unstable = list(ents)
            self.unstable_offset = first
        else:
            self.unstable = self.unstable[: first - off] + list(ents)
        for i in [i for i in self.configs if i >= first]:
            del self.configs[i]
        for e in ents:
            if e.type == EntryType.CONFIG:
                payload = e.data[entry.HEADER_SIZE :]
                self.configs[e.index] = Membership.decode(payload)

    def find_conflict(self, ents: list[Ent]) -> int:
        """Index of the first entry we lack or hold with another term; 0 if all match.

        Only this position may be truncated: a delayed or duplicated AppendEntries whose
        entries all match must never cut entries after them.
        """
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def maybe_append(
        self, prev_index: int, prev_term: int, commit: int, ents: list[Ent]
    ) -> int | None:
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(ents)
        conflict = self.find_conflict(ents)
        if conflict:
            assert conflict > self.committed, (
                f"entry {conflict} conflicts with committed prefix up to {self.committed}"
            )
            if conflict <= self.last_index:
                self.truncated_from = min(self.truncated_from or conflict, conflict)
            self.append(ents[conflict - prev_index - 1 :])
        # Commit only what this message proved we hold: entries past last_new may be stale.
        self.commit_to(min(commit, last_new))
        return last_new

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest index <= ``index`` whose term is <= ``term``: skips a whole term per RTT."""
        index = min(index, self.last_index)  # a follower's hint may lie past our end
        while index > 0:
            try:
                t = self.term(index)
            except CompactedError:
                return index, 0
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            assert index <= self.last_index, f"commit {index} beyond last {self.last_index}"
            self.committed = index

    def maybe_commit(self, index: int, term: int) -> bool:
        """Advance commit to a quorum-replicated ``index`` only if it is of ``term`` (§5.4.2)."""
        if index > self.committed and self.term(index) == term:
            self.commit_to(index)
            return True
        return False

    def stable_to(self, index: int, term: int) -> None:
        """The driver persisted up to ``index``; ignore if the tail was rewritten since."""
        if not self.unstable or index < self.unstable_offset or index > self.last_index:
            return
        if self.unstable[index - self.unstable_offset].term != term:
            return
        drop = index + 1 - self.unstable_offset
        self.unstable = self.unstable[drop:]
        self.unstable_offset = index + 1

    def restore(self, snap: SnapshotMeta) -> None:
        assert snap.index > self.committed
        self.unstable = []
        self.unstable_offset = snap.index + 1
        self.pending_snapshot = snap
        self.configs.clear()
        self.committed = snap.index
