"""The share consumer (docs/share-groups.md): a member of a share group, which consumes a
topic's records together with any number of other members, each record acquired by one
member at a time under a lock, until that member acknowledges it.

Two faces over one core, as the consumer has (raftmq.client.consumer):
:class:`ShareConsumer` runs the core on an event loop of its own thread;
:class:`AsyncShareConsumer` runs it in the caller's loop.

How it works, on the I/O loop:

- Membership is raftmq.client.share_session's heartbeat; its answers name the partitions
  to fetch from (several members may share one).
- Each assigned partition has a fetch loop: one ShareFetch at a time at the partition's
  leader, at most ``max_concurrent_fetches`` of them at once over all partitions, and a
  partition fetches again only once ``poll`` took what its last fetch acquired (one batch
  ahead per partition, no more: an acquired record's lock runs from its acquisition).
- Acknowledgements are kept until the next ``poll`` or commit. ``poll`` hands them to the
  fetch it frees (ShareFetch carries them: one round trip for both) or, where no fetch
  starts now, sends them with ShareAcknowledge; ``commit_sync`` / ``commit_async`` send
  them all at once and report each range's result. A refusal of an acknowledgement is a
  result, never an exception that stops the consumer.
- Records are delivered only inside the ranges the leader acquired for the member, with
  their delivery counts (ConsumerRecord.delivery_count); a record whose lock expired
  before ``poll`` took it is dropped (the leader has made it available again).

Acknowledgement mode: ``implicit`` (the default, as Kafka's): the next ``poll``, or a
commit, accepts every record of the last ``poll``; only RENEW may be given by hand.
``explicit``: the application acknowledges each record; one it does not stays acquired
until its lock expires, and is then delivered again (to any member).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar, Unpack

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client.backoff import backoff
from raftmq.client.connections import (
    Connections,
    TlsSettings,
    bootstrap_addresses,
    checked_client_id,
    client_id_headers,
)
from raftmq.client.consumer import ConsumerRecord
from raftmq.client.errors import ClientError, error_of
from raftmq.client.produce_stream import refusal
from raftmq.client.sasl import SaslSettings, security_of
from raftmq.client.share_acks import (
    AcknowledgementResult,
    AcknowledgeType,
    AckRange,
    Pending,
    acquired_records,
    coalesce,
)
from raftmq.client.share_session import ShareSession
from raftmq.tasks import stop_task

__all__ = [
    "AcknowledgeType",
    "AcknowledgementResult",
    "AsyncShareConsumer",
    "ShareConsumer",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
TopicPartition = tuple[str, int]
AcknowledgementMode = Literal["implicit", "explicit"]
RPC_SLACK_S = 10.0
"""How much longer than its long poll a ShareFetch may take before the client gives up."""
CLOSE_RELEASE_S = 5.0
"""How long ``close`` waits for its releases before leaving (which releases too)."""
MAX_HELD_AGE_MS = 60_000
"""A held record whose lock expired this long ago is forgotten (its lock is gone; an
acknowledgement of it would be refused anyway): bounds what a consumer remembers."""


@dataclass(frozen=True, slots=True)
class ShareConsumerConfig:
    bootstrap: tuple[str, ...]
    group_id: str
    """The share group: a name (1-255 of A-Z a-z 0-9 . _ -) no consumer group uses."""
    acknowledgement_mode: AcknowledgementMode = "implicit"
    """implicit: the next poll (or a commit) accepts every record of the last poll;
    explicit: acknowledge each record (the module says more)."""
    max_poll_records: int = 500
    """Records per poll, and per ShareFetch (each acquires at most this many)."""
    fetch_max_wait_ms: int = 500
    """How long a leader holds a ShareFetch that found nothing to acquire (long poll)."""
    fetch_max_bytes: int = 1024 * 1024
    max_concurrent_fetches: int = 16
    """ShareFetches in flight at once over all the partitions assigned."""
    session_timeout_ms: int = 45_000
    """A member silent this long is removed from the group, and the records it holds
    are given back by their leaders."""
    ack_timeout_ms: int = 30_000
    """How long an acknowledgement is retried (no leader, leader moved) before its
    result is the last refusal."""
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    sasl_oauth_token: str | None = None
    client_id: str | None = None
    """Kafka's ``client.id`` (None: ``share-consumer-N``)."""

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ValueError("give at least one broker address host:port in bootstrap")
        security_of(self)
        object.__setattr__(self, "client_id", checked_client_id(self.client_id, "share-consumer"))
        if not isinstance(self.group_id, str) or not self.group_id:
            raise ValueError("a share consumer needs group_id: the share group's name")
        if self.acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError(
                "acknowledgement_mode must be 'implicit' or 'explicit', not "
                f"{self.acknowledgement_mode!r}"
            )
        if not 1 <= self.max_poll_records <= 10_000:
            raise ValueError(f"max_poll_records must be 1-10000, not {self.max_poll_records}")
        if not 0 <= self.fetch_max_wait_ms <= 30_000:
            raise ValueError(f"fetch_max_wait_ms must be 0-30000, not {self.fetch_max_wait_ms}")
        if not 1 <= self.fetch_max_bytes <= 64 * 1024 * 1024:
            raise ValueError(f"fetch_max_bytes must be 1 B to 64 MiB, not {self.fetch_max_bytes}")
        if not 1 <= self.max_concurrent_fetches <= 1024:
            raise ValueError(
                f"max_concurrent_fetches must be 1-1024, not {self.max_concurrent_fetches}"
            )
        if not 1000 <= self.session_timeout_ms <= 300_000:
            raise ValueError(
                f"session_timeout_ms must be 1000-300000, not {self.session_timeout_ms}"
            )
        if self.ack_timeout_ms < 1:
            raise ValueError(f"ack_timeout_ms must be positive, not {self.ack_timeout_ms}")


class ShareConsumerSettings(TlsSettings, SaslSettings, total=False):
    """The keyword settings of a share consumer (defaults and meaning:
    ShareConsumerConfig)."""

    acknowledgement_mode: AcknowledgementMode
    max_poll_records: int
    fetch_max_wait_ms: int
    fetch_max_bytes: int
    max_concurrent_fetches: int
    session_timeout_ms: int
    ack_timeout_ms: int
    client_id: str | None


class Held(NamedTuple):
    deadline_ms: int
    delivery_count: int


@dataclass(slots=True)
class _Partition:
    """One partition's share of the consumer. ``pending`` and ``held`` are guarded by the
    core's lock (the synchronous consumer's ``acknowledge`` runs in the caller's thread);
    the rest is the loop's."""

    tp: TopicPartition
    assigned: bool = False
    ready: deque[tuple[ConsumerRecord, int]] = field(default_factory=deque)
    """Acquired and not yet polled, each with its lock deadline (ms, leader's clock)."""
    pending: dict[int, Pending] = field(default_factory=dict)
    """Acknowledged and not yet sent."""
    held: dict[int, Held] = field(default_factory=dict)
    """Offset: lock deadline and delivery count of each record acquired and not yet
    settled. The delivery count names the acquisition: an acknowledgement's answer
    settles only the acquisition it was sent for, not a later one of the same offset
    that a concurrent fetch brought (a RELEASE, then the record acquired again)."""
    awaiting_room: bool = False
    """The fetch loop waits for ``poll`` to take ``ready``, and fetches once it has."""
    room: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    carrying: bool = False
    """The fetch in flight carries acknowledgements: ``close`` lets it finish."""


@dataclass(slots=True)
class _Sent:
    """Acknowledgements on their way to a leader, and where their results go."""

    tp: TopicPartition
    ranges: list[AckRange]
    future: asyncio.Future[list[AcknowledgementResult]]


class _ShareCore:
    """Everything but the thread: create, use and close it on one loop (``acknowledge``
    and ``lock_deadline_ms`` may be called from any thread)."""

    def __init__(self, config: ShareConsumerConfig) -> None:
        self.config = config
        self.links = Connections(
            config.bootstrap,
            security=security_of(config),
            headers=client_id_headers(config.client_id or ""),
        )
        self.lock = threading.Lock()
        self.parts: dict[TopicPartition, _Partition] = {}
        self.session: ShareSession | None = None
        self.errors: deque[ClientError] = deque(maxlen=16)
        self.last_polled: list[ConsumerRecord] = []
        self.unanswered: set[asyncio.Future[list[AcknowledgementResult]]] = set()
        self.slots = asyncio.Semaphore(config.max_concurrent_fetches)
        self.data = asyncio.Event()
        self.closed = False
        self._turn = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()

    # --- membership -----------------------------------------------------------------------

    def subscribe(self, topics: list[str]) -> None:
        if self.session is None:
            self.session = ShareSession(
                self.links,
                self.config.group_id,
                session_timeout_ms=self.config.session_timeout_ms,
                on_assigned=self._assigned,
                on_error=self._error,
            )
        self.session.subscribe(topics)

    def _error(self, err: ClientError) -> None:
        self.errors.append(err)
        self.data.set()

    def _assigned(self, assigned: frozenset[TopicPartition]) -> None:
        for tp, p in list(self.parts.items()):
            if p.assigned and tp not in assigned:
                p.assigned = False
                p.room.set()  # its loop ends after the fetch in flight
        for tp in sorted(assigned):
            p = self._partition(tp)
            if not p.assigned:
                p.assigned = True
                if p.task is None or p.task.done():
                    p.task = asyncio.get_running_loop().create_task(self._fetch_loop(p))

    def _partition(self, tp: TopicPartition) -> _Partition:
        with self.lock:
            p = self.parts.get(tp)
            if p is None:
                p = self.parts[tp] = _Partition(tp)
            return p

    def assignment(self) -> set[TopicPartition]:
        return {tp for tp, p in list(self.parts.items()) if p.assigned}

    async def partitions_for(self, topic: str) -> list[int]:
        await self.links.refresh()
        return list(range(self.links.view.partitions.get(topic, 0)))

    # --- fetching -------------------------------------------------------------------------

    async def _fetch_loop(self, p: _Partition) -> None:
        attempt = 0
        try:
            while p.assigned and not self.closed:
                if p.ready:
                    p.awaiting_room = True
                    p.room.clear()
                    await p.room.wait()
                    p.awaiting_room = False
                    continue
                session = self.session
                assert session is not None
                if not session.joined:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(session.joined_event.wait(), 0.5)
                    continue
                async with self.slots:
                    if not p.assigned:
                        break
                    ok = await self._fetch_once(p, session)
                if ok:
                    attempt = 0
                else:
                    await backoff(attempt)
                    attempt += 1
        finally:
            self._give_back_ready(p)

    async def _fetch_once(self, p: _Partition, session: ShareSession) -> bool:
        """One ShareFetch, carrying the partition's pending acknowledgements; False when
        it failed (after retrying what a retry may mend)."""
        if not session.member_id:
            return True  # fenced while waiting for a turn: the loop waits for the rejoin
        sent = self._take_pending(p)
        c = self.config
        request = spb.ShareFetchRequest(
            group_id=c.group_id,
            member_id=session.member_id,
            metadata_version=session.metadata_version,
            topic=p.tp[0],
            partition=p.tp[1],
            max_records=c.max_poll_records,
            max_bytes=c.fetch_max_bytes,
            max_wait_ms=c.fetch_max_wait_ms,
            acknowledgements=[] if sent is None else [r.batch() for r in sent.ranges],
        )
        p.carrying = sent is not None
        failures: list[ClientError] = []
        try:
            answer: spb.ShareFetchResponse = await self._at_leader(
                p.tp, "ShareFetch", request, c.fetch_max_wait_ms / 1000 + RPC_SLACK_S, failures
            )
        except ClientError as err:
            if sent is not None:
                self._failed(sent, _unknown_if(_maybe_done(failures), err))
            self._refused(p, err)
            return False
        finally:
            p.carrying = False
            if sent is not None and not sent.future.done() and self.closed:
                self._failed(sent, _closed_error())
        if sent is not None:
            self._answered(sent, answer.acknowledge_results, retried=_maybe_done(failures))
        self._deliver(p, answer)
        return True

    def _refused(self, p: _Partition, err: ClientError) -> None:
        """A fetch or acknowledgement the leader refused: the member unknown there makes
        the session heartbeat now; a refusal no retry mends is raised by ``poll``."""
        if err.code in (pb.ERROR_CODE_UNKNOWN_MEMBER, pb.ERROR_CODE_FENCED_MEMBER_EPOCH):
            if self.session is not None:
                self.session.suspect()
            return
        if err.retriable or err.unreachable or err.timed_out:
            return
        if err.code == pb.ERROR_CODE_OUTCOME_UNKNOWN:
            # The leader could not get its change committed in time (it lost its quorum,
            # or its term): what a fetch may have acquired comes back when its locks end,
            # and its acknowledgements' results say so. The next fetch goes on.
            log.info("share group %s: %s/%d: %s", self.config.group_id, *p.tp, err)
            return
        if err.code in (pb.ERROR_CODE_UNKNOWN_GROUP, pb.ERROR_CODE_UNKNOWN_TOPIC):
            log.info("share group %s: %s/%d: %s", self.config.group_id, *p.tp, err)
            return
        self._error(err)

    async def _at_leader(
        self,
        tp: TopicPartition,
        rpc: str,
        request: Any,
        timeout_s: float,
        failures: list[ClientError] | None = None,
    ) -> Any:
        """``rpc`` of SharePartitions at ``tp``'s leader, following NOT_LEADER hints and
        waiting out elections and unreachable leaders for up to ack_timeout_ms; raises
        the last ClientError. ``failures`` collects the attempts that failed: one that got
        no answer may have been done (:func:`_maybe_done`)."""
        give_up = time.monotonic() + self.config.ack_timeout_ms / 1000
        attempt = 0
        while True:
            try:
                address = await self.links.leader(*tp)
                stub = spb_grpc.SharePartitionsStub(self.links.channel(address))
                return await getattr(stub, rpc)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as exc:
                err = error_of(exc)
            except ClientError as exc:  # no leader known yet
                err = exc
            if failures is not None:
                failures.append(err)
            if not (err.retriable or err.unreachable or err.timed_out) or self.closed:
                raise err
            if time.monotonic() >= give_up:
                raise err
            self.links.learn(*tp, err)
            if not err.meta.get("raftmq-leader-address"):
                await backoff(attempt)
                attempt += 1

    def _deliver(self, p: _Partition, answer: spb.ShareFetchResponse) -> None:
        """Keep the records acquired for ``poll``; give back at once any the entries did
        not hold, and those of a partition no longer assigned."""
        records, missing = acquired_records(answer.entries, answer.acquired)
        deadline = int(answer.lock_deadline_ms)
        topic, partition = p.tp
        with self.lock:
            for a in records:
                p.held[a.record.offset] = Held(deadline, a.delivery_count)
            for offset, count in missing:
                p.held[offset] = Held(deadline, count)
                p.pending[offset] = Pending(AcknowledgeType.RELEASE, count)
            if missing:
                log.warning(
                    "share group %s: %s/%d: the leader acquired %d records its answer did "
                    "not hold; giving them back",
                    self.config.group_id,
                    topic,
                    partition,
                    len(missing),
                )
        for a in records:
            r = a.record
            record = ConsumerRecord(
                topic, partition, r.offset, r.key, r.value, r.timestamp, r.headers, a.delivery_count
            )
            p.ready.append((record, deadline))
        if not p.assigned or self.closed:
            self._give_back_ready(p)
        elif records:
            self.data.set()

    def _give_back_ready(self, p: _Partition) -> None:
        """RELEASE what was acquired and not polled (unassigned, or closing)."""
        with self.lock:
            while p.ready:
                record, _ = p.ready.popleft()
                p.pending[record.offset] = Pending(
                    AcknowledgeType.RELEASE, record.delivery_count or 0
                )
        p.room.set()

    # --- acknowledgements -----------------------------------------------------------------

    def acknowledge(self, record: ConsumerRecord, type: AcknowledgeType) -> None:
        """Any thread: keep the acknowledgement for the next poll or commit."""
        if self.closed:
            raise RuntimeError("the share consumer is closed; create a new one")
        if not isinstance(type, AcknowledgeType):
            raise TypeError(
                f"acknowledge with an AcknowledgeType (ACCEPT, RELEASE, REJECT or RENEW), "
                f"not {type!r}"
            )
        if record.delivery_count is None:
            raise ValueError(
                f"{record.topic}/{record.partition} offset {record.offset} was not delivered "
                "by a share consumer; only a share group's records are acknowledged"
            )
        if self.config.acknowledgement_mode == "implicit" and type.settles:
            raise RuntimeError(
                f"acknowledge({type.name}) needs acknowledgement_mode='explicit': in "
                "implicit mode the next poll (or a commit) accepts every record of the last "
                "poll, and only RENEW may be given by hand"
            )
        p = self._partition((record.topic, record.partition))
        with self.lock:
            p.pending[record.offset] = Pending(type, record.delivery_count)

    def _accept_last_poll(self) -> None:
        """Implicit mode: what the last poll returned is accepted (any RENEW of it too)."""
        if self.config.acknowledgement_mode != "implicit" or not self.last_polled:
            return
        polled, self.last_polled = self.last_polled, []
        with self.lock:
            for r in polled:
                self.parts[(r.topic, r.partition)].pending[r.offset] = Pending(
                    AcknowledgeType.ACCEPT, r.delivery_count or 0
                )

    def _take_pending(self, p: _Partition) -> _Sent | None:
        with self.lock:
            if not p.pending:
                return None
            pending, p.pending = p.pending, {}
        future: asyncio.Future[list[AcknowledgementResult]] = (
            asyncio.get_running_loop().create_future()
        )
        self.unanswered.add(future)
        future.add_done_callback(self.unanswered.discard)
        return _Sent(p.tp, coalesce(pending), future)

    def _flush(self, *, piggy_back: bool) -> None:
        """Send the pending acknowledgements: ``piggy_back``, those of a partition whose
        fetch loop is about to fetch (``poll`` just took its records) go with that fetch;
        the others with ShareAcknowledge now."""
        for p in list(self.parts.values()):
            if not p.pending:
                continue
            if piggy_back and p.assigned and p.awaiting_room and not p.ready:
                continue
            sent = self._take_pending(p)
            if sent is not None:
                task = asyncio.get_running_loop().create_task(self._acknowledge(sent))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _acknowledge(self, sent: _Sent) -> None:
        c = self.config
        session = self.session
        if session is None or not session.member_id:
            self._failed(sent, _not_member_error(c.group_id))
            return
        request = spb.ShareAcknowledgeRequest(
            group_id=c.group_id,
            member_id=session.member_id,
            metadata_version=session.metadata_version,
            topic=sent.tp[0],
            partition=sent.tp[1],
            acknowledgements=[r.batch() for r in sent.ranges],
        )
        failures: list[ClientError] = []
        try:
            answer: spb.ShareAcknowledgeResponse = await self._at_leader(
                sent.tp, "ShareAcknowledge", request, RPC_SLACK_S, failures
            )
        except ClientError as err:
            self._failed(sent, _unknown_if(_maybe_done(failures), err))
            self._refused(self._partition(sent.tp), err)
            return
        except BaseException:
            self._failed(sent, _closed_error())
            raise
        self._answered(sent, answer.results, retried=_maybe_done(failures))

    def _answered(
        self, sent: _Sent, results: Sequence[spb.AcknowledgeResult], *, retried: bool = False
    ) -> None:
        """``retried``: an earlier attempt got no answer and may have been done, so a
        range refused INVALID_RECORD_STATE now may be what that attempt settled."""
        by_range = {(int(r.first_offset), int(r.last_offset)): r for r in results}
        out = []
        for rng in sent.ranges:
            answer = by_range.get((rng.first_offset, rng.last_offset))
            if answer is None:
                error: ClientError | None = ClientError(
                    f"the leader of {sent.tp[0]}/{sent.tp[1]} did not answer for offsets "
                    f"{rng.first_offset}-{rng.last_offset}",
                    pb.ERROR_CODE_UNSPECIFIED,
                    None,
                    {},
                )
                deadline = None
            else:
                error = refusal(answer.error) if answer.error.code else None
                if (
                    retried
                    and error is not None
                    and error.code == pb.ERROR_CODE_INVALID_RECORD_STATE
                ):
                    error = _unknown_if(True, error)
                deadline = int(answer.lock_deadline_ms) or None
            out.append(
                AcknowledgementResult(
                    sent.tp[0],
                    sent.tp[1],
                    rng.first_offset,
                    rng.last_offset,
                    rng.type,
                    error,
                    deadline if rng.type is AcknowledgeType.RENEW and error is None else None,
                    rng.delivery_count,
                )
            )
        self._settle(sent, out)

    def _failed(self, sent: _Sent, err: ClientError) -> None:
        topic, partition = sent.tp
        self._settle(
            sent,
            [
                AcknowledgementResult(
                    topic,
                    partition,
                    r.first_offset,
                    r.last_offset,
                    r.type,
                    err,
                    delivery_count=r.delivery_count,
                )
                for r in sent.ranges
            ],
        )

    def _settle(self, sent: _Sent, results: list[AcknowledgementResult]) -> None:
        """Held records settled leave ``held``; a RENEW done moves the deadline."""
        if sent.future.done():
            return
        p = self.parts.get(sent.tp)
        with self.lock:
            for r in results:
                if p is None:
                    break
                for offset in range(r.first_offset, r.last_offset + 1):
                    h = p.held.get(offset)
                    if h is None or h.delivery_count != r.delivery_count:
                        continue  # a later delivery of the record: not this answer's
                    if r.type.settles:
                        del p.held[offset]
                    elif r.lock_deadline_ms is not None:
                        p.held[offset] = Held(r.lock_deadline_ms, h.delivery_count)
        for r in results:
            if r.error is not None:
                log.warning(
                    "share group %s: %s of %s/%d offsets %d-%d refused: %s",
                    self.config.group_id,
                    r.type.name,
                    r.topic,
                    r.partition,
                    r.first_offset,
                    r.last_offset,
                    r.error,
                )
        sent.future.set_result(results)

    async def commit(self) -> list[AcknowledgementResult]:
        """Send every pending acknowledgement now (implicit mode: accepting the last
        poll's records first) and wait for them and for those already on their way."""
        self._check_open()
        self._accept_last_poll()
        self._flush(piggy_back=False)
        waiting = list(self.unanswered)
        if not waiting:
            return []
        done = await asyncio.gather(*waiting)
        return [r for results in done for r in results]

    def lock_deadline_ms(self, record: ConsumerRecord) -> int | None:
        p = self.parts.get((record.topic, record.partition))
        if p is None:
            return None
        with self.lock:
            h = p.held.get(record.offset)
            return None if h is None else h.deadline_ms

    # --- poll -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the share consumer is closed; create a new one")

    async def poll(self, timeout: float) -> list[ConsumerRecord]:
        self._check_open()
        if self.session is None:
            raise RuntimeError("subscribe to topics before polling")
        self._accept_last_poll()
        deadline = time.monotonic() + timeout
        flushed = False
        while True:
            self.data.clear()
            if self.errors:
                raise self.errors.popleft()
            records = self._take()
            if not flushed:
                self._flush(piggy_back=True)
                flushed = True
            left = deadline - time.monotonic()
            if records or left <= 0:
                if self.config.acknowledgement_mode == "implicit":
                    self.last_polled = records
                return records
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.data.wait(), left)

    def _take(self) -> list[ConsumerRecord]:
        """Up to max_poll_records ready records, partition after partition (starting at a
        different one each time, so none waits behind the others), dropping those whose
        lock expired meanwhile (the leader made them available again)."""
        limit = self.config.max_poll_records
        out: list[ConsumerRecord] = []
        parts = [p for p in list(self.parts.values()) if p.ready]
        if not parts:
            return out
        start = next(self._turn) % len(parts)
        now_ms = time.time_ns() // 1_000_000
        for p in parts[start:] + parts[:start]:
            expired = 0
            while p.ready and len(out) < limit:
                record, deadline = p.ready.popleft()
                with self.lock:
                    h = p.held.get(record.offset)
                    settled = h is None or h.delivery_count != record.delivery_count
                if settled:
                    continue  # acknowledged meanwhile (an earlier delivery's ACCEPT took it)
                if deadline and deadline <= now_ms:
                    expired += 1
                    continue
                out.append(record)
            if expired:
                log.info(
                    "share group %s: %s/%d: %d records' locks expired before poll took them",
                    self.config.group_id,
                    *p.tp,
                    expired,
                )
            if not p.ready:
                p.room.set()
            if len(out) >= limit:
                break
        self._forget_expired(now_ms)
        return out

    def _forget_expired(self, now_ms: int) -> None:
        with self.lock:
            for p in self.parts.values():
                too_old = now_ms - MAX_HELD_AGE_MS
                stale = [o for o, h in p.held.items() if h.deadline_ms < too_old]
                for offset in stale:
                    del p.held[offset]

    # --- close ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop fetching, give back every record held and not settled (RELEASE), send
        what was acknowledged, and leave the group."""
        if self.closed:
            return
        self.closed = True
        parts = list(self.parts.values())
        carrying = [p.task for p in parts if p.task is not None and p.carrying]
        if carrying:  # their acknowledgements' answers are on the way: let them land
            await asyncio.wait(carrying, timeout=CLOSE_RELEASE_S)
        for p in parts:
            if p.task is not None:
                await stop_task(p.task)
        with self.lock:
            for p in self.parts.values():
                for offset, h in p.held.items():  # (under the lock: no partition is added)
                    p.pending.setdefault(offset, Pending(AcknowledgeType.RELEASE, h.delivery_count))
        self._flush(piggy_back=False)
        waiting = list(self.unanswered)
        if waiting:
            await asyncio.wait(waiting, timeout=CLOSE_RELEASE_S)
        for task in list(self._tasks):
            await stop_task(task)
        if self.session is not None:
            await self.session.close()
        await self.links.close()


def _maybe_done(failures: list[ClientError]) -> bool:
    """Did an attempt that failed perhaps reach a leader that did it? One that got no
    answer did, perhaps; a refusal (NOT_LEADER and the like) did nothing."""
    return any(err.unreachable or err.timed_out for err in failures)


def _unknown_if(maybe_done: bool, err: ClientError) -> ClientError:
    """``err`` as OUTCOME_UNKNOWN when an attempt may have been done before it: the
    acknowledgement may have been committed by a leader that failed before answering (a
    retry then finds the records settled), or not at all."""
    if not maybe_done or err.code == pb.ERROR_CODE_OUTCOME_UNKNOWN:
        return err
    return ClientError(
        f"the outcome is unknown: an earlier attempt got no answer and may have been "
        f"committed before its leader failed; then: {err}",
        pb.ERROR_CODE_OUTCOME_UNKNOWN,
        err.status,
        err.meta,
    )


def _not_member_error(group_id: str) -> ClientError:
    return ClientError(
        f"this consumer is not a member of share group {group_id} right now (it is joining "
        "again): the records it held were given back when it left, so there is nothing to "
        "acknowledge",
        pb.ERROR_CODE_UNKNOWN_MEMBER,
        None,
        {},
        "UNKNOWN_MEMBER",
    )


def _closed_error() -> ClientError:
    return ClientError(
        "the share consumer closed before the leader answered",
        pb.ERROR_CODE_UNSPECIFIED,
        grpc.StatusCode.CANCELLED,
        {},
    )


def _topics(topics: Iterable[str] | str) -> list[str]:
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ValueError("subscribe to one or more topic names")
    return names


class _Face:
    _core: _ShareCore

    def __init__(
        self, bootstrap: str | Sequence[str], group_id: str, settings: ShareConsumerSettings
    ) -> None:
        self.config = ShareConsumerConfig(bootstrap_addresses(bootstrap), group_id, **settings)

    @property
    def closed(self) -> bool:
        return self._core.closed

    def acknowledge(
        self, record: ConsumerRecord, type: AcknowledgeType = AcknowledgeType.ACCEPT
    ) -> None:
        """Say what became of ``record`` (ACCEPT by default); sent with the next poll or
        commit. Until then a later acknowledgement of the same record replaces it. In
        implicit mode only RENEW may be given (the next poll accepts the rest)."""
        self._core.acknowledge(record, type)

    def lock_deadline_ms(self, record: ConsumerRecord) -> int | None:
        """When this member's lock on ``record`` expires (ms since the epoch, the
        leader's clock; a RENEW done moves it), or None once it is settled or unknown."""
        return self._core.lock_deadline_ms(record)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member fetches from now (others may fetch them too)."""
        return self._core.assignment()

    @property
    def member_id(self) -> str:
        """This member's id in the group ("" until it joined)."""
        session = self._core.session
        return session.member_id if session is not None else ""


class ShareConsumer(_Face):
    """A share consumer for one thread (``acknowledge`` may be called from any).
    ``with ShareConsumer(...) as c:`` closes it on exit."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group_id: str,
        **settings: Unpack[ShareConsumerSettings],
    ) -> None:
        """``bootstrap``: broker addresses host:port (a list, or comma-separated); the
        settings and their defaults: ShareConsumerConfig."""
        super().__init__(bootstrap, group_id, settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftmq-share-consumer", daemon=True
        )
        self._thread.start()
        self._core = self._wait(self._make())

    async def _make(self) -> _ShareCore:
        return _ShareCore(self.config)

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Join the share group and consume these topics with its other members."""
        self._core._check_open()
        names = _topics(topics)

        async def call() -> None:
            self._core.subscribe(names)

        self._wait(call())

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """The records acquired for this member, waiting up to ``timeout`` s for some; at
        most max_poll_records. Sends the acknowledgements given since the last poll
        (implicit mode: accepts every record the last poll returned)."""
        return self._wait(self._core.poll(timeout))

    def partitions_for(self, topic: str) -> list[int]:
        """The partitions of ``topic`` (asking the cluster); [] when it does not exist."""
        return self._wait(self._core.partitions_for(topic))

    def commit_sync(self) -> list[AcknowledgementResult]:
        """Send every acknowledgement given (implicit mode: accept the last poll's
        records) and wait for the leaders: one result per range of offsets, refused ones
        with their error (nothing in such a range changed)."""
        return self._wait(self._core.commit())

    def commit_async(self) -> concurrent.futures.Future[list[AcknowledgementResult]]:
        """As commit_sync, without waiting: the future's result is the same list."""
        return asyncio.run_coroutine_threadsafe(self._core.commit(), self._loop)

    def __iter__(self) -> Any:
        """Every record, polling until the consumer closes."""
        while not self.closed:
            yield from self.poll(1.0)

    def close(self) -> None:
        """Give back every record held and not settled (RELEASE; in implicit mode the
        last poll's records too: commit_sync first to accept them), send what was
        acknowledged, leave the group, and stop."""
        if self._loop.is_closed():
            return
        try:
            self._wait(self._core.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncShareConsumer(_Face):
    """The share consumer for asyncio code, with the same methods as
    :class:`ShareConsumer` (those that wait are coroutines; ``commit_async`` returns a
    task); create it inside the loop that uses it."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        group_id: str,
        **settings: Unpack[ShareConsumerSettings],
    ) -> None:
        super().__init__(bootstrap, group_id, settings)
        self._core = _ShareCore(self.config)

    def subscribe(self, topics: Iterable[str] | str) -> None:
        self._core._check_open()
        self._core.subscribe(_topics(topics))

    async def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        return await self._core.poll(timeout)

    async def partitions_for(self, topic: str) -> list[int]:
        return await self._core.partitions_for(topic)

    async def commit_sync(self) -> list[AcknowledgementResult]:
        return await self._core.commit()

    def commit_async(self) -> asyncio.Task[list[AcknowledgementResult]]:
        return asyncio.get_running_loop().create_task(self._core.commit())

    async def close(self) -> None:
        await self._core.close()

    async def __aenter__(self) -> AsyncShareConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
