"""A byte rate for one node's traffic of a kind (what its leaders send to learners: the
copies a replica move makes), so a move cannot take the whole network from producers and
followers.

Pacing, not dropping: a message over the rate is sent later, when the rate allows. Raft
takes a late append like any other, and the leader's in-flight window for the learner
bounds how many wait (a learner that never catches up gets no more than the window).
"""

from __future__ import annotations


class ByteRate:
    """``rate_bytes_per_s`` on average, with up to ``burst_s`` seconds' worth at once
    (the generic cell rate algorithm: a theoretical time by which what was let through
    would have passed at the rate). Whole messages are paced: one larger than the burst
    passes whole, and the ones after it wait for it."""

    __slots__ = ("_due_s", "burst_s", "rate_bytes_per_s")

    def __init__(self, rate_bytes_per_s: int, *, burst_s: float = 1.0) -> None:
        assert rate_bytes_per_s > 0 and burst_s >= 0
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_s = burst_s
        self._due_s = 0.0

    def delay_s(self, size_bytes: int, now_s: float) -> float:
        """Account for ``size_bytes`` sent at ``now_s``: how long to hold them first
        (0: send at once)."""
        start_s = max(self._due_s, now_s)
        wait_s = max(0.0, start_s - now_s - self.burst_s)
        self._due_s = start_s + size_bytes / self.rate_bytes_per_s
        return wait_s
