"""Cluster membership and the payload of a CONFIG entry.

Payload layout (big-endian), the whole new configuration rather than a delta so that
replaying or re-reading a CONFIG entry is idempotent::

    u16 voter_count, voter_count * i64 node_id,
    u16 learner_count, learner_count * i64 node_id

Ids are sorted ascending; the sets are disjoint.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

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
        return len(self.voters) // 2 + 1

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
