"""Partition leaders tell the controller who leads (controller.proto ReportLeader), so the
metadata (admin DescribeTopic, every broker's Metadata answer) names the leader of a
partition even to a broker that hosts no replica of it.

Bounded, so that 1,000 partitions electing at once (a broker died) do not flood the
controller: the broker scans its replicas every ``SCAN_S`` (elections are not waited
on one by one; and only when something may have changed: a leadership, the metadata, a
report's end, a retry's time), and

- reports only what the metadata does not already say (leader and term);
- keeps at most one report in flight per partition; a newer term met while one is in
  flight is reported after it (coalesced: only the newest term goes, older ones never);
- keeps at most ``MAX_IN_FLIGHT`` reports in flight per broker (the controller puts the
  reports that arrive together into one entry, :meth:`ControllerQuorum.report_leader`,
  and the metadata watch coalesces the versions they make into the newest state);
- retries a failed report with a doubling backoff per partition; a refusal saying the
  report is stale (STALE_LEADER_TERM: the controller knows a newer leader) or moot (the
  topic, the partition or this replica is gone) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.controller_link import LinkRefusal
from raftmq.controller.model import MetadataState
from raftmq.partition.replica import PartitionReplica
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

SCAN_S = 0.25
"""How often the replicas are scanned for a leadership the metadata does not show."""
MAX_IN_FLIGHT = 64
"""Reports in flight per broker at most: those in flight together share a controller
entry, so a broker that just won a few hundred elections reports them in a few."""
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
_DROPPED = frozenset(
    {
        pb.ERROR_CODE_STALE_LEADER_TERM,
        pb.ERROR_CODE_NOT_A_REPLICA,
        pb.ERROR_CODE_UNKNOWN_TOPIC,
        pb.ERROR_CODE_UNKNOWN_PARTITION,
    }
)
"""Refusals that a retry cannot change: the report is dropped."""

Report = Callable[[str, int, int, int], Awaitable[int]]
"""(topic, partition, leader, term) -> the metadata version holding it:
:meth:`ControllerLink.report_leader`."""


class LeaderReports:
    def __init__(
        self,
        broker_id: int,
        report: Report,
        replicas: Mapping[tuple[str, int], PartitionReplica],
        metadata: Callable[[], MetadataState],
        leadership_changes: Callable[[], int],
    ) -> None:
        """``leadership_changes``: a count that grows with every change of role or leader
        of any replica here (:attr:`RaftHost.soft_state_changes`)."""
        self.broker_id = broker_id
        self._leadership_changes = leadership_changes
        self._scanned: tuple[int, int] | None = None
        """(leadership changes, metadata version) at the last scan that found nothing
        left to do but what is in flight or backing off; None after a report ended."""
        self._report = report
        self._replicas = replicas
        self._metadata = metadata
        self._done: dict[tuple[str, int], int] = {}
        """Per partition, the newest term reported (or dropped) by this process."""
        self._in_flight: set[tuple[str, int]] = set()
        self._retry: dict[tuple[str, int], tuple[float, float]] = {}
        """Per partition whose last report failed: (when to try again, the next backoff)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        """Reports the controller took (for tests and logs)."""

    async def run(self) -> None:
        """Scan and report until cancelled."""
        try:
            while True:
                try:
                    self.scan()
                except Exception:  # never the end of every partition's reports
                    log.exception("broker %d: a scan for leader reports failed", self.broker_id)
                await asyncio.sleep(SCAN_S)
        finally:
            for task in list(self._tasks):
                with contextlib.suppress(Exception):
                    await stop_task(task)

    def due(self) -> list[tuple[tuple[str, int], int]]:
        """The partitions this broker leads in a term neither the metadata nor an earlier
        report of this process shows, with that term; not those in flight or backing
        off."""
        state = self._metadata()
        now_s = time.monotonic()
        out = []
        for key, replica in list(self._replicas.items()):
            try:
                term = replica.led_term
            except Exception:  # this replica alone is skipped (its failure is reported)
                log.exception("%s/%d: reading its leadership failed", *key)
                continue
            if term <= 0 or self._done.get(key, 0) >= term:
                continue
            if key in self._in_flight or self._retry.get(key, (0.0, 0.0))[0] > now_s:
                continue
            topic = state.topics.get(key[0])
            if topic is None or key[1] >= len(topic.partitions):
                continue
            part = topic.partitions[key[1]]
            if part.leader_term > term or (
                part.leader == self.broker_id and part.leader_term == term
            ):
                self._done[key] = term  # the metadata knows as much or more
                continue
            out.append((key, term))
        for key in [k for k in self._done if k not in self._replicas]:
            del self._done[key]
            self._retry.pop(key, None)
        return out

    def scan(self) -> None:
        """Start reports for what is due, up to MAX_IN_FLIGHT in flight. Nothing to look
        at while no leadership changed, the metadata stayed, no report ended and no retry
        is due: an idle broker of 10,000 replicas spent a tenth of a core scanning them."""
        seen = (self._leadership_changes(), self._metadata().version)
        now_s = time.monotonic()
        if seen == self._scanned and not any(at <= now_s for at, _ in self._retry.values()):
            return
        self._scanned = seen
        for key, term in self.due():
            if len(self._in_flight) >= MAX_IN_FLIGHT:
                return  # the rest on a later scan
            self._in_flight.add(key)
            task = asyncio.get_running_loop().create_task(self._send(key, term))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, key: tuple[str, int], term: int) -> None:
        topic, partition = key
        try:
            await self._report(topic, partition, self.broker_id, term)
        except LinkRefusal as exc:
            if exc.code in _DROPPED:
                log.info(
                    "%s/%d: leader report for term %d dropped: %s", topic, partition, term, exc
                )
                self._done[key] = max(term, self._done.get(key, 0))
                self._retry.pop(key, None)
            else:
                self._back_off(key, exc)
        except Exception as exc:
            self._back_off(key, exc)
        else:
            self.sent += 1
            self._done[key] = max(term, self._done.get(key, 0))
            self._retry.pop(key, None)
        finally:
            self._in_flight.discard(key)
            self._scanned = None  # a newer term met meanwhile is due now

    def _back_off(self, key: tuple[str, int], exc: Exception) -> None:
        backoff_s = self._retry.get(key, (0.0, RETRY_FIRST_S))[1]
        self._retry[key] = (time.monotonic() + backoff_s, min(backoff_s * 2, RETRY_MAX_S))
        # INFO, not WARNING: while the controller elects a leader, every partition's report
        # fails once; the controller's own log says why.
        log.info("%s/%d: leader report failed (%s); retrying in %.1f s", *key, exc, backoff_s)
