"""The transaction coordinator as a running service on the controller quorum's leader,
over the pure transitions of :mod:`raftmq.controller.transactions`: batched calls, the
timeout of open transactions, and the marker driver.

- Calls from every producer are gathered into one ``TransactionCalls`` command per Raft
  round (:class:`~raftmq.controller.batching.Batcher`), each caller answered with its
  own call's outcome.
- The quorum's timer (:meth:`ControllerQuorum.on_tick`) aborts every transaction open
  past its ``started_ms + timeout_ms`` (both on proposers' clocks), with an epoch bump, as
  a call of the batch like any other.
- The marker driver (:class:`MarkerDriver`) has each partition's leader append the
  pending markers of every ended transaction, and records the written ones (a transaction
  with none left pending completes in that entry). It works from the metadata alone, so
  a new controller leader finishes what the last one left half-ended. Sending is the
  broker's (raftmq.broker.txn_markers: Broker.WriteTxnMarkers over gRPC); here are the
  plan, the retries and their bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from raftmq.controller import commands as c
from raftmq.controller.batching import Batcher
from raftmq.controller.coordinator import commit_bytes
from raftmq.controller.errors import RefusalCode
from raftmq.controller.metadata import broker_addresses
from raftmq.controller.model import MetadataState, TopicPartition, TxnState
from raftmq.controller.quorum import ControllerError, ControllerQuorum, ControllerRefusal
from raftmq.controller.transactions import marker_commits, marker_of
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

MAX_BATCH_CALLS = 1_000
MAX_BATCH_BYTES = 768 * 1024
"""Bounds of one TransactionCalls command, under the 1 MiB of a metadata command."""
MARKERS_PER_REQUEST = 1_000
"""Markers in one WriteTxnMarkers request at most (broker.proto's bound)."""
MARKERS_PER_ROUND = 20_000
"""Markers one round of the driver sends at most; the rest go in the next rounds."""
CONCURRENT_REQUESTS = 8
"""WriteTxnMarkers requests in flight at once, to every leader together."""
RECORDS_PER_ENTRY = 5_000
"""Written partitions one RecordTxnMarkers command records at most (~60 bytes each)."""
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 5.0
"""A marker refused or unanswered is sent again after a backoff doubling between these."""
IDLE_POLL_S = 0.5
"""How often an idle driver looks at the metadata anyway (a new leader's first look, a
leader report that makes a partition reachable again)."""
CONCURRENT_WAIT_S = 2.0
"""How long a call that must wait for its id's previous markers (an EndTxn, an
InitTransactions, an abort) waits here for them before it answers
CONCURRENT_TRANSACTIONS: it would otherwise come back refused and wait out a client
backoff. (AddPartitionsToTxn and AddOffsetsToTxn do not wait: the next transaction
begins while the last one's markers are written.)"""


def call_bytes(call: c.TxnCall) -> int:
    """A bound on what a call adds to a TransactionCalls command's encoding (canonical
    JSON, ASCII: a transactional id of at most 200 characters, topic names of at most
    255 characters, offsets as a group commit bounds them)."""
    request = call.request
    if isinstance(request, c.AddPartitionsToTxn):
        return 600 + 300 * len(request.partitions)
    if isinstance(request, c.AddOffsetsToTxn):
        return 600 + commit_bytes(request.commit)
    return 600


@dataclass(frozen=True, slots=True)
class MarkerTarget:
    """One marker to append: a transaction's end on one partition."""

    transactional_id: str
    partition: TopicPartition
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class MarkerAnswer:
    """A leader's answer for one marker: ``written``, else ``error`` (an ErrorCode name)
    and, for NOT_LEADER, where the leader is (``leader_address``, "" if unknown)."""

    written: bool
    error: str = ""
    leader_address: str = ""


SendMarkers = Callable[[str, list[MarkerTarget]], Awaitable[list[MarkerAnswer]]]
"""Send markers to the broker at an address; one answer per marker, in order. Raises
:class:`MarkersUnsent` (or ``OSError``) when the request got no answer."""


class MarkersUnsent(Exception):
    """The request got no answer (the broker is down, unreachable, or has no handler)."""


def plan_markers(
    state: MetadataState,
    hints: dict[TopicPartition, str],
    due: Callable[[MarkerTarget], bool],
    limit: int = MARKERS_PER_ROUND,
) -> dict[str, list[MarkerTarget]]:
    """The markers to send this round, by leader address: every pending marker of every
    transactional id that is ``due``, to the leader a NOT_LEADER answer pointed
    to (``hints``) or else to the one the metadata knows; at most ``limit``. A partition
    with no known leader waits for the next round."""
    addresses = broker_addresses(state)
    plan: dict[str, list[MarkerTarget]] = {}
    count = 0
    for tid in sorted(state.transactions):
        txn = state.transactions[tid]
        if not txn.pending_markers:
            continue
        producer_id, epoch = marker_of(txn)
        commit = marker_commits(txn)
        for tp in txn.pending_markers:
            target = MarkerTarget(tid, tp, producer_id, epoch, commit)
            if not due(target):
                continue
            address = hints.get(tp) or _leader_address(state, addresses, tp)
            if address is None:
                continue
            plan.setdefault(address, []).append(target)
            count += 1
            if count >= limit:
                return plan
    return plan


def _leader_address(
    state: MetadataState, addresses: dict[int, str], tp: TopicPartition
) -> str | None:
    topic = state.topics.get(tp.topic)
    if topic is None or tp.partition >= len(topic.partitions):
        return None
    leader = topic.partitions[tp.partition].leader
    return addresses.get(leader) if leader is not None else None


def written_commands(targets: Iterable[MarkerTarget]) -> list[c.RecordTxnMarkers]:
    """The commands that record ``targets`` as written, at most RECORDS_PER_ENTRY each."""
    commands: list[c.RecordTxnMarkers] = []
    batch = sorted(targets, key=lambda t: (t.transactional_id, t.partition))
    for start in range(0, len(batch), RECORDS_PER_ENTRY):
        by_txn: dict[tuple[str, int, int], list[TopicPartition]] = {}
        for t in batch[start : start + RECORDS_PER_ENTRY]:
            key = (t.transactional_id, t.producer_id, t.producer_epoch)
            by_txn.setdefault(key, []).append(t.partition)
        commands.append(
            c.RecordTxnMarkers(
                tuple(c.WrittenMarkers(*key, tuple(tps)) for key, tps in by_txn.items())
            )
        )
    return commands


class MarkerDriver:
    """Writes the markers of ended transactions through their partitions' leaders while
    this voter leads the quorum; see the module's docstring."""

    def __init__(
        self,
        quorum: ControllerQuorum,
        send: SendMarkers,
        *,
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self.quorum = quorum
        self._send = send
        self.retry_first_s = retry_first_s
        self.retry_max_s = retry_max_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.recorded = asyncio.Event()
        """Set (and replaced) each time written markers are recorded: transactions may
        have completed."""
        self._hints: dict[TopicPartition, str] = {}
        """A NOT_LEADER answer's leader, for the next attempt at that partition."""
        self._retry: dict[MarkerTarget, tuple[float, float]] = {}
        """A marker that failed: (when it is due again, its backoff), both monotonic s."""
        self.rounds = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"controller-{self.quorum.node_id}-txn-markers"
            )

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    def wake(self) -> None:
        """Look at the metadata now (a decision was just taken)."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            wait_s = IDLE_POLL_S
            if self.quorum.is_leader:
                try:
                    wait_s = await self.round()
                except ControllerError as exc:  # leadership moved; the next leader goes on
                    log.info("controller %d: markers deferred: %s", self.quorum.node_id, exc)
            else:
                self._hints.clear()
                self._retry.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
            self._wake.clear()

    async def round(self) -> float:
        """Send every due marker once, record the written ones; how long until the next
        round is due (the earliest retry, or the idle poll)."""
        self.rounds += 1
        _, state = self.quorum.local_state()
        now_s = self.quorum.monotonic_s()
        plan = plan_markers(
            state, self._hints, lambda t: self._retry.get(t, (0.0, 0.0))[0] <= now_s
        )
        pending = set(_pending_targets(state))
        pending_partitions = {t.partition for t in pending}
        self._retry = {t: r for t, r in self._retry.items() if t in pending}
        self._hints = {tp: a for tp, a in self._hints.items() if tp in pending_partitions}
        if plan:
            limit = asyncio.Semaphore(CONCURRENT_REQUESTS)
            requests = [
                (address, targets[i : i + MARKERS_PER_REQUEST])
                for address, targets in sorted(plan.items())
                for i in range(0, len(targets), MARKERS_PER_REQUEST)
            ]
            answered = await asyncio.gather(
                *(self._request(limit, address, targets) for address, targets in requests)
            )
            written = [t for done in answered for t in done]
            for command in written_commands(written):
                await self.quorum.propose(command, c.Done)
            if written:
                self.recorded.set()
                self.recorded = asyncio.Event()
            if written:
                log.debug("controller %d: %d markers written", self.quorum.node_id, len(written))
        if not self._retry:
            return IDLE_POLL_S
        soonest = min(due for due, _ in self._retry.values())
        return max(0.0, min(IDLE_POLL_S, soonest - self.quorum.monotonic_s()))

    async def _request(
        self, limit: asyncio.Semaphore, address: str, targets: list[MarkerTarget]
    ) -> list[MarkerTarget]:
        """Send one request; the targets written. Failures are scheduled for a retry."""
        async with limit:
            try:
                answers = await self._send(address, targets)
            except (MarkersUnsent, OSError) as exc:
                log.info(
                    "controller %d: %d markers to %s unsent (%s); retrying",
                    self.quorum.node_id,
                    len(targets),
                    address,
                    exc,
                )
                for t in targets:
                    self._hints.pop(t.partition, None)  # ask the metadata again
                    self._backoff(t)
                return []
        written = []
        for t, answer in zip(targets, answers, strict=True):
            if answer.written:
                written.append(t)
                self._retry.pop(t, None)
                continue
            if answer.error == "NOT_LEADER" and answer.leader_address:
                self._hints[t.partition] = answer.leader_address
            else:
                self._hints.pop(t.partition, None)
            self._backoff(t)
        return written

    def _backoff(self, target: MarkerTarget) -> None:
        _, last_s = self._retry.get(target, (0.0, 0.0))
        backoff_s = min(self.retry_max_s, max(self.retry_first_s, last_s * 2))
        self._retry[target] = (self.quorum.monotonic_s() + backoff_s, backoff_s)


def _pending_targets(state: MetadataState) -> Iterable[MarkerTarget]:
    for tid, txn in state.transactions.items():
        if txn.pending_markers:
            producer_id, epoch = marker_of(txn)
            for tp in txn.pending_markers:
                yield MarkerTarget(tid, tp, producer_id, epoch, marker_commits(txn))


class TransactionCoordinator:
    """The coordinator of every transactional id, on one controller voter; it answers only
    while the voter leads the quorum (else NotControllerError, as every command). Call
    :meth:`start` on a running loop, :meth:`close` before the quorum stops."""

    def __init__(
        self,
        quorum: ControllerQuorum,
        send: SendMarkers,
        *,
        max_batch_calls: int = MAX_BATCH_CALLS,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        retry_first_s: float = RETRY_FIRST_S,
    ) -> None:
        self.quorum = quorum
        self.batcher: Batcher[c.TxnCall, c.TxnOutcome] = Batcher(
            self._propose,
            max_items=max_batch_calls,
            max_bytes=max_batch_bytes,
            linger_ms=0,
            name="txn-calls",
        )
        self.markers = MarkerDriver(quorum, send, retry_first_s=retry_first_s)
        self._expiring: set[tuple[str, int, int]] = set()
        quorum.on_tick(self.abort_expired)

    def start(self) -> None:
        self.markers.start()

    async def close(self) -> None:
        await self.markers.stop()
        await self.batcher.close()

    async def call(
        self, call: c.TxnCall, *, concurrent_wait_s: float = CONCURRENT_WAIT_S
    ) -> c.TxnOutcome:
        """The call's outcome once applied; ControllerRefusal with its refusal (for an
        InitTransactions that began aborting an open transaction, CONCURRENT_TRANSACTIONS:
        it changed state all the same), or the quorum's error for the whole batch."""
        self.quorum.require_leader()
        give_up_s = self.quorum.monotonic_s() + concurrent_wait_s
        while True:
            recorded = self.markers.recorded
            outcome = await self.batcher.submit(call, call_bytes(call))
            if not isinstance(call.request, (c.AddPartitionsToTxn, c.AddOffsetsToTxn)):
                self.markers.wake()  # maybe a decision: its markers go now
            left_s = give_up_s - self.quorum.monotonic_s()
            if outcome.code != RefusalCode.CONCURRENT_TRANSACTIONS or left_s <= 0:
                break
            # The previous transaction is ending: wait for its markers here, then ask again.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recorded.wait(), left_s)
            self.quorum.require_leader()
        if outcome.code:
            raise ControllerRefusal(RefusalCode(outcome.code), outcome.message)
        return outcome

    async def _propose(self, calls: list[c.TxnCall]) -> list[c.TxnOutcome]:
        command = c.TransactionCalls(tuple(calls), self.quorum.now_ms())
        applied = await self.quorum.propose(command, c.TxnOutcomes)
        assert len(applied.outcomes) == len(calls), (len(applied.outcomes), len(calls))
        return list(applied.outcomes)

    async def abort_expired(self) -> None:
        """Abort every transaction open past its timeout (run by the quorum's timer)."""
        if not self.quorum.is_leader:
            return
        now_ms = self.quorum.now_ms()
        _, state = self.quorum.local_state()
        expired = [
            (tid, txn.producer_id, txn.producer_epoch)
            for tid, txn in sorted(state.transactions.items())
            if txn.state == TxnState.ONGOING
            and txn.started_ms + txn.timeout_ms < now_ms
            and (tid, txn.producer_id, txn.producer_epoch) not in self._expiring
        ]
        if expired:
            await asyncio.gather(*(self._abort_expired(*key) for key in expired))

    async def _abort_expired(self, tid: str, producer_id: int, epoch: int) -> None:
        key = (tid, producer_id, epoch)
        self._expiring.add(key)
        try:
            log.warning(
                "transactional id %s: its transaction at epoch %d ran past its timeout: "
                "aborting it",
                tid,
                epoch,
            )
            # No wait for the last transaction's markers: this runs on the quorum's timer,
            # which expires sessions too; the next tick tries again.
            await self.call(
                c.TxnCall(abort=c.AbortTxn(tid, producer_id, epoch)), concurrent_wait_s=0
            )
        except ControllerRefusal as exc:  # it ended meanwhile
            log.info("transactional id %s: the timeout's abort refused: %s", tid, exc)
        finally:
            self._expiring.discard(key)

    async def current(self) -> MetadataState:
        """The metadata as of this call, on the leader (a read index)."""
        self.quorum.require_leader()
        _, state = await self.quorum.metadata(linearizable=True)
        return state
