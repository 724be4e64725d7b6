"""Share-partition state (docs/share-groups.md): for each share group on one partition,
which records are in flight, in what state, held by whom until when, delivered how often.

Pure and deterministic. Every replica applies the same committed SHARE_STATE entries
(raftmq.format.share_ops) in log order and so holds the same state: each entry carries the
leader's clock (``now_ms``) and the settings apply needs (delivery limit, lock duration,
whether archived records wait for the dead-letter topic), so nothing here reads a clock or
the metadata. A leader *decides* with this state (:func:`redeliverable`,
:func:`pick_new`), proposes the entry, and answers its client with what apply made of it
(:class:`Outcome`), so an answer never claims what the log does not hold.

Per group: ``start`` (the share-partition start offset, SPSO: every record below it is
done) and ``end`` (SPEO: the first offset never acquired). Records in [start, end) that
are not done are in ``records``: AVAILABLE (released, or their lock expired), ACQUIRED
(member, deadline) or ARCHIVED-and-waiting for the dead-letter writer. A record accepted,
or archived with no dead-letter topic, is dropped from ``records``: below ``end`` and not
there, it is never acquired again. An offset in [start, end) that is in no state was
skipped when the leader acquired past it (a control entry's place, an aborted record).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from raftmq.format import entry
from raftmq.format.share_ops import Ack, AckType, Op, ShareOp

MAX_OFFSETS_PER_OP = 10_000
"""An ACQUIRE or DEAD_LETTERED naming more offsets than this (the largest in-flight limit)
changes nothing: a bound on what one entry can cost every replica."""

INVALID_RECORD_STATE = "INVALID_RECORD_STATE"
LOCK_RENEWAL_LIMIT = "LOCK_RENEWAL_LIMIT"


class RecordState(IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 3


@dataclass(slots=True)
class InFlight:
    state: RecordState
    delivery_count: int
    """Acquisitions so far: grows by one per acquisition, never goes back."""
    member_id: str = ""
    deadline_ms: int = 0
    acquired_ms: int = 0
    """When the current acquisition began (RENEW's hold limit counts from it)."""


@dataclass(frozen=True, slots=True)
class AckResult:
    error: str = ""
    """"" for done, else INVALID_RECORD_STATE or LOCK_RENEWAL_LIMIT (nothing changed)."""
    message: str = ""
    deadline_ms: int = 0
    """RENEW: the new lock deadline."""


@dataclass(slots=True)
class Outcome:
    """What applying one entry did (the leader answers from it)."""

    applied: bool = True
    """False when the entry named a group state this replica does not have (an older
    group's, or one never started here): nothing changed."""
    acquired: list[tuple[int, int, int]] = field(default_factory=list)
    """ACQUIRE: (first, last, delivery count) ranges actually acquired."""
    acks: list[AckResult] = field(default_factory=list)
    """ACK: one result per acknowledgement of the entry, in order."""


@dataclass(slots=True)
class SharePartitionState:
    """One share group's state on one partition."""

    created_version: int
    start: int
    end: int
    records: dict[int, InFlight] = field(default_factory=dict)
    archived_total: int = 0
    dead_lettered_total: int = 0
    seen_version: int = 0
    """The newest metadata version a leader judged this group's members at (ACQUIRE,
    INIT): membership changes are applied only by a leader whose metadata is as new."""
    next_deadline_ms: float = math.inf
    """No ACQUIRED record's deadline is earlier (a lower bound): expiry scans nothing before."""

    # --- reading ---------------------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self.records)

    def count(self, state: RecordState) -> int:
        return sum(1 for r in self.records.values() if r.state == state)

    def oldest_acquired_ms(self) -> int | None:
        times = [r.acquired_ms for r in self.records.values() if r.state == RecordState.ACQUIRED]
        return min(times) if times else None

    def waiting_dead_letter(self) -> list[int]:
        """Archived records the dead-letter writer has yet to write, by offset."""
        return sorted(o for o, r in self.records.items() if r.state == RecordState.ARCHIVED)

    def held_by(self, member_id: str) -> int:
        return sum(
            1
            for r in self.records.values()
            if r.state == RecordState.ACQUIRED and r.member_id == member_id
        )

    # --- changing --------------------------------------------------------------------------

    def expire(self, now_ms: int, limit: int, dead_letter: bool) -> bool:
        """Locks whose deadline is at or before ``now_ms`` end: their records are available,
        or archived when delivered ``limit`` times. Whether any ended."""
        if now_ms < self.next_deadline_ms:
            return False
        ended = False
        nxt = math.inf
        for offset, rec in list(self.records.items()):
            if rec.state != RecordState.ACQUIRED:
                continue
            if rec.deadline_ms <= now_ms:
                self._give_back(offset, rec, limit, dead_letter)
                ended = True
            else:
                nxt = min(nxt, rec.deadline_ms)
        self.next_deadline_ms = nxt
        return ended

    def _give_back(self, offset: int, rec: InFlight, limit: int, dead_letter: bool) -> None:
        if rec.delivery_count >= limit:
            self._archive(offset, rec, dead_letter)
        else:
            rec.state, rec.member_id, rec.deadline_ms = RecordState.AVAILABLE, "", 0

    def _archive(self, offset: int, rec: InFlight, dead_letter: bool) -> None:
        self.archived_total += 1
        if dead_letter:
            rec.state, rec.member_id, rec.deadline_ms = RecordState.ARCHIVED, "", 0
        else:
            del self.records[offset]

    def acquire(self, op: ShareOp) -> list[tuple[int, int, int]]:
        if sum(last - first + 1 for first, last in op.ranges) > MAX_OFFSETS_PER_OP:
            return []
        got: list[tuple[int, int]] = []
        records = self.records
        acquired = RecordState.ACQUIRED
        for first, last in op.ranges:
            if first >= self.end:
                # Never acquired: the usual case, and the whole range is taken (a first
                # delivery is within every limit); one object per record, no checks.
                member, deadline, now = op.member_id, op.deadline_ms, op.now_ms
                for offset in range(first, last + 1):
                    records[offset] = InFlight(acquired, 1, member, deadline, now)
                got += ((offset, 1) for offset in range(first, last + 1))
                self.end = last + 1
                continue
            for offset in range(first, last + 1):
                rec = records.get(offset)
                if offset >= self.end:
                    rec = records[offset] = InFlight(RecordState.AVAILABLE, 0)
                    self.end = offset + 1
                elif rec is None or rec.state != RecordState.AVAILABLE:
                    continue
                if rec.delivery_count >= op.delivery_count_limit:
                    # The limit was lowered since it was released: it is done.
                    self._archive(offset, rec, op.dead_letter)
                    continue
                rec.state, rec.member_id = acquired, op.member_id
                rec.deadline_ms, rec.acquired_ms = op.deadline_ms, op.now_ms
                rec.delivery_count += 1
                got.append((offset, rec.delivery_count))
        if got:
            self.next_deadline_ms = min(self.next_deadline_ms, op.deadline_ms)
        return _runs(got)

    def acknowledge(self, op: ShareOp) -> list[AckResult]:
        return [self._ack_one(op, a) for a in op.acks]

    def _ack_one(self, op: ShareOp, ack: Ack) -> AckResult:
        first, last, kind, count = ack
        now = op.now_ms
        recs: list[tuple[int, InFlight]] = []
        if last - first + 1 <= len(self.records):
            for offset in range(first, last + 1):
                rec = self.records.get(offset)
                if (
                    rec is None
                    or rec.state != RecordState.ACQUIRED
                    or rec.member_id != op.member_id
                    or rec.deadline_ms <= now
                    or (count and rec.delivery_count != count)
                ):
                    break
                recs.append((offset, rec))
        if len(recs) != last - first + 1:
            bad = first + len(recs)
            return AckResult(
                INVALID_RECORD_STATE,
                f"offset {bad} is not acquired by member {op.member_id}"
                + (f" in delivery {count}" if count else "")
                + " (its lock expired, another member holds it, or it was acknowledged "
                f"already): nothing in {first}-{last} changed",
            )
        if kind == AckType.RENEW:
            if any(
                now - r.acquired_ms + op.lock_duration_ms > op.max_lock_hold_ms for _, r in recs
            ):
                return AckResult(
                    LOCK_RENEWAL_LIMIT,
                    f"records {first}-{last} would be held more than {op.max_lock_hold_ms} ms "
                    "after their acquisition: acknowledge or release them",
                )
            deadline = now + op.lock_duration_ms
            for _, rec in recs:
                rec.deadline_ms = deadline
            return AckResult(deadline_ms=deadline)
        for offset, rec in recs:
            if kind == AckType.ACCEPT:
                del self.records[offset]
            elif kind == AckType.RELEASE:
                self._give_back(offset, rec, op.delivery_count_limit, op.dead_letter)
            else:
                self._archive(offset, rec, op.dead_letter)
        return AckResult()

    def release_member(self, op: ShareOp) -> None:
        for offset, rec in list(self.records.items()):
            if rec.state == RecordState.ACQUIRED and rec.member_id == op.member_id:
                self._give_back(offset, rec, op.delivery_count_limit, op.dead_letter)

    def dead_lettered(self, op: ShareOp) -> None:
        if sum(last - first + 1 for first, last in op.ranges) > MAX_OFFSETS_PER_OP:
            return
        for first, last in op.ranges:
            for offset in range(first, last + 1):
                rec = self.records.get(offset)
                if rec is not None and rec.state == RecordState.ARCHIVED:
                    del self.records[offset]
                    self.dead_lettered_total += 1

    def advance_start(self) -> None:
        if self.start not in self.records:
            self.start = min(self.records) if self.records else self.end

    # --- checkpoint ------------------------------------------------------------------------

    def to_json(self) -> list[object]:
        return [
            self.created_version,
            self.start,
            self.end,
            self.archived_total,
            self.dead_lettered_total,
            self.seen_version,
            [
                [o, int(r.state), r.delivery_count, r.member_id, r.deadline_ms, r.acquired_ms]
                for o, r in sorted(self.records.items())
            ],
        ]

    @classmethod
    def from_json(cls, row: list[object]) -> SharePartitionState:
        created, start, end, archived, dead, seen, recs = row
        st = cls(int(created), int(start), int(end))  # type: ignore[call-overload]
        st.archived_total, st.dead_lettered_total = int(archived), int(dead)  # type: ignore[call-overload]
        st.seen_version = int(seen)  # type: ignore[call-overload]
        for o, state, count, member, deadline, acquired in recs:  # type: ignore[attr-defined]
            st.records[int(o)] = InFlight(
                RecordState(state), int(count), str(member), int(deadline), int(acquired)
            )
            if not st.start <= int(o) < st.end:
                raise ValueError(f"in-flight offset {o} outside {start}-{end}")
        deadlines = [r.deadline_ms for r in st.records.values() if r.state == RecordState.ACQUIRED]
        st.next_deadline_ms = min(deadlines, default=math.inf)
        return st


class ShareStates:
    """Every share group's state on one partition, changed only by :meth:`apply`."""

    def __init__(self) -> None:
        self.groups: dict[str, SharePartitionState] = {}

    def __len__(self) -> int:
        return len(self.groups)

    def get(self, group_id: str, created_version: int) -> SharePartitionState | None:
        st = self.groups.get(group_id)
        return st if st is not None and st.created_version == created_version else None

    def apply(self, op: ShareOp) -> Outcome:
        st = self.groups.get(op.group_id)
        if st is not None and op.created_version != st.created_version:
            if op.created_version < st.created_version:
                return Outcome(applied=False)  # an older group's: its state is gone
            del self.groups[op.group_id]
            st = None
        kind = op.op
        if kind == Op.DELETE:
            self.groups.pop(op.group_id, None)
            return Outcome()
        if kind == Op.INIT:
            if st is None:
                self.groups[op.group_id] = SharePartitionState(
                    op.created_version, op.start, op.start
                )
            return Outcome()
        if st is None:
            return Outcome(applied=False)
        st.seen_version = max(st.seen_version, op.metadata_version)
        st.expire(op.now_ms, op.delivery_count_limit, op.dead_letter)
        out = Outcome()
        if kind == Op.ACQUIRE:
            out.acquired = st.acquire(op)
        elif kind == Op.ACK:
            out.acks = st.acknowledge(op)
        elif kind == Op.RELEASE_MEMBER:
            st.release_member(op)
        elif kind == Op.RESET:
            st.records.clear()
            st.start = st.end = op.start
            st.next_deadline_ms = math.inf
        elif kind == Op.DEAD_LETTERED:
            st.dead_lettered(op)
        st.advance_start()
        return out

    def to_json(self) -> dict[str, list[object]]:
        return {gid: st.to_json() for gid, st in sorted(self.groups.items())}

    @classmethod
    def from_json(cls, saved: dict[str, list[object]]) -> ShareStates:
        states = cls()
        for gid, row in saved.items():
            states.groups[str(gid)] = SharePartitionState.from_json(row)
        return states


# --- the leader's decisions ----------------------------------------------------------------


def redeliverable(
    st: SharePartitionState, now_ms: int, reserved: Iterable[int], max_records: int
) -> list[int]:
    """The in-flight records an acquisition at ``now_ms`` takes first, by offset: those
    available, and those whose lock expired by then; not those a proposal not yet applied
    takes (``reserved``); at most ``max_records``. One delivered as often as the limit
    allows is archived by the ACQUIRE's apply instead of acquired, so an expiry no entry
    has applied yet is applied by the next acquisition, not waited on."""
    taken = set(reserved)
    out = [
        o
        for o, r in st.records.items()
        if o not in taken
        and (
            r.state == RecordState.AVAILABLE
            or (r.state == RecordState.ACQUIRED and r.deadline_ms <= now_ms)
        )
    ]
    out.sort()
    return out[:max_records]


def is_aborted(h: entry.EntryHeader, aborted: Iterable[tuple[int, int, int]]) -> bool:
    """Whether a transactional DATA entry belongs to one of the ``aborted`` transactions
    ((producer id, first offset, marker offset), as the partition lists them)."""
    if not h.attributes & entry.TRANSACTIONAL:
        return False
    return any(
        pid == h.producer_id and first <= h.base_offset < last for pid, first, last in aborted
    )


def pick_new(
    headers: Iterable[entry.EntryHeader],
    from_offset: int,
    upper: int,
    aborted: Iterable[tuple[int, int, int]],
    max_records: int,
) -> tuple[list[tuple[int, int]], list[entry.EntryHeader]]:
    """Records never acquired, from ``from_offset`` (the end offset, or past what pending
    proposals take) up to ``upper`` (the last stable offset): the records of DATA entries
    not in an aborted transaction, at most ``max_records``. Returns (first, last) ranges
    and the entries that hold them."""
    ranges: list[tuple[int, int]] = []
    used: list[entry.EntryHeader] = []
    left = max_records
    aborted = list(aborted)
    for h in headers:
        if left <= 0 or h.base_offset >= upper:
            break
        if h.type != entry.EntryType.DATA or h.next_offset <= from_offset:
            continue
        if is_aborted(h, aborted):
            continue
        first = max(h.base_offset, from_offset)
        last = min(h.next_offset, upper, first + left) - 1
        ranges.append((first, last))
        used.append(h)
        left -= last - first + 1
    return ranges, used


def _runs(got: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(offset, count) pairs by offset as (first, last, count) runs."""
    runs: list[tuple[int, int, int]] = []
    for offset, count in got:
        if runs and runs[-1][1] == offset - 1 and runs[-1][2] == count:
            runs[-1] = (runs[-1][0], offset, count)
        else:
            runs.append((offset, offset, count))
    return runs


def ranges_of(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted offsets as inclusive (first, last) ranges."""
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][1] == o - 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out
