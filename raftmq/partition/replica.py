"""One replica of one partition on this broker: a Raft group whose log is the partition's
log, the high watermark that bounds what consumers see, and the fetches parked on it.

The leader takes producers' entries (checked, never decoded), proposes them to Raft, and
answers according to acks. Every replica, leader or follower, advances its high watermark
as entries commit and wakes the long polls waiting for data.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from raftmq.log import entry
from raftmq.log.config import LogConfig
from raftmq.log.entry import EntryType
from raftmq.log.errors import CorruptEntryError, InvalidEntryError, LogError
from raftmq.log.log import Log, ReadResult
from raftmq.partition.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    InvalidBatchError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    ProduceTimeoutError,
)
from raftmq.raft import errors as raft_errors
from raftmq.raft.driver import RaftGroup, RaftHost
from raftmq.raft.membership import Membership
from raftmq.raft.messages import SnapshotMeta
from raftmq.raft.ready import SoftState

MAX_ENTRIES_PER_PRODUCE = 10_000
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
"""Bytes proposed but not yet answered, per partition: past it producers wait (backpressure)."""


class Acks(IntEnum):
    ALL = 0
    LEADER = 1
    NONE = 2


@dataclass(frozen=True, slots=True)
class ProduceResult:
    base_offset: int
    last_offset: int


def group_name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class PartitionReplica:
    def __init__(
        self,
        host: RaftHost,
        topic: str,
        partition: int,
        directory: Path,
        replicas: list[int],
        log_config: LogConfig,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.replicas = replicas
        self.max_entry_bytes = log_config.max_message_bytes
        self._host = host
        self._hw_event = asyncio.Event()
        self._inflight_bytes = 0
        self._inflight_free = asyncio.Condition()
        self.leader_term = 0
        self.group: RaftGroup = host.open_group(
            group_name(topic, partition),
            directory,
            Membership(frozenset(replicas)),
            log_config=log_config,
            apply=self._apply,
            on_soft_state=self._on_soft_state,
            replay=False,
            on_snapshot=self._on_snapshot,
        )
        self.high_watermark = self._offset_after(self.group.core.log.committed)

    # --- state ------------------------------------------------------------------------

    @property
    def log(self) -> Log:
        return self.group.log

    @property
    def is_leader(self) -> bool:
        return self.group.is_leader

    @property
    def leader_id(self) -> int:
        return self.group.leader

    @property
    def log_start_offset(self) -> int:
        return self.group.log.start_offset

    def _offset_after(self, index: int) -> int:
        log = self.group.log
        if index < log.start_index:
            return log.start_offset
        data = log.read_by_index(index, 1).data
        return entry.parse_header(data).next_offset

    def _apply(self, _: bytes, applied_to: int) -> None:
        """The commit reached ``applied_to`` (the group does not hand us the bytes: the log
        is the state). The high watermark is the offset after it."""
        core_log = self.group.core.log
        if applied_to == core_log.last_index:
            self._advance_hw(core_log.next_offset)  # the usual case at low load: no read
        else:
            self._advance_hw(self._offset_after(applied_to))

    def _on_snapshot(self, snap: SnapshotMeta, data: bytes) -> None:
        """A snapshot of a partition is its start point: everything before it is gone on
        the leader too, and everything up to it is committed."""
        self._advance_hw(snap.next_offset)

    def _advance_hw(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            # Wake every parked fetch; each re-checks its own condition.
            self._hw_event.set()
            self._hw_event = asyncio.Event()

    def _on_soft_state(self, soft: SoftState) -> None:
        # The term in which the current leader (maybe this replica) was elected: clients
        # compare it to tell newer metadata from older.
        if soft.leader:
            self.leader_term = self.group.core.term

    # --- produce ----------------------------------------------------------------------

    def validate(self, entries: bytes) -> None:
        """Check every header and CRC of a producer's buffer, so a refusal names the batch
        and its problem; nothing is decoded beyond the 74-byte headers."""
        if not entries:
            raise InvalidBatchError("the produce request holds no entries")
        count = 0
        try:
            for h in entry.iter_headers(entries):
                if h.type != EntryType.DATA:
                    raise InvalidBatchError(
                        f"entry {count} is a {h.type.name} entry; producers send DATA entries"
                    )
                if h.size > self.max_entry_bytes:
                    raise BatchTooLargeError(
                        f"entry {count} is {h.size} bytes; this topic's max.message.bytes "
                        f"is {self.max_entry_bytes}. Send smaller batches."
                    )
                count += 1
                if count > MAX_ENTRIES_PER_PRODUCE:
                    raise InvalidBatchError(
                        f"more than {MAX_ENTRIES_PER_PRODUCE} entries in one produce request"
                    )
        except CorruptEntryError as exc:
            raise CorruptBatchError(f"a batch failed its CRC32C check: {exc}") from None
        except InvalidEntryError as exc:
            raise InvalidBatchError(f"malformed batch: {exc}") from None

    async def produce(self, entries: bytes, acks: Acks, timeout: float) -> ProduceResult:
        """Propose the request's entries as one proposal: they are appended together in one
        term or not at all, so one answer covers them and a refusal proves none was kept."""
        self.validate(entries)
        if not self.is_leader:
            raise NotLeaderError(self.topic, self.partition, self.leader_id)
        size = len(entries)
        deadline = time.monotonic() + timeout
        await self._reserve(size, deadline)
        try:
            core = self.group.core
            base = core.log.next_offset
            try:
                future = self._host.propose(
                    self.group.name, entries, durable_locally=acks == Acks.LEADER
                )
            except raft_errors.NotLeaderError as exc:
                raise NotLeaderError(self.topic, self.partition, exc.leader) from None
            except raft_errors.ProposalDroppedError as exc:
                # Refused before anything was appended (e.g. a leadership transfer is under
                # way): definite, and the client should retry at the next leader.
                raise NotLeaderError(self.topic, self.partition, 0, str(exc)) from None
            last = core.log.next_offset - 1
            if acks == Acks.NONE:
                future.add_done_callback(_consume_exception)
                return ProduceResult(-1, -1)
            remaining = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                raise ProduceTimeoutError(
                    f"the write was not confirmed by a majority within {timeout * 1000:.0f} ms; "
                    "it may or may not have been committed"
                ) from None
            except raft_errors.OutcomeUnknownError as exc:
                raise OutcomeUnknownError(
                    f"the broker stopped before the write was confirmed ({exc}); it may or may "
                    "not have been committed"
                ) from None
            except (raft_errors.NotLeaderError, raft_errors.ProposalDroppedError) as exc:
                # Definite: the entry was replaced or never kept, so a retry cannot duplicate.
                raise NotLeaderError(self.topic, self.partition, self.leader_id, str(exc)) from None
            return ProduceResult(base, last)
        finally:
            await self._release(size)

    async def _reserve(self, size: int, deadline: float) -> None:
        async with self._inflight_free:
            while self._inflight_bytes and self._inflight_bytes + size > MAX_INFLIGHT_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProduceTimeoutError(
                        "the partition has too much data in flight; the request timed out "
                        "waiting for room. Slow down or raise timeout_ms."
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._inflight_free.wait(), remaining)
            self._inflight_bytes += size

    async def _release(self, size: int) -> None:
        async with self._inflight_free:
            self._inflight_bytes -= size
            self._inflight_free.notify_all()

    # --- fetch ------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Committed entries from ``offset``; OffsetOutOfRangeError names the valid range."""
        hw = self.high_watermark
        start = self.log_start_offset
        if not start <= offset <= hw:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic}/{self.partition}: "
                f"valid offsets are {start} to {hw} (the high watermark)",
                start,
                hw,
            )
        try:
            return self.group.log.read(offset, max_bytes, upper_offset=hw)
        except LogError as exc:
            if isinstance(exc, CorruptEntryError):
                self._host.request_repair(self.group.name)  # restore it from a replica
            if hasattr(exc, "start"):
                raise OffsetOutOfRangeError(str(exc), start, hw) from None
            raise

    async def fetch(
        self, offset: int, max_bytes: int, min_bytes: int, max_wait: float
    ) -> ReadResult:
        """Long poll: answer once ``min_bytes`` of committed data are there, or at the end
        of ``max_wait`` with whatever there is (maybe nothing)."""
        deadline = time.monotonic() + max_wait
        while True:
            result = self.read(offset, max_bytes)
            if len(result.data) >= max(min_bytes, 1) or time.monotonic() >= deadline:
                return result
            event = self._hw_event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), deadline - time.monotonic())


def _consume_exception(fut: asyncio.Future[int]) -> None:
    """acks=0 callers never look at the outcome; keep asyncio from logging it as lost."""
    if not fut.cancelled():
        fut.exception()
