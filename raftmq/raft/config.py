"""Tuning knobs of one Raft member, fixed for the life of the core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the core needs besides its storage: all time is counted in ticks.

    The core never reads a clock, so the driver decides how long a tick is; the simulator
    uses the same numbers in simulated time.
    """

    id: int
    election_tick: int = 10
    """Followers campaign after a random timeout in [election_tick, 2*election_tick)."""
    heartbeat_tick: int = 1
    max_append_bytes: int = 1 << 20
    """Entry bytes in one AppendEntries: bounds the latency of a retry and memory per peer."""
    max_inflight_msgs: int = 64
    max_inflight_bytes: int = 8 << 20
    """Pipelining window per follower, in messages and in entry bytes."""
    max_apply_bytes: int = 4 << 20
    """Committed entry bytes handed to the application in one Ready."""
    apply_entries: bool = True
    """False where the log *is* the state (a partition): a Ready then says how far the
    commit reached (``applied_to``) without reading the committed entries back."""
    pre_vote: bool = True
    check_quorum: bool = True
    seed: int = 0
    """Seeds the election timeout jitter so that runs replay exactly."""

    def __post_init__(self) -> None:
        assert self.id > 0, "node ids are positive; 0 means none"
        assert self.heartbeat_tick >= 1
        assert self.election_tick > self.heartbeat_tick, "heartbeats must beat elections"
        assert self.max_append_bytes > 0 and self.max_inflight_msgs > 0
        assert self.max_inflight_bytes >= self.max_append_bytes
