"""The durable triple (term, vote, commit) the core hands the host to persist.

Raft's safety rests on term and vote surviving crashes: a node that forgets its vote can
vote twice in one term and elect two leaders. The core only produces this value; the host
writes it (raftmq/raft/host/group_storage.py) before anything that depends on it is sent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0
    vote: int = 0
    commit: int = 0
    rejoining: bool = False
    """This replica may have lost entries or votes it once acknowledged (its disk was
    wiped or truncated) and has not caught up yet: it must not vote (docs/raft.md,
    "Rejoining after disk loss"). Durable so that a crash mid-rejoin cannot forget it."""
