"""A share consumer's acknowledgements and deliveries, as pure functions and values: the
acknowledgement types, the results a commit reports, how acknowledgements become the
ranges the leaders take (share.proto's AcknowledgementBatch), and which records of a
ShareFetch answer are the member's to deliver. No I/O, so the rules are tested alone
(raftmq.client.share_consumer sends and receives).

Why ranges of consecutive offsets only: a leader judges a range all-or-nothing (every
record in it must be held by the member, else nothing in it changes), so a range may
only span records this member was given and acknowledged alike; offsets are dense
(only data records take them), so "consecutive" is exactly "nothing between".
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from raftmq.api.v1 import share_pb2 as spb
from raftmq.client.errors import ClientError
from raftmq.format import entry
from raftmq.format.records import Record, decode_records

TopicPartition = tuple[str, int]


class AcknowledgeType(enum.Enum):
    """What a member says of a record it holds (share.proto's AcknowledgeType)."""

    ACCEPT = spb.ACKNOWLEDGE_TYPE_ACCEPT
    """Processed: never delivered again."""
    RELEASE = spb.ACKNOWLEDGE_TYPE_RELEASE
    """Give it back now: any member may get it at once (its delivery count stays)."""
    REJECT = spb.ACKNOWLEDGE_TYPE_REJECT
    """Cannot be processed: never delivered again (archived, and dead-lettered when the
    group has a dead-letter topic)."""
    RENEW = spb.ACKNOWLEDGE_TYPE_RENEW
    """Still working on it: the lock is extended by the group's lock duration (up to the
    group's maximum hold), and the record stays held."""

    @property
    def settles(self) -> bool:
        """Whether the record is no longer held once the leader took it (all but RENEW)."""
        return self is not AcknowledgeType.RENEW


@dataclass(frozen=True, slots=True)
class AcknowledgementResult:
    """The leader's answer for one range of acknowledged records of one partition
    (both offsets inclusive): done when ``error`` is None, else nothing in the range
    changed (``error.code``: INVALID_RECORD_STATE when a record was not held by this
    member, its lock expired, or it was already settled; LOCK_RENEWAL_LIMIT for a RENEW
    past the group's maximum hold; UNKNOWN_MEMBER, or a refusal no retry mended)."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    type: AcknowledgeType
    error: ClientError | None = None
    lock_deadline_ms: int | None = None
    """For a RENEW done: the new lock deadline (ms since the epoch, the leader's clock)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def covers(self, topic: str, partition: int, offset: int) -> bool:
        return (
            topic == self.topic
            and partition == self.partition
            and self.first_offset <= offset <= self.last_offset
        )


@dataclass(frozen=True, slots=True)
class AckRange:
    first_offset: int
    last_offset: int
    type: AcknowledgeType

    def __post_init__(self) -> None:
        assert 0 <= self.first_offset <= self.last_offset, self

    def batch(self) -> spb.AcknowledgementBatch:
        return spb.AcknowledgementBatch(
            first_offset=self.first_offset, last_offset=self.last_offset, type=self.type.value
        )


def coalesce(pending: Mapping[int, AcknowledgeType]) -> list[AckRange]:
    """``pending`` (offset: type) as the fewest ranges of consecutive offsets of one type,
    in offset order."""
    out: list[AckRange] = []
    first = last = -2
    kind: AcknowledgeType | None = None
    for offset in sorted(pending):
        t = pending[offset]
        if offset == last + 1 and t is kind:
            last = offset
            continue
        if kind is not None:
            out.append(AckRange(first, last, kind))
        first = last = offset
        kind = t
    if kind is not None:
        out.append(AckRange(first, last, kind))
    return out


def offsets_of(ranges: Iterable[AckRange]) -> Iterator[int]:
    for r in ranges:
        yield from range(r.first_offset, r.last_offset + 1)


@dataclass(frozen=True, slots=True)
class Acquired:
    """One record of a ShareFetch answer the member acquired."""

    record: Record
    delivery_count: int


def acquired_records(
    entries: bytes, acquired: Sequence[spb.AcquiredRecords]
) -> tuple[list[Acquired], list[int]]:
    """The records of ``entries`` inside the ``acquired`` ranges, in offset order, with
    their delivery counts; and the acquired offsets the entries did not hold (the leader
    sends whole entries holding every acquired record, so none should be missing: the
    caller gives such a lock back rather than hold it unseen). Control entries are
    skipped, as a consumer skips them; the entries' other records are not this member's
    (earlier or later records of the same batches)."""
    ranges = sorted(
        (int(a.first_offset), int(a.last_offset), int(a.delivery_count)) for a in acquired
    )
    if not ranges:
        return [], []
    out: list[Acquired] = []
    seen: set[int] = set()
    lo, hi = ranges[0][0], ranges[-1][1]
    for header in entry.iter_headers(entries):
        if header.type != entry.EntryType.DATA:
            continue
        if header.next_offset <= lo or header.base_offset > hi:
            continue
        for r in decode_records(entries, header):
            count = _count_at(ranges, r.offset)
            if count is not None and r.offset not in seen:
                seen.add(r.offset)
                out.append(Acquired(r, count))
    missing = [o for first, last, _ in ranges for o in range(first, last + 1) if o not in seen]
    return out, missing


def _count_at(ranges: Sequence[tuple[int, int, int]], offset: int) -> int | None:
    """The delivery count of the acquired range holding ``offset`` (``ranges`` sorted and
    disjoint), or None."""
    i = bisect.bisect_right(ranges, (offset, _MAX, _MAX)) - 1
    if i >= 0 and ranges[i][0] <= offset <= ranges[i][1]:
        return ranges[i][2]
    return None


_MAX = 1 << 63
