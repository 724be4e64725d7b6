"""Cluster membership and the payload of a CONFIG entry.

Payload layout (big-endian), the whole new configuration rather than a delta so that
replaying or re-reading a CONFIG entry is idempotent::

    u16 voter_count, voter_count * i64 node_id,
    u16 learner_count, learner_count * i64 node_id

Ids are sorted ascending; the sets are disjoint.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from raftmq.raft import quorum

_COUNT = struct.Struct(">H")
_ID = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Membership:
    """Voters decide elections and commits; learners only receive the log."""

    voters: frozenset[int]
    learners: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        assert not (self.voters & self.learners), "a node is a voter or a learner, not both"
        assert all(i > 0 for i in self.voters | self.learners)

    @property
    def members(self) -> frozenset[int]:
        return self.voters | self.learners

    def quorum(self) -> int:
        return quorum.size(len(self.voters))

    def encode(self) -> bytes:
        out = bytearray(_COUNT.pack(len(self.voters)))
        for node in sorted(self.voters):
            out += _ID.pack(node)
        out += _COUNT.pack(len(self.learners))
        for node in sorted(self.learners):
            out += _ID.pack(node)
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | memoryview) -> Membership:
        pos = 0
        (nv,) = _COUNT.unpack_from(buf, pos)
        pos += 2
        voters = [_ID.unpack_from(buf, pos + 8 * i)[0] for i in range(nv)]
        pos += 8 * nv
        (nl,) = _COUNT.unpack_from(buf, pos)
        pos += 2
        learners = [_ID.unpack_from(buf, pos + 8 * i)[0] for i in range(nl)]
        pos += 8 * nl
        if pos != len(buf):
            raise ValueError(f"membership payload has {len(buf) - pos} trailing bytes")
        return Membership(frozenset(voters), frozenset(learners))

    def is_single_step_from(self, old: Membership) -> bool:
        """True when at most one voter changed: any two majorities then overlap.

        Learner changes never affect quorums, so any number of them may ride along.
        """
        return len(self.voters ^ old.voters) <= 1


_HISTORY_HEAD = struct.Struct(">qI")  # through, change count
_CHANGE_HEAD = struct.Struct(">qH")  # index, membership payload length


@dataclass(frozen=True, slots=True)
class ConfigHistory:
    """The committed configurations of a log from its start through index ``through``:
    ``changes`` lists (index, configuration) ascending, the first in force at the log's
    start, the rest one per committed CONFIG entry after it, up to ``through``.

    Why: a restart must know the configuration at the end of the log, and without this it
    reads the whole log to find CONFIG entries. A saved history lets it read only what
    lies after ``through``. Committed entries never change and a log only ever loses a
    suffix, so a history stays true for any later log once ``through`` is clamped to that
    log's last index: it needs no fsync, and a lost or stale copy only means more reading.
    """

    through: int
    changes: tuple[tuple[int, Membership], ...]

    def __post_init__(self) -> None:
        assert _well_formed(self.through, self.changes), f"malformed history {self}"

    def for_log(self, start: int, last_index: int, at_start: Membership) -> ConfigHistory | None:
        """This history as it holds for a log of entries ``start + 1 .. last_index`` whose
        configuration at ``start`` is ``at_start``: its end clamped to the log's. None when
        that leaves nothing after the start; ValueError when the history names another
        configuration at the start (it describes some other log)."""
        through = min(self.through, last_index)
        if through <= start:
            return None
        if self.as_of(start) != at_start:
            raise ValueError("saved configurations disagree with the log's start")
        return ConfigHistory(through, tuple(c for c in self.changes if c[0] <= through))

    def as_of(self, index: int) -> Membership | None:
        """The configuration in force at ``index`` (None when the history starts later)."""
        found = None
        for i, m in self.changes:
            if i > index:
                break
            found = m
        return found

    def encode(self) -> bytes:
        out = bytearray(_HISTORY_HEAD.pack(self.through, len(self.changes)))
        for index, m in self.changes:
            payload = m.encode()
            out += _CHANGE_HEAD.pack(index, len(payload))
            out += payload
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | memoryview) -> ConfigHistory:
        """Raises ValueError on anything malformed (callers then read the whole log)."""
        try:
            through, count = _HISTORY_HEAD.unpack_from(buf, 0)
            pos = _HISTORY_HEAD.size
            changes = []
            for _ in range(count):
                index, size = _CHANGE_HEAD.unpack_from(buf, pos)
                pos += _CHANGE_HEAD.size
                if pos + size > len(buf):
                    raise ValueError("configuration history is cut short")
                changes.append((index, Membership.decode(buf[pos : pos + size])))
                pos += size
        except (struct.error, AssertionError) as exc:
            raise ValueError(f"configuration history is malformed: {exc}") from None
        if pos != len(buf):
            raise ValueError(f"configuration history has {len(buf) - pos} trailing bytes")
        if not _well_formed(through, changes):
            raise ValueError("configuration history is not an ascending list up to its end")
        return ConfigHistory(through, tuple(changes))


def _well_formed(through: int, changes: Sequence[tuple[int, Membership]]) -> bool:
    """At least one change, indexes strictly ascending, none past ``through``."""
    indexes = [i for i, _ in changes]
    return bool(indexes) and indexes == sorted(set(indexes)) and indexes[-1] <= through
