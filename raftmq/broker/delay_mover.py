"""The movers of delayed delivery (docs/delayed-delivery.md): for each level of the
internal delay topic this broker leads, one task reads the level's committed log in order
and, when the head record's ``hop-at`` has passed, moves it on: to its target partition
when it is due, else to the lower level its remaining wait calls for.

Why no per-message timer: a level holds records that wait the same time from when they
entered it, so its log is ordered by release time and the mover only ever looks at its
head; memory is one read window per level, whatever the number of pending messages.

Exactly once across failover: a mover produces as the level's reserved producer id
(delay.MOVER_PRODUCER_ID_BASE + level) and numbers its records per destination densely, in
source-offset order. Its progress (the source offset below which everything moved, and
the next sequence per destination there) is a cursor record it appends to its own level
now and then; a new leader resumes from the last cursor and numbers the same records the
same way, so destinations recognise what the old leader already stored (the sparse rule
of raftmq.partition.producer_state) and store each record once.

The broker layer may not import the client, so the produce calls are plain gRPC, as
raftmq.broker.txn_markers does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

import grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.broker.delay_steps import Cursor, Destination, LevelPending, Move, hop_at_of, next_step
from raftmq.controller.metadata import broker_addresses
from raftmq.controller.model import MetadataState
from raftmq.format import delay, entry
from raftmq.format.errors import FormatError
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.partition.errors import PartitionError
from raftmq.partition.producer_state import BatchRange
from raftmq.partition.replica import Acks, PartitionReplica

log = logging.getLogger(__name__)

DELAY_CONFIG = {"retention.ms": "-1", "retention.bytes": "0", "segment.bytes": str(16 << 20)}
"""The delay topic's settings: never deleted by time (a record may wait 40 days and more),
every sealed segment by size, but retention keeps everything from the segment holding
the level's last durable cursor (:meth:`DelayMovers.retention_index`), so only records
already moved go, a 16 MiB segment at a time."""
POLL_S = 0.05
"""How long a mover waits between the head's checks at most (its due time bounds it)."""
IDLE_WAIT_S = 1.0
"""How long a mover that has read its whole level waits for new records (it wakes as
soon as one commits) before it looks again."""
CHECK_LEADERS_S = 0.1
"""How often the broker looks for levels it started or stopped leading."""
READ_BYTES = 1024 * 1024
"""One read of a level: the memory a mover holds, with its decoded window."""
MAX_CHUNK = 2_000
"""Records moved per step: sent together, then acknowledged together."""
BATCH_BYTES = 256 * 1024
"""Largest batch a mover sends one destination."""
CURSOR_EVERY_S = 1.0
"""A mover appends its cursor at most this often (resends after failover are
deduplicated anyway; a cursor only shortens them)."""
MAX_SCAN_RECORDS = 200_000
"""The most records of one level a describe reads (about a second of CPU)."""
SEND_TIMEOUT_MS = 10_000
RETRY_S = 0.2
REFUSED_WARN_S = 5.0
"""A destination that refuses this long (a retriable refusal) is logged, then every as long."""
MAX_CHANNELS = 256


def _code(exc: grpc.aio.AioRpcError) -> str:
    for key, value in exc.trailing_metadata() or ():
        if key == "raftmq-error":
            return str(value)
    return exc.code().name


_ONE_BY_ONE = {"OUT_OF_ORDER_SEQUENCE", "BATCH_TOO_LARGE"}
"""Refusals of a batch that its records may pass one by one: it overlaps what the
destination holds, or it is over the destination topic's max.message.bytes."""
_DROP = {
    "UNKNOWN_TOPIC",
    "UNKNOWN_PARTITION",
    "PARTITION_DECOMMISSIONED",
    "DELAY_TOO_LONG",
    "INVALID_DELAY",
    "INVALID_BATCH",
}
"""Refusals no retry mends: the record cannot go there (its topic was deleted, its
partition decommissioned). It is dropped with a warning rather than block its level."""


class Sender:
    """A broker's own produce calls to partition leaders, one cached channel per address:
    the movers' (ProduceDelayed, which takes their batches only), and with ``delayed``
    False ProduceInternal calls (the share groups' dead-letter writer)."""

    def __init__(
        self,
        metadata: Callable[[], MetadataState],
        replicas: Mapping[Destination, PartitionReplica],
        security: net.Security,
        *,
        delayed: bool = True,
    ) -> None:
        self._delayed = delayed
        self._metadata = metadata
        self._replicas = replicas
        self._channels = net.AioChannels(max_channels=MAX_CHANNELS, security=security)

    def _leader_address(self, topic: str, partition: int) -> str | None:
        state = self._metadata()
        leader = 0
        replica = self._replicas.get((topic, partition))
        if replica is not None:
            leader = replica.leader_id
        if not leader:
            found = state.topics.get(topic)
            if found is None or partition >= len(found.partitions):
                return None
            leader = found.partitions[partition].leader or 0
        return broker_addresses(state).get(leader) if leader else None

    async def produce(self, topic: str, partition: int, entries: bytes) -> str:
        """ "" on success (or a duplicate), else the refusal's code name."""
        address = self._leader_address(topic, partition)
        if address is None:
            state = self._metadata()
            if topic not in state.topics:
                return "UNKNOWN_TOPIC"
            if partition >= len(state.topics[topic].partitions):
                return "UNKNOWN_PARTITION"
            return "LEADER_NOT_AVAILABLE"
        request = pb.ProduceRequest(
            topic=topic,
            partition=partition,
            entries=entries,
            acks=pb.ACKS_ALL,
            timeout_ms=SEND_TIMEOUT_MS,
        )
        try:
            stub = pb_grpc.BrokerStub(await self._channels.get(address))
            # Both inter-broker calls, taken with this broker's certificate (a plain
            # Produce needs a client's credentials on a SASL listener: chaos seed 7514,
            # secure, had every dead letter refused UNSUPPORTED_SASL_MECHANISM).
            call = stub.ProduceDelayed if self._delayed else stub.ProduceInternal
            await call(request, timeout=SEND_TIMEOUT_MS / 1000 + 2)
        except grpc.aio.AioRpcError as exc:
            return _code(exc)
        return ""

    async def close(self) -> None:
        await self._channels.close()


class LevelMover:
    """Moves one level's due records while this broker leads it, in the term it led in."""

    def __init__(self, replica: PartitionReplica, sender: Sender) -> None:
        self.replica = replica
        self.level = replica.partition
        self.term = replica.led_term
        self.producer_id = delay.MOVER_PRODUCER_ID_BASE + self.level
        self._sender = sender
        self.cursor = Cursor(0)
        self._window: deque[Record] = deque()
        """Records read and not yet moved, in offset order (popped from the left)."""
        self._read_to = 0
        self._cursor_written_s = 0.0
        self._unrecorded = False
        """Records moved since the last cursor record."""
        self.moved = 0
        self.dropped = 0
        self.ready = False
        """Its cursor is loaded: it moves records, and :meth:`pending_for` may count."""

    @property
    def leading(self) -> bool:
        return self.replica.is_leader and self.replica.led_term == self.term

    async def run(self) -> None:
        while self.leading and self.replica.high_watermark < self.replica.log_end_offset:
            await asyncio.sleep(POLL_S)  # this term's first entry commits everything before
        if not self.leading:
            return
        self.cursor = self._load_cursor()
        self.ready = True
        self._read_to = self.cursor.offset
        log.info(
            "broker leads %s/%d: moving from offset %d",
            delay.DELAY_TOPIC,
            self.level,
            self.cursor.offset,
        )
        while self.leading:
            chunk, wait_s = self._due(time.time_ns() // 1_000_000)
            if chunk:
                await self._move(chunk)
            elif self._window:
                await asyncio.sleep(wait_s)  # the head is not due yet
            else:
                await self.replica.wait_for_records(self._read_to, IDLE_WAIT_S)
            await self._maybe_write_cursor()

    def _entries_from(self, offset: int) -> tuple[list[Record], int]:
        """Committed records of this level from ``offset`` (one read), and where the
        next read starts."""
        try:
            result = self.replica.read(offset, READ_BYTES)
        except PartitionError:
            return [], offset
        records: list[Record] = []
        for header in entry.iter_headers(result.data):
            try:
                records.extend(r for r in decode_records(result.data, header) if r.offset >= offset)
            except FormatError as exc:
                log.warning(
                    "%s/%d: skipping an unreadable entry: %s", delay.DELAY_TOPIC, self.level, exc
                )
        return records, max(offset, result.next_offset)

    def _load_cursor(self) -> Cursor:
        """The level's last cursor: the record its cursor producer id last wrote (the
        producer state, built from entry headers on every replica, says where), or the
        log start when there is none. A scan of what is committed when the state does
        not know it (a checkpoint rebuilt from a short tail of the log)."""
        start = self.replica.log_start_offset
        batch = _last_cursor_batch(self.replica)
        found: Cursor | None = None
        if batch is not None and start <= batch.base_offset < self.replica.high_watermark:
            records, _ = self._entries_from(batch.base_offset)
            if records and delay.is_cursor(records[0].headers) and records[0].value:
                found = Cursor.decode(records[0].value)
        if found is None:
            found = self._scan_for_cursor()
        found.offset = max(found.offset, start)
        return found

    def _scan_for_cursor(self) -> Cursor:
        found = Cursor(self.replica.log_start_offset)
        offset = found.offset
        while offset < self.replica.high_watermark:
            records, after = self._entries_from(offset)
            for r in records:
                if delay.is_cursor(r.headers) and r.value is not None:
                    found = Cursor.decode(r.value)
            if after <= offset:
                break
            offset = after
        return found

    def _due(self, now_ms: int) -> tuple[list[Record], float]:
        """The records at the head whose hop-at has passed (at most MAX_CHUNK), or none and
        how long to wait before looking again."""
        chunk: list[Record] = []
        while len(chunk) < MAX_CHUNK:
            if not self._window:
                if self._read_to >= self.replica.high_watermark:
                    break
                records, self._read_to = self._entries_from(self._read_to)
                self._window = deque(records)
                if not self._window:
                    break
            head = self._window[0]
            if delay.is_cursor(head.headers):
                self._window.popleft()
                chunk.append(head)  # moves nothing, but the cursor passes it
                continue
            hop_at = hop_at_of(head)
            if hop_at is not None and hop_at > now_ms:
                if chunk:
                    break
                return [], min(POLL_S * 4, (hop_at - now_ms) / 1000)
            chunk.append(self._window.popleft())
        return chunk, POLL_S

    async def _move(self, chunk: list[Record]) -> None:
        by_destination: dict[Destination, list[Move]] = {}
        for record in chunk:
            if delay.is_cursor(record.headers):
                continue
            move = next_step(record)
            if move is None:
                log.warning(
                    "%s/%d offset %d is no delayed record; skipped",
                    delay.DELAY_TOPIC,
                    self.level,
                    record.offset,
                )
                continue
            by_destination.setdefault(move.destination, []).append(move)
        sends = []
        for destination, moves in by_destination.items():
            first = self.cursor.sequences.get(destination, 0)
            self.cursor.sequences[destination] = first + len(moves)
            sends.append(self._send_all(destination, moves, first))
        await asyncio.gather(*sends)
        if self.leading:
            self.cursor.offset = chunk[-1].offset + 1
            self._unrecorded = self._unrecorded or bool(by_destination)

    async def _send_all(self, destination: Destination, moves: list[Move], first: int) -> None:
        """Send ``moves`` to ``destination`` in order, one batch at a time, numbered from
        ``first``; returns once all are stored (or dropped), or this mover stops leading."""
        start = 0
        while start < len(moves):
            size = 0
            end = start
            while end < len(moves) and (end == start or size < BATCH_BYTES):
                r = moves[end].record
                size += len(r.key or b"") + len(r.value or b"") + 64
                end += 1
            if not await self._send(destination, moves[start:end], first + start):
                for i in range(start, end):  # ambiguous: overlaps what is stored
                    await self._send(destination, moves[i : i + 1], first + i, single=True)
            start = end

    async def _send(
        self, destination: Destination, moves: list[Move], sequence: int, *, single: bool = False
    ) -> bool:
        """One batch, retried until stored; False when it overlaps what the destination
        holds or is too large for it (send its records one by one; a record alone too
        large for its target is dropped)."""
        topic, partition = destination
        batch = build_batch(
            [m.record for m in moves],
            producer_id=self.producer_id,
            producer_epoch=0,
            base_sequence=sequence,
        )
        refused_since = 0.0
        while self.leading:
            code = await self._sender.produce(topic, partition, batch)
            if code and not refused_since:
                refused_since = time.monotonic()
            elif code and time.monotonic() - refused_since > REFUSED_WARN_S:
                refused_since = time.monotonic()
                log.warning(
                    "%s/%d: %s/%d has refused its batch for %.0f s (%s); retrying",
                    delay.DELAY_TOPIC,
                    self.level,
                    topic,
                    partition,
                    REFUSED_WARN_S,
                    code,
                )
            if not code:
                self.moved += len(moves)
                return True
            if code in _ONE_BY_ONE and not single:
                return False
            if code in _DROP or (code == "BATCH_TOO_LARGE" and single):
                self.dropped += len(moves)
                log.warning(
                    "%s/%d: dropped %d delayed records for %s/%d (offsets %d-%d): %s",
                    delay.DELAY_TOPIC,
                    self.level,
                    len(moves),
                    topic,
                    partition,
                    moves[0].source_offset,
                    moves[-1].source_offset,
                    code,
                )
                return True
            await asyncio.sleep(RETRY_S)
        return True

    async def pending_for(self, topic: str) -> tuple[int, int, bool]:
        """(pending, earliest deliver-at or -1, complete) of ``topic``'s records in this
        level: a scan from the cursor, of at most MAX_SCAN_RECORDS records, yielding to the
        loop between reads. On demand only: nothing is kept per message."""
        pending, next_due, scanned = 0, -1, 0
        offset = self.cursor.offset
        while offset < self.replica.high_watermark:
            if scanned >= MAX_SCAN_RECORDS:
                return pending, next_due, False
            records, after = self._entries_from(offset)
            for r in records:
                scanned += 1
                try:
                    target, _, due, _ = delay.parse_route(r.headers)
                except delay.DelayHeaderError:
                    continue  # a cursor record
                if target == topic:
                    pending += 1
                    next_due = due if next_due < 0 else min(next_due, due)
            if after <= offset:
                break
            offset = after
            await asyncio.sleep(0)
        return pending, next_due, True

    async def _maybe_write_cursor(self) -> None:
        now_s = time.monotonic()
        if not self._unrecorded or now_s - self._cursor_written_s < CURSOR_EVERY_S:
            return  # passing cursor records alone is no progress worth a new one
        if not self.leading:
            return
        self._cursor_written_s = now_s
        if self.cursor.offset > delay.MAX_CURSOR_OFFSET:
            return  # (documented) the cursor cannot go further; resends after failover grow
        record = Record(
            None, self.cursor.encode(), time.time_ns() // 1_000_000, ((delay.CURSOR, None),)
        )
        batch = build_batch(
            [record],
            producer_id=delay.CURSOR_PRODUCER_ID_BASE + self.level,
            producer_epoch=0,
            base_sequence=self.cursor.offset,
        )
        try:
            await self.replica.produce(batch, Acks.ALL, SEND_TIMEOUT_MS / 1000)
            self._unrecorded = False
        except PartitionError as exc:
            log.info("%s/%d: cursor not written: %s", delay.DELAY_TOPIC, self.level, exc)


def _last_cursor_batch(replica: PartitionReplica) -> BatchRange | None:
    """The last committed cursor record's batch in a level's replica (its sequence is the
    cursor's offset), from the producer state."""
    state = replica.producers.states.get(delay.CURSOR_PRODUCER_ID_BASE + replica.partition)
    return state.batches[-1] if state is not None and state.batches else None


def durable_index(replica: PartitionReplica) -> int:
    """The Raft index of the entry holding the offset of a level's last committed cursor:
    everything before it is moved, and any leader of the level resumes at or after it.
    0 when the level has no cursor (yet) or the offset is not readable here."""
    batch = _last_cursor_batch(replica)
    if batch is None:
        return 0
    offset = batch.first_sequence
    if not replica.log_start_offset <= offset < replica.high_watermark:
        return 0
    try:
        data = replica.read(offset, 1).data
    except (PartitionError, FormatError):
        return 0
    return entry.parse_header(data).index if data else 0


class DelayMovers:
    """A LevelMover for each level this broker leads, started and stopped as leadership
    moves."""

    def __init__(
        self,
        replicas: Mapping[Destination, PartitionReplica],
        metadata: Callable[[], MetadataState],
        stopping: Callable[[], bool],
        security: net.Security = net.PLAINTEXT,
    ) -> None:
        self._replicas = replicas
        self._stopping = stopping
        self._sender = Sender(metadata, replicas, security)
        self.movers: dict[int, LevelMover] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}

    async def run(self) -> None:
        try:
            while not self._stopping():
                for (topic, partition), replica in list(self._replicas.items()):
                    if topic != delay.DELAY_TOPIC or not replica.is_leader:
                        continue
                    task = self._tasks.get(partition)
                    if task is not None and not task.done():
                        continue
                    mover = LevelMover(replica, self._sender)
                    self.movers[partition] = mover
                    self._tasks[partition] = asyncio.get_running_loop().create_task(
                        self._guarded(mover)
                    )
                await asyncio.sleep(CHECK_LEADERS_S)
        finally:
            for task in self._tasks.values():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            await self._sender.close()

    async def describe(self, topic: str) -> list[LevelPending]:
        """The pending delayed messages of ``topic`` in each level this broker moves."""
        out = []
        for level, mover in sorted(self.movers.items()):
            task = self._tasks.get(level)
            if task is None or task.done() or not (mover.ready and mover.leading):
                continue
            pending, next_due, complete = await mover.pending_for(topic)
            out.append(LevelPending(level, pending, next_due, complete))
        return out

    def retention_index(self, topic: str, partition: int) -> int | None:
        """The Raft index retention must keep from in a replica of the delay topic (None
        for other topics): the entry holding the offset of the level's last committed
        cursor, as this replica's producer state knows it (leader and followers alike);
        0, which keeps everything, when there is none."""
        if topic != delay.DELAY_TOPIC:
            return None
        replica = self._replicas.get((topic, partition))
        if replica is None:
            return 0
        return durable_index(replica)

    async def _guarded(self, mover: LevelMover) -> None:
        try:
            await mover.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%d: mover failed; restarting", delay.DELAY_TOPIC, mover.level)
            await asyncio.sleep(RETRY_S)
