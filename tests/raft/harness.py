"""A tiny synchronous driver for unit tests: persist, send, apply, advance - in order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from raftmq.format import entry
from raftmq.raft import (
    Config,
    HardState,
    Membership,
    MemoryStorage,
    Message,
    RaftCore,
    Ready,
    Role,
    write_to_storage,
)
from raftmq.raft.log_view import split


def data_entry(payload: bytes = b"x", records: int = 1) -> bytes:
    return entry.encode(payload, record_count=records)


def stamped(index: int, term: int, offset: int | None = None, payload: bytes = b"x") -> bytes:
    """A DATA entry as a leader would have stamped it (one record, offset = index - 1)."""
    off = index - 1 if offset is None else offset
    return entry.stamp(data_entry(payload), index=index, term=term, base_offset=off)


@dataclass
class Peer:
    core: RaftCore
    storage: MemoryStorage
    hs: HardState = field(default_factory=HardState)
    applied: list[bytes] = field(default_factory=list)
    readies: list[Ready] = field(default_factory=list)


def make(
    node: int,
    voters: set[int],
    *,
    learners: set[int] | None = None,
    storage: MemoryStorage | None = None,
    hs: HardState | None = None,
    rejoining: bool = False,
    **cfg: object,
) -> Peer:
    """A member whose durable state is ``hs`` and ``storage``; unless ``rejoining``, one
    that lost nothing (a zero hard state alone would make it rejoin, see
    ``starts_rejoining``)."""
    st = storage or MemoryStorage()
    hard = hs or HardState()
    m = Membership(frozenset(voters), frozenset(learners or ()))
    core = RaftCore(
        Config(id=node, **cfg),  # type: ignore[arg-type]
        st,
        hard_state=hard,
        membership=m,
        rejoining=rejoining,
    )
    return Peer(core, st, hard)


def preload(st: MemoryStorage, terms: list[int]) -> None:
    """Fill storage with DATA entries of the given terms (index i has terms[i-1])."""
    st.append(b"".join(stamped(i + 1, t) for i, t in enumerate(terms)))
    st.sync()


def flush(p: Peer) -> list[Message]:
    """Handle every Ready of ``p`` as a correct driver would; return what it sends."""
    out: list[Message] = []
    while p.core.has_ready():
        rd = p.core.ready()
        p.readies.append(rd)
        out += rd.send_now
        write_to_storage(p.storage, rd)
        p.storage.sync()
        if rd.hard_state is not None:
            p.hs = rd.hard_state
        out += rd.messages
        p.applied += [e.data for e in split(rd.committed_entries)]
        p.core.advance(rd)
    return out


def persist(p: Peer, rd: Ready) -> None:
    """Steps 2 and 5 of the contract for a Ready whose messages the test handles itself."""
    write_to_storage(p.storage, rd)
    p.storage.sync()
    if rd.hard_state is not None:
        p.hs = rd.hard_state
    p.applied += [e.data for e in split(rd.committed_entries)]
    p.core.advance(rd)


def restart(p: Peer, node: int, voters: set[int], **cfg: object) -> Peer:
    """Power loss: keep only what was synced, rebuild the core from it."""
    p.storage.crash()
    return make(node, voters, storage=p.storage, hs=p.hs, **cfg)


class Net:
    """Delivers messages between peers in FIFO order, with an optional filter."""

    def __init__(self, peers: dict[int, Peer]) -> None:
        self.peers = peers
        self.queue: list[Message] = []
        self.drop: Callable[[Message], bool] = lambda m: False
        self.delivered: list[Message] = []

    def pump(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            for p in self.peers.values():
                self.queue += flush(p)
            if not self.queue:
                return
            m = self.queue.pop(0)
            if m.dst in self.peers and not self.drop(m):
                self.delivered.append(m)
                self.peers[m.dst].core.step(m)
        raise AssertionError("network did not quiesce")

    def tick(self, n: int = 1, only: set[int] | None = None) -> None:
        for _ in range(n):
            for i, p in self.peers.items():
                if only is None or i in only:
                    p.core.tick()
            self.pump()

    def elect(self, node: int) -> None:
        self.peers[node].core.campaign()
        self.pump()
        assert self.peers[node].core.role == Role.LEADER


def cluster(n: int, **cfg: object) -> Net:
    voters = set(range(1, n + 1))
    return Net({i: make(i, voters, **cfg) for i in voters})
