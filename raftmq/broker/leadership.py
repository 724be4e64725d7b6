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
import math
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
"""A preferred replica's head start: how long a new group's other replicas hold back their
first election (unless the controller fenced the preferred broker). Long enough for the
brokers' opening of a large topic to drift apart by seconds, short enough that a group
whose preferred replica cannot open is led soon after."""
PREFER_HOLD_MAX_SECONDS = 30.0
"""How long at most a new group's other replicas keep holding their first election back
for a preferred replica that has not led yet while its broker is reachable and not fenced
(:meth:`Leadership.prefer`): over a creation of 10,000 partitions the brokers' opening
drifted apart by more than :data:`PREFER_WINDOW_SECONDS`, and 34 partitions elected
without their preferred replica, to be handed back later."""
PREFER_CHECK_SECONDS = 2.0
"""After this long, a held-back replica looks again: if the transport has not reached the
preferred broker by then, it stops waiting for it. The controller fences a dead broker
only after its session timeout, and while the controller itself kept failing over it did
not for two minutes (a chaos schedule): every reopen of the group's other replicas held
their election back for a preferred replica that was long gone."""
SETTLE_SECONDS = PREFER_WINDOW_SECONDS
"""No hand-back starts within this long of the last replica this broker opened: until
then an election may still be under way, and the preferred replica may still win it."""
MAX_SETTLE_WAIT_SECONDS = 60.0
"""Hand-backs wait for leaderless groups at most this long in a row: a group that stays
leaderless longer has a fault of its own (replicas that cannot open, say), and must not
keep every other partition's leadership where an election put it."""
MAX_HAND_BACKS_PER_PASS = 200
"""Hand-backs a broker starts per pass at most: each is an election (a vote, a term
fsynced on every replica) and a leader report, and a broker that came back after a long
absence is owed a third of the cluster's leaderships (10,000 partitions: some 3,300, which
at 100 per pass every other pass took over five minutes). The groups a pass leaves over
stay due for the next one (:meth:`HandBack.due`'s limit)."""


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
        self.last_open_s = -math.inf
        """When :meth:`prefer` last saw a replica open here (monotonic seconds)."""
        self._handed_back: set[str] = set()
        """The groups whose leadership this broker's last pass handed back (at
        :attr:`_handed_back_s`, monotonic): their elections are its own doing, not ones
        to wait for."""
        self._handed_back_s = -math.inf

    def prefer(self, replica: PartitionReplica) -> None:
        """Give the preferred replica (the first listed, as in Kafka) the first election
        of a group that just opened here, before the next replica opens: this broker
        campaigns at once for a group it is preferred for, and a replica of a group whose
        preferred broker is not fenced holds its own first election back by
        :data:`PREFER_WINDOW_SECONDS`.

        Why: a topic's creation opens its replicas on every broker at once, each broker
        at its own pace. Left to random election timeouts the first elections picked
        whichever replica's timer fired first, often one broker for most partitions, and
        the hand-backs that followed moved most leaderships a second time, each an
        election more while thousands were still running (1,000 partitions: 956
        hand-backs, 931 partitions still leaderless after 120 s). Now the preferred
        replica either finds a peer open (it campaigns here, as it opens) or is asked
        again by the peer as that one opens (its host announces the open, and the
        candidate repeats its vote request: :meth:`RaftCore.ask_again`), while the other
        replicas' timers wait; so the first election already picks it.

        The campaign does not wait for a peer to be reachable: with pre-vote, one whose
        requests are lost changes no term and tries again at its election timeout, and
        under load the transport's liveness flaps (a peer whose pings were late by 1.5 s
        counts as dead), which left preferred replicas waiting while the others elected
        one of their own. Nor does the delay trust the transport: only a preferred broker
        the controller fenced is known to be away. Both steps only start or delay an
        election nobody else started: a leader or candidate heard meanwhile restarts the
        timers as usual, pre-vote keeps a campaign from disturbing a leader that is
        already there, and a preferred replica that does not win within the window (its
        broker went down, its replica cannot open) leaves the group to the others'
        timers, and, once back, to a hand-back (:meth:`restore_preferred_leaders`)."""
        self.last_open_s = time.monotonic()
        if len(replica.replicas) < 2:
            return
        name = group_name(replica.topic, replica.partition)
        state = self._metadata()
        preferred = preferred_leader(state, replica.topic, replica.partition)
        broker = state.brokers.get(preferred)
        try:
            if preferred == self.id:
                self.host.campaign(name)
            elif preferred in replica.replicas and broker is not None and not broker.fenced:
                self.host.delay_election(name, PREFER_WINDOW_SECONDS)
                # A new group (a creation) may hold on longer; a reopened one may not: its
                # preferred replica may be one that cannot campaign (rejoining).
                new = replica.group.term == 0
                until_s = time.monotonic() + (PREFER_HOLD_MAX_SECONDS if new else 0.0)
                self._look_again(PREFER_CHECK_SECONDS, replica, preferred, until_s)
        except RaftError:  # e.g. its replica failed meanwhile: its timers decide
            pass

    def _look_again(
        self, delay_s: float, replica: PartitionReplica, preferred: int, until_s: float
    ) -> None:
        asyncio.get_running_loop().call_later(delay_s, self._hold, replica, preferred, until_s)

    def _hold(self, replica: PartitionReplica, preferred: int, until_s: float) -> None:
        """A held-back replica whose group still has no leader: stop waiting when the
        preferred broker is fenced or the transport does not reach it; else, for a new
        group, renew the delay until :data:`PREFER_HOLD_MAX_SECONDS` after its open (the
        first window alone did not cover the brokers' drift over a large creation)."""
        if self._stopping():
            return
        try:
            key = (replica.topic, replica.partition)
            if self.replicas.get(key) is not replica or replica.leader_id:
                return
            name = group_name(replica.topic, replica.partition)
            broker = self._metadata().brokers.get(preferred)
            if broker is None or broker.fenced or not self._peer_alive(preferred):
                self.host.end_election_delay(name)
                return
            remaining_s = until_s - time.monotonic()
            if remaining_s <= 0:
                return
            self.host.delay_election(name, min(PREFER_WINDOW_SECONDS, remaining_s))
        except Exception:  # closed or failed meanwhile: its timers decide
            return
        self._look_again(PREFER_WINDOW_SECONDS / 2, replica, preferred, until_s)

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
        """Every ``rebalance_seconds``, hand groups this broker leads back to their
        preferred replica (the first in its list) when that replica is reachable and in
        sync (the policy, and why: raftmq.controller.leadership), at most
        :data:`MAX_HAND_BACKS_PER_PASS` per pass. The transfer itself waits until the
        replica holds the whole log, and the group takes no proposals meanwhile (an
        election timeout at most); producers retry.

        Never while elections here are settling (:meth:`settling`): a hand-back is an
        election more, and one started while a creation's elections run moved
        leaderships that their preferred replica was about to win anyway, or won a
        moment later (1,000 partitions: 201 of them handed back twice). The policy's
        two checks in a row start over after a settling pass."""
        policy = HandBack()
        electing_since: float | None = None
        while not self._stopping():
            await asyncio.sleep(self.rebalance_seconds)
            try:
                now_s = time.monotonic()
                opening, electing = self.settling()
                if not electing:
                    electing_since = None
                elif electing_since is None:
                    electing_since = now_s
                waiting = electing_since is not None and (
                    now_s - electing_since <= MAX_SETTLE_WAIT_SECONDS
                )
                if opening or waiting:
                    policy = HandBack()
                    continue
                due = hand_back_due(
                    self.id,
                    self.replicas.values(),
                    lambda topic, p: preferred_leader(self._metadata(), topic, p),
                    self.host,
                    self._peer_alive,
                    policy,
                    MAX_HAND_BACKS_PER_PASS,
                )
            except Exception:  # the policy itself: the next pass looks again
                log.exception("broker %d: choosing hand-backs failed", self.id)
                continue
            if not self._stopping():
                self._handed_back = {g.name for g in due}
                self._handed_back_s = time.monotonic()
                hand_back(self.host, due)

    def settling(self) -> tuple[bool, bool]:
        """Whether elections here may still be under way: (a replica opened here within
        :data:`SETTLE_SECONDS`, a group here has no leader though a majority of its
        replicas' brokers is reachable, so it is electing one)."""
        now_s = time.monotonic()
        if now_s - self.last_open_s < SETTLE_SECONDS:
            return True, False
        recent = self._handed_back if now_s - self._handed_back_s < SETTLE_SECONDS else set()
        for r in list(self.replicas.values()):
            try:
                if r.leader_id:
                    continue
                if group_name(r.topic, r.partition) in recent:
                    # Handed back by the last pass, its new leader not heard yet: waiting
                    # for it held every other pass back (one pass in three handed back).
                    continue
                voters = r.replicas
                reachable = sum(1 for b in voters if b == self.id or self._peer_alive(b))
                if reachable * 2 > len(voters):
                    return False, True
            except Exception:  # a replica closed meanwhile: the others decide
                continue
        return False, False

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


def _is_leader(replica: PartitionReplica) -> Callable[[], bool]:
    return lambda: replica.is_leader


def hand_back_due(
    broker_id: int,
    replicas: Iterable[_Replica],
    preferred_leader: Callable[[str, int], int],
    host: _Host,
    peer_alive: Callable[[int], bool],
    policy: HandBack,
    limit: int | None = None,
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
    return policy.due(led, limit)


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
