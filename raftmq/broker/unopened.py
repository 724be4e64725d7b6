"""The replicas the metadata assigns to this broker that are not open: each is opening,
being repaired from a peer before it can open, or failed to open (why, and when it is
tried again).

Why a registry of its own: a replica that cannot open must neither stop the broker's
control loop (every other change of the same metadata version still applies) nor vanish
from what the broker reports. It stays here, with its reason, until it opens or the
metadata no longer assigns it; Metadata and ``raftmq status`` list it as REPLICA_OPENING or
REPLICA_FAILED, and the broker retries it with a doubling backoff (docs/driver.md,
"Failure isolation in the broker's control loop").
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

OPEN_RETRY_FIRST_S = 1.0
"""A replica that failed to open is tried again after this long, then after twice as
long, and so on."""
OPEN_RETRY_MAX_S = 60.0
MAX_REASON_CHARS = 500

Key = tuple[str, int]
"""(topic, partition)."""


class OpenState(Enum):
    OPENING = "opening"
    """Assigned by the metadata, not opened yet (its turn has not come, or it is being
    tried again now)."""
    REPAIRING = "repairing"
    """What it reads at open is damaged: its damaged range is being fetched from a peer."""
    FAILED = "failed"
    """Its last open failed; it is tried again at ``retry_at_s``."""


@dataclass
class Unopened:
    state: OpenState
    reason: str
    failures: int = 0
    """Opens that failed in a row (the backoff doubles with each)."""
    retry_at_s: float = 0.0
    """time.monotonic() at which a FAILED replica is tried again."""


class UnopenedReplicas:
    """What :class:`Broker` knows of each assigned replica that is not open."""

    def __init__(self) -> None:
        self._by_key: dict[Key, Unopened] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: Key) -> Unopened | None:
        return self._by_key.get(key)

    def keys(self) -> list[Key]:
        return sorted(self._by_key)

    def count(self, state: OpenState) -> int:
        """How many are in ``state`` (the metrics' count of failed replicas)."""
        return sum(1 for entry in self._by_key.values() if entry.state is state)

    def opening(self, key: Key, reason: str = "opening") -> None:
        entry = self._by_key.get(key)
        if entry is None:
            self._by_key[key] = Unopened(OpenState.OPENING, reason)
        else:  # a retry keeps its count of failures, for the backoff
            entry.state, entry.reason = OpenState.OPENING, reason

    def repairing(self, key: Key, reason: str) -> None:
        entry = self._by_key.setdefault(key, Unopened(OpenState.REPAIRING, reason))
        entry.state, entry.reason = OpenState.REPAIRING, _short(reason)

    def failed(self, key: Key, reason: str, *, now_s: float | None = None) -> float:
        """Record a failed open; returns the delay before the next try."""
        entry = self._by_key.setdefault(key, Unopened(OpenState.FAILED, reason))
        delay_s = min(OPEN_RETRY_MAX_S, OPEN_RETRY_FIRST_S * 2 ** min(entry.failures, 16))
        entry.state, entry.reason = OpenState.FAILED, _short(reason)
        entry.failures += 1
        entry.retry_at_s = (time.monotonic() if now_s is None else now_s) + delay_s
        return delay_s

    def opened(self, key: Key) -> None:
        self._by_key.pop(key, None)

    def keep_only(self, assigned: set[Key]) -> list[Key]:
        """Forget the replicas the metadata no longer assigns here; returns them."""
        gone = [key for key in self._by_key if key not in assigned]
        for key in gone:
            del self._by_key[key]
        return gone

    def may_open(self, key: Key, *, now_s: float | None = None) -> bool:
        """Whether an open of ``key`` may be tried now: not while a repair runs, nor
        before a failed one's backoff has passed."""
        entry = self._by_key.get(key)
        if entry is None or entry.state is OpenState.OPENING:
            return True
        if entry.state is OpenState.REPAIRING:
            return False
        return (time.monotonic() if now_s is None else now_s) >= entry.retry_at_s

    def due(self, *, now_s: float | None = None) -> list[Key]:
        """The failed replicas whose backoff has passed."""
        now_s = time.monotonic() if now_s is None else now_s
        return sorted(
            key
            for key, entry in self._by_key.items()
            if entry.state is OpenState.FAILED and now_s >= entry.retry_at_s
        )


class RebuildRefused(Exception):
    """An operator's rebuild of a replica (``raftmq broker rebuild-replica``) that the
    broker will not do: ``kind`` is "not-hosted" or "unsafe"; the message says why and
    what to do instead."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _short(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


__all__ = ["OpenState", "RebuildRefused", "Unopened", "UnopenedReplicas"]
