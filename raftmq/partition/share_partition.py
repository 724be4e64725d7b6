"""A partition leader's share-group operations (share.proto, SharePartitions; docs/
share-groups.md): acknowledge, acquire (with a long poll), describe, reset, release a
member's records, drop a group's state.

Every change is a SHARE_STATE entry proposed to the partition's Raft group and answered
only once committed, from what applying it did (raftmq.partition.share_tracking), so an
answer never claims more than the log holds: a failover keeps every acquisition's lock and
delivery count and every answered acknowledgement.

Concurrent fetches of one group on one partition never take the same record: the records
a proposal not yet applied takes are *reserved* here (released records by offset, new
records by the end offset past them), and the next decision skips them. Decisions and
proposals happen with no await between them, so no other decision sees stale
reservations. Reservations are the leader's alone; a new leader starts with none, after
it applied every entry of earlier terms (the same readiness as for producers).

Membership (is the member in the group, which created_version, which settings) is the
caller's: the broker judges it against its metadata and hands a :class:`ShareGroupView`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftmq.format import entry, share_ops
from raftmq.format.share_ops import Ack, AckType, Op, ShareOp
from raftmq.partition.errors import OffsetOutOfRangeError, OutcomeUnknownError
from raftmq.partition.share_state import (
    AckResult,
    Outcome,
    RecordState,
    SharePartitionState,
    pick_new,
    ranges_of,
    redeliverable,
)
from raftmq.share_settings import ShareSettings

if TYPE_CHECKING:
    from raftmq.partition.replica import PartitionReplica

AckTuple = tuple[int, int, int] | tuple[int, int, int, int]
"""An acknowledgement as a request gives it: (first, last, AcknowledgeType number[,
delivery count: absent or 0 for whichever delivery the member holds])."""
DEFAULT_MAX_RECORDS = 500
DEFAULT_MAX_BYTES = 1 << 20
MAX_WAIT_S = 30.0
COMMIT_TIMEOUT_S = 10.0
"""How long one share-state change may take to commit before its caller is told TIMEOUT."""
MIN_EXPIRY_WAIT_S = 0.05
"""A long poll waiting for a lock to expire sleeps at least this long between looks."""
INVALID_ACKNOWLEDGE_TYPE = "INVALID_ACKNOWLEDGE_TYPE"


@dataclass(frozen=True, slots=True)
class ShareGroupView:
    """What the metadata says of a group, as the broker resolved it for one request."""

    group_id: str
    created_version: int
    settings: ShareSettings = field(default_factory=ShareSettings)
    metadata_version: int = 0
    """The metadata version the broker judged the member at (written in the entries)."""


@dataclass(frozen=True, slots=True)
class ShareFetchResult:
    entries: bytes
    acquired: list[tuple[int, int, int]]
    """(first, last, delivery count) of the records acquired for the member."""
    lock_deadline_ms: int
    acknowledged: list[AckResult]
    high_watermark: int


@dataclass(frozen=True, slots=True)
class ShareDescription:
    exists: bool
    start_offset: int = 0
    end_offset: int = 0
    in_flight: int = 0
    acquired: int = 0
    available: int = 0
    archived_total: int = 0
    dead_lettered_total: int = 0
    oldest_acquired_age_ms: int = -1
    high_watermark: int = 0


class SharePartitions:
    """The share operations of one :class:`PartitionReplica` (``replica.share``)."""

    def __init__(self, replica: PartitionReplica) -> None:
        self.replica = replica
        self._reserved: dict[str, set[int]] = {}
        self._reserved_end: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        """Proposals of each group not yet applied (or failed): reservations end with them."""
        self._reserved_term = 0
        self._last_now_ms = 0
        self._woken = asyncio.Event()

    def wake(self) -> None:
        """Wake the share long polls: records committed, or a share change that may make
        some acquirable (not every share entry: 16 members' acquisitions would wake each
        other for nothing)."""
        self._woken.set()
        self._woken = asyncio.Event()

    # --- reading -----------------------------------------------------------------------------

    def state(self, group: ShareGroupView) -> SharePartitionState | None:
        return self.replica.shares.states.get(group.group_id, group.created_version)

    def describe(self, group: ShareGroupView) -> ShareDescription:
        """The group's state here as this replica has it (the broker asks the leader)."""
        st = self.state(group)
        hw = self.replica.high_watermark
        if st is None:
            return ShareDescription(False, high_watermark=hw)
        oldest = st.oldest_acquired_ms()
        return ShareDescription(
            True,
            st.start,
            st.end,
            st.in_flight(),
            st.count(RecordState.ACQUIRED),
            st.count(RecordState.AVAILABLE),
            st.archived_total,
            st.dead_lettered_total,
            -1 if oldest is None else max(0, int(time.time() * 1000) - oldest),
            hw,
        )

    def groups(self) -> dict[str, SharePartitionState]:
        return dict(self.replica.shares.states.groups)

    # --- operations ----------------------------------------------------------------------------

    async def fetch(
        self,
        group: ShareGroupView,
        member_id: str,
        *,
        max_records: int = 0,
        max_bytes: int = 0,
        max_wait_s: float = 0.0,
        acknowledgements: list[AckTuple] | None = None,
    ) -> ShareFetchResult:
        """Acknowledge ``acknowledgements`` ((first, last, AcknowledgeType number, delivery
        count or 0 for any)), then acquire records for the member, waiting up to
        ``max_wait_s`` for some: new records, records released, locks expiring wake it."""
        self._check_leader()
        max_records = max_records or DEFAULT_MAX_RECORDS
        max_bytes = max_bytes or DEFAULT_MAX_BYTES
        deadline_s = time.monotonic() + min(max(0.0, max_wait_s), MAX_WAIT_S)
        await self._ensure_state(group)
        # The acknowledgements go in the same proposal as the first acquisition, applied
        # first: one commit for both. The records they release are among those the
        # acquisition may take (if the release fails, it takes none of them).
        template, ack_op = self._ack_request(group, member_id, acknowledgements or [])
        acked: list[AckResult] = []
        while True:
            woken = self._woken
            result, outcomes = await self._acquire(
                group, member_id, max_records, max_bytes, [ack_op] if ack_op else []
            )
            if ack_op is not None or template:
                acked = _fill(template, outcomes[0] if ack_op else None, member_id, group)
                ack_op, template = None, []
            now_s = time.monotonic()
            if result is not None or now_s >= deadline_s:
                break
            wait_s = deadline_s - now_s
            st = self.state(group)
            if st is not None and st.next_deadline_ms != float("inf"):
                expiry_s = st.next_deadline_ms / 1000 - time.time()
                wait_s = min(wait_s, max(MIN_EXPIRY_WAIT_S, expiry_s))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await woken.wait()
        entries, acquired, lock_deadline = result or (b"", [], 0)
        return ShareFetchResult(
            entries, acquired, lock_deadline, acked, self.replica.high_watermark
        )

    async def acknowledge(
        self,
        group: ShareGroupView,
        member_id: str,
        acknowledgements: list[AckTuple],
    ) -> list[AckResult]:
        """One result per acknowledgement, in order; those answered without error are
        committed. An unknown type or a range that is not one is refused on its own."""
        if not acknowledgements:
            return []
        self._check_leader()
        template, op = self._ack_request(group, member_id, acknowledgements)
        outcome = None if op is None else (await self._propose_all([op]))[0]
        return _fill(template, outcome, member_id, group)

    def _ack_request(
        self,
        group: ShareGroupView,
        member_id: str,
        acknowledgements: list[AckTuple],
    ) -> tuple[list[AckResult | None], ShareOp | None]:
        """The results known without the state (an unknown type, a range that is not
        one), None in the places the ACK entry answers, and that entry (None: none)."""
        results: list[AckResult | None] = []
        valid: list[Ack] = []
        for given in acknowledgements:
            first, last, kind, count = Ack(*given)  # the count is optional: 0, any
            if kind not in AckType._value2member_map_:
                results.append(
                    AckResult(
                        INVALID_ACKNOWLEDGE_TYPE,
                        f"acknowledge type {kind} is not ACCEPT (1), RELEASE (2), REJECT (3) "
                        "or RENEW (4): nothing in the range changed",
                    )
                )
            elif not 0 <= first <= last:
                results.append(
                    AckResult(
                        "INVALID_RECORD_STATE",
                        f"{first}-{last} is not a range of offsets: nothing changed",
                    )
                )
            elif count < 0:
                results.append(
                    AckResult(
                        "INVALID_RECORD_STATE",
                        f"delivery count {count} is negative: nothing in {first}-{last} changed",
                    )
                )
            else:
                results.append(None)
                valid.append(Ack(first, last, AckType(kind), count))
        if not valid:
            return results, None
        return results, self._op(Op.ACK, group, member_id=member_id, acks=tuple(valid))

    async def release_member(self, group: ShareGroupView, member_id: str) -> bool:
        """Make every record ``member_id`` holds here available (it left the group).
        Whether there was anything to release."""
        st = self.state(group)
        if st is None or not st.held_by(member_id):
            return False
        self._check_leader()
        await self._propose(self._op(Op.RELEASE_MEMBER, group, member_id=member_id))
        return True

    async def drop_group(self, group_id: str, created_version: int) -> bool:
        """Drop a group's state here: the group was deleted (``created_version`` is the
        state's own), or created again (the new group's; any older state goes). Whether
        there was state to drop."""
        st = self.replica.shares.states.groups.get(group_id)
        if st is None or st.created_version > created_version:
            return False
        self._check_leader()
        await self._propose(ShareOp(Op.DELETE, group_id, created_version, self._now_ms()))
        return True

    async def reset(self, group: ShareGroupView, offset: int) -> int:
        """Move the share-partition start offset to ``offset``: records below are done,
        records from it available with delivery count 0. Returns the new start."""
        self._check_leader()
        start, hw = self.replica.log_start_offset, self.replica.high_watermark
        if not start <= offset <= hw:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.replica.topic}/"
                f"{self.replica.partition}: a share group may start between {start} (the log "
                f"start) and {hw} (the high watermark)",
                start,
                hw,
            )
        await self._ensure_state(group)
        await self._propose(self._op(Op.RESET, group, start=offset))
        st = self.state(group)
        return offset if st is None else st.start

    async def dead_lettered(self, group: ShareGroupView, offsets: list[int]) -> None:
        """The dead-letter writer wrote these archived records: they are done."""
        self._check_leader()
        await self._propose(self._op(Op.DEAD_LETTERED, group, ranges=tuple(ranges_of(offsets))))

    # --- internals ---------------------------------------------------------------------------

    def _check_leader(self) -> None:
        replica = self.replica
        replica.check_serving()
        replica._check_ready("share group requests")
        term = replica.led_term
        if term != self._reserved_term:
            # Reservations are of proposals of an older term: none of them is pending now.
            self._reserved.clear()
            self._reserved_end.clear()
            self._pending.clear()
            self._reserved_term = term

    def _now_ms(self) -> int:
        """The leader's clock, never back within its life (entries judge locks by it)."""
        self._last_now_ms = max(self._last_now_ms, int(time.time() * 1000))
        return self._last_now_ms

    def _op(self, kind: Op, group: ShareGroupView, **fields: object) -> ShareOp:
        s = group.settings
        return ShareOp(
            kind,
            group.group_id,
            group.created_version,
            self._now_ms(),
            delivery_count_limit=s.delivery_count_limit,
            dead_letter=bool(s.dead_letter_topic),
            lock_duration_ms=s.record_lock_duration_ms,
            max_lock_hold_ms=s.max_lock_hold_ms(),
            metadata_version=group.metadata_version,
            **fields,  # type: ignore[arg-type]
        )

    async def _ensure_state(self, group: ShareGroupView) -> None:
        """Start the group here (INIT) if it never consumed this partition: at the high
        watermark (auto.offset.reset latest: only what comes next) or the log start."""
        if self.state(group) is not None:
            return
        replica = self.replica
        if group.settings.auto_offset_reset == "earliest":
            start = replica.log_start_offset
        else:
            start = replica.last_stable_offset
        # Two fetches may both start it: the second INIT changes nothing.
        await self._propose(self._op(Op.INIT, group, start=start))

    async def _propose(self, op: ShareOp) -> Outcome:
        return (await self._propose_all([op]))[0]

    async def _propose_all(
        self,
        ops: list[ShareOp],
        reserve: Callable[[asyncio.Future[int]], None] | None = None,
    ) -> list[Outcome]:
        """Propose ``ops`` as one proposal (appended together, in one term or not at all)
        and answer, once committed, what applying each did. ``reserve`` is handed the
        proposal's outcome future at once, before anything else runs."""
        replica = self.replica
        data = b"".join(share_ops.encode_entry(op) for op in ops)
        proposed = replica._propose(data, durable_locally=False)
        first = proposed.index - len(ops) + 1
        waiters = [replica.shares.expect(i) for i in range(first, proposed.index + 1)]
        if reserve is not None:
            reserve(proposed.done)
        deadline_s = time.monotonic() + COMMIT_TIMEOUT_S
        try:
            await replica._committed(
                asyncio.shield(proposed.done),
                deadline_s,
                COMMIT_TIMEOUT_S,
                None,
                "share-state change",
            )
        finally:
            for i in range(first, proposed.index + 1):
                replica.shares.forget(i)
        if not all(w.done() and not w.cancelled() for w in waiters):
            raise OutcomeUnknownError(
                "the share-state change committed but this replica could not apply it; retry"
            )
        return [w.result() for w in waiters]

    async def _acquire(
        self,
        group: ShareGroupView,
        member_id: str,
        max_records: int,
        max_bytes: int,
        before: list[ShareOp],
    ) -> tuple[tuple[bytes, list[tuple[int, int, int]], int] | None, list[Outcome]]:
        """One try: decide, propose (after ``before``, in the same proposal), answer: what
        was acquired (None: nothing) and the outcomes of ``before``."""
        self._check_leader()
        st = self.state(group)
        if st is None:
            return None, await self._propose_all(before) if before else []
        gid = group.group_id
        settings = group.settings
        now_ms = self._now_ms()
        reserved = self._reserved.setdefault(gid, set())
        again = redeliverable(st, now_ms, reserved, max_records)
        if before:
            again = sorted(set(again).union(_released(st, before, now_ms, reserved)))
            again = again[:max_records]
        chosen_entries: dict[int, entry.EntryHeader] = {}
        datas: dict[int, bytes] = {}
        size = 0
        taken_again: list[int] = []
        for offset in again:
            if size >= max_bytes and chosen_entries:
                break
            if any(h.base_offset <= offset < h.next_offset for h in chosen_entries.values()):
                taken_again.append(offset)
                continue
            h, data = self._entry_at(offset)
            if h is None:
                continue
            chosen_entries[h.base_offset], datas[h.base_offset] = h, data
            size += h.size
            taken_again.append(offset)
        new_from = max(st.end, self._reserved_end.get(gid, 0), self.replica.log_start_offset)
        room = settings.record_lock_partition_limit - st.in_flight() - self._reserved_new(gid, st)
        want = min(max_records - len(taken_again), room)
        upper = self.replica.last_stable_offset
        new_ranges: list[tuple[int, int]] = []
        if want > 0 and new_from < upper and (size < max_bytes or not chosen_entries):
            result = self.replica.read(new_from, max(1, max_bytes - size), read_committed=True)
            data = bytes(result.data)
            headers = list(entry.iter_headers(data))
            aborted = [
                (t.producer_id, t.first_offset, t.last_offset)
                for t in self.replica.aborted_transactions(new_from, result.next_offset)
            ]
            new_ranges, used = pick_new(headers, new_from, upper, aborted, want)
            for h in used:
                chosen_entries[h.base_offset] = h
                datas[h.base_offset] = data[h.position : h.end]
        if not taken_again and not new_ranges:
            return None, await self._propose_all(before) if before else []
        ranges = sorted(ranges_of(taken_again) + new_ranges)
        lock_deadline = now_ms + settings.record_lock_duration_ms
        op = self._op(
            Op.ACQUIRE, group, member_id=member_id, deadline_ms=lock_deadline, ranges=tuple(ranges)
        )
        new_end = new_ranges[-1][1] + 1 if new_ranges else 0

        def reserve(done: asyncio.Future[int]) -> None:
            reserved.update(taken_again)
            if new_end:
                self._reserved_end[gid] = max(self._reserved_end.get(gid, 0), new_end)
            self._pending[gid] = self._pending.get(gid, 0) + 1
            term = self._reserved_term

            def release(_: asyncio.Future[int]) -> None:
                if term != self._reserved_term:
                    return
                reserved.difference_update(taken_again)
                self._pending[gid] -= 1
                if not self._pending[gid]:
                    del self._pending[gid]
                    self._reserved_end.pop(gid, None)

            done.add_done_callback(release)

        *earlier, outcome = await self._propose_all([*before, op], reserve)
        acquired = outcome.acquired if outcome.applied else []
        if not acquired:
            return None, earlier
        held = [(first, last) for first, last, _ in acquired]
        parts = [
            datas[base]
            for base, h in sorted(chosen_entries.items())
            if any(first < h.next_offset and last >= h.base_offset for first, last in held)
        ]
        return (b"".join(parts), acquired, lock_deadline), earlier

    def _reserved_new(self, gid: str, st: SharePartitionState) -> int:
        """New records reserved by pending proposals (past the applied end offset)."""
        return max(0, self._reserved_end.get(gid, 0) - st.end)

    def _entry_at(self, offset: int) -> tuple[entry.EntryHeader | None, bytes]:
        """The stored DATA entry holding ``offset``, or None when retention removed it."""
        replica = self.replica
        if offset < replica.log_start_offset:
            return None, b""
        data = bytes(replica.read(offset, 1).data)
        for h in entry.iter_headers(data):
            if h.type == entry.EntryType.DATA and h.base_offset <= offset < h.next_offset:
                return h, data[h.position : h.end]
        return None, b""


def _fill(
    template: list[AckResult | None], outcome: Outcome | None, member_id: str, group: ShareGroupView
) -> list[AckResult]:
    """``template``'s open places filled with the ACK entry's results, in order."""
    done = iter(outcome.acks if outcome is not None and outcome.applied else [])
    return [
        r
        if r is not None
        else next(
            done,
            AckResult(
                "INVALID_RECORD_STATE",
                f"member {member_id} holds no records of group {group.group_id} on this "
                "partition: nothing changed",
            ),
        )
        for r in template
    ]


def _released(
    st: SharePartitionState, ops: list[ShareOp], now_ms: int, reserved: set[int]
) -> list[int]:
    """The records the RELEASEs of ``ops`` (ACK entries) make available if they apply:
    held by their member, locked still, with deliveries left."""
    out: list[int] = []
    for op in ops:
        for first, last, kind, count in op.acks:
            if kind != AckType.RELEASE or last - first + 1 > len(st.records):
                continue
            for offset in range(first, last + 1):
                rec = st.records.get(offset)
                if (
                    rec is not None
                    and rec.state == RecordState.ACQUIRED
                    and rec.member_id == op.member_id
                    and rec.deadline_ms > now_ms
                    and (not count or rec.delivery_count == count)
                    and rec.delivery_count < op.delivery_count_limit
                    and offset not in reserved
                ):
                    out.append(offset)
    return out
