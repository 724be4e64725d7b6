"""The preferred-leader policy: which groups a leader should hand back to their preferred
replica. Policy only; the broker's loop asks :meth:`HandBack.due` and does the transfers.

Why hand back at all: leaders that an election put elsewhere (the preferred broker started
a little late, or failed and came back) otherwise stay there for good, and one broker ends
up carrying the load of several, as Kafka's automatic preferred-leader election avoids.
Why two checks in a row: a broker that is stopping hands its groups away and is gone
within seconds, and must not get them straight back; nor should a replica whose link
flaps pull leadership to and fro.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from raftmq.raft.host.host import GroupStatus
from raftmq.raft.progress import ProgressState


@dataclass(frozen=True, slots=True)
class LedGroup:
    """One group this broker leads whose preferred replica is another broker."""

    name: str
    preferred: int
    status: GroupStatus
    preferred_alive: bool
    """Whether the transport currently reaches the preferred replica's broker."""


def in_sync(group: LedGroup) -> bool:
    """The preferred replica is reachable and holds every committed entry."""
    pr = group.status.followers.get(group.preferred)
    return (
        pr is not None
        and pr.state == ProgressState.REPLICATE
        and pr.match >= group.status.commit
        and group.preferred_alive
    )


class HandBack:
    """Remembers, between two checks, which groups were ready to hand back."""

    def __init__(self) -> None:
        self._ready_before: set[str] = set()

    def due(self, led: Iterable[LedGroup], limit: int | None = None) -> list[LedGroup]:
        """The groups to hand back now: in sync at this check and at the one before; at
        most ``limit`` of them. Those past the limit stay ready, so they are due at the
        next check if still in sync: were they to start over, a pass that hit the limit
        would make the next one hand back nothing, and a broker owed thousands of
        leaderships would get them at half the pace."""
        ready_now: set[str] = set()
        due: list[LedGroup] = []
        for group in led:
            if not in_sync(group):
                continue
            if group.name not in self._ready_before or (limit is not None and len(due) >= limit):
                ready_now.add(group.name)
                continue
            due.append(group)
        self._ready_before = ready_now
        return due
