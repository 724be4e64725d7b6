"""The producer's record accumulator: records wait here, grouped into one open batch per
partition, until the batch is full (``batch_size``) or has waited ``linger_ms``; then the
sender takes it. Every record's bytes count against ``buffer_memory`` from ``send`` until
its batch is answered, so a producer faster than its brokers blocks in ``send`` instead
of growing without bound.

Thread-safe: the synchronous Producer's callers append from their threads while its
sender drains on its event-loop thread; one lock guards everything, held for
microseconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from raftmq.format.records import Record
from raftmq.format.tags import TAG_HEADER

RECORD_OVERHEAD_BYTES = 24
"""What a record costs beyond its key, value and header bytes: framing varints, and the
slack that keeps the estimate of a batch's size above its encoded size."""


class Outcome(Protocol):
    """A batch's fate, told once: the base offset it was stored at (-1 with acks=0), or
    why it was not. A ``concurrent.futures.Future`` or an ``asyncio.Future``: one per
    batch, so that a record costs no future of its own (its future is a view of this)."""

    def set_result(self, base_offset: int) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...

    def done(self) -> bool: ...


def record_size(record: Record) -> int:
    """The bytes a record is counted for, before compression."""
    size = RECORD_OVERHEAD_BYTES + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += len(name) + len(value or b"") + 4
    return size


@dataclass(slots=True)
class Batch:
    topic: str
    partition: int
    created_s: float
    deadline_s: float
    """When ``delivery_timeout_ms`` after the first record's send runs out."""
    outcome: Outcome
    records: list[Record] = field(default_factory=list)
    size_bytes: int = 0
    attempts: int = 0
    entry: bytes | None = None
    """The entry as sent, built once on the first send so every retry sends the same bytes."""
    producer_id: int = -1
    producer_epoch: int = -1
    sequence: int = -1
    """With idempotence: the sequence of its first record, given on its first send."""
    tags: frozenset[bytes | None] = frozenset()
    """The tags of every record in the batch: a batch is tag-uniform (see ``append``)."""

    def finish(self, base_offset: int, error: BaseException | None) -> None:
        if self.outcome.done():
            return
        if error is not None:
            self.outcome.set_exception(error)
        else:
            self.outcome.set_result(base_offset)


_NO_TAGS: frozenset[bytes | None] = frozenset()


def _tags_of(record: Record) -> frozenset[bytes | None]:
    """A record's tag set; the one empty set when it has none (``is`` compares them)."""
    return frozenset(v for n, v in record.headers if n == TAG_HEADER) or _NO_TAGS


class BufferFullError(TimeoutError):
    """``send`` waited ``max_block_ms`` and ``buffer_memory`` never had room."""


class Accumulator:
    def __init__(
        self,
        *,
        batch_size_bytes: int,
        linger_s: float,
        buffer_bytes: int,
        delivery_s: float,
        new_outcome: Callable[[], Outcome],
    ) -> None:
        self.new_outcome = new_outcome
        self.batch_size_bytes = batch_size_bytes
        self.linger_s = linger_s
        self.buffer_bytes = buffer_bytes
        self.delivery_s = delivery_s
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._open: dict[tuple[str, int], Batch] = {}
        self._ready: dict[tuple[str, int], deque[Batch]] = {}
        self.used_bytes = 0

    def append(
        self, topic: str, partition: int, record: Record, max_block_s: float
    ) -> tuple[Outcome, int, bool, bool]:
        """Add ``record``. Returns (outcome, index, wake, rolled): the outcome of the batch
        it joined and its place there; wake when the sender should look now (a new batch's
        linger started), rolled when a full batch closed (a sticky partitioner moves on).
        Blocks up to ``max_block_s`` for buffer room; raises BufferFullError after that."""
        size = record_size(record)
        with self._lock:
            if self.used_bytes + size > self.buffer_bytes:
                deadline = time.monotonic() + max_block_s
                while self.used_bytes + size > self.buffer_bytes:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BufferFullError  # the producer says it in its own words
                    self._room.wait(left)
            self.used_bytes += size
            key = (topic, partition)
            batch = self._open.get(key)
            rolled = False
            # Tag-uniform batches: a record whose tags differ from the open batch's closes
            # it, so each batch's tag block (docs/format.md, "Tags") is exactly every one
            # of its records' tags and a filtered fetch gets only matching batches.
            record_tags = _tags_of(record) if record.headers else _NO_TAGS
            if batch is not None and batch.size_bytes + size > self.batch_size_bytes:
                self._close(key, batch)  # full: this record starts the next one
                batch, rolled = None, True
            elif batch is not None and batch.tags is not record_tags and batch.tags != record_tags:
                self._close(key, batch)  # other tags: ready now, not a full batch
                batch = None
            wake = rolled
            if batch is None:
                now = time.monotonic()
                batch = Batch(topic, partition, now, now + self.delivery_s, self.new_outcome())
                batch.tags = record_tags
                self._open[key] = batch
                wake = True
            batch.records.append(record)
            batch.size_bytes += size
            return batch.outcome, len(batch.records) - 1, wake, rolled

    def _close(self, key: tuple[str, int], batch: Batch) -> None:
        del self._open[key]
        self._ready.setdefault(key, deque()).append(batch)

    def drain(
        self, now_s: float, claim: Callable[[Batch], bool], *, flush: bool
    ) -> tuple[list[Batch], float | None]:
        """The batches to send now, each one for which ``claim`` took a send slot (the
        sender's in-flight limits), oldest first per partition, and when the next
        open batch's linger runs out. ``flush``: close open batches at once."""
        out: list[Batch] = []
        next_due: float | None = None
        with self._lock:
            for key, batch in list(self._open.items()):
                due = batch.created_s + self.linger_s
                if flush or due <= now_s:
                    self._close(key, batch)
                elif next_due is None or due < next_due:
                    next_due = due
            for key, queue in list(self._ready.items()):
                while queue and claim(queue[0]):
                    out.append(queue.popleft())
                if not queue:
                    del self._ready[key]
        return out, next_due

    def retry_first(self, batch: Batch) -> None:
        """Put a batch that failed back at the head of its partition: it goes again before
        anything sent after it, so the partition keeps its order. Batches with sequences
        (several in flight) go back in sequence order, whichever failure came first."""
        with self._lock:
            queue = self._ready.setdefault((batch.topic, batch.partition), deque())
            at = 0
            if batch.sequence >= 0:
                while at < len(queue) and 0 <= queue[at].sequence < batch.sequence:
                    at += 1
            queue.insert(at, batch)

    def release(self, batch: Batch) -> None:
        """A batch was answered (or failed for good): its records' bytes are free."""
        with self._lock:
            self.used_bytes -= batch.size_bytes
            assert self.used_bytes >= 0, "released more than was appended"
            self._room.notify_all()

    def expired(self, now_s: float) -> list[Batch]:
        """Take out every waiting batch (open or ready) whose delivery timeout ran out."""
        out = []
        with self._lock:
            for key, batch in list(self._open.items()):
                if batch.deadline_s <= now_s:
                    del self._open[key]
                    out.append(batch)
            for key, queue in list(self._ready.items()):
                keep = deque(b for b in queue if b.deadline_s > now_s)
                out += [b for b in queue if b.deadline_s <= now_s]
                if keep:
                    self._ready[key] = keep
                else:
                    del self._ready[key]
        return out

    def take_all(self) -> list[Batch]:
        """Every waiting batch (the producer closes without sending them)."""
        with self._lock:
            out = list(self._open.values())
            self._open.clear()
            for queue in self._ready.values():
                out += queue
            self._ready.clear()
        return out

    def lingering(self) -> list[tuple[str, int]]:
        """The partitions whose open batch still takes records (its linger runs)."""
        with self._lock:
            return list(self._open)

    @property
    def waiting(self) -> bool:
        with self._lock:
            return bool(self._open) or any(self._ready.values())
