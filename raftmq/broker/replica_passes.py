"""The passes the broker's periodic loops make over every replica it hosts: retention and
the hand-back of leadership to preferred replicas.

Why a module of their own: each pass keeps a failure to the replica that raised it (it is
logged, and the pass goes on with the next one), the rule of docs/driver.md, "Failure
isolation in the broker's control loop". Written as plain functions of what they read, so
that a test can make one replica fail and see the others still served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from raftmq.controller.leadership import HandBack, LedGroup
from raftmq.partition.replica import group_name
from raftmq.raft.errors import RaftError
from raftmq.raft.host.host import GroupStatus

log = logging.getLogger("raftmq.broker.server")


class _Replica(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def is_leader(self) -> bool: ...


class _Host(Protocol):
    def compact(self, name: str) -> int: ...
    def status(self, name: str) -> GroupStatus: ...
    def transfer_leadership(self, name: str, to: int) -> None: ...


def compact_each(host: _Host, replicas: Iterable[_Replica]) -> int:
    """Apply retention to each replica's log; returns how many failed (each is logged,
    and the others are compacted all the same)."""
    failed = 0
    for r in list(replicas):
        try:
            host.compact(group_name(r.topic, r.partition))
        except Exception:
            failed += 1
            log.exception("retention of %s/%d failed", r.topic, r.partition)
    return failed


def hand_back_due(
    broker_id: int,
    replicas: Iterable[_Replica],
    preferred_leader: Callable[[str, int], int],
    host: _Host,
    peer_alive: Callable[[int], bool],
    policy: HandBack,
) -> list[LedGroup]:
    """The groups this broker leads that are due to go back to their preferred replica
    (``policy`` decides: raftmq.controller.leadership). A replica whose state cannot be
    read (closed meanwhile, say) is left out, and the others are still looked at."""
    led = []
    for r in list(replicas):
        try:
            preferred = preferred_leader(r.topic, r.partition)
            if preferred == broker_id or not r.is_leader:
                continue
            name = group_name(r.topic, r.partition)
            led.append(LedGroup(name, preferred, host.status(name), peer_alive(preferred)))
        except Exception:
            log.exception("preferred leader of %s/%d: looking failed", r.topic, r.partition)
    return policy.due(led)


def hand_back(host: _Host, due: Iterable[LedGroup]) -> None:
    """Ask each group of ``due`` to transfer its leadership to its preferred replica; one
    refused (leadership lost meanwhile, a transfer under way) or failing does not keep
    the others from going."""
    for group in due:
        name, preferred = group.name, group.preferred
        log.info("handing %s back to its preferred leader, broker %d", name, preferred)
        try:
            host.transfer_leadership(name, preferred)
        except RaftError as exc:
            log.info("no hand-back of %s: %s", name, exc)
        except Exception:
            log.exception("handing %s back to broker %d failed", name, preferred)


__all__ = ["compact_each", "hand_back", "hand_back_due"]
