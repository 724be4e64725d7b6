"""The mover: on the controller quorum's leader only, every ``period_s`` it asks
:func:`raftmq.controller.healing.plan` what to start next and proposes it (give-ups,
``AddReplica`` moves, ``ReorderReplicas``). It never finishes a move: the partition's
Raft leader promotes the learner (``PromoteReplica``) once it caught up.

Runs beside a :class:`~raftmq.controller.quorum.ControllerQuorum` on every voter (the
broker starts it after the quorum), idle on followers. Everything it knows comes from
the metadata, so a new leader carries on where the old one stopped: the fence times are
stamped in the metadata (the heal delay keeps counting across a failover), and an
operator's rebalance request is the metadata's ``rebalance_requested`` flag, cleared
here once a plan finds the cluster balanced. The clock is read here, by the proposer,
the quorum's own (:meth:`ControllerQuorum.now_ms`), the one that stamps fences.

A command refused at apply time (the state moved on since the plan: a broker came back,
a topic was deleted) is logged and dropped; the next round plans from the new state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from raftmq.controller import commands as c
from raftmq.controller import healing
from raftmq.controller.quorum import ControllerError, ControllerQuorum, ControllerRefusal
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

PERIOD_S = 1.0
"""How often the leader plans: a move takes seconds at least (a log copy), so a second
costs nothing in speed and keeps the planning off the event loop's busy path."""


class Mover:
    def __init__(
        self,
        quorum: ControllerQuorum,
        limits: healing.Limits = healing.DEFAULT_LIMITS,
        *,
        period_s: float = PERIOD_S,
        rebalance_every_s: float | None = None,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        """``rebalance_every_s``: also rebalance on a timer (None: only on request)."""
        assert period_s > 0, period_s
        assert rebalance_every_s is None or rebalance_every_s > 0, rebalance_every_s
        self.quorum = quorum
        self.limits = limits
        self.period_s = period_s
        self.rebalance_every_s = rebalance_every_s
        self._monotonic_s = monotonic_s
        self._next_timed_rebalance: float | None = None
        self._timed_rebalance = False  # a timed rebalance is under way (until balanced)
        self._stuck: tuple[str, ...] = ()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"controller-{self.quorum.node_id}-mover"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            if not self.quorum.is_leader:
                self._next_timed_rebalance = None
                continue
            try:
                await self.round()
            except ControllerError as exc:  # leadership moved; the next leader goes on
                log.info("controller %d: moves deferred: %s", self.quorum.node_id, exc)

    def _timer_due(self) -> bool:
        if self.rebalance_every_s is None:
            return False
        now = self._monotonic_s()
        if self._next_timed_rebalance is None:
            self._next_timed_rebalance = now + self.rebalance_every_s
        if now >= self._next_timed_rebalance:
            self._next_timed_rebalance = now + self.rebalance_every_s
            self._timed_rebalance = True
        return self._timed_rebalance

    async def round(self) -> healing.Plan:
        """Plan from the current metadata and propose the plan; the plan."""
        # Current, not just applied here: a new leader may not have applied its
        # predecessor's last entries yet, and a plan from before them could give up a
        # move that already finished.
        _, state = await self.quorum.metadata(linearizable=True)
        rebalance = state.rebalance_requested or self._timer_due()
        plan = healing.plan(state, self.quorum.now_ms(), self.limits, rebalance=rebalance)
        if plan.stuck != self._stuck:
            for sentence in plan.stuck:
                log.warning("controller %d: cannot move %s", self.quorum.node_id, sentence)
            self._stuck = plan.stuck
        for command in plan.commands:
            try:
                await self.quorum.propose_change(command)
            except ControllerRefusal as exc:
                log.info("controller %d: %s refused: %s", self.quorum.node_id, command, exc)
                continue
            if isinstance(command, c.AddReplica):
                log.info(
                    "controller %d: moving %s/%d from broker %s to broker %d",
                    self.quorum.node_id,
                    command.name,
                    command.partition,
                    command.replacing,
                    command.broker_id,
                )
        if rebalance and plan.balanced:
            self._timed_rebalance = False
            if state.rebalance_requested:
                log.info("controller %d: the cluster is balanced", self.quorum.node_id)
                await self.quorum.propose_change(c.RequestRebalance(False))
        return plan
