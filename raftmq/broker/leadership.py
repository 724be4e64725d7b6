"""Who leads a broker's partitions, as far as the broker itself can steer it: it campaigns
at once where it is the preferred leader (and, a voter, for the controller's metadata
group), hands each group it leads back to its preferred replica when that one is in sync
again, and hands its leaderships over to caught-up followers on a graceful stop.

Each pass keeps a failure to the group that raised it (it is logged, and the pass goes on
with the next one), the rule of docs/driver.md, "Failure isolation in the broker's control
loop": :func:`hand_back_due` and :func:`hand_back` are plain functions of what they read,
so that a test can make one group fail and see the others still handed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from raftmq.controller.leadership import HandBack, LedGroup
from raftmq.controller.metadata import preferred_leader
from raftmq.controller.model import MetadataState
from raftmq.controller.quorum import GROUP, ControllerQuorum
from raftmq.partition.replica import PartitionReplica, group_name
from raftmq.raft.errors import RaftError
from raftmq.raft.host.host import GroupStatus, RaftHost

log = logging.getLogger(__name__)

PREFER_WINDOW_SECONDS = 10.0
"""How long after it opens a preferred replica may still start an election for its group."""


class _Replica(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def is_leader(self) -> bool: ...


class _Host(Protocol):
    def status(self, name: str) -> GroupStatus: ...
    def transfer_leadership(self, name: str, to: int) -> None: ...


class Leadership:
    def __init__(
        self,
        broker_id: int,
        host: RaftHost,
        replicas: Mapping[tuple[str, int], PartitionReplica],
        metadata: Callable[[], MetadataState],
        peer_alive: Callable[[int], bool],
        stopping: Callable[[], bool],
        rebalance_seconds: float,
    ) -> None:
        """``rebalance_seconds`` paces :meth:`restore_preferred_leaders`."""
        self.id = broker_id
        self.host = host
        self.replicas = replicas
        self._metadata = metadata
        self._peer_alive = peer_alive
        self._stopping = stopping
        self.rebalance_seconds = rebalance_seconds

    async def campaign_where_preferred(
        self, opened: list[PartitionReplica], within: float = PREFER_WINDOW_SECONDS
    ) -> None:
        """Campaign at once for the partitions whose replica list names this broker first
        (the preferred leader, as in Kafka), as soon as a peer of the group is reachable,
        while the group has no leader yet.

        Why: left to random election timeouts, a cluster that starts together often elects
        one broker for most partitions, and that broker's single event loop then carries
        most of the produce load while the others idle (seen as 4 of 6 leaders on one
        broker in the produce benchmark). Replica lists rotate the first broker, so this
        spreads leaders evenly. It runs for the replicas each metadata version opens. It only
        starts elections a timeout would start anyway, and pre-vote keeps it from disturbing
        a leader that is already there. A group whose preferred broker started too late, or
        came back after a failure, is handed back by its leader: see
        :meth:`restore_preferred_leaders`."""
        pending: dict[str, tuple[Callable[[], int], list[int]]] = {
            group_name(r.topic, r.partition): (_leader_of(r), r.replicas)
            for r in opened
            if preferred_leader(self._metadata(), r.topic, r.partition) == self.id
            and len(r.replicas) > 1
        }
        await self._campaign_while_leaderless(pending, within)

    async def _campaign_while_leaderless(
        self, pending: dict[str, tuple[Callable[[], int], list[int]]], within: float
    ) -> None:
        """Campaign for each group of ``pending`` (name: its leader as known here, and its
        replicas) once one of its peers is reachable, unless it has a leader by then."""
        deadline = time.monotonic() + within
        while pending and time.monotonic() < deadline and not self._stopping():
            for name, (leader, replicas) in list(pending.items()):
                peers = [p for p in replicas if p != self.id]
                if leader():
                    del pending[name]  # someone leads (maybe us): leave it be
                elif not peers or any(self._peer_alive(p) for p in peers):
                    with contextlib.suppress(RaftError):  # e.g. its replica failed meanwhile
                        self.host.campaign(name)
                    del pending[name]
            await asyncio.sleep(0.02)

    async def campaign_for_metadata(self, quorum: ControllerQuorum) -> None:
        """The first controller voter campaigns for the metadata group as soon as a peer
        is reachable, as a preferred replica does for its partition: nothing in the
        cluster works before the controller has a leader, and a long election timeout
        (seconds, with slow ticks) would otherwise delay every start by that much."""
        voters = sorted(quorum.voters)
        if voters[0] == self.id:
            await self._campaign_while_leaderless(
                {GROUP: (lambda: quorum.leader, voters)}, PREFER_WINDOW_SECONDS
            )

    async def restore_preferred_leaders(self) -> None:
        """Every ``rebalance_seconds``, hand each group this broker leads back to its
        preferred replica (the first in its list) when that replica is reachable and in
        sync (the policy, and why: raftmq.controller.leadership). The transfer itself waits
        until the replica holds the whole log, and the group takes no proposals meanwhile
        (an election timeout at most); producers retry."""
        policy = HandBack()
        while not self._stopping():
            await asyncio.sleep(self.rebalance_seconds)
            try:
                due = hand_back_due(
                    self.id,
                    self.replicas.values(),
                    lambda topic, p: preferred_leader(self._metadata(), topic, p),
                    self.host,
                    self._peer_alive,
                    policy,
                )
            except Exception:  # the policy itself: the next pass looks again
                log.exception("broker %d: choosing hand-backs failed", self.id)
                continue
            if not self._stopping():
                hand_back(self.host, due)

    async def hand_over(self, wait: float, quorum: ControllerQuorum | None) -> None:
        """Move each partition this broker leads, and the controller's metadata group if it
        leads that, to a live follower that is caught up, so producers (and brokers, and
        operators) see a short redirect instead of an election timeout."""
        led: list[tuple[str, Callable[[], bool]]] = [
            (group_name(r.topic, r.partition), _is_leader(r))
            for r in self.replicas.values()
            if r.is_leader
        ]
        if quorum is not None and quorum.is_leader:
            led.append((GROUP, lambda: quorum.is_leader))
        for name, _ in led:
            st = self.host.status(name)
            voters = st.membership.voters if st.membership is not None else frozenset()
            # The most caught-up live voter (a learner cannot lead); the core brings it
            # fully up to date before telling it to campaign, so it need not match the log
            # at this very moment.
            candidates = sorted(
                (pr.match, peer)
                for peer, pr in st.followers.items()
                if peer in voters and self._peer_alive(peer)
            )
            if candidates:
                with contextlib.suppress(Exception):
                    self.host.transfer_leadership(name, candidates[-1][1])
        deadline = time.monotonic() + wait
        while any(leads() for _, leads in led) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


def _leader_of(replica: PartitionReplica) -> Callable[[], int]:
    return lambda: replica.group.leader


def _is_leader(replica: PartitionReplica) -> Callable[[], bool]:
    return lambda: replica.is_leader


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
