"""The payload of a SHARE_STATE entry (docs/format.md, "Share-state entries"): one change a
share-partition leader made to one share group's state on its partition, replicated
through the partition's own Raft group so every replica applies the same change.

Compact and versioned: a fixed head (version, operation, the group's created_version, the
leader's clock, the settings apply needs to judge deterministically), the group id, then
the operation's own fields. Offsets travel as inclusive ranges, so a fetch that acquired
500 consecutive records costs 16 bytes, not 500 entries. Bounded: at most MAX_RANGES
ranges and MAX_ID_BYTES per id, so no entry grows past about 200 KiB.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

from raftmq.format import entry
from raftmq.format.errors import InvalidEntryError

VERSION = 0
MAX_RANGES = 10_000
"""Ranges per entry at most: share.record.lock.partition.limit bounds a share-partition's
records in flight at 10,000, so no operation needs more."""
MAX_ID_BYTES = 255
"""A group or member id's UTF-8 bytes at most (ids are checked shorter where they enter)."""


class Op(IntEnum):
    INIT = 0  # the group starts consuming here at ``start``
    ACQUIRE = 1  # ``member`` acquires the records of ``ranges`` until ``deadline_ms``
    ACK = 2  # ``member`` acknowledges ``acks``
    RELEASE_MEMBER = 3  # every record ``member`` holds is available again
    RESET = 4  # the start offset moves to ``start``; everything from it is available
    DELETE = 5  # the group's state here is dropped
    DEAD_LETTERED = 6  # the archived records of ``ranges`` were written to the dead-letter topic


class AckType(IntEnum):
    """As share.proto's AcknowledgeType (same numbers)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


_HEAD = struct.Struct(">BB q q H B I q q B")
"""version, op | created_version | now_ms | delivery_count_limit (u16) | dead_letter (u8:
1 when archived records are to be dead-lettered) | lock_duration_ms (u32) |
max_lock_hold_ms (i64) | metadata_version (i64) | group id length (u8)."""
_LEN8 = struct.Struct(">B")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_RANGE = struct.Struct(">qq")
_ACK = struct.Struct(">qqBi")


class Ack(NamedTuple):
    """One acknowledged range (inclusive) of an ACK entry."""

    first: int
    last: int
    type: AckType
    delivery_count: int = 0
    """The delivery the member acknowledges (its records' delivery count), so an answer
    for an earlier delivery never settles a later acquisition of the same records by the
    same member (its lock expired and a prefetch took them again); 0: whichever it holds."""


@dataclass(frozen=True, slots=True)
class ShareOp:
    """One decoded SHARE_STATE payload. Fields an operation does not use keep defaults."""

    op: Op
    group_id: str
    created_version: int
    now_ms: int
    delivery_count_limit: int = 5
    dead_letter: bool = False
    lock_duration_ms: int = 30_000
    max_lock_hold_ms: int = 360_000
    metadata_version: int = 0
    """The leader's metadata version when it judged the member (or group): a leader whose
    metadata is older does not take a member missing from it for one that left."""
    member_id: str = ""
    start: int = 0
    deadline_ms: int = 0
    ranges: tuple[tuple[int, int], ...] = field(default=())
    """Inclusive (first, last) offset ranges: ACQUIRE, DEAD_LETTERED."""
    acks: tuple[Ack, ...] = field(default=())
    """The acknowledged ranges: ACK (plain tuples are taken as Acks)."""

    def __post_init__(self) -> None:
        if self.acks and not all(isinstance(a, Ack) for a in self.acks):
            object.__setattr__(self, "acks", tuple(Ack(*a) for a in self.acks))


def encode(op: ShareOp) -> bytes:
    """The payload of ``op``; raises InvalidEntryError when it breaks a bound."""
    gid = op.group_id.encode()
    mid = op.member_id.encode()
    if not gid or len(gid) > MAX_ID_BYTES or len(mid) > MAX_ID_BYTES:
        raise InvalidEntryError(f"share-state ids must be 1 to {MAX_ID_BYTES} bytes")
    if len(op.ranges) > MAX_RANGES or len(op.acks) > MAX_RANGES:
        raise InvalidEntryError(f"a share-state entry holds at most {MAX_RANGES} ranges")
    parts = [
        _HEAD.pack(
            VERSION,
            int(op.op),
            op.created_version,
            op.now_ms,
            op.delivery_count_limit,
            int(op.dead_letter),
            op.lock_duration_ms,
            op.max_lock_hold_ms,
            op.metadata_version,
            len(gid),
        ),
        gid,
    ]
    kind = op.op
    if kind in (Op.ACQUIRE, Op.ACK, Op.RELEASE_MEMBER):
        parts += [_LEN8.pack(len(mid)), mid]
    if kind in (Op.INIT, Op.RESET):
        parts.append(_I64.pack(op.start))
    elif kind == Op.ACQUIRE:
        parts.append(_I64.pack(op.deadline_ms))
    if kind in (Op.ACQUIRE, Op.DEAD_LETTERED):
        parts.append(_U32.pack(len(op.ranges)))
        parts += [_RANGE.pack(first, last) for first, last in op.ranges]
    elif kind == Op.ACK:
        parts.append(_U32.pack(len(op.acks)))
        parts += [_ACK.pack(a.first, a.last, int(a.type), a.delivery_count) for a in op.acks]
    return b"".join(parts)


def encode_entry(op: ShareOp) -> bytes:
    """A SHARE_STATE entry as a leader proposes it (index, term, offset 0: the log stamps
    them). It takes no offset and names no producer, like a TXN_MARKER."""
    return entry.encode(
        encode(op),
        type=entry.EntryType.SHARE_STATE,
        first_timestamp=op.now_ms,
        max_timestamp=op.now_ms,
    )


class _Reader:
    __slots__ = ("at", "buf")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = buf
        self.at = 0

    def take(self, s: struct.Struct) -> tuple[int, ...]:
        if self.at + s.size > len(self.buf):
            raise InvalidEntryError("a share-state payload ends early")
        out = s.unpack_from(self.buf, self.at)
        self.at += s.size
        return out

    def text(self, n: int) -> str:
        if self.at + n > len(self.buf):
            raise InvalidEntryError("a share-state payload ends early")
        raw = bytes(self.buf[self.at : self.at + n])
        self.at += n
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise InvalidEntryError("a share-state id is not UTF-8") from None

    def count(self) -> int:
        (n,) = self.take(_U32)
        if n > MAX_RANGES:
            raise InvalidEntryError(f"a share-state entry declares {n} ranges")
        return n


def decode(payload: bytes | bytearray | memoryview) -> ShareOp:
    """The operation a payload holds; raises InvalidEntryError on anything else (an
    unknown version or operation included)."""
    r = _Reader(memoryview(payload))
    version, kind, created, now_ms, limit, dead, lock_ms, hold_ms, seen, glen = r.take(_HEAD)
    if version != VERSION:
        raise InvalidEntryError(f"unknown share-state payload version {version}")
    try:
        op = Op(kind)
    except ValueError:
        raise InvalidEntryError(f"unknown share-state operation {kind}") from None
    group_id = r.text(glen)
    member_id = ""
    start = deadline_ms = 0
    ranges: Sequence[tuple[int, int]] = ()
    acks: Sequence[Ack] = ()
    if op in (Op.ACQUIRE, Op.ACK, Op.RELEASE_MEMBER):
        member_id = r.text(r.take(_LEN8)[0])
    if op in (Op.INIT, Op.RESET):
        (start,) = r.take(_I64)
    elif op == Op.ACQUIRE:
        (deadline_ms,) = r.take(_I64)
    if op in (Op.ACQUIRE, Op.DEAD_LETTERED):
        ranges = [_range(*r.take(_RANGE)) for _ in range(r.count())]
    elif op == Op.ACK:
        acks = [_ack(*r.take(_ACK)) for _ in range(r.count())]
    if r.at != len(r.buf):
        raise InvalidEntryError(f"{len(r.buf) - r.at} bytes follow a share-state operation")
    return ShareOp(
        op,
        group_id,
        created,
        now_ms,
        limit,
        bool(dead),
        lock_ms,
        hold_ms,
        seen,
        member_id,
        start,
        deadline_ms,
        tuple(ranges),
        tuple(acks),
    )


def _range(first: int, last: int) -> tuple[int, int]:
    if not 0 <= first <= last:
        raise InvalidEntryError(f"share-state range {first}-{last} is not a range")
    return first, last


def _ack(first: int, last: int, kind: int, delivery_count: int) -> Ack:
    _range(first, last)
    if delivery_count < 0:
        raise InvalidEntryError(f"acknowledged delivery count {delivery_count} is negative")
    try:
        return Ack(first, last, AckType(kind), delivery_count)
    except ValueError:
        raise InvalidEntryError(f"unknown acknowledge type {kind}") from None
