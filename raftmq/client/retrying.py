"""Retry topics and dead letters: :class:`RetryingConsumer` consumes topics as a member of
a group and hands each record to the application's handler; a record whose handler
raises goes to the group's retry topic of its topic, to come back after a back-off, and
after ``max_attempts`` failed attempts to the dead-letter topic (docs/clients.md,
"Retries and dead letters"; the headers: raftmq.client.retry_headers).

Why a class of its own rather than options on Consumer: the retrying consumer owns a
producer (the hand-offs) and the commits (made only once a batch is handled or handed
off, acknowledged by acks=all), so it must drive the poll loop itself; a Consumer
option would have to forbid half of Consumer's methods (commit, seek, auto-commit).

The partition is never blocked by a poison record: a failure is handed off and the next
record handled at once. A retried record comes back through the retry topic, which the
consumer subscribes to beside the original: it is sent with ``deliver_at`` (the broker's
delayed delivery makes it visible when due), and keeps its due time (the ``deliver-at``
header), so one that arrives early anyway (a broker's clock ahead of the consumer's)
waits in its partition, paused, rather than being handled before it is due.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Unpack

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.connections import bootstrap_addresses
from raftmq.client.consumer import (
    AsyncConsumer,
    CommitFailedError,
    Consumer,
    ConsumerRecord,
    ReadingSettings,
    TopicPartition,
)
from raftmq.client.errors import ClientError
from raftmq.client.producer import AsyncProducer, AsyncRecordFuture, Producer, RecordFuture
from raftmq.client.sasl import SECURITY_KEYS
from raftmq.format import delay, retry_headers
from raftmq.format.retry_headers import RetryInfo

__all__ = ["AsyncRetryingConsumer", "Handled", "RetryPolicy", "RetryingConsumer"]
log = logging.getLogger(__name__)

DEFAULT_BACKOFF_MS = (1_000, 10_000, 60_000)
MAX_BACKOFF_MS = delay.DEFAULT_MAX_DELAY_MS
"""The longest back-off: the default longest delay of delayed delivery (the topic setting
``delivery.max.delay.ms``, 40 days)."""
TOPIC_READY_S = 30.0
"""How long the consumer waits for the retry and dead-letter topics it created to have
leaders."""
Handler = Callable[[ConsumerRecord], object]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how late a failed record is tried again. ``max_attempts``: the
    handler's attempts in all, the first one included (1: no retry, a failure goes
    straight to the dead-letter topic); ``backoff_ms``: the wait before each retry, the
    last one repeated if there are more retries than entries."""

    max_attempts: int = len(DEFAULT_BACKOFF_MS) + 1
    backoff_ms: tuple[int, ...] = DEFAULT_BACKOFF_MS

    def __post_init__(self) -> None:
        n = self.max_attempts
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(
                f"max_attempts is how many times the handler may try a record in all, at "
                f"least 1 (1: no retry), not {n!r}"
            )
        backoff = self.backoff_ms
        if isinstance(backoff, (str, bytes)) or not isinstance(backoff, Sequence):
            raise ValueError(
                f"backoff_ms is a list of waits in ms, such as [1000, 10000], not {backoff!r}"
            )
        object.__setattr__(self, "backoff_ms", tuple(backoff))
        if not self.backoff_ms:
            raise ValueError(
                "backoff_ms is empty: give the wait before each retry in ms, such as [1000, "
                "10000, 60000]"
            )
        for i, ms in enumerate(self.backoff_ms):
            if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms <= MAX_BACKOFF_MS:
                raise ValueError(
                    f"backoff_ms[{i}] is {ms!r}: each wait is a whole number of ms from 0 to "
                    f"{MAX_BACKOFF_MS} (40 days, the longest delayed delivery)"
                )
        for i, (before, after) in enumerate(
            zip(self.backoff_ms, self.backoff_ms[1:], strict=False)
        ):
            if after < before:
                raise ValueError(
                    f"backoff_ms[{i + 1}] ({after} ms) is shorter than backoff_ms[{i}] "
                    f"({before} ms): back-offs grow or stay, never shrink"
                )

    def backoff_for(self, attempts: int) -> int | None:
        """After ``attempts`` failed attempts: the wait before the next, or None when
        none is left (the record is a dead letter)."""
        assert attempts >= 1, attempts
        if attempts >= self.max_attempts:
            return None
        return self.backoff_ms[min(attempts, len(self.backoff_ms)) - 1]


def next_info(
    record: ConsumerRecord, history: RetryInfo | None, error: str, now_ms: int, policy: RetryPolicy
) -> tuple[RetryInfo, int | None]:
    """The history of ``record`` after its handler failed with ``error`` at ``now_ms``
    (``history``: what its headers said before; None on its first attempt), and when its
    next attempt is due (None: it is a dead letter)."""
    if history is None:
        origin = (record.topic, record.partition, record.offset)
        attempts, first_ms = 1, now_ms
    else:
        origin = (history.original_topic, history.original_partition, history.original_offset)
        attempts, first_ms = history.attempts + 1, history.first_failure_ms
    backoff = policy.backoff_for(attempts)
    due = None if backoff is None else now_ms + backoff
    return RetryInfo(*origin, attempts, first_ms, error), due


@dataclass(slots=True)
class Handled:
    """What one :meth:`RetryingConsumer.process` did."""

    handled: int = 0
    """Records the handler took without raising."""
    retried: int = 0
    """Records handed to a retry topic."""
    dead_lettered: int = 0
    """Records handed to a dead-letter topic."""
    waiting: int = 0
    """Partitions of retry topics holding a record not yet due (paused until it is)."""


@dataclass(frozen=True, slots=True)
class _HandOff:
    """Where a failed record goes, and as what."""

    topic: str
    headers: list[tuple[str, bytes | None]]
    deliver_at: int | None
    """None for a dead letter: delivered at once."""


class _Consumer(Protocol):
    """What the retries do on either consumer (Consumer and AsyncConsumer alike)."""

    def assignment(self) -> set[TopicPartition]: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    def pause(self, *partitions: TopicPartition) -> None: ...
    def resume(self, *partitions: TopicPartition) -> None: ...


class _Retries:
    """What both retrying consumers share, without waiting on anything: the checked
    settings, the topics' names, the retry partitions waiting for a record to be due,
    and what becomes of each record."""

    def __init__(
        self,
        topics: Iterable[str] | str,
        group_id: str,
        policy: RetryPolicy | None,
        settings: ReadingSettings,
    ) -> None:
        self.policy = policy if policy is not None else RetryPolicy()
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError("give one or more topic names to consume")
        if not group_id:
            raise ValueError(
                "a retrying consumer needs a group_id: its commits and topics are the group's"
            )
        if "enable_auto_commit" in settings:
            raise ValueError(
                "a retrying consumer commits by itself, once records are handled or handed "
                "off: leave enable_auto_commit out"
            )
        self.group_id = group_id
        self.topics = names
        self.retry_topics = {retry_headers.retry_topic(t, group_id): t for t in names}
        """Each retry topic -> the topic it retries."""
        self.dead_letter_topics = {t: retry_headers.dead_letter_topic(t, group_id) for t in names}
        given: dict[str, Any] = dict(settings)
        self.shared = {k: given[k] for k in (*SECURITY_KEYS, "client_id") if k in given}
        """The settings its producer and admin client take too."""
        self.waiting: dict[TopicPartition, int] = {}
        """Retry partitions paused until their next record is due: the time (ms)."""

    @property
    def subscription(self) -> list[str]:
        return [*self.topics, *self.retry_topics]

    def topic_pairs(self) -> list[tuple[str, list[str]]]:
        """Each topic with the retry and dead-letter topics that serve it."""
        return [
            (t, [retry_headers.retry_topic(t, self.group_id), self.dead_letter_topics[t]])
            for t in self.topics
        ]

    def forget(self, partitions: set[TopicPartition]) -> None:
        """on_revoke: the group took these; their waits go with them."""
        for tp in partitions:
            self.waiting.pop(tp, None)

    def resume_due(self, consumer: _Consumer) -> None:
        now_ms = _now_ms()
        held = consumer.assignment()
        for tp, due_ms in list(self.waiting.items()):
            if tp not in held:
                del self.waiting[tp]
            elif due_ms <= now_ms:
                del self.waiting[tp]
                consumer.resume(tp)

    def ready(
        self,
        consumer: _Consumer,
        record: ConsumerRecord,
        first: dict[TopicPartition, int],
        commits: dict[TopicPartition, int],
    ) -> tuple[bool, RetryInfo | None]:
        """Whether ``record`` goes to the handler now, and its history. Not when its
        partition waits for an earlier record, nor when it is not due yet: then its
        partition is held at it, paused, and committed up to it. ``first`` gets each
        partition's first offset of the poll."""
        tp = (record.topic, record.partition)
        if tp in self.waiting:
            return False, None  # an earlier record of this partition is not due yet
        first.setdefault(tp, record.offset)
        history, due_ms = self._history(record)
        if due_ms is not None and due_ms > _now_ms():
            consumer.seek(tp, record.offset)
            consumer.pause(tp)
            self.waiting[tp] = due_ms
            commits[tp] = record.offset
            return False, None
        return True, history

    def rewind(self, consumer: _Consumer, first: dict[TopicPartition, int]) -> None:
        """Put each partition back at ``first`` (none of it committed), not waiting."""
        for tp, offset in first.items():
            self.waiting.pop(tp, None)
            consumer.seek(tp, offset)
            consumer.resume(tp)

    def _history(self, record: ConsumerRecord) -> tuple[RetryInfo | None, int | None]:
        """A retry topic's record's history and due time (None, None for an original
        topic's)."""
        if record.topic not in self.retry_topics:
            return None, None
        try:
            return retry_headers.decode(record.headers), retry_headers.due_ms(record.headers)
        except ValueError as exc:
            log.warning(
                "%s/%d offset %d: %s; it is handled as a new record",
                record.topic,
                record.partition,
                record.offset,
                exc,
            )
            return None, None

    def hand_off(
        self, record: ConsumerRecord, history: RetryInfo | None, exc: Exception, done: Handled
    ) -> _HandOff:
        """Where ``record``, which its handler failed on, goes: its retry topic, when due,
        or its dead-letter topic."""
        now_ms = _now_ms()
        info, due = next_info(record, history, retry_headers.error_text(exc), now_ms, self.policy)
        headers = retry_headers.strip(record.headers) + retry_headers.encode(info)
        served = self.retry_topics.get(record.topic, record.topic)  # the topic retried
        if due is not None:
            done.retried += 1
            return _HandOff(retry_headers.retry_topic(served, self.group_id), headers, due)
        done.dead_lettered += 1
        to = self.dead_letter_topics[served]
        log.warning(
            "%s/%d offset %d failed %d times, last with %s: sent to %s",
            info.original_topic,
            info.original_partition,
            info.original_offset,
            info.attempts,
            info.last_error,
            to,
        )
        return _HandOff(to, headers, None)

    def refused(self, exc: CommitFailedError) -> None:
        """A commit the group refused: the partitions moved on, their new owner redoes
        those records."""
        log.warning("group %s refused a commit: %s", self.group_id, exc)


class RetryingConsumer:
    """A group member that hands each record of ``topics`` to ``handler``; a record whose
    handler raises is retried after a back-off, through the retry topic
    ``<topic>.<group_id>.retry``, and after ``policy.max_attempts`` failed attempts is
    sent to ``<topic>.<group_id>.dlq``, with headers saying where it came from, how often
    it failed, since when, and the last error. Offsets are committed only once their
    records are handled or handed off (acknowledged by acks=all): a crash in between
    redelivers, nothing is lost. Call :meth:`process` in a loop; use from one thread.

    ``create_topics``: create the retry and dead-letter topics that do not exist yet
    (with the partitions and replication factor of the topic they serve), at once.
    ``consumer`` is the Consumer underneath, for reads (``assignment()``,
    ``committed()``); committing or seeking through it breaks the promise above."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        topics: Iterable[str] | str,
        handler: Handler,
        *,
        group_id: str,
        policy: RetryPolicy | None = None,
        create_topics: bool = True,
        **settings: Unpack[ReadingSettings],
    ) -> None:
        self._retries = core = _Retries(topics, group_id, policy, settings)
        self.handler = handler
        if create_topics:
            _create_topics(bootstrap, core.topic_pairs(), core.shared)
        self._producer = Producer(
            bootstrap, acks="all", enable_idempotence=True, linger_ms=1, **core.shared
        )
        try:
            self.consumer = Consumer(
                bootstrap, group_id=group_id, enable_auto_commit=False, **settings
            )
            self.consumer.subscribe(core.subscription, on_revoke=core.forget)
        except BaseException:
            self._producer.close()
            raise

    def process(self, timeout: float = 1.0) -> Handled:
        """Poll once (waiting up to ``timeout`` s for records), hand each record to the
        handler, hand the failed ones off, wait until every hand-off is acknowledged, then
        commit. Raises the ClientError of a hand-off that failed for good, or the
        handler's BaseException (KeyboardInterrupt, SystemExit): nothing of that poll is
        committed then, and its partitions go back to its first records, so the next
        ``process`` (or the next owner) handles them again."""
        done = Handled()
        core = self._retries
        core.resume_due(self.consumer)
        records = self.consumer.poll(timeout)
        first: dict[TopicPartition, int] = {}
        try:
            commits = self._handle(records, first, done)
        except BaseException:
            core.rewind(self.consumer, first)
            raise
        if commits:
            try:
                self.consumer.commit(commits)
            except CommitFailedError as exc:
                core.refused(exc)
        done.waiting = len(core.waiting)
        return done

    def _handle(
        self, records: list[ConsumerRecord], first: dict[TopicPartition, int], done: Handled
    ) -> dict[TopicPartition, int]:
        """Handle ``records`` and hand the failed ones off, acknowledged; the offsets to
        commit."""
        commits: dict[TopicPartition, int] = {}
        hand_offs: list[RecordFuture] = []
        for record in records:
            go, history = self._retries.ready(self.consumer, record, first, commits)
            if not go:
                continue
            try:
                self.handler(record)
                done.handled += 1
            except Exception as exc:  # the application's failure: retried, never raised
                to = self._retries.hand_off(record, history, exc, done)
                hand_offs.append(
                    self._producer.send(
                        to.topic,
                        record.value,
                        key=record.key,
                        headers=to.headers,
                        deliver_at=to.deliver_at,
                    )
                )
            commits[record.topic, record.partition] = record.offset + 1
        if hand_offs:
            self._producer.flush()
            for future in hand_offs:
                future.result()  # raises what stopped it
        return commits

    def close(self) -> None:
        """Leave the group (what was handled is committed already) and stop."""
        try:
            self.consumer.close()
        finally:
            self._producer.close()

    def __enter__(self) -> RetryingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetryingConsumer:
    """The retrying consumer for asyncio code, as :class:`RetryingConsumer` (``await
    process()``; the handler may be a coroutine function); create it inside the loop
    that uses it. It makes no call before its first ``process``, which creates the
    retry and dead-letter topics (off the loop) and joins the group."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        topics: Iterable[str] | str,
        handler: Handler,
        *,
        group_id: str,
        policy: RetryPolicy | None = None,
        create_topics: bool = True,
        **settings: Unpack[ReadingSettings],
    ) -> None:
        self._retries = core = _Retries(topics, group_id, policy, settings)
        self.handler = handler
        self._bootstrap = bootstrap
        self._create_topics = create_topics
        self._producer = AsyncProducer(
            bootstrap, acks="all", enable_idempotence=True, linger_ms=1, **core.shared
        )
        self.consumer = AsyncConsumer(
            bootstrap, group_id=group_id, enable_auto_commit=False, **settings
        )
        self._joined = False

    async def process(self, timeout: float = 1.0) -> Handled:
        """As RetryingConsumer.process."""
        core = self._retries
        if not self._joined:
            if self._create_topics:
                await asyncio.to_thread(
                    _create_topics, self._bootstrap, core.topic_pairs(), core.shared
                )
            self.consumer.subscribe(core.subscription, on_revoke=core.forget)
            self._joined = True
        done = Handled()
        core.resume_due(self.consumer)
        records = await self.consumer.poll(timeout)
        first: dict[TopicPartition, int] = {}
        try:
            commits = await self._handle(records, first, done)
        except BaseException:
            core.rewind(self.consumer, first)
            raise
        if commits:
            try:
                await self.consumer.commit(commits)
            except CommitFailedError as exc:
                core.refused(exc)
        done.waiting = len(core.waiting)
        return done

    async def _handle(
        self, records: list[ConsumerRecord], first: dict[TopicPartition, int], done: Handled
    ) -> dict[TopicPartition, int]:
        commits: dict[TopicPartition, int] = {}
        hand_offs: list[AsyncRecordFuture] = []
        for record in records:
            go, history = self._retries.ready(self.consumer, record, first, commits)
            if not go:
                continue
            try:
                result = self.handler(record)
                if inspect.isawaitable(result):
                    await result
                done.handled += 1
            except Exception as exc:  # the application's failure: retried, never raised
                to = self._retries.hand_off(record, history, exc, done)
                hand_offs.append(
                    await self._producer.send(
                        to.topic,
                        record.value,
                        key=record.key,
                        headers=to.headers,
                        deliver_at=to.deliver_at,
                    )
                )
            commits[record.topic, record.partition] = record.offset + 1
        if hand_offs:
            await self._producer.flush()
            for future in hand_offs:
                await future  # raises what stopped it
        return commits

    async def close(self) -> None:
        try:
            await self.consumer.close()
        finally:
            await self._producer.close()

    async def __aenter__(self) -> AsyncRetryingConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _create_topics(
    bootstrap: str | Sequence[str], pairs: list[tuple[str, list[str]]], settings: dict[str, Any]
) -> None:
    """Create each missing retry and dead-letter topic like the topic it serves (its
    partitions and replication factor), and wait until they have leaders."""
    with AdminClient(bootstrap_addresses(bootstrap), **settings) as admin:
        created = []
        for topic, derived in pairs:
            try:
                described = admin.describe_topic(topic)
            except ClientError as exc:
                if exc.code == pb.ERROR_CODE_UNKNOWN_TOPIC:
                    raise ValueError(
                        f"topic {topic} does not exist; create it before consuming it with "
                        "retries ('raftmq topic create')"
                    ) from None
                raise
            for name in derived:
                try:
                    admin.create_topic(
                        name, len(described.partitions), described.replication_factor
                    )
                    created.append(name)
                except ClientError as exc:
                    if exc.code != pb.ERROR_CODE_TOPIC_ALREADY_EXISTS:
                        raise
        deadline = time.monotonic() + TOPIC_READY_S
        for name in created:
            while not all(p.leader_id for p in admin.describe_topic(name).partitions):
                if time.monotonic() > deadline:
                    raise ClientError(
                        f"topic {name} has partitions without a leader {TOPIC_READY_S:.0f} s "
                        "after it was created",
                        pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
                        None,
                        {},
                    )
                time.sleep(0.1)
