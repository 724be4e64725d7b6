"""The producer: ``send`` returns at once with a future of the record's offset; records
are batched per partition, compressed, and sent over one ProduceStream per broker, with
retries on the errors a retry can mend.

Two faces over one engine: :class:`Producer` (call it from any thread; its engine runs an
event loop on a thread of its own) and :class:`AsyncProducer` (its engine runs in the
caller's event loop). Futures are the one way to learn a record's fate: ``result()`` /
``await``, or ``add_done_callback``. The synchronous producer's callbacks run on its I/O
thread: keep them short, and never call ``flush`` or ``close`` from one.

Delivery (README, "Delivery semantics"): acks='all' waits until a majority of replicas
has the record on disk, acks=1 until the leader has appended it, acks=0 not at all (the
offset is then -1). Per partition, batches go one after another and a failed one is
retried before anything sent after it, so records of one partition are stored in the
order of their ``send`` calls.

Idempotence (``enable_idempotence``, on by default with acks='all'): the producer takes a
producer id from a broker and numbers its records per partition; a partition's leader
stores each batch once and in order, and answers a resent batch with the offsets it got
the first time. So a retry after an answer that never came (a broken connection, a
timeout, a leader that died) cannot duplicate or reorder records, and up to
``max_in_flight_per_partition`` batches of a partition may be on their way at once.
Without it only one batch per partition is in flight, and such a retry may store a batch
twice: that is at-least-once; ``retries=0`` gives at-most-once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Unpack

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.accumulator import Accumulator, Batch, BufferFullError, Outcome
from raftmq.client.backoff import backoff
from raftmq.client.connections import (
    Connections,
    TlsSettings,
    bootstrap_addresses,
    checked_client_id,
    client_id_headers,
)
from raftmq.client.errors import ClientError, error_of
from raftmq.client.group_link import OffsetAndMetadata
from raftmq.client.idempotence import Sequencer
from raftmq.client.partitioner import Partitioner, StickyPartitioner
from raftmq.client.produce_stream import ProduceStream
from raftmq.client.sasl import SaslSettings, security_of
from raftmq.client.transactions import TransactionManager, TransactionStateError
from raftmq.format import delay
from raftmq.format.compression import Codec, codec_named
from raftmq.format.entry import MAX_ENTRY_BYTES
from raftmq.format.records import Record, build_batch
from raftmq.limits import KEPT_BATCHES

Acks = Literal["all", 1, 0]
_ACKS = {"all": pb.ACKS_ALL, 1: pb.ACKS_LEADER, 0: pb.ACKS_NONE}
UNKNOWN_TOPIC_GRACE_S = 3.0
_MAY_DUPLICATE = {pb.ERROR_CODE_OUTCOME_UNKNOWN, pb.ERROR_CODE_TIMEOUT}
"""Refusals after which the batch may or may not be stored: retried (at-least-once, or
exactly once with idempotence, since the leader recognises the resent batch)."""
_SESSION_ENDED = {pb.ERROR_CODE_PRODUCER_FENCED, pb.ERROR_CODE_UNKNOWN_PRODUCER_ID}
_OVERTAKEN = {pb.ERROR_CODE_OUT_OF_ORDER_SEQUENCE, pb.ERROR_CODE_UNKNOWN_PRODUCER_ID}
"""Answers that only mean an earlier batch of the session has not landed yet, while one
has no outcome (:meth:`_Engine._overtook`)."""
SESSION_RETRY_S = 0.5
"""The wait before asking again for a producer id after no broker gave one."""

log = logging.getLogger(__name__)


class ProducerClosedError(RuntimeError):
    """``send`` after ``close``."""


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    """-1 with acks=0 (the broker does not say)."""
    timestamp: int


class RecordFuture:
    """A sent record's future (the synchronous producer's): ``result(timeout)`` gives its
    RecordMetadata or raises what stopped it; ``add_done_callback(fn)`` calls ``fn(self)``
    once it is settled, on the producer's I/O thread. A view of its batch's one future:
    records cost no future of their own, which was most of ``send``'s time.

    A delayed record's metadata names its target topic and partition with offset -1: it
    is stored (in the internal delay topic) and takes its offset in the target when due."""

    __slots__ = ("_index", "_outcome", "partition", "timestamp", "topic")

    def __init__(
        self,
        outcome: concurrent.futures.Future[int],
        index: int,
        topic: str,
        partition: int,
        timestamp: int,
    ) -> None:
        self._outcome = outcome
        self._index = index
        """The record's place in its batch; -1 for a delayed record (no offset yet)."""
        self.topic = topic
        self.partition = partition
        self.timestamp = timestamp

    def _meta(self, base_offset: int) -> RecordMetadata:
        return RecordMetadata(
            self.topic, self.partition, _offset(base_offset, self._index), self.timestamp
        )

    def result(self, timeout: float | None = None) -> RecordMetadata:
        return self._meta(self._outcome.result(timeout))

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._outcome.exception(timeout)

    def done(self) -> bool:
        return self._outcome.done()

    def add_done_callback(self, fn: Callable[[RecordFuture], object]) -> None:
        self._outcome.add_done_callback(lambda _: fn(self))


def _offset(base_offset: int, index: int) -> int:
    """A record's offset from its batch's; -1 with acks=0 or for a delayed record."""
    return base_offset + index if base_offset >= 0 and index >= 0 else -1


class AsyncRecordFuture:
    """A sent record's future (the asyncio producer's): ``await`` it for its
    RecordMetadata; ``add_done_callback(fn)`` calls ``fn(self)`` once it is settled."""

    __slots__ = ("_index", "_outcome", "partition", "timestamp", "topic")

    def __init__(
        self, outcome: asyncio.Future[int], index: int, topic: str, partition: int, timestamp: int
    ) -> None:
        self._outcome = outcome
        self._index = index
        self.topic = topic
        self.partition = partition
        self.timestamp = timestamp

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        base_offset = yield from self._outcome.__await__()
        offset = _offset(base_offset, self._index)
        return RecordMetadata(self.topic, self.partition, offset, self.timestamp)

    def done(self) -> bool:
        return self._outcome.done()

    def exception(self) -> BaseException | None:
        return self._outcome.exception()

    def add_done_callback(self, fn: Callable[[AsyncRecordFuture], object]) -> None:
        self._outcome.add_done_callback(lambda _: fn(self))


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Every setting, checked once at construction: a bad one fails there, not later."""

    bootstrap: tuple[str, ...]
    acks: Acks = "all"
    """'all': stored on a majority's disks; 1: appended by the leader; 0: not waited for."""
    linger_ms: int = 5
    """How long a batch waits for more records before it is sent (it goes at once when
    full). A few ms make batches, and so throughput, much larger under load."""
    batch_size: int = 256 * 1024
    """A batch is sent once its records reach this many bytes (before compression)."""
    buffer_memory: int = 64 * 1024 * 1024
    """Bytes of records held from send until answered; send blocks when it is full."""
    compression: str | None = None
    """None, 'gzip', 'lz4' or 'zstd': the codec of each batch's records."""
    max_in_flight: int = 64
    """Batches awaiting an answer, over all brokers."""
    enable_idempotence: bool | None = None
    """Store each batch once and in order despite retries (docs/clients.md,
    "Idempotence"). None (the default): on with acks='all' and retries, else off; True
    with acks 0 or 1, or with retries=0, is refused."""
    max_in_flight_per_partition: int = 5
    """With idempotence, batches of one partition awaiting an answer (without it, one);
    at most 5, the batches a partition remembers per producer."""
    retries: int = 10
    """Attempts after the first, for errors a retry can mend. 0: at-most-once."""
    retry_backoff_ms: int = 50
    """The first wait before a retry; it doubles with each attempt, up to 1 s."""
    request_timeout_ms: int = 30_000
    """How long the broker (and then this client) waits for one attempt's acks."""
    delivery_timeout_ms: int = 120_000
    """From send to answer, retries included: then the record's future fails."""
    max_block_ms: int = 60_000
    """How long send may block, for buffer room or a topic's first metadata."""
    max_request_size: int = 1024 * 1024
    """The largest record (key and value) send takes."""
    transactional_id: str | None = None
    """Makes the producer transactional (docs/transactions.md): its writes become visible
    to read_committed readers only when its transaction commits, together with the
    consumer offsets it carries. One id per instance of an application's task: a new
    instance with the same id fences the old one. Implies idempotence."""
    transaction_timeout_ms: int = 60_000
    """How long a transaction may stay open before the coordinator aborts it."""
    ssl_cafile: str | None = None
    """TLS (docs/security.md): the CA file that signed the brokers' certificates. Setting
    any ssl_ file turns TLS on (with only a CA: the system's trust is replaced by it)."""
    ssl_certfile: str | None = None
    """This client's certificate, for brokers that require one (mutual TLS)."""
    ssl_keyfile: str | None = None
    """The key of ``ssl_certfile``."""
    sasl_mechanism: str | None = None
    """Authentication (docs/security.md): "SCRAM-SHA-256" (with sasl_username and
    sasl_password) or "OAUTHBEARER" (with sasl_oauth_token); None: no credentials."""
    sasl_username: str | None = None
    sasl_password: str | None = None
    sasl_oauth_token: str | None = None
    client_id: str | None = None
    """Kafka's ``client.id``, sent on every call: quotas may be set per client id
    (docs/quotas.md). None: ``producer-N``, one per producer of the process."""

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ValueError("give at least one broker address host:port in bootstrap")
        security_of(self)  # raises ValueError for sasl_ settings that do not go together
        object.__setattr__(self, "client_id", checked_client_id(self.client_id, "producer"))
        if self.acks not in _ACKS:
            raise ValueError(f"acks must be 'all', 1 or 0, not {self.acks!r}")
        for name in ("linger_ms", "retries", "retry_backoff_ms", "max_block_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)}")
        for name in ("batch_size", "buffer_memory", "max_in_flight", "request_timeout_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not 1 <= self.max_request_size <= MAX_ENTRY_BYTES:
            raise ValueError(
                f"max_request_size must be 1 to {MAX_ENTRY_BYTES} bytes (the largest entry), "
                f"not {self.max_request_size}"
            )
        if self.batch_size > self.max_request_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must not exceed max_request_size "
                f"({self.max_request_size}): a full batch must fit one request"
            )
        if self.buffer_memory < self.batch_size:
            raise ValueError(
                f"buffer_memory ({self.buffer_memory}) must hold at least one batch "
                f"(batch_size {self.batch_size})"
            )
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be at least linger_ms "
                f"+ request_timeout_ms ({self.linger_ms + self.request_timeout_ms}): a record "
                "must have time for one attempt"
            )
        codec_named(self.compression)  # raises a sentence for an unknown codec
        if self.enable_idempotence:
            if self.acks != "all":
                raise ValueError(
                    f"enable_idempotence needs acks='all', not acks={self.acks!r}: with fewer "
                    "acks a stored batch can be lost in a failover and its sequence with it; "
                    "use acks='all', or enable_idempotence=False"
                )
            if self.retries == 0:
                raise ValueError(
                    "enable_idempotence with retries=0 does nothing (idempotence makes "
                    "retries safe); set retries above 0, or enable_idempotence=False for "
                    "at-most-once"
                )
        if self.transactional_id is not None and (
            self.enable_idempotence is False or self.acks != "all" or self.retries == 0
        ):
            raise ValueError(
                "a transactional producer is idempotent: it needs acks='all', retries above "
                "0 and enable_idempotence left on"
            )
        if self.transactional_id == "":
            raise ValueError("transactional_id must not be empty (None: not transactional)")
        if not 1 <= self.max_in_flight_per_partition <= KEPT_BATCHES:
            raise ValueError(
                f"max_in_flight_per_partition must be 1 to {KEPT_BATCHES} (the batches a "
                f"partition remembers per producer), not {self.max_in_flight_per_partition}"
            )

    @property
    def idempotent(self) -> bool:
        if self.transactional_id is not None:
            return True
        if self.enable_idempotence is None:
            return self.acks == "all" and self.retries > 0
        return self.enable_idempotence

    @property
    def codec(self) -> Codec:
        return codec_named(self.compression)


class ProducerSettings(TlsSettings, SaslSettings, total=False):
    """The keyword settings of both producers (defaults and meaning: ProducerConfig)."""

    acks: Acks
    linger_ms: int
    batch_size: int
    buffer_memory: int
    compression: str | None
    max_in_flight: int
    enable_idempotence: bool | None
    max_in_flight_per_partition: int
    retries: int
    retry_backoff_ms: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    max_block_ms: int
    max_request_size: int
    transactional_id: str | None
    transaction_timeout_ms: int
    client_id: str | None


class _Engine:
    """Drains the accumulator into produce requests, on one event loop."""

    def __init__(self, config: ProducerConfig, accumulator: Accumulator) -> None:
        self.config = config
        self.acc = accumulator
        self.links = Connections(
            config.bootstrap,
            security=security_of(config),
            headers=client_id_headers(config.client_id or ""),
        )
        self._streams: dict[str, ProduceStream] = {}
        self._in_flight: dict[tuple[str, int], int] = {}
        self._claimed = 0
        self._backing_off: dict[tuple[str, int], int] = {}
        """Per partition, its batches waiting to be sent again: no new batch of it goes
        first (with idempotence, one stored ahead of a resend would push the resend out
        of the batches the leader remembers)."""
        self.idempotent = config.idempotent
        self._per_partition = config.max_in_flight_per_partition if self.idempotent else 1
        self.sequencer = Sequencer()
        self.txn: TransactionManager | None = None
        if config.transactional_id is not None:
            self.txn = TransactionManager(
                config.transactional_id,
                config.transaction_timeout_ms,
                self.links,
                self.sequencer,
                deadline_s=config.max_block_ms / 1000,
                wake=self.wake,
            )
        self._session_task: asyncio.Task[None] | None = None
        self._session_error: BaseException | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self.room = asyncio.Event()
        """Set when a batch releases buffer room (the async producer waits on it)."""
        self._flushing = 0
        self._idle = asyncio.Event()
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wake.set()

    # --- metadata ---------------------------------------------------------------------

    async def partitions_of(self, topic: str, wait_s: float) -> int:
        """The partition count of ``topic``, refreshing metadata for up to ``wait_s``.

        A topic the answering brokers do not know for UNKNOWN_TOPIC_GRACE_S is refused
        then, not after ``wait_s``: that grace covers a topic created a moment ago that
        some broker has not heard of yet, and a missing topic fails fast."""
        deadline = time.monotonic() + wait_s
        unknown_since: float | None = None
        while topic not in self.links.view.partitions:
            answered = await self.links.refresh()
            if topic in self.links.view.partitions:
                break
            if self.links.refused is not None:
                raise self.links.refused  # authentication: waiting will not mend it
            now = time.monotonic()
            if answered and unknown_since is None:
                unknown_since = now
                # A broker with --auto-create-topics creates it now; others ignore this.
                await self.links.ask_to_create(topic)
                continue
            known_missing = (
                unknown_since is not None and now - unknown_since >= UNKNOWN_TOPIC_GRACE_S
            )
            if known_missing or now >= deadline:
                raise ClientError(
                    f"topic {topic!r} does not exist (no broker's metadata names it); create "
                    "it with 'raftmq topic create' or the admin API"
                    if unknown_since is not None
                    else f"no broker answered Metadata within {wait_s:.0f} s (max_block_ms) "
                    f"to find topic {topic!r}; are the bootstrap addresses right?",
                    pb.ERROR_CODE_UNKNOWN_TOPIC if unknown_since else pb.ERROR_CODE_UNSPECIFIED,
                    grpc.StatusCode.NOT_FOUND if unknown_since else grpc.StatusCode.UNAVAILABLE,
                    {},
                    "UNKNOWN_TOPIC" if unknown_since else "",
                )
            await asyncio.sleep(min(0.2, max(0.0, deadline - now)))
        return self.links.view.partitions[topic]

    # --- sending ------------------------------------------------------------------------

    def _claim(self, batch: Batch) -> bool:
        """At most max_in_flight batches in all; per partition one at a time (so a retry
        cannot reorder), or with idempotence up to max_in_flight_per_partition (the
        leader refuses one that overtook another, and it is sent again after it)."""
        key = (batch.topic, batch.partition)
        if self._in_flight.get(key, 0) >= self._per_partition:
            return False
        if self._claimed >= self.config.max_in_flight:
            return False
        fresh = self.idempotent and batch.sequence < 0
        if fresh and (self._backing_off.get(key) or not self.sequencer.may_send_fresh(key)):
            return False
        if self.txn is not None and not self.txn.partition_ready(key):
            return False  # it goes once the partition is in the transaction
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        self._claimed += 1
        return True

    def _prepare(self, batch: Batch) -> bool:
        """Build a batch's entry on its first send, with its sequence under idempotence
        (here, in drain order, so a partition's sequences follow its batches); False when
        it cannot be built (it is failed)."""
        if batch.entry is not None:
            return True
        if self.idempotent:
            self.sequencer.assign(batch)
        try:
            batch.entry = build_batch(
                batch.records,
                producer_id=batch.producer_id,
                producer_epoch=batch.producer_epoch,
                base_sequence=batch.sequence,
                compression_codec=self.config.codec,
                transactional=self.txn is not None,
            )
        except ValueError as exc:
            self._fail(batch, exc)
            return False
        return True

    def _renew_session(self) -> None:
        """Start asking for a producer id when the session needs one (in the background:
        the sender goes on with retries and expiries meanwhile)."""
        if not (self.idempotent and self.sequencer.renew) or self._stopping:
            return
        if self.txn is not None:
            return  # its producer id and epoch come from the coordinator
        if self._session_task is None or self._session_task.done():
            self._session_task = asyncio.get_running_loop().create_task(self._init_session())

    async def _init_session(self) -> None:
        """InitProducerId at a broker (any: the bootstrap ones, then those metadata named)."""
        addresses = list(dict.fromkeys([*self.links.view.brokers.values(), *self.config.bootstrap]))
        for address in addresses:
            try:
                answer = await self.links.stub(address).InitProducerId(
                    pb.InitProducerIdRequest(), timeout=self.config.request_timeout_ms / 1000
                )
            except grpc.aio.AioRpcError as exc:
                self._session_error = error_of(exc)
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # the ACLs refuse this principal a producer id: no retry would do
                    self._fail_queued(self._session_error)
                    break
                continue
            self.sequencer.start(answer.producer_id, answer.producer_epoch)
            self._session_error = None
            self._wake.set()
            return
        await asyncio.sleep(SESSION_RETRY_S)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for batch in self.acc.expired(time.monotonic()):
                self._fail(batch, self._expired(batch, self._session_error))
            self._renew_session()
            batches, next_due = self.acc.drain(
                time.monotonic(), self._claim, flush=self._flushing > 0 or self._stopping
            )
            if self.txn is not None:
                # A partition joins the transaction while its first batch still lingers,
                # so the batch need not wait for the answer once it is ready.
                self.txn.add_early(self.acc.lingering())
            for batch in batches:
                if not self._prepare(batch):
                    self._release_slot(batch)
                    continue
                task = loop.create_task(self._send(batch))
                self._sending.add(task)
                task.add_done_callback(self._sent)
            if not self._sending and not self.acc.waiting:
                self._idle.set()
                if self._stopping:
                    return
            else:
                self._idle.clear()
            timeout = 1.0 if next_due is None else max(0.0, next_due - time.monotonic())
            # asyncio.timeout, not wait_for (which on 3.11 wraps the wait in a new task on
            # every turn): a send's wake reaches the drain one loop turn sooner.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()

    def _release_slot(self, batch: Batch) -> None:
        key = (batch.topic, batch.partition)
        left = self._in_flight.get(key, 0) - 1
        if left > 0:
            self._in_flight[key] = left
        else:
            self._in_flight.pop(key, None)
        self._claimed -= 1

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._wake.set()

    async def _send(self, batch: Batch) -> None:
        try:
            error = await self._attempt(batch)
            if error is None:
                return
            overtook = self._overtook(batch, error)
            if overtook:
                # It arrived before a batch sent ahead of it: not a failed attempt.
                batch.attempts -= 1
            if (overtook or self._retriable(error)) and batch.attempts <= self.config.retries:
                key = (batch.topic, batch.partition)
                self._backing_off[key] = self._backing_off.get(key, 0) + 1
                try:
                    await backoff(max(0, batch.attempts - 1), self.config.retry_backoff_ms / 1000)
                    if time.monotonic() < batch.deadline_s:
                        self.acc.retry_first(batch)
                        return
                finally:
                    left = self._backing_off[key] - 1
                    if left:
                        self._backing_off[key] = left
                    else:
                        del self._backing_off[key]
                error = self._expired(batch, error)
            self._fail(batch, self._final(batch, error))
        except Exception as exc:
            # A bug of ours: the batch must still end, or its futures (and flush) would
            # wait for ever.
            log.exception(
                "sending %d records to %s/%d failed",
                len(batch.records),
                batch.topic,
                batch.partition,
            )
            if not batch.outcome.done():
                self._fail(batch, exc)
        finally:
            self._release_slot(batch)

    async def _attempt(self, batch: Batch) -> BaseException | None:
        """One try; None when the batch was stored (its futures are then done)."""
        batch.attempts += 1
        try:
            address = await self.links.leader(batch.topic, batch.partition)
        except ClientError as exc:
            return exc
        assert batch.entry is not None
        request = pb.ProduceRequest(
            topic=batch.topic,
            partition=batch.partition,
            entries=batch.entry,
            acks=_ACKS[self.config.acks],
            timeout_ms=self.config.request_timeout_ms,
        )
        await self.links.throttle(address)  # over a quota there: Kafka's client holds back
        try:
            # Not wait_for: on 3.11 it runs the request in a task of its own, a loop turn
            # each way on every send's path.
            async with asyncio.timeout(self.config.request_timeout_ms / 1000 + 1):
                answer = await self._stream(address).produce(request)
        except ClientError as exc:
            self.links.learn(batch.topic, batch.partition, exc)
            return exc
        except TimeoutError:
            return ClientError(
                f"{address} did not answer for {batch.topic}/{batch.partition} within "
                f"{self.config.request_timeout_ms} ms (request_timeout_ms)",
                pb.ERROR_CODE_TIMEOUT,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                {},
                "TIMEOUT",
            )
        self.links.hold_back(address, answer.throttle_time_ms)
        self.acc.release(batch)
        self.room.set()
        self.sequencer.settled(batch, failed=False)
        batch.finish(answer.base_offset, None)
        return None

    def _stream(self, address: str) -> ProduceStream:
        stream = self._streams.get(address)
        if stream is None or stream.ended:
            stream = ProduceStream(self.links.channel(address), address)
            self._streams[address] = stream
        return stream

    def _retriable(self, error: BaseException) -> bool:
        if not isinstance(error, ClientError):
            return False
        return error.retriable or error.unreachable or error.code in _MAY_DUPLICATE

    def _overtook(self, batch: Batch, error: BaseException) -> bool:
        """OUT_OF_ORDER_SEQUENCE while a batch sent before it is still on its way: the
        leader saw this one first; it goes again after that one. UNKNOWN_PRODUCER_ID the
        same: a new leader that holds no batch of this producer yet was reached by this
        batch before the session's first one (sent to the old leader, lost with it, and
        being retried), so it is that batch, not the session, that is missing."""
        return (
            isinstance(error, ClientError)
            and error.code in _OVERTAKEN
            and self.sequencer.earlier_unsettled(batch)
        )

    def _final(self, batch: Batch, error: BaseException) -> BaseException:
        """The error a batch fails with for good, in the producer's words."""
        if not isinstance(error, ClientError):
            return error
        if self.txn is not None:
            return self.txn.batch_error(batch.topic, batch.partition, len(batch.records), error)
        if error.code in _SESSION_ENDED or error.code == pb.ERROR_CODE_OUT_OF_ORDER_SEQUENCE:
            return ClientError(
                f"{len(batch.records)} records for {batch.topic}/{batch.partition} were not "
                f"stored: {error} (the producer takes a new producer id for the records "
                "sent after them)",
                error.code,
                error.status,
                error.meta,
                error.code_name,
            )
        return error

    def _expired(self, batch: Batch, last: BaseException | None = None) -> ClientError:
        why = f"; the last attempt failed: {last}" if last is not None else ""
        return ClientError(
            f"{len(batch.records)} records for {batch.topic}/{batch.partition} were not "
            f"stored within {self.config.delivery_timeout_ms} ms (delivery_timeout_ms) after "
            f"{batch.attempts} attempts{why}",
            pb.ERROR_CODE_TIMEOUT,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            {},
            "TIMEOUT",
        )

    def _fail(self, batch: Batch, error: BaseException) -> None:
        if self.txn is not None:
            self.txn.failed(error)
        self.sequencer.settled(batch, failed=True)
        self.acc.release(batch)
        self.room.set()
        batch.finish(-1, error)

    # --- transactions ---------------------------------------------------------------------

    def _txn(self) -> TransactionManager:
        if self.txn is None:
            raise TransactionStateError(
                "transactions need a transactional producer: create it with transactional_id"
            )
        return self.txn

    async def init_transactions(self) -> None:
        await self._txn().init()

    async def begin_transaction(self) -> None:
        self._txn().begin()

    async def send_offsets(
        self, offsets: Mapping[tuple[str, int], int | OffsetAndMetadata], group: Sequence[Any]
    ) -> None:
        group_id, member_id, member_epoch = group
        await self._txn().add_offsets(offsets, (group_id, member_id, member_epoch))

    async def end_transaction(self, *, commit: bool) -> None:
        await self._txn().end(commit=commit, flush=self.flush, fail_queued=self._fail_queued)

    def _fail_queued(self, error: BaseException) -> None:
        for batch in self.acc.take_all():
            self._fail(batch, error)
        self._wake.set()

    # --- flush and close ------------------------------------------------------------------

    async def flush(self) -> None:
        """Send everything waiting and wait for every answer."""
        self._flushing += 1
        try:
            self._idle.clear()
            self._wake.set()
            await self._idle.wait()
        finally:
            self._flushing -= 1

    async def close(self, *, abandon: bool) -> None:
        """Send what waits (unless ``abandon``: fail it), then close every connection."""
        if abandon:
            for batch in self.acc.take_all():
                self._fail(batch, ProducerClosedError("the producer closed before sending it"))
        self._stopping = True
        self._wake.set()
        await self._task
        if self._session_task is not None:
            self._session_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._session_task
        for stream in self._streams.values():
            await stream.close()
        await self.links.close()


def _record(
    value: bytes | None,
    key: bytes | None,
    headers: Mapping[str, bytes | None] | Sequence[tuple[str, bytes | None]] | None,
    tags: Sequence[str] | None,
    timestamp: int | None,
) -> Record:
    if timestamp is None:
        timestamp = time.time_ns() // 1_000_000
    elif timestamp < 0:
        raise ValueError(f"timestamp {timestamp} is negative; use ms since the epoch")
    if headers is None and tags is None:  # the common case, without building lists
        return Record(key, value, timestamp)
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers or ())
    pairs += [("tag", t.encode()) for t in tags or ()]
    return Record(key, value, timestamp, tuple(pairs))


def _with_headers(record: Record, extra: Sequence[tuple[str, bytes | None]]) -> Record:
    for name, _ in record.headers:
        if name in delay.INTERNAL_HEADERS or name == delay.DELIVER_AT:
            raise ValueError(
                f"header {name!r} is reserved for delayed delivery; use delay_ms or deliver_at"
            )
    return Record(record.key, record.value, record.timestamp, (*record.headers, *extra))


def _due(delay_ms: int | None, deliver_at: int | None) -> int | None:
    """The due time (ms since the epoch) of a send with ``delay_ms`` or ``deliver_at``;
    None when neither is given. Raises ValueError for an absurd one: negative, both at
    once, or further than any topic may allow (delay.MAX_DELIVERY_DELAY_MS). A topic's own
    ``delivery.max.delay.ms`` is checked by the broker (DELAY_TOO_LONG)."""
    if delay_ms is None and deliver_at is None:
        return None
    if delay_ms is not None and deliver_at is not None:
        raise ValueError("give delay_ms or deliver_at, not both")
    now_ms = time.time_ns() // 1_000_000
    if delay_ms is not None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms {delay_ms} is negative; use 0 or more")
        due = now_ms + delay_ms
    else:
        assert deliver_at is not None
        if deliver_at < 0:
            raise ValueError(
                f"deliver_at {deliver_at} is negative; use ms since the epoch (a time in "
                "the past is delivered at once)"
            )
        due = deliver_at
    if due - now_ms > delay.MAX_DELIVERY_DELAY_MS:
        raise ValueError(
            f"the record would be due in {due - now_ms} ms; no topic allows a delay over "
            f"{delay.MAX_DELIVERY_DELAY_MS} ms (10 years), and each topic's "
            "delivery.max.delay.ms (default 40 days) bounds it further"
        )
    return due


class _Face:
    """What both producers share: the settings, the accumulator, the partitioner and the
    checks each send makes before a record is accepted."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        partitioner: Partitioner | None,
        settings: ProducerSettings,
        new_outcome: Callable[[], Outcome],
    ) -> None:
        addresses = bootstrap_addresses(bootstrap)
        config = ProducerConfig(addresses, **settings)
        self.config = config
        self.partitioner: Partitioner = partitioner or StickyPartitioner()
        self.acc = Accumulator(
            batch_size_bytes=config.batch_size,
            linger_s=config.linger_ms / 1000,
            buffer_bytes=config.buffer_memory,
            delivery_s=config.delivery_timeout_ms / 1000,
            new_outcome=new_outcome,
        )
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise ProducerClosedError("the producer is closed; create a new one to send")

    def _place(self, topic: str, record: Record, partition: int | None, partitions: int) -> int:
        size = len(record.key or b"") + len(record.value or b"")
        if size > self.config.max_request_size:
            raise ValueError(
                f"the record is {size} bytes, more than max_request_size "
                f"({self.config.max_request_size}); send smaller records or raise it (and the "
                "topic's max.message.bytes)"
            )
        if partition is None:
            return self.partitioner.partition(topic, record.key, partitions)
        if not 0 <= partition < partitions:
            raise ValueError(f"topic {topic} has partitions 0-{partitions - 1}, not {partition}")
        return partition

    def _route(
        self,
        topic: str,
        partition: int,
        record: Record,
        deliver_at_ms: int | None,
        transactional: bool,
    ) -> tuple[str, int, Record]:
        """Where a record goes and as what. A delayed one (docs/delayed-delivery.md): its
        target partition is chosen now, as for any record; if not yet due it goes to the
        level of the delay topic its wait calls for, with its route in headers; if due
        already, straight to its target. Either way it keeps ``deliver-at``."""
        if deliver_at_ms is None:
            return topic, partition, record
        if transactional:
            raise ValueError("a transactional producer cannot send delayed records")
        now_ms = time.time_ns() // 1_000_000
        hop = delay.route(deliver_at_ms, now_ms)
        if hop is None:
            due = [(delay.DELIVER_AT, str(deliver_at_ms).encode())]
            return topic, partition, _with_headers(record, due)
        level, hop_at_ms = hop
        headers = delay.route_headers(topic, partition, deliver_at_ms, hop_at_ms)
        return delay.DELAY_TOPIC, level, _with_headers(record, headers)

    def _buffer_full(self) -> BufferFullError:
        return BufferFullError(
            f"the producer's buffer ({self.config.buffer_memory} bytes, buffer_memory) stayed "
            f"full for {self.config.max_block_ms} ms (max_block_ms): the brokers take records "
            "slower than they are sent; send slower, flush, or raise buffer_memory"
        )

    def _rolled(self, topic: str, partition: int, partitions: int) -> None:
        batch_sent = getattr(self.partitioner, "batch_sent", None)
        if batch_sent is not None:
            batch_sent(topic, partition, partitions)


class Producer(_Face):
    """A thread-safe producer. ``with Producer(...) as p:`` closes (after sending
    everything) on exit."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        partitioner: Partitioner | None = None,
        **settings: Unpack[ProducerSettings],
    ) -> None:
        """``bootstrap``: broker addresses host:port (a list, or comma-separated);
        ``partitioner``: where records without an explicit partition go (default:
        StickyPartitioner); the settings and their defaults: ProducerConfig."""
        super().__init__(bootstrap, partitioner, settings, concurrent.futures.Future)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftmq-producer", daemon=True
        )
        self._thread.start()
        self._engine = asyncio.run_coroutine_threadsafe(self._make_engine(), self._loop).result()

    async def _make_engine(self) -> _Engine:
        return _Engine(self.config, self.acc)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Mapping[str, bytes | None] | Sequence[tuple[str, bytes | None]] | None = None,
        tags: Sequence[str] | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        delay_ms: int | None = None,
        deliver_at: int | None = None,
    ) -> RecordFuture:
        """Queue one record; its future holds its RecordMetadata once stored, or the
        ClientError that stopped it. Blocks (up to max_block_ms) only for buffer room or
        a topic's first metadata. A transactional producer sends inside a transaction
        only (begin_transaction).

        ``delay_ms`` or ``deliver_at`` (ms since the epoch) delay the record: it is stored
        at once (acks as for any record) and appended to its topic, at a new offset, no
        earlier than it is due (docs/delayed-delivery.md); a ``deliver_at`` in the past is
        delivered at once. Its metadata then has offset -1."""
        self._check_open()
        if self._engine.txn is not None:
            self._engine.txn.check_send()
        record = _record(value, key, headers, tags, timestamp)
        due = _due(delay_ms, deliver_at)
        partitions = self._partitions(topic)
        p = self._place(topic, record, partition, partitions)
        to_topic, to_p, record = self._route(topic, p, record, due, self._engine.txn is not None)
        if to_topic != topic:
            self._partitions(to_topic)  # the delay topic: created on first use
        try:
            outcome, index, wake, rolled = self.acc.append(
                to_topic, to_p, record, self.config.max_block_ms / 1000
            )
        except BufferFullError:
            raise self._buffer_full() from None
        if rolled and to_topic == topic:
            self._rolled(topic, p, partitions)
        if wake:
            self._loop.call_soon_threadsafe(self._engine.wake)
        assert isinstance(outcome, concurrent.futures.Future)
        index = index if to_topic == topic else -1
        return RecordFuture(outcome, index, topic, p, record.timestamp)

    def _partitions(self, topic: str) -> int:
        count = self._engine.links.view.partitions.get(topic)
        if count is None:
            wait_s = self.config.max_block_ms / 1000
            fut = asyncio.run_coroutine_threadsafe(
                self._engine.partitions_of(topic, wait_s), self._loop
            )
            count = fut.result()
        return count

    def flush(self, timeout: float | None = None) -> None:
        """Send every queued record now and wait until each has its answer."""
        self._check_open()
        asyncio.run_coroutine_threadsafe(self._engine.flush(), self._loop).result(timeout)

    # --- transactions (docs/transactions.md; with transactional_id only) ----------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Once, before the first transaction: take the producer id and epoch of the
        transactional id, fencing every older instance and aborting what it left open."""
        self._on_loop(self._engine.init_transactions(), timeout)

    def begin_transaction(self) -> None:
        """Start a transaction: the sends and offsets until commit or abort belong to it."""
        self._on_loop(self._engine.begin_transaction(), None)

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[tuple[str, int], int | OffsetAndMetadata],
        group_metadata: Sequence[Any],
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer's positions (the next offset to consume, per partition) with
        the transaction: ``group_metadata`` is ``consumer.group_metadata()``."""
        self._on_loop(self._engine.send_offsets(offsets, group_metadata), timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, wait until it is stored, then commit: the records and
        offsets become visible together. TransactionAbortableError: abort and redo the
        transaction; ProducerFencedError: close this producer; another ClientError (no
        answer: timed out, unreachable, OUTCOME_UNKNOWN): it may have committed, so call
        commit_transaction() again, which learns the outcome (as Kafka's TimeoutException)."""
        self._on_loop(self._engine.end_transaction(commit=True), timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Fail what is queued, wait for what is on its way, then abort: nothing of the
        transaction becomes visible to read_committed readers."""
        self._on_loop(self._engine.end_transaction(commit=False), timeout)

    def _on_loop(self, coro: Coroutine[Any, Any, None], timeout: float | None) -> None:
        self._check_open()
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (waiting up to ``timeout``; then the rest fails), and stop.
        Closing twice is allowed."""
        if self.closed:
            return
        self.closed = True
        flushed = asyncio.run_coroutine_threadsafe(self._engine.flush(), self._loop)
        abandon = False
        try:
            flushed.result(timeout)
        except concurrent.futures.TimeoutError:
            abandon = True
        asyncio.run_coroutine_threadsafe(self._engine.close(abandon=abandon), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncProducer(_Face):
    """The producer for asyncio code: create it inside the event loop that uses it
    (``async with AsyncProducer(...) as p``), and ``await p.send(...)`` returns the
    record's future once the record is queued."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        partitioner: Partitioner | None = None,
        **settings: Unpack[ProducerSettings],
    ) -> None:
        """``bootstrap``: broker addresses host:port (a list, or comma-separated);
        ``partitioner``: where records without an explicit partition go (default:
        StickyPartitioner); the settings and their defaults: ProducerConfig."""
        super().__init__(bootstrap, partitioner, settings, asyncio.get_running_loop().create_future)
        self._engine = _Engine(self.config, self.acc)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Mapping[str, bytes | None] | Sequence[tuple[str, bytes | None]] | None = None,
        tags: Sequence[str] | None = None,
        timestamp: int | None = None,
        partition: int | None = None,
        delay_ms: int | None = None,
        deliver_at: int | None = None,
    ) -> AsyncRecordFuture:
        """As :meth:`Producer.send`; waits (without blocking the loop) for buffer room."""
        self._check_open()
        if self._engine.txn is not None:
            self._engine.txn.check_send()
        record = _record(value, key, headers, tags, timestamp)
        due = _due(delay_ms, deliver_at)
        wait_s = self.config.max_block_ms / 1000
        partitions = await self._engine.partitions_of(topic, wait_s)
        p = self._place(topic, record, partition, partitions)
        to_topic, to_p, record = self._route(topic, p, record, due, self._engine.txn is not None)
        if to_topic != topic:
            await self._engine.partitions_of(to_topic, wait_s)
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while True:
            try:
                outcome, index, wake, rolled = self.acc.append(to_topic, to_p, record, 0)
                break
            except BufferFullError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._buffer_full() from None
                self._engine.room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._engine.room.wait(), left)
        if rolled and to_topic == topic:
            self._rolled(topic, p, partitions)
        if wake:
            self._engine.wake()
        assert isinstance(outcome, asyncio.Future)
        index = index if to_topic == topic else -1
        return AsyncRecordFuture(outcome, index, topic, p, record.timestamp)

    async def flush(self) -> None:
        self._check_open()
        await self._engine.flush()

    # --- transactions: as Producer's ----------------------------------------------------

    async def init_transactions(self) -> None:
        self._check_open()
        await self._engine.init_transactions()

    async def begin_transaction(self) -> None:
        self._check_open()
        await self._engine.begin_transaction()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[tuple[str, int], int | OffsetAndMetadata],
        group_metadata: Sequence[Any],
    ) -> None:
        self._check_open()
        await self._engine.send_offsets(offsets, group_metadata)

    async def commit_transaction(self) -> None:
        self._check_open()
        await self._engine.end_transaction(commit=True)

    async def abort_transaction(self) -> None:
        self._check_open()
        await self._engine.end_transaction(commit=False)

    async def close(self, timeout: float | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        abandon = False
        try:
            await asyncio.wait_for(self._engine.flush(), timeout)
        except TimeoutError:
            abandon = True
        await self._engine.close(abandon=abandon)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
