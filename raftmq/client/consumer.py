"""The consumer: ``assign`` partitions, then ``poll`` returns their records in offset
order per partition, fetched ahead in the background (raftmq.client.fetcher).

Two faces over one fetcher: :class:`Consumer` (its fetcher runs an event loop on a thread
of its own; use the consumer from one thread) and :class:`AsyncConsumer` (its fetcher
runs in the caller's loop). Positions live in the consumer: where a partition starts is
a ``seek`` or ``auto_offset_reset``. Consumer groups, subscriptions and committed offsets
come with the group coordinator (issue 14) and are not here yet.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.connections import bootstrap_addresses
from raftmq.client.fetcher import (
    Chunk,
    Fetcher,
    NoOffsetError,
    OffsetReset,
    PartitionState,
    TopicPartition,
)
from raftmq.controller.transitions import RACK
from raftmq.format import entry
from raftmq.format.records import decode_records

__all__ = ["AsyncConsumer", "Consumer", "ConsumerRecord", "NoOffsetError", "TopicPartition"]
T = TypeVar("T")
IsolationLevel = Literal["read_uncommitted", "read_committed"]


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...]


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
    """'read_uncommitted' or 'read_committed'. Both read up to the high watermark while
    raftmq has no transactions; read_committed will then also stop at the last stable
    offset and drop aborted transactions' records (docs/transactions.md)."""
    client_rack: str | None = None
    """This consumer's rack: each partition is read from its in-sync replica in that
    rack when it has one (less cross-rack traffic), else from its leader."""

    def __post_init__(self) -> None:
        if not self.bootstrap:
            raise ValueError("give at least one broker address host:port in bootstrap")
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
        if self.max_buffer_bytes < self.fetch_max_bytes:
            raise ValueError(
                f"max_buffer_bytes ({self.max_buffer_bytes}) must hold at least one fetch "
                f"(fetch_max_bytes {self.fetch_max_bytes})"
            )


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
                taken, done = _records_of(tp, state, chunk, max_records - len(out))
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
    tp: TopicPartition, state: PartitionState, chunk: Chunk, limit: int
) -> tuple[list[ConsumerRecord], bool]:
    """The records of ``chunk`` at or after the position (at most ``limit``), and whether
    the chunk is used up."""
    out: list[ConsumerRecord] = []
    position = state.position if state.position is not None else 0
    for header in entry.iter_headers(chunk.entries):
        if header.next_offset <= position or header.type != entry.EntryType.DATA:
            continue
        for r in decode_records(chunk.entries, header):
            if r.offset < position:
                continue
            if len(out) == limit:
                state.position = position
                return out, False
            out.append(
                ConsumerRecord(tp[0], tp[1], r.offset, r.key, r.value, r.timestamp, r.headers)
            )
            position = r.offset + 1
    state.position = position
    return out, True


class ConsumerSettings(TypedDict, total=False):
    """The keyword settings of both consumers (defaults and meaning: ConsumerConfig)."""

    auto_offset_reset: OffsetReset
    max_poll_records: int
    fetch_max_wait_ms: int
    fetch_max_bytes: int
    max_buffer_bytes: int
    isolation_level: IsolationLevel
    client_rack: str | None


class _Face:
    """What both consumers share: the settings, the fetcher's making, and the offset
    lookups (ListOffsets at each partition's leader)."""

    def __init__(self, bootstrap: str | Sequence[str], settings: ConsumerSettings) -> None:
        addresses = bootstrap_addresses(bootstrap)
        self.config = ConsumerConfig(addresses, **settings)
        self.closed = False

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
        )

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the consumer is closed; create a new one")


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
        fetcher.seek(tp, offset)


async def _partitions_for(fetcher: Fetcher, topic: str) -> list[int]:
    await fetcher.links.refresh()
    return list(range(fetcher.links.view.partitions.get(topic, 0)))


def _time_specs(times: Mapping[TopicPartition, int]) -> dict[TopicPartition, pb.ListOffsetsRequest]:
    return {tp: pb.ListOffsetsRequest(timestamp_ms=ts) for tp, ts in times.items()}


def _check_offset(offset: int) -> None:
    if offset < 0:
        raise ValueError(f"offset {offset} is negative; offsets start at 0")


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
        """Consume exactly these partitions (replacing any earlier assignment)."""
        self._check_open()
        self._on_loop(self._fetcher.assign, list(partitions))

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
            records, freed = _take(self._fetcher, self.config.max_poll_records)
            if freed:
                self._loop.call_soon_threadsafe(self._fetcher.consumed, freed)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            with self._data:
                self._data.wait(min(left, 0.1))

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
        for tp in partitions:
            self._on_loop(self._fetcher.set_paused, tp, False)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
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

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._check_open()
        self._fetcher.assign(list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.states)

    async def partitions_for(self, topic: str) -> list[int]:
        return await _partitions_for(self._fetcher, topic)

    async def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        self._check_open()
        deadline = time.monotonic() + timeout
        while True:
            self._data.clear()
            records, freed = _take(self._fetcher, self.config.max_poll_records)
            if freed:
                self._fetcher.consumed(freed)
            left = deadline - time.monotonic()
            if records or left <= 0:
                return records
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._data.wait(), left)

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
        for tp in partitions:
            self._fetcher.set_paused(tp, False)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._fetcher.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
