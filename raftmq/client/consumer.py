"""The consumer: ``assign`` partitions, or ``subscribe`` to topics as a member of a
group, then ``poll`` returns their records in offset order per partition, fetched ahead
in the background (raftmq.client.fetcher).

Two faces over one fetcher: :class:`Consumer` (its fetcher runs an event loop on a thread
of its own; use the consumer from one thread) and :class:`AsyncConsumer` (its fetcher
runs in the caller's loop). Where a partition starts is a ``seek``, the group's committed
offset, or ``auto_offset_reset``.

Group mode (``group_id`` and ``subscribe``): the group session
(raftmq.client.group_session) heartbeats on the I/O loop; ``poll`` runs the on_assign,
on_revoke and on_lost callbacks in the caller's thread, and, with
``enable_auto_commit``, commits the positions of what earlier polls returned, every
``auto_commit_interval_ms``, before a partition is given up, and on close. Committing
in ``poll`` (not on a timer of the loop) is what makes auto-commit at-least-once: a
position is committed only once the caller came back for more. ``unsubscribe`` gives
everything up as ``close`` does (and leaves, a static member too), keeping the consumer
for another ``subscribe`` or ``assign``. Commits name an offset or an
:class:`OffsetAndMetadata` per partition; ``committed(with_metadata=True)`` reads both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import re
import threading
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar, Unpack, overload

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.connections import (
    TlsSettings,
    bootstrap_addresses,
    checked_client_id,
    client_id_headers,
)
from raftmq.client.errors import ClientError
from raftmq.client.fetcher import (
    Chunk,
    Fetcher,
    NoOffsetError,
    OffsetReset,
    PartitionState,
    TopicPartition,
)
from raftmq.client.group_link import Commits, GroupLink, OffsetAndMetadata
from raftmq.client.group_session import CommitFailedError, GroupEvent, GroupSession, positions
from raftmq.client.sasl import SaslSettings, security_of
from raftmq.format import entry, tag_filter
from raftmq.format.records import decode_records
from raftmq.format.tag_filter import TagFilter
from raftmq.format.tags import record_tags
from raftmq.limits import MAX_OFFSET_METADATA_CHARS, RACK

__all__ = [
    "AsyncConsumer",
    "CommitFailedError",
    "Consumer",
    "ConsumerRecord",
    "NoOffsetError",
    "OffsetAndMetadata",
    "TopicPartition",
]
T = TypeVar("T")
IsolationLevel = Literal["read_uncommitted", "read_committed"]
log = logging.getLogger(__name__)
Partitions = set[TopicPartition]
Callback = Callable[[Partitions], Any]
"""on_assign / on_revoke / on_lost: called with the set of partitions (an async
consumer's may be a coroutine function)."""
ASSIGNORS = ("sticky", "range", "round_robin")
Committed = dict[TopicPartition, int | None]
CommittedWithMetadata = dict[TopicPartition, OffsetAndMetadata | None]


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int | None = None
    """How many times a share group delivered the record, this time included (1 on the
    first delivery; raftmq.client.share_consumer); None from a consumer."""


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    bootstrap: tuple[str, ...]
    auto_offset_reset: OffsetReset = "latest"
    """Where a partition without a position starts: 'earliest', 'latest', or 'error'
    (poll raises NoOffsetError until the caller seeks). Also where one restarts whose
    position fell below the log start (retention deleted it)."""
    max_poll_records: int = 500
    fetch_max_wait_ms: int = 500
    """How long the broker holds a fetch that found nothing new (long poll)."""
    fetch_max_bytes: int = 1024 * 1024
    """Bytes per fetch, and what each partition may hold fetched but not yet polled."""
    max_buffer_bytes: int = 64 * 1024 * 1024
    """What all partitions together may hold fetched but not yet polled."""
    isolation_level: IsolationLevel = "read_uncommitted"
    """'read_uncommitted': every record below the high watermark, open and aborted
    transactions' included. 'read_committed': only below the last stable offset (no
    transaction still open before it), without aborted transactions' records
    (docs/transactions.md)."""
    client_rack: str | None = None
    """This consumer's rack: each partition is read from its in-sync replica in that
    rack when it has one (less cross-rack traffic), else from its leader."""
    tag_filter: str | None = None
    """A tag expression (docs/tags.md), e.g. ``"paid && (eu || us)"``: ``poll`` returns
    only records whose tags match it, and the brokers send only the batches that may
    hold one. Positions and commits still move past the records it filters out. One
    that does not parse is a ValueError naming the position of the mistake."""
    group_id: str | None = None
    """The consumer group: needed by ``subscribe`` and by ``commit``/``committed``."""
    enable_auto_commit: bool = True
    """Commit the positions of what ``poll`` returned, in ``poll`` every
    auto_commit_interval_ms, before giving a partition up, and on close."""
    auto_commit_interval_ms: int = 5000
    session_timeout_ms: int = 45_000
    """A member silent this long is removed from the group and its partitions handed on."""
    group_instance_id: str | None = None
    """Static membership: a restart with the same id within the session timeout takes
    the partitions back without a rebalance; close() does not leave the group."""
    assignor: str = "sticky"
    """How the coordinator spreads partitions: sticky, range or round_robin."""
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
    (docs/quotas.md). None: ``consumer-N``, one per consumer of the process."""

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ValueError("give at least one broker address host:port in bootstrap")
        security_of(self)  # raises ValueError for sasl_ settings that do not go together
        object.__setattr__(self, "client_id", checked_client_id(self.client_id, "consumer"))
        if self.auto_offset_reset not in ("earliest", "latest", "error"):
            raise ValueError(
                "auto_offset_reset must be 'earliest', 'latest' or 'error', not "
                f"{self.auto_offset_reset!r}"
            )
        if self.max_poll_records < 1:
            raise ValueError(f"max_poll_records must be at least 1, not {self.max_poll_records}")
        if not 0 <= self.fetch_max_wait_ms <= 60_000:
            raise ValueError(f"fetch_max_wait_ms must be 0-60000, not {self.fetch_max_wait_ms}")
        if not 1 <= self.fetch_max_bytes <= 64 * 1024 * 1024:
            raise ValueError(f"fetch_max_bytes must be 1 B to 64 MiB, not {self.fetch_max_bytes}")
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                "isolation_level must be 'read_uncommitted' or 'read_committed', not "
                f"{self.isolation_level!r}"
            )
        if self.client_rack is not None and not RACK.fullmatch(self.client_rack):
            raise ValueError(
                f"client_rack {self.client_rack!r} is not a rack name: brokers' racks are "
                "1-64 characters of A-Z a-z 0-9 . _ - (or leave it None to read from leaders)"
            )
        if self.tag_filter is not None:
            tag_filter.parse(self.tag_filter)  # raises TagFilterError, a ValueError
        if self.max_buffer_bytes < self.fetch_max_bytes:
            raise ValueError(
                f"max_buffer_bytes ({self.max_buffer_bytes}) must hold at least one fetch "
                f"(fetch_max_bytes {self.fetch_max_bytes})"
            )
        if self.group_id is not None and not self.group_id:
            raise ValueError("group_id is a name (1-255 of A-Z a-z 0-9 . _ -), or None")
        if not 1000 <= self.session_timeout_ms <= 300_000:
            raise ValueError(
                f"session_timeout_ms must be 1000-300000, not {self.session_timeout_ms}"
            )
        if self.auto_commit_interval_ms < 1:
            raise ValueError(
                f"auto_commit_interval_ms must be positive, not {self.auto_commit_interval_ms}"
            )
        if self.assignor not in ASSIGNORS:
            raise ValueError(
                f"assignor must be one of {', '.join(ASSIGNORS)}, not {self.assignor!r}"
            )
        if self.group_instance_id is not None and self.group_id is None:
            raise ValueError("group_instance_id needs a group_id")


def _take(fetcher: Fetcher, max_records: int) -> tuple[list[ConsumerRecord], int]:
    """Up to ``max_records`` records from the buffers, partition after partition (each
    in offset order), advancing positions; raises a partition's pending error first.
    Returns the records and the bytes of buffer freed."""
    out: list[ConsumerRecord] = []
    freed = 0
    with fetcher.lock:
        for tp, state in fetcher.states.items():
            if state.error is not None:
                err, state.error = state.error, None
                raise err
            if state.paused:
                continue
            while state.buffered and len(out) < max_records:
                chunk = state.buffered[0]
                taken, done = _records_of(
                    tp, state, chunk, max_records - len(out), fetcher.tag_filter
                )
                out += taken
                if done:
                    state.buffered.popleft()
                    state.buffered_bytes -= len(chunk.entries)
                    fetcher.total_bytes -= len(chunk.entries)
                    freed += len(chunk.entries)
                    if state.position is not None and state.position < chunk.next_offset:
                        state.position = chunk.next_offset  # past control entries too
            if len(out) >= max_records:
                break
    return out, freed


def _records_of(
    tp: TopicPartition, state: PartitionState, chunk: Chunk, limit: int, flt: TagFilter | None
) -> tuple[list[ConsumerRecord], bool]:
    """The records of ``chunk`` at or after the position (at most ``limit``), and whether
    the chunk is used up. With a tag filter, only the records that match it: the broker
    sends whole batches that may hold one (a batch mixing tags comes whole)."""
    out: list[ConsumerRecord] = []
    position = state.position if state.position is not None else 0
    for header in entry.iter_headers(chunk.entries):
        if header.next_offset <= position or header.type != entry.EntryType.DATA:
            continue
        if (
            chunk.aborted
            and header.attributes & entry.TRANSACTIONAL
            and chunk.drops(header.producer_id, header.base_offset)
        ):
            continue  # an aborted transaction's: read_committed never returns it
        if flt is not None and not header.attributes & entry.TAGGED and not flt.matches_untagged:
            position = max(position, header.next_offset)  # no record of it can match
            continue
        for r in decode_records(chunk.entries, header):
            if r.offset < position:
                continue
            if len(out) == limit:
                state.position = position
                return out, False
            if flt is not None and not flt.matches(record_tags(r)):
                position = r.offset + 1
                continue
            out.append(
                ConsumerRecord(tp[0], tp[1], r.offset, r.key, r.value, r.timestamp, r.headers)
            )
            position = r.offset + 1
    state.position = position
    return out, True


class ReadingSettings(TlsSettings, SaslSettings, total=False):
    """The keyword settings of every consumer but the group's id and auto-commit: also
    those of raftmq.client.retrying.RetryingConsumer, which names its group apart and
    commits by itself (defaults and meaning: ConsumerConfig)."""

    auto_offset_reset: OffsetReset
    max_poll_records: int
    fetch_max_wait_ms: int
    fetch_max_bytes: int
    max_buffer_bytes: int
    isolation_level: IsolationLevel
    client_rack: str | None
    tag_filter: str | None
    session_timeout_ms: int
    group_instance_id: str | None
    assignor: str
    client_id: str | None


class ConsumerSettings(ReadingSettings, total=False):
    """The keyword settings of both consumers (defaults and meaning: ConsumerConfig)."""

    group_id: str | None
    enable_auto_commit: bool
    auto_commit_interval_ms: int


class ConsumerGroupMetadata(NamedTuple):
    """A consumer's place in its group (Consumer.group_metadata)."""

    group_id: str
    member_id: str
    member_epoch: int


@dataclass(slots=True)
class _Callbacks:
    on_assign: Callback | None = None
    on_revoke: Callback | None = None
    on_lost: Callback | None = None
    """None: on_revoke is called for lost partitions too."""

    def of(self, event: GroupEvent) -> Callback | None:
        if event.kind == "assign":
            return self.on_assign
        if event.kind == "lost":
            return self.on_lost or self.on_revoke
        return self.on_revoke


class _Face:
    """What both consumers share: the settings, the fetcher's making, the offset
    lookups (ListOffsets at each partition's leader), and the group's bookkeeping."""

    _fetcher: Fetcher

    def __init__(self, bootstrap: str | Sequence[str], settings: ConsumerSettings) -> None:
        addresses = bootstrap_addresses(bootstrap)
        self.config = ConsumerConfig(addresses, **settings)
        self.closed = False
        self._session: GroupSession | None = None
        self._callbacks = _Callbacks()
        self._link: GroupLink | None = None  # assign mode's commits
        self._commit_turn: asyncio.Lock | None = None
        """Assign mode's commits go one at a time, as a member's do (GroupSession.commit)."""
        self._auto_commit_at = time.monotonic()
        self._in_callback = False
        """Inside on_assign / on_revoke / on_lost (run by ``poll``)."""

    def _make_fetcher(self, on_data: Callable[[], None]) -> Fetcher:
        c = self.config
        return Fetcher(
            c.bootstrap,
            auto_offset_reset=c.auto_offset_reset,
            fetch_max_wait_ms=c.fetch_max_wait_ms,
            partition_buffer_bytes=c.fetch_max_bytes,
            max_buffer_bytes=c.max_buffer_bytes,
            on_data=on_data,
            client_rack=c.client_rack,
            read_committed=c.isolation_level == "read_committed",
            tag_filter=None if c.tag_filter is None else tag_filter.parse(c.tag_filter),
            security=security_of(c),
            headers=client_id_headers(c.client_id or ""),
        )

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the consumer is closed; create a new one")

    def _group_id(self, what: str) -> str:
        if self.config.group_id is None:
            raise ValueError(f"{what} needs a consumer group: create the consumer with group_id")
        return self.config.group_id

    def _check_subscribe(self, callbacks: _Callbacks) -> None:
        self._check_open()
        self._group_id("subscribe")
        if self._session is None and self._fetcher.states:
            raise RuntimeError(
                "this consumer has partitions from assign(); a consumer either assigns or "
                "subscribes (create another for the other)"
            )
        self._callbacks = callbacks

    def _check_assign(self) -> None:
        self._check_open()
        if self._session is not None:
            raise RuntimeError(
                "this consumer subscribed: its group assigns its partitions (create another "
                "consumer to assign partitions yourself)"
            )

    def _new_session(self, notify: Callable[[], None]) -> GroupSession:
        c = self.config
        assert c.group_id is not None
        return GroupSession(
            self._fetcher,
            c.group_id,
            instance_id=c.group_instance_id,
            session_timeout_ms=c.session_timeout_ms,
            assignor=c.assignor,
            notify=notify,
        )

    def _check_unsubscribe(self) -> None:
        self._check_open()
        if self._in_callback:
            raise RuntimeError(
                "unsubscribe() inside on_assign, on_revoke or on_lost: poll is handing "
                "partitions over; call it after poll returns"
            )

    def _commits(self, offsets: Commits | None) -> dict[TopicPartition, int | OffsetAndMetadata]:
        """What ``commit`` commits, checked in the caller's thread: ``offsets`` (an offset
        or OffsetAndMetadata per partition), or every position held."""
        self._check_open()
        self._group_id("commit")
        if offsets is None:
            return dict(self._positions())
        for tp, o in offsets.items():
            if not (isinstance(tp, tuple) and len(tp) == 2):
                raise ValueError(f"commit offsets per (topic, partition), not per {tp!r}")
            offset, metadata = o if isinstance(o, OffsetAndMetadata) else (o, "")
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise TypeError(
                    f"commit an offset (int) or OffsetAndMetadata(offset, metadata) for "
                    f"{tp!r}, not {o!r}"
                )
            _check_offset(offset)
            _check_metadata(tp, metadata)
        return dict(offsets)

    def _group_step(self) -> GroupEvent | None:
        """In ``poll``: the session's refusal, if any, then the next event to handle."""
        session = self._session
        if session is None:
            return None
        if session.error is not None:
            err, session.error = session.error, None
            raise err
        return session.events.popleft() if session.events else None

    def _stamp(self, offsets: Commits) -> dict[TopicPartition, int] | None:
        """In the caller's thread, with the offsets a commit names: the partitions'
        tenures now, so the commit is refused if one is lost before it is sent."""
        return self._session.stamp(offsets) if self._session is not None else None

    def _auto_commit_due(self) -> dict[TopicPartition, int] | None:
        """With auto-commit, every auto_commit_interval_ms: the positions to commit (of
        what earlier polls returned; read before this poll takes more)."""
        c = self.config
        if not c.enable_auto_commit or c.group_id is None:
            return None
        now = time.monotonic()
        if (now - self._auto_commit_at) * 1000 < c.auto_commit_interval_ms:
            return None
        self._auto_commit_at = now
        return self._positions()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group membership a transactional producer sends with the offsets it
        commits in its transaction (Producer.send_offsets_to_transaction): the
        coordinator checks them as it checks this consumer's own commits, so a consumer
        that lost its partitions in a rebalance cannot commit them through a
        transaction either. Outside a group's membership (assign mode): member id "" and
        epoch 0."""
        group_id = self._group_id("group_metadata")
        session = self._session
        if session is None:
            return ConsumerGroupMetadata(group_id, "", 0)
        m = session.membership
        return ConsumerGroupMetadata(group_id, m.member_id, m.epoch)

    def _positions(self) -> dict[TopicPartition, int]:
        if self._session is not None:
            return self._session.positions()
        return positions(self._fetcher)

    async def _commit(
        self, offsets: Commits, stamp: dict[TopicPartition, int] | None = None
    ) -> None:
        """On the loop: as the member (refused if a partition was lost since ``stamp``),
        or (assign mode) outside the membership."""
        if self._session is not None:
            await self._session.commit(offsets, stamp)
            return
        if not offsets:
            return
        if self._link is None:
            self._link = GroupLink(self._fetcher.links)
        if self._commit_turn is None:
            self._commit_turn = asyncio.Lock()
        group_id = self._group_id("commit")
        try:
            async with self._commit_turn:
                await self._link.commit(group_id, "", 0, offsets)
        except ClientError as err:
            if err.code != pb.ERROR_CODE_GROUP_NOT_EMPTY:
                raise
            raise CommitFailedError(
                f"group {group_id} refused the commit: {err} (a consumer using assign() "
                "commits for a group only while it has no members)",
                err.code,
                err.status,
                err.meta,
                err.code_name,
            ) from None

    async def _auto_commit(
        self, offsets: dict[TopicPartition, int], stamp: dict[TopicPartition, int] | None = None
    ) -> None:
        try:
            await self._commit(offsets, stamp)
        except ClientError as err:  # the next one, or the heartbeat, mends it
            log.warning("auto-commit of group %s failed: %s", self.config.group_id, err)

    async def _committed(
        self, partitions: Iterable[TopicPartition] | None, with_metadata: bool
    ) -> Committed | CommittedWithMetadata:
        wanted = sorted(set(self._fetcher.states if partitions is None else partitions))
        if self._link is None:
            self._link = GroupLink(self._fetcher.links)
        found = await self._link.fetch_offsets(self._group_id("committed"), wanted)
        if with_metadata:
            return {tp: found.get(tp) for tp in wanted}
        return {tp: o.offset if (o := found.get(tp)) is not None else None for tp in wanted}

    def _subscribe(self, notify: Callable[[], None], topics: list[str] | re.Pattern[str]) -> None:
        """On the loop."""
        if self._session is None:
            self._session = self._new_session(notify)
        self._session.subscribe(topics)

    def _closing_held(self) -> Partitions:
        """What on_revoke is told at close: the partitions being consumed."""
        if self._session is None:
            return set()
        held = self._session.membership.held
        return {tp for tp in dict(self._fetcher.states) if tp in held}

    def _resumable(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Not those the group is taking away (paused until ``poll`` gives them up)."""
        stopping = self._session.stopping if self._session is not None else set()
        return [tp for tp in partitions if tp not in stopping]

    async def _close_group(self, *, leave: bool) -> None:
        """On the loop, at close or unsubscribe, after on_revoke: commit (auto-commit) and
        stop heartbeating, leaving the group if ``leave``."""
        session = self._session
        if session is not None:
            if self.config.enable_auto_commit:
                await self._auto_commit(session.positions())
            await session.close(leave=leave)
        elif self.config.enable_auto_commit and self.config.group_id is not None:
            await self._auto_commit(positions(self._fetcher))

    async def _unsubscribe(self) -> None:
        """On the loop, after on_revoke: commit (auto-commit), leave the group (a static
        member too: it asked to consume nothing, so its partitions must go to others now,
        not after its session timeout), and drop every partition, so the consumer may
        subscribe or assign afresh."""
        await self._close_group(leave=True)
        self._session = None
        self._callbacks = _Callbacks()
        self._fetcher.assign([])


async def _offsets(
    fetcher: Fetcher, specs: Mapping[TopicPartition, pb.ListOffsetsRequest]
) -> dict[TopicPartition, int]:
    return {tp: await fetcher.list_offset(tp, spec) for tp, spec in specs.items()}


async def _seek_to(
    fetcher: Fetcher, partitions: Sequence[TopicPartition], where: pb.OffsetPosition
) -> None:
    partitions = partitions or tuple(fetcher.states)
    specs = {tp: pb.ListOffsetsRequest(position=where) for tp in partitions}
    for tp, offset in (await _offsets(fetcher, specs)).items():
        fetcher.seek(tp, offset, reached=True)  # a broker's answer: the log has it


async def _partitions_for(fetcher: Fetcher, topic: str) -> list[int]:
    await fetcher.links.refresh()
    return list(range(fetcher.links.view.partitions.get(topic, 0)))


def _time_specs(times: Mapping[TopicPartition, int]) -> dict[TopicPartition, pb.ListOffsetsRequest]:
    return {tp: pb.ListOffsetsRequest(timestamp_ms=ts) for tp, ts in times.items()}


def _check_offset(offset: int) -> None:
    if offset < 0:
        raise ValueError(f"offset {offset} is negative; offsets start at 0")


def _check_metadata(tp: TopicPartition, metadata: str) -> None:
    """The coordinator's bound, checked before anything is sent (it refuses the same)."""
    if not isinstance(metadata, str):
        raise TypeError(f"the metadata of {tp!r} is text (str), not {type(metadata).__name__}")
    if len(metadata) > MAX_OFFSET_METADATA_CHARS:
        raise ValueError(
            f"the metadata of {tp[0]}/{tp[1]} is {len(metadata)} characters; a group keeps "
            f"at most {MAX_OFFSET_METADATA_CHARS} per offset (keep a reference to larger "
            "state there, not the state itself)"
        )


def _topics(topics: Iterable[str] | str | re.Pattern[str]) -> list[str] | re.Pattern[str]:
    if isinstance(topics, re.Pattern):
        return topics
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ValueError("subscribe to one or more topic names, or a compiled re pattern")
    return names


class Consumer(_Face):
    """A consumer for one thread. ``with Consumer(...) as c:`` closes it on exit."""

    def __init__(
        self, bootstrap: str | Sequence[str], **settings: Unpack[ConsumerSettings]
    ) -> None:
        """``bootstrap``: broker addresses host:port (a list, or comma-separated); the
        settings and their defaults: ConsumerConfig."""
        super().__init__(bootstrap, settings)
        self._data = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftmq-consumer", daemon=True
        )
        self._thread.start()
        self._fetcher = self._wait(self._make())

    async def _make(self) -> Fetcher:
        return self._make_fetcher(self._notify)

    def _notify(self) -> None:
        with self._data:
            self._data.notify_all()

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _on_loop(self, fn: Callable[..., None], *args: object) -> None:
        async def call() -> None:
            fn(*args)

        self._wait(call())

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing any earlier assignment). With a
        group_id, commits go to that group outside its membership (member id "")."""
        self._check_assign()
        self._on_loop(self._fetcher.assign, list(partitions))

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        *,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        on_lost: Callback | None = None,
    ) -> None:
        """Join the group (``group_id``) and consume the partitions it assigns, of these
        topics, or of every topic a compiled pattern matches in full (checked again as
        topics come and go). The callbacks run inside ``poll``, in its thread:
        on_assign after partitions are added (seek there to override the committed
        offset), on_revoke before they are given up (commit there yourself without
        auto-commit), on_lost when the group dropped this member (they may be another's
        already: do not commit; without on_lost, on_revoke is called)."""
        self._check_subscribe(_Callbacks(on_assign, on_revoke, on_lost))
        self._on_loop(self._subscribe, self._notify, _topics(topics))

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.states)

    def partitions_for(self, topic: str) -> list[int]:
        """The partitions of ``topic`` (asking the cluster); [] when it does not exist."""
        return self._wait(_partitions_for(self._fetcher, topic))

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """The records ready now, waiting up to ``timeout`` s for some; at most
        max_poll_records."""
        self._check_open()
        deadline = time.monotonic() + timeout
        while True:
            self._handle_group()
            records, freed = _take(self._fetcher, self.config.max_poll_records)
            if freed:
                self._loop.call_soon_threadsafe(self._fetcher.consumed, freed)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            with self._data:
                self._data.wait(min(left, 0.1))

    def _handle_group(self) -> None:
        """In ``poll``: the group's news (callbacks here, in the caller's thread), then
        auto-commit when due."""
        while (event := self._group_step()) is not None:
            assert self._session is not None
            session, callback = self._session, self._callbacks.of(event)
            commit = self.config.enable_auto_commit
            if event.kind == "assign":
                self._wait(session.finish(event, commit=commit))
                self._call(callback, set(event.partitions))
                continue
            try:
                self._call(callback, set(event.partitions))
            finally:
                self._wait(session.finish(event, commit=commit))
        due = self._auto_commit_due()
        if due:
            asyncio.run_coroutine_threadsafe(self._auto_commit(due, self._stamp(due)), self._loop)

    def _call(self, callback: Callback | None, partitions: Partitions) -> None:
        if callback is None:
            return
        self._in_callback = True
        try:
            callback(partitions)
        finally:
            self._in_callback = False

    def commit(
        self,
        offsets: Commits | None = None,
        *,
        asynchronous: bool = False,
    ) -> concurrent.futures.Future[None] | None:
        """Commit ``offsets`` (per partition, the next offset to consume, or an
        OffsetAndMetadata(offset, metadata) to keep text beside it), or the position of
        every partition held. Waits for the group's answer, raising CommitFailedError if
        it refused (the member was fenced: another may consume those partitions now),
        unless ``asynchronous``: then returns a future."""
        chosen = self._commits(offsets)
        future = asyncio.run_coroutine_threadsafe(
            self._commit(chosen, self._stamp(chosen)), self._loop
        )
        if asynchronous:
            return future
        future.result()
        return None

    @overload
    def committed(
        self,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        with_metadata: Literal[False] = False,
    ) -> Committed: ...
    @overload
    def committed(
        self, partitions: Iterable[TopicPartition] | None = None, *, with_metadata: Literal[True]
    ) -> CommittedWithMetadata: ...
    @overload
    def committed(
        self, partitions: Iterable[TopicPartition] | None = None, *, with_metadata: bool
    ) -> Committed | CommittedWithMetadata: ...
    def committed(
        self, partitions: Iterable[TopicPartition] | None = None, *, with_metadata: bool = False
    ) -> Committed | CommittedWithMetadata:
        """The group's committed offsets (None where there is none) of these partitions,
        or of the assigned ones; ``with_metadata``: as OffsetAndMetadata, with the text
        committed beside each."""
        self._check_open()
        chosen = None if partitions is None else list(partitions)
        return self._wait(self._committed(chosen, with_metadata))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        """Every record, polling until the consumer closes."""
        while not self.closed:
            yield from self.poll(1.0)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record poll returns for ``tp`` (None before it has one)."""
        return self._fetcher.states[tp].position

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Poll ``tp`` from ``offset`` on."""
        _check_offset(offset)
        self._on_loop(self._fetcher.seek, tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Poll from the log start (of these, or of every assigned partition)."""
        self._wait(_seek_to(self._fetcher, partitions, pb.EARLIEST))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Poll only what is produced from now on."""
        self._wait(_seek_to(self._fetcher, partitions, pb.LATEST))

    def offsets_for_times(self, times: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Per partition, the offset of the first entry holding a record at or after the
        time (ms), or the log end when none does: seek there to read from that time."""
        return self._wait(_offsets(self._fetcher, _time_specs(times)))

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning these partitions; their positions stay."""
        for tp in partitions:
            self._on_loop(self._fetcher.set_paused, tp, True)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in self._resumable(partitions):
            self._on_loop(self._fetcher.set_paused, tp, False)

    def unsubscribe(self) -> None:
        """Stop consuming, as Kafka's: give up every partition (on_revoke, then the
        auto-commit), leave the group (a static member too), and drop what assign()
        gave; then subscribe or assign again. Nothing held: nothing to do."""
        self._check_unsubscribe()
        try:
            held = self._closing_held()
            if held:
                self._call(self._callbacks.on_revoke, held)
        finally:
            self._wait(self._unsubscribe())

    def close(self) -> None:
        """Give up the partitions (on_revoke, then the auto-commit), leave the group
        (not a static member), and stop."""
        if self.closed:
            return
        try:
            held = self._closing_held()
            if held:
                self._call(self._callbacks.on_revoke, held)
        finally:
            self.closed = True
            try:
                self._wait(self._close_group(leave=self.config.group_instance_id is None))
            finally:
                self._wait(self._fetcher.close())
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()
                self._loop.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncConsumer(_Face):
    """The consumer for asyncio code, with the same methods as :class:`Consumer` (those
    that wait are coroutines); create it inside the loop that uses it."""

    def __init__(
        self, bootstrap: str | Sequence[str], **settings: Unpack[ConsumerSettings]
    ) -> None:
        super().__init__(bootstrap, settings)
        self._data = asyncio.Event()
        self._fetcher = self._make_fetcher(self._data.set)
        self._tasks: set[asyncio.Task[None]] = set()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._check_assign()
        self._fetcher.assign(list(partitions))

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        *,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        on_lost: Callback | None = None,
    ) -> None:
        """As Consumer.subscribe; a callback may be a coroutine function."""
        self._check_subscribe(_Callbacks(on_assign, on_revoke, on_lost))
        self._subscribe(self._data.set, _topics(topics))

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.states)

    async def partitions_for(self, topic: str) -> list[int]:
        return await _partitions_for(self._fetcher, topic)

    async def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        self._check_open()
        deadline = time.monotonic() + timeout
        while True:
            self._data.clear()
            await self._handle_group()
            records, freed = _take(self._fetcher, self.config.max_poll_records)
            if freed:
                self._fetcher.consumed(freed)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._data.wait(), left)

    async def _handle_group(self) -> None:
        while (event := self._group_step()) is not None:
            assert self._session is not None
            session, callback = self._session, self._callbacks.of(event)
            commit = self.config.enable_auto_commit
            if event.kind == "assign":
                await session.finish(event, commit=commit)
                await self._call(callback, set(event.partitions))
                continue
            try:
                await self._call(callback, set(event.partitions))
            finally:
                await session.finish(event, commit=commit)
        due = self._auto_commit_due()
        if due:
            task = asyncio.get_running_loop().create_task(self._auto_commit(due, self._stamp(due)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, callback: Callback | None, partitions: Partitions) -> None:
        """A callback, plain or a coroutine function."""
        if callback is None:
            return
        self._in_callback = True
        try:
            result = callback(partitions)
            if inspect.isawaitable(result):
                await result
        finally:
            self._in_callback = False

    async def commit(
        self,
        offsets: Commits | None = None,
        *,
        asynchronous: bool = False,
    ) -> asyncio.Task[None] | None:
        """As Consumer.commit; ``asynchronous`` returns the commit's task at once."""
        chosen = self._commits(offsets)
        stamp = self._stamp(chosen)
        if asynchronous:
            task = asyncio.get_running_loop().create_task(self._commit(chosen, stamp))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return task
        await self._commit(chosen, stamp)
        return None

    @overload
    async def committed(
        self,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        with_metadata: Literal[False] = False,
    ) -> Committed: ...
    @overload
    async def committed(
        self, partitions: Iterable[TopicPartition] | None = None, *, with_metadata: Literal[True]
    ) -> CommittedWithMetadata: ...
    @overload
    async def committed(
        self, partitions: Iterable[TopicPartition] | None = None, *, with_metadata: bool
    ) -> Committed | CommittedWithMetadata: ...
    async def committed(
        self, partitions: Iterable[TopicPartition] | None = None, *, with_metadata: bool = False
    ) -> Committed | CommittedWithMetadata:
        """As Consumer.committed."""
        self._check_open()
        chosen = None if partitions is None else list(partitions)
        return await self._committed(chosen, with_metadata)

    async def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        while not self.closed:
            for record in await self.poll(1.0):
                yield record

    def position(self, tp: TopicPartition) -> int | None:
        return self._fetcher.states[tp].position

    def seek(self, tp: TopicPartition, offset: int) -> None:
        _check_offset(offset)
        self._fetcher.seek(tp, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        await _seek_to(self._fetcher, partitions, pb.EARLIEST)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        await _seek_to(self._fetcher, partitions, pb.LATEST)

    async def offsets_for_times(
        self, times: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        return await _offsets(self._fetcher, _time_specs(times))

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._fetcher.set_paused(tp, True)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in self._resumable(partitions):
            self._fetcher.set_paused(tp, False)

    async def unsubscribe(self) -> None:
        """As Consumer.unsubscribe."""
        self._check_unsubscribe()
        try:
            held = self._closing_held()
            if held:
                await self._call(self._callbacks.on_revoke, held)
        finally:
            await self._unsubscribe()

    async def close(self) -> None:
        if self.closed:
            return
        try:
            held = self._closing_held()
            if held:
                await self._call(self._callbacks.on_revoke, held)
        finally:
            self.closed = True
            try:
                await self._close_group(leave=self.config.group_instance_id is None)
                for task in list(self._tasks):
                    with contextlib.suppress(BaseException):
                        await task
            finally:
                await self._fetcher.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
