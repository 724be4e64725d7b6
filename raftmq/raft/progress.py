"""What a leader knows about one follower's log, and how fast it may send to it.

A follower is in one of three states. PROBE: the leader does not know where the logs
match, so it sends one AppendEntries at a time and waits (a heartbeat response
un-pauses it). REPLICATE: the logs match at ``match``; the leader streams appends
optimistically, bounded by the in-flight window so a slow follower cannot make the
leader buffer without limit. SNAPSHOT: the follower needs entries the leader has
truncated; nothing is sent until the snapshot transfer reports back.
"""

from __future__ import annotations

from collections import deque
from enum import Enum


class ProgressState(Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """AppendEntries sent but not yet acknowledged, in send order (last index, bytes)."""

    __slots__ = ("_q", "bytes", "max_bytes", "max_count")

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self._q: deque[tuple[int, int]] = deque()
        self.bytes = 0
        self.max_count = max_count
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._q)

    def add(self, last_index: int, size: int) -> None:
        assert not self._q or last_index > self._q[-1][0], "in-flight appends advance"
        self._q.append((last_index, size))
        self.bytes += size

    def free_le(self, index: int) -> None:
        """An ack for ``index`` also acknowledges every earlier append."""
        while self._q and self._q[0][0] <= index:
            self.bytes -= self._q.popleft()[1]
        assert self.bytes >= 0

    def free_first_one(self) -> None:
        """Unstick a full window whose appends were lost: a heartbeat ack proves the peer
        is alive, so let one more append go out and draw a rejection or an ack."""
        if self._q:
            self.bytes -= self._q.popleft()[1]

    def full(self) -> bool:
        return len(self._q) >= self.max_count or self.bytes >= self.max_bytes

    def reset(self) -> None:
        self._q.clear()
        self.bytes = 0


class Progress:
    __slots__ = (
        "inflights",
        "is_learner",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "rejoin_incarnation",
        "rejoin_to",
        "state",
    )

    def __init__(self, next_index: int, inflights: Inflights, *, is_learner: bool) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.rejoin_to = 0
        self.rejoin_incarnation = 0
        """The follower's life (after a disk loss) that last said it is rejoining."""
        """What we had counted the follower for before it showed that it lost entries it
        acknowledged: it must hold our log that far before it votes again."""
        self.inflights = inflights
        self.is_learner = is_learner

    def __repr__(self) -> str:
        return (
            f"Progress({self.state.value} match={self.match} next={self.next} "
            f"inflight={len(self.inflights)})"
        )

    def _reset(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state == ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = index

    def forget(self, next_index: int) -> None:
        """The follower lost entries it acknowledged: nothing recorded for it holds any
        more. Probe from ``next_index``; ``match`` rises again only with its new acks."""
        self.match = 0
        self._reset(ProgressState.PROBE)
        self.next = next_index

    def maybe_update(self, index: int) -> bool:
        """Record an ack up to ``index``; False if it tells nothing new (stale/duplicate)."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def maybe_decrease_to(self, rejected: int, match_hint: int) -> bool:
        """Move ``next`` back after a rejection; False for a rejection of an old message.

        A rejection is stale if it refers to a prevLogIndex we no longer send from:
        acting on it would re-send entries needlessly or, worse, loop.
        """
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True

    def sent_entries(self, last_index: int, size: int) -> None:
        if self.state == ProgressState.REPLICATE:
            self.next = last_index + 1
            self.inflights.add(last_index, size)
        else:
            assert self.state == ProgressState.PROBE
            self.probe_sent = True

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.probe_sent
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True
