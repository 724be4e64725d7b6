"""One replica of one partition on this broker: a Raft group whose log is the partition's
log, the high watermark that bounds what consumers see, and the fetches parked on it.

The leader takes producers' entries (checked, never decoded), proposes them to Raft, and
answers according to acks. Every replica, leader or follower, advances its high watermark
as entries commit and wakes the long polls waiting for data.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from raftmq.format import entry
from raftmq.format.errors import CorruptEntryError, FormatError, InvalidEntryError
from raftmq.format.tag_filter import TagFilter
from raftmq.log.config import LogConfig
from raftmq.log.errors import LogError
from raftmq.log.filtered_reads import FilteredRead
from raftmq.log.log import ReadResult
from raftmq.partition.aborted_transactions import AbortedIndexError, AbortedTransaction
from raftmq.partition.batch_check import check_produce
from raftmq.partition.errors import (
    ConcurrentTransactionsError,
    CorruptBatchError,
    CorruptDataError,
    InvalidBatchError,
    InvalidTxnStateError,
    LeaderNotReadyError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    PartitionDecommissionedError,
    PartitionError,
    ProducerFencedError,
    ProduceTimeoutError,
    ReplicaFailedError,
    UnknownProducerIdError,
)
from raftmq.partition.producer_state import MarkerVerdict, Verdict
from raftmq.partition.producer_tracking import PendingBatch, PendingMarker, ProducerTracking
from raftmq.partition.share_partition import SharePartitions
from raftmq.partition.share_tracking import ATTACHMENT_KEY, ShareTracking
from raftmq.raft import errors as raft_errors
from raftmq.raft.host.host import (
    DurableFn,
    GroupStatus,
    LogReads,
    Proposed,
    RaftGroup,
    RaftHost,
)
from raftmq.raft.membership import Membership
from raftmq.raft.messages import SnapshotMeta
from raftmq.raft.progress import ProgressState
from raftmq.raft.ready import Role, SoftState

log = logging.getLogger(__name__)

VALIDATE_INLINE_BYTES = 256 * 1024
"""Produce requests up to this size are checked on the event loop; larger ones in a thread."""
MAX_INFLIGHT_BYTES = 64 * 1024 * 1024
"""Bytes proposed but not yet answered, per partition: past it producers wait (backpressure)."""
MARKER_HOLD_S = 2.0
"""How long a transactional batch that came before its producer's marker of the last
transaction waits here for the marker before it is refused CONCURRENT_TRANSACTIONS
(retriable)."""
CORRUPT_PROBE_ENTRIES = 256
"""How many entries a read that met a corrupt one walks, one by one, to name its offset."""
MAX_CORRUPT_REPORTED = 1024
"""Corrupt places remembered per replica so each is logged once, not on every retry."""
IN_SYNC_MAX_LAG_ENTRIES = 16
"""How far below the commit a live, replicating follower's log may end and still count as
in sync for min.insync.replicas: under a steady load a healthy follower's last ack is
always a round or two behind the commit, and must not make acks=all writes fail."""


_LEADER_DOING = {
    ProgressState.PROBE: "is probing where its log ends (no recent answer, or it diverged)",
    ProgressState.REPLICATE: "is sending it entries",
    ProgressState.SNAPSHOT: "is sending it a snapshot",
}


class Acks(IntEnum):
    ALL = 0
    LEADER = 1
    NONE = 2


@dataclass(frozen=True, slots=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    records_appended: int = dataclasses.field(compare=False)
    """Records this request appended (0 for a duplicate answered from an earlier one): the
    broker counts produced records per topic from it, without walking the entries. Not
    compared: a duplicate's answer equals the first one's."""


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
        *,
        learners: list[int] | None = None,
        on_durable: DurableFn | None = None,
        min_insync_replicas: int = 1,
    ) -> None:
        """``replicas`` are the voters, ``learners`` the replicas being added (they copy
        the log, never campaign, and count for no quorum): the configuration a new
        replica starts from. A replica that has a log takes its configuration from it
        (CONFIG entries; the leader changes them as the metadata's replica set changes)."""
        self.topic = topic
        self.partition = partition
        self.replicas = replicas
        self.max_entry_bytes = log_config.max_message_bytes
        self.max_future_ms = log_config.message_timestamp_after_max_ms
        self.min_insync_replicas = min_insync_replicas
        self.decommissioned = False
        """Set from the metadata: the partition takes no new writes (reads go on)."""
        self._host = host
        self._hw_event = asyncio.Event()
        self._marker_event = asyncio.Event()
        """Set (and replaced) when this leader proposes a marker, or the leadership
        changes: the batches held for a marker check again. (A marker applied but not
        proposed here is one of an earlier term: a leader checks no batch before it
        applied those, so no batch can be held for one.)"""
        self._inflight_bytes = 0
        self._inflight_free = asyncio.Condition()
        self._corrupt_reported: set[tuple[str, int]] = set()
        self.leader_term = 0
        self.producers = ProducerTracking(directory, group_name(topic, partition))
        self.shares = ShareTracking(directory, group_name(topic, partition))
        self.producers.on_share = self.shares.on_entry
        self.producers.share_applied = lambda: self.shares.applied_index
        self.share = SharePartitions(self)
        """The share groups' operations on this partition (raftmq.partition.share_partition)."""
        self.shares.on_change = self.share.wake
        self.group: RaftGroup = host.open_group(
            group_name(topic, partition),
            directory,
            Membership(frozenset(replicas), frozenset(learners or ()) - frozenset(replicas)),
            log_config=_replicated(log_config),
            apply=self._apply,
            on_soft_state=self._on_soft_state,
            replay=False,
            on_snapshot=self._on_snapshot,
            on_durable=on_durable,
            snapshot_attachment=self._snapshot_attachment,
        )
        try:
            self._high_watermark = self._offset_after(self.group.commit_index)
        except (FormatError, LogError) as exc:
            # The committed entry it reads may lie in a sealed segment that rotted while
            # the broker was down: named as damage, the broker repairs it from a peer
            # (as for the group's own reads at open) instead of retrying the same read.
            raise self.group.damage_of(exc) from exc
        # The producer checkpoint may cover committed entries past the commit hint (written
        # lazily): the share state replays those too, so it is whole before it serves.
        self.shares.open_at(self._log, max(self.group.commit_index, self.producers.applied_index))
        self.producers.open_at(self._log, self.group.commit_index)

    # --- state ------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        """The offset after the last committed record: fetches read below it."""
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        # Never back: a consumer that read up to the high watermark must never be told
        # later that those offsets are out of range (or see other records there).
        assert offset >= self._high_watermark, (self._high_watermark, offset)
        self._high_watermark = offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest transaction open here, else the high watermark:
        read_committed fetches read below it. From committed entries, on every replica."""
        return self.producers.last_stable_offset(self._high_watermark)

    def aborted_transactions(self, lo: int, hi: int) -> list[AbortedTransaction]:
        """The aborted transactions with batches in offsets [lo, hi), by first offset."""
        try:
            return self.producers.states.aborted.overlapping(lo, hi)
        except AbortedIndexError as exc:
            # Never answer without them: the reader would take aborted records for
            # committed ones. Another replica has its own index.
            raise CorruptDataError(
                f"this replica of {self.topic}/{self.partition} cannot read its "
                f"aborted-transaction index: {exc}; read_committed fetches of offsets "
                f"{lo}-{hi} go to another replica (or retry once it is reopened)",
                self.leader_id if self.leader_id != self._host.node_id else 0,
            ) from None

    @property
    def _log(self) -> LogReads:
        return self.group.log_reader

    @property
    def is_leader(self) -> bool:
        return self.group.is_leader

    @property
    def led_term(self) -> int:
        """The term in which this replica leads, 0 when it does not lead (read from the
        group, not from :attr:`leader_term`, which follows the leader changes only once
        their round ends)."""
        group = self.group
        return group.term if group.is_leader else 0

    @property
    def leader_id(self) -> int:
        return self.group.leader

    @property
    def log_start_offset(self) -> int:
        return self._log.start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset after the last record in this replica's log (committed or not)."""
        return self._log.next_offset

    @property
    def log_size_bytes(self) -> int:
        """The bytes of this replica's segments on disk."""
        return self._log.size_bytes

    @property
    def state(self) -> tuple[str, str]:
        """("ok" | "catching_up" | "failed", why): this replica as it sees itself. A
        follower is catching up when its leader has committed past its log's end; how far
        behind each follower is, only the leader knows (:meth:`RaftHost.status`)."""
        st = self._host.status(self.group.name)
        if st.failed is not None:
            return "failed", st.failed
        if st.rejoining:
            return "catching_up", (
                "rejoining after losing entries or votes it had acknowledged; it votes again "
                "once it holds the leader's log"
            )
        if st.repairing:
            return "catching_up", "restoring a range that failed its checksum from a replica"
        if st.role != Role.LEADER and st.leader_commit > st.last_index:
            return "catching_up", (
                f"holds entries up to {st.last_index}; the leader has committed {st.leader_commit}"
            )
        return "ok", ""

    def replica_states(self) -> dict[int, tuple[str, str]]:
        """Broker id -> (state, why) for this replica and, on the leader, each follower:
        "ok" once its log matches the commit and the leader's connection to it is up, else
        "catching_up" (unreachable, or how far behind, and the leader's progress state
        for it)."""
        states = {self._host.node_id: self.state}
        st = self._host.status(self.group.name)
        alive = self._host.transport.peer_alive
        for peer, pr in sorted(st.followers.items()):
            if not alive(peer):
                states[peer] = (
                    "catching_up",
                    f"unreachable: the leader has no connection to it; it holds entries up "
                    f"to {pr.match} of the commit at {st.commit}",
                )
            elif pr.match >= st.commit and pr.state == ProgressState.REPLICATE:
                states[peer] = ("ok", "")
            else:
                states[peer] = (
                    "catching_up",
                    f"holds entries up to {pr.match} of the commit at {st.commit}; the leader "
                    + _LEADER_DOING[pr.state],
                )
        return states

    def reconfigure(self, log_config: LogConfig, min_insync_replicas: int) -> None:
        """Take a topic's altered settings live: the next produce is checked against the
        new limits, and the log (its rolls, retention, flushes) runs with them from now
        on; nothing reopens."""
        self.max_entry_bytes = log_config.max_message_bytes
        self.max_future_ms = log_config.message_timestamp_after_max_ms
        self.min_insync_replicas = min_insync_replicas
        self._host.reconfigure_log(self.group.name, _replicated(log_config))

    def in_sync_voters(self) -> list[int]:
        """On the leader: the voting replicas in sync, itself first. A follower is in sync
        while its connection is up, the leader is streaming entries to it, and its log
        ends at most IN_SYNC_MAX_LAG_ENTRIES below the commit. Empty off the leader."""
        return self._in_sync(self._host.status(self.group.name))

    def under_replicated(self) -> bool:
        """On the leader: fewer voters in sync (:meth:`in_sync_voters`) than the group has,
        Kafka's under-replicated partition. False off the leader (only it knows)."""
        st = self._host.status(self.group.name)
        if st.role != Role.LEADER or st.membership is None:
            return False
        return len(self._in_sync(st)) < len(st.membership.voters)

    def _in_sync(self, st: GroupStatus) -> list[int]:
        if st.role != Role.LEADER:
            return []
        alive = self._host.transport.peer_alive
        return [self._host.node_id] + [
            peer
            for peer, pr in sorted(st.followers.items())
            if not pr.learner
            and pr.state == ProgressState.REPLICATE
            and st.commit - pr.match <= IN_SYNC_MAX_LAG_ENTRIES
            and alive(peer)
        ]

    def _check_enough_in_sync(self) -> None:
        """acks=all promises the write is on min.insync.replicas voters: refuse it, before
        anything is appended, while fewer are in sync."""
        needed = self.min_insync_replicas
        if needed <= 1:
            return
        in_sync = self.in_sync_voters()
        if in_sync and len(in_sync) < needed:
            raise NotEnoughReplicasError(
                f"{self.topic}/{self.partition} has {len(in_sync)} in-sync replicas "
                f"(brokers {', '.join(map(str, in_sync))}) and its min.insync.replicas is "
                f"{needed}: nothing was written. Retry once its replicas are back, lower "
                "min.insync.replicas, or produce with acks=1"
            )

    def check_serving(self) -> None:
        """Raise ReplicaFailedError while this replica is quarantined."""
        failure = self.group.failure
        if failure is not None:
            raise ReplicaFailedError(self.topic, self.partition, failure)

    def _not_leader(self, leader: int, detail: str = "") -> NotLeaderError:
        return NotLeaderError(
            self.topic, self.partition, leader, detail, failed=self.group.failure or ""
        )

    def retention_floor(self) -> int:
        """The Raft index retention must keep: the first entry a restart replays to rebuild
        the producer state (after its durable checkpoint), or the entry of the oldest open
        transaction's first batch if that is earlier. Deleting the latter would leave
        read_committed readers a last stable offset below the log start, with the
        transaction's records gone before its marker says whether they count. A hanging
        transaction is ended by the coordinator's timeout (transaction_timeout_ms, at most
        15 minutes), which frees retention again."""
        replay = min(self.producers.replay_floor(), self.shares.replay_floor())
        first = self.producers.states.first_open_offset()
        log = self._log
        if first is None or not log.start_offset <= first < log.next_offset:
            # Not in this log, so nothing here to keep for it: below its start (retention
            # passed it before it opened here), or past its end (a snapshot or a cut-back
            # log left the producer state ahead of the log until the leader sends the
            # entries; chaos seed 7422 met it, and retention failed on it every pass).
            return replay
        return min(replay, entry.parse_header(log.read(first, 1).data).index)

    def _offset_after(self, index: int) -> int:
        log = self._log
        if index < log.start_index:
            return log.start_offset
        data = log.read_by_index(index, 1).data
        return entry.parse_header(data).next_offset

    def _apply(self, _: bytes, applied_to: int) -> None:
        """The commit reached ``applied_to`` (the group does not hand us the bytes: the log
        is the state). The high watermark is the offset after it."""
        group = self.group
        states = self.producers.states
        first_open = states.first_open_offset()
        if applied_to == group.last_index:
            self._advance_hw(group.next_offset)  # the usual case at low load: no read
        else:
            self._advance_hw(self._offset_after(applied_to))
        self.producers.catch_up(self._log, applied_to)
        self.shares.advanced(applied_to)
        if states.first_open_offset() != first_open:
            # A marker moved the last stable offset (it takes no offset, so the high
            # watermark stayed): wake the read_committed long polls.
            self._wake_fetches()

    def _on_snapshot(self, snap: SnapshotMeta, data: bytes) -> None:
        """A snapshot of a partition is its start point: everything before it is gone on
        the leader too, and everything up to it is committed. It carries the leader's
        producer state (open and aborted transactions, sequences), which the entries
        below the start point built."""
        self._advance_hw(snap.next_offset)
        self.producers.install(snap.index, snap.term, data)
        try:
            saved = json.loads(data) if data else None
        except ValueError:
            saved = None
        self.shares.install(snap.index, saved)

    def _snapshot_attachment(self) -> bytes:
        """What a leader sends with a snapshot: the producer state's object (which older
        versions read as they always did) with the share-partition state under its key."""
        saved = self.producers.snapshot_state()
        saved[ATTACHMENT_KEY] = self.shares.attachment()
        return json.dumps(saved, separators=(",", ":")).encode()

    def _advance_hw(self, offset: int) -> None:
        """Raise the high watermark to ``offset``; a lower one is ignored (a group reopened
        after quarantine restarts from its saved commit, which may be below it)."""
        # The log end never below the high watermark: a fetch below it must find its records
        # here, so the core's view may not run ahead of what the log has written.
        assert offset <= self._log.next_offset, (offset, self._log.next_offset)
        if offset > self._high_watermark:
            self.high_watermark = offset
            self._wake_fetches()

    def _markers_moved(self) -> None:
        self._marker_event.set()
        self._marker_event = asyncio.Event()

    def _wake_fetches(self) -> None:
        """Wake every parked fetch; each re-checks its own condition."""
        self._hw_event.set()
        self._hw_event = asyncio.Event()
        self.share.wake()

    def _on_soft_state(self, soft: SoftState) -> None:
        # The term in which the current leader (maybe this replica) was elected: clients
        # compare it to tell newer metadata from older.
        if soft.leader:
            self.leader_term = self.group.term
        # A batch held for a marker checks again now: a leader that lost its term answers
        # NOT_LEADER at once rather than after MARKER_HOLD_S.
        self._markers_moved()

    # --- produce ----------------------------------------------------------------------

    def validate(self, entries: bytes) -> None:
        """Refuse a producer's request unless every entry is consumable as it stands (client
        edge: batch_check); nothing is decoded beyond headers and record length prefixes."""
        check_produce(
            entries,
            max_entry_bytes=self.max_entry_bytes,
            max_future_ms=self.max_future_ms,
            now_ms=int(time.time() * 1000),
        )

    async def produce(self, entries: bytes, acks: Acks, timeout_s: float) -> ProduceResult:
        """Propose the request's entries as one proposal: they are appended together in one
        term or not at all, so one answer covers them and a refusal proves none was kept."""
        if len(entries) > VALIDATE_INLINE_BYTES:
            # The record walk costs ~10 us per KiB: a 64 MiB request would hold the event
            # loop (and with it every group's Raft ticks) for most of a second. In a thread
            # the interpreter switches back to the loop every few milliseconds.
            await asyncio.to_thread(self.validate, entries)
        else:
            self.validate(entries)
        self.check_serving()
        if self.decommissioned:
            raise PartitionDecommissionedError(
                f"{self.topic}/{self.partition} is decommissioned: it takes no new writes "
                "(its records stay readable until its data is deleted); produce to one of "
                "the topic's active partitions"
            )
        if not self.is_leader:
            raise self._not_leader(self.leader_id)
        if acks == Acks.ALL:
            self._check_enough_in_sync()
        producer = _producer_of(entries)
        size_bytes = len(entries)
        deadline_s = time.monotonic() + timeout_s
        await self._reserve(size_bytes, deadline_s)
        forget = None
        try:
            if producer is not None:
                earlier = await self._check_producer_held(producer, deadline_s)
                if isinstance(earlier, ProduceResult):
                    return earlier
                if earlier is not None:
                    await self._await_earlier(earlier.done, deadline_s, timeout_s, "batch")
                    return ProduceResult(earlier.base_offset, earlier.last_offset, 0)
            proposed = self._propose(entries, durable_locally=acks == Acks.LEADER)
            appended = proposed.last_offset - proposed.base_offset + 1
            waited: asyncio.Future[int] = proposed.done
            if producer is not None:
                # A retry of this batch may wait on the same future: a timeout here must
                # not cancel it, and its failure is then seen by whoever waits, or no one.
                waited = asyncio.shield(proposed.done)
                proposed.done.add_done_callback(_consume_exception)
                pid, epoch, first, count, transactional = producer
                forget = self.producers.proposed(
                    pid,
                    PendingBatch(
                        epoch,
                        first,
                        first + count - 1,
                        proposed.index,
                        proposed.base_offset,
                        proposed.last_offset,
                        proposed.done,
                        transactional,
                    ),
                )
            if acks == Acks.NONE:
                proposed.done.add_done_callback(_consume_exception)
                return ProduceResult(-1, -1, appended)
            await self._committed(waited, deadline_s, timeout_s, forget, "write")
            return ProduceResult(proposed.base_offset, proposed.last_offset, appended)
        finally:
            await self._release(size_bytes)

    def _propose(self, entries: bytes, *, durable_locally: bool) -> Proposed:
        """Hand ``entries`` to Raft, or raise the refusal that proves nothing was appended."""
        try:
            return self._host.propose(self.group.name, entries, durable_locally=durable_locally)
        except raft_errors.NotLeaderError as exc:
            raise self._not_leader(exc.leader) from None
        except raft_errors.GroupFailedError as exc:
            raise ReplicaFailedError(self.topic, self.partition, exc.reason) from None
        except raft_errors.ProposalDroppedError as exc:
            # Refused before anything was appended (e.g. a leadership transfer is under
            # way): definite, and the client should retry at the next leader.
            raise self._not_leader(0, f"nothing was written: {exc}") from None
        except CorruptEntryError as exc:
            raise CorruptBatchError(f"a batch failed its CRC32C check: {exc}") from None
        except InvalidEntryError as exc:
            # The Raft core's own check of what it is handed; validate() should have
            # caught it first, and a client must still get a refusal, not a crash.
            raise InvalidBatchError(f"malformed batch: {exc}") from None

    async def _committed(
        self,
        waited: asyncio.Future[int],
        deadline_s: float,
        timeout_s: float,
        forget: Callable[[], None] | None,
        what: str,
    ) -> None:
        """Wait until a proposal of this leader commits, or raise what its client is told."""
        remaining_s = max(0.0, deadline_s - time.monotonic())
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for adds a waiter future
            # and a callback between the commit and this task (two more loop turns on
            # every acks=all answer, ~20-40 us on a busy machine).
            async with asyncio.timeout(remaining_s):
                await waited
        except TimeoutError:
            raise ProduceTimeoutError(
                f"the {what} was not confirmed by a majority within {timeout_s * 1000:.0f} "
                "ms; it may or may not have been committed"
            ) from None
        except raft_errors.OutcomeUnknownError as exc:
            who = "this broker's replica" if self.group.failure else "the broker"
            raise OutcomeUnknownError(
                f"{who} stopped before the {what} was confirmed ({exc}); it may or may "
                "not have been committed"
            ) from None
        except (raft_errors.NotLeaderError, raft_errors.ProposalDroppedError) as exc:
            # Definite: the entry was replaced or never kept, so a retry cannot duplicate.
            if forget is not None:
                forget()
            raise self._not_leader(
                self.leader_id, f"the {what} was not kept, a retry cannot duplicate it: {exc}"
            ) from None

    def _check_ready(self, what: str) -> None:
        """A leader checks producers' writes only once its producer state holds every
        entry of earlier terms (ProducerTracking.ready)."""
        if not self.is_leader:
            raise self._not_leader(self.leader_id)
        if not self.producers.ready(self.led_term):
            raise LeaderNotReadyError(
                f"broker {self._host.node_id} became leader of {self.topic}/{self.partition} "
                "a moment ago and is still applying the entries of earlier terms; it takes "
                f"{what} once it has (retry shortly)"
            )

    def _check_producer(
        self, producer_id: int, epoch: int, first_sequence: int, count: int, transactional: bool
    ) -> ProduceResult | PendingBatch | None:
        """An idempotent or transactional producer's batch against what this partition
        holds and what this leader proposed: None to append it, its first answer (a
        ProduceResult, or the proposal still on its way) when it is a duplicate; raises
        for a refusal."""
        self._check_ready("idempotent and transactional batches")
        decision = self.producers.check(producer_id, epoch, first_sequence, count, transactional)
        verdict = decision.verdict
        if verdict is Verdict.APPEND:
            return None
        if verdict is Verdict.DUPLICATE:
            if decision.duplicate_of is not None:
                first = decision.duplicate_of
                return ProduceResult(first.base_offset, first.last_offset, 0)
            pending = self.producers.pending_duplicate(
                producer_id, epoch, first_sequence, first_sequence + count - 1
            )
            assert pending is not None, "check() said a pending duplicate"
            return pending
        where = f"{self.topic}/{self.partition}: "
        error = _REFUSALS.get(verdict, OutOfOrderSequenceError)
        raise error(where + decision.message)

    async def _check_producer_held(
        self, producer: tuple[int, int, int, int, bool], deadline_s: float
    ) -> ProduceResult | PendingBatch | None:
        """:meth:`_check_producer`, holding a transactional batch that arrived before its
        producer's marker of the last transaction (CONCURRENT_TRANSACTIONS) until this
        leader proposes the marker (or loses its term), within the request's deadline and
        MARKER_HOLD_S. The coordinator lets the next transaction begin while the last
        one's markers are written, so this is the usual race, not a fault: a refusal would
        cost the producer a retry backoff."""
        give_up_s = min(deadline_s, time.monotonic() + MARKER_HOLD_S)
        while True:
            moved = self._marker_event
            try:
                return self._check_producer(*producer)
            except ConcurrentTransactionsError:
                left_s = give_up_s - time.monotonic()
                if left_s <= 0:
                    raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), left_s)

    async def _await_earlier(
        self, done: asyncio.Future[int], deadline_s: float, timeout_s: float, what: str
    ) -> None:
        """A resend of a batch or marker this leader proposed and has not seen commit: its
        answer is the first proposal's, once that commits."""
        try:
            await asyncio.wait_for(asyncio.shield(done), max(0.0, deadline_s - time.monotonic()))
        except TimeoutError:
            raise ProduceTimeoutError(
                f"this {what} was sent before and is not confirmed by a majority within "
                f"{timeout_s * 1000:.0f} ms; it may or may not be committed"
            ) from None
        except (raft_errors.NotLeaderError, raft_errors.ProposalDroppedError) as exc:
            raise self._not_leader(
                self.leader_id, f"the {what}'s first write was not kept: {exc}"
            ) from None
        except raft_errors.OutcomeUnknownError as exc:
            raise OutcomeUnknownError(
                f"the broker stopped before the {what} was confirmed ({exc})"
            ) from None

    # --- transaction markers ----------------------------------------------------------

    async def write_marker(
        self, producer_id: int, epoch: int, commit: bool, timeout_s: float
    ) -> None:
        """End ``producer_id``'s transaction here with a TXN_MARKER of ``epoch`` (the one
        the coordinator moved it to), returning once the marker is committed; a marker this
        partition holds already (a resend) returns at once and appends nothing
        (docs/transactions.md). A decommissioned partition takes markers still: its
        readers must see its transactions end.

        The decision and the proposal happen with no await between them, and each
        proposed marker is pending for the checks until it applies, so neither a second
        marker nor a batch of the producer is ever checked against stale state."""
        self.check_serving()
        self._check_ready("transaction markers")
        deadline_s = time.monotonic() + timeout_s
        verdict, earlier = self.producers.check_marker(producer_id, epoch)
        if verdict is MarkerVerdict.HELD:
            return
        if earlier is not None:
            await self._await_earlier(earlier.done, deadline_s, timeout_s, "marker")
            return
        self._check_enough_in_sync()  # a new marker is an acks=all write
        marker = entry.encode_marker(
            commit=commit,
            producer_id=producer_id,
            producer_epoch=epoch,
            timestamp_ms=int(time.time() * 1000),
        )
        proposed = self._propose(marker, durable_locally=False)
        proposed.done.add_done_callback(_consume_exception)
        forget = self.producers.proposed(
            producer_id, PendingMarker(epoch, proposed.index, proposed.done)
        )
        self._markers_moved()  # a batch held for this marker may be proposed behind it
        await self._committed(
            asyncio.shield(proposed.done), deadline_s, timeout_s, forget, "marker"
        )

    async def _reserve(self, size_bytes: int, deadline_s: float) -> None:
        async with self._inflight_free:
            while self._inflight_bytes and self._inflight_bytes + size_bytes > MAX_INFLIGHT_BYTES:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    raise ProduceTimeoutError(
                        f"the partition has {self._inflight_bytes} bytes of writes in flight, "
                        f"its limit is {MAX_INFLIGHT_BYTES} bytes, and the request timed out "
                        "waiting for room; nothing was written. Slow down or raise timeout_ms."
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._inflight_free.wait(), remaining_s)
            self._inflight_bytes += size_bytes

    async def _release(self, size_bytes: int) -> None:
        async with self._inflight_free:
            self._inflight_bytes -= size_bytes
            self._inflight_free.notify_all()

    # --- fetch ------------------------------------------------------------------------

    def follower_read_refusal(self, offset: int) -> NotLeaderError | None:
        """Why this replica may not answer a consumer's replica read (FetchRequest.
        replica_read) at ``offset``, or None when it may: the leader always may; a follower
        only while in sync by its own lights (a voter, not quarantined, rejoining or
        repairing, its log holding everything its leader said is committed, its leader
        known and its connection to it up) and while ``offset`` is within what it holds
        committed. Past its high watermark the consumer has seen more than this follower
        knows; below its log start only the leader may say out of range (a reset). The
        refusal names the leader (none when it is unreachable), so the consumer goes there."""
        if self.is_leader:
            return None
        st = self._host.status(self.group.name)
        leader = st.leader
        why = ""
        if st.failed is not None or st.rejoining or st.repairing:
            why = self.state[1]
        elif leader == 0 or leader == self._host.node_id:
            why = "it knows no leader"
        elif not self._host.transport.peer_alive(leader):
            why = f"it has no connection to the leader, broker {leader}"
            leader = 0
        elif st.membership is not None and self._host.node_id not in st.membership.voters:
            why = "it is a learner, still copying the log"
        elif st.leader_commit > st.last_index:
            why = self.state[1]
        elif offset > self.high_watermark:
            why = (
                f"its commit reaches offset {self.high_watermark}, below the fetch offset {offset}"
            )
        elif offset < self.log_start_offset:
            why = f"its log starts at offset {self.log_start_offset}, after the fetch offset"
        if not why:
            return None
        return self._not_leader(leader, f"this follower does not serve the read now: {why}")

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        replica_read: bool = False,
        read_committed: bool = False,
        tag_filter: TagFilter | None = None,
    ) -> ReadResult | FilteredRead:
        """Committed entries from ``offset``; OffsetOutOfRangeError names the valid range.
        ``replica_read``: a consumer's read of the closest replica; a follower that may not
        serve it (:meth:`follower_read_refusal`) refuses with NotLeaderError.
        ``read_committed``: only entries below the last stable offset (an offset between it
        and the high watermark is valid and reads nothing yet).
        ``tag_filter``: only the entries that may match it, and a next offset past all that
        was looked at (Log.read_filtered)."""
        self.check_serving()
        if replica_read:
            refusal = self.follower_read_refusal(offset)
            if refusal is not None:
                raise refusal
        hw = self.high_watermark
        start = self.log_start_offset
        if not start <= offset <= hw:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic}/{self.partition}: "
                f"valid offsets are {start} to {hw} (the high watermark)",
                start,
                hw,
            )
        log_ = self._log
        # The log end never below the high watermark: every offset a consumer was told is
        # committed must be readable here (a log only loses a suffix above the commit).
        assert hw <= log_.next_offset, (hw, log_.next_offset)
        upper = self.last_stable_offset if read_committed else hw
        try:
            if tag_filter is not None:
                return log_.read_filtered(offset, max_bytes, tag_filter, upper_offset=upper)
            return log_.read(offset, max_bytes, upper_offset=upper)
        except CorruptEntryError as exc:
            self._host.request_repair(self.group.name, "a client read")  # restore it from a replica
            raise self._corrupt(exc, offset, hw) from None
        except (LogError, FormatError) as exc:
            if hasattr(exc, "start"):
                raise OffsetOutOfRangeError(str(exc), start, hw) from None
            raise

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first committed offset whose entry's max timestamp is at or after
        ``timestamp_ms``, or the high watermark when none is."""
        hw = self.high_watermark
        try:
            found = self._log.offset_for_timestamp(timestamp_ms)
        except CorruptEntryError as exc:
            raise self._corrupt(exc, self.log_start_offset, hw) from None
        return hw if found is None else min(found, hw)

    def _corrupt(self, exc: CorruptEntryError, offset: int, hw: int) -> CorruptDataError:
        """The client's error for a stored entry that failed its checksum on a read, with
        the offset it starts at (found by reading on entry by entry: corruption is rare,
        so the walk costs nothing in the common case), logged once as a WARNING: a disk
        problem, not the client's, and no traceback to add."""
        bad = offset
        log_ = self._log
        with contextlib.suppress(LogError, FormatError):
            for _ in range(CORRUPT_PROBE_ENTRIES):
                result = log_.read(bad, 1, upper_offset=hw)
                if not result.entries or result.next_offset >= hw:
                    break
                bad = result.next_offset
        me = self._host.node_id
        leader = self.leader_id
        if leader and leader != me:
            where = f"fetch them from the leader, broker {leader}, or another replica"
        else:
            where = "fetch them from another replica or retry later"
        place = (exc.segment, exc.position)
        if (
            place not in self._corrupt_reported
            and len(self._corrupt_reported) < MAX_CORRUPT_REPORTED
        ):
            self._corrupt_reported.add(place)
            log.warning(
                "%s/%d: stored entry from offset %d failed its checksum (%s)",
                self.topic,
                self.partition,
                bad,
                exc,
            )
        return CorruptDataError(
            f"offsets from {bad} of {self.topic}/{self.partition} failed their checksum on "
            f"broker {me} (segment {exc.segment or '?'} byte {exc.position}): {where}",
            leader,
        )

    async def fetch(
        self,
        offset: int,
        max_bytes: int,
        min_bytes: int,
        max_wait_s: float,
        *,
        replica_read: bool = False,
        read_committed: bool = False,
        tag_filter: TagFilter | None = None,
    ) -> ReadResult | FilteredRead:
        """Long poll: answer once ``min_bytes`` of committed data are there (below the last
        stable offset for ``read_committed``), or at the end of ``max_wait_s`` with
        whatever there is (maybe nothing). A replica read on a follower whose commit is
        still below ``offset`` (it trails the leader's by about a heartbeat) waits for it
        within the same time before refusing. With a ``tag_filter``, matching data counts;
        each wake-up reads on from where the last read stopped looking (only the new
        range), and the answer's next offset is past all that was looked at."""
        deadline_s = time.monotonic() + max_wait_s
        gathered: list[FilteredRead] = []
        while True:
            commit_behind = replica_read and offset > self.high_watermark and not self.is_leader
            if not commit_behind or time.monotonic() >= deadline_s:
                result = self.read(
                    offset,
                    max_bytes,
                    replica_read=replica_read,
                    read_committed=read_committed,
                    tag_filter=tag_filter,
                )
                if isinstance(result, FilteredRead):
                    gathered.append(result)
                    result = _joined(gathered)
                    offset = result.next_offset
                    max_bytes -= len(gathered[-1].data)
                    upper = self.last_stable_offset if read_committed else self.high_watermark
                    if max_bytes <= 0 or offset < upper:
                        return result  # full, or the read stopped at its work bound
                if len(result.data) >= max(min_bytes, 1) or time.monotonic() >= deadline_s:
                    return result
            event = self._hw_event
            # asyncio.timeout, not wait_for: on 3.11 wait_for runs the wait in a task of
            # its own on every long poll.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline_s - time.monotonic())):
                    await event.wait()

    async def wait_for_records(self, offset: int, timeout_s: float) -> None:
        """Return once the high watermark is past ``offset``, or after ``timeout_s``: how a
        reader of the committed log on the broker (the delay movers) waits for new
        records without polling."""
        event = self._hw_event
        if self.high_watermark > offset:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()


def _joined(reads: list[FilteredRead]) -> FilteredRead:
    """The filtered reads of one long poll, one after the other, as one answer."""
    if len(reads) == 1:
        return reads[0]
    return FilteredRead(
        b"".join(r.data for r in reads),
        sum(r.entries for r in reads),
        reads[-1].next_offset,
        sum(r.read_bytes for r in reads),
    )


def _replicated(log_config: LogConfig) -> LogConfig:
    """The settings a partition's log runs with: the topic's, but any entry size up to the
    format's limit. max.message.bytes is checked where producers' entries come in
    (:meth:`PartitionReplica.validate`, on the leader); an entry a leader accepted must
    be taken by every replica, also after the limit was lowered (a follower catching up
    on older entries) or before a follower's broker saw it raised, else that follower
    could never hold its leader's log."""
    return dataclasses.replace(log_config, max_message_bytes=entry.MAX_ENTRY_BYTES)


def _producer_of(entries: bytes) -> tuple[int, int, int, int, bool] | None:
    """(producer id, epoch, base sequence, record count, transactional) of an idempotent or
    transactional producer's request, or None for a plain one. Such a request holds that
    one entry, as Kafka's holds one batch per partition: the answer is that batch's, a
    duplicate's included."""
    f = entry.decode_header(entries, 0)
    producer_id = f[11]
    if producer_id < 0:
        return None
    # check_produce (run by validate, first) refuses a producer's entry beside another.
    assert f[0] + 4 == len(entries), "a producer's entry goes alone in its request"
    return producer_id, f[12], f[13], f[8], bool(f[4] & entry.TRANSACTIONAL)


_REFUSALS: dict[Verdict, type[PartitionError]] = {
    Verdict.FENCED: ProducerFencedError,
    Verdict.UNKNOWN_PRODUCER: UnknownProducerIdError,
    Verdict.OUT_OF_ORDER: OutOfOrderSequenceError,
    Verdict.INVALID_TXN_STATE: InvalidTxnStateError,
    Verdict.CONCURRENT_TRANSACTIONS: ConcurrentTransactionsError,
}


def _consume_exception(fut: asyncio.Future[int]) -> None:
    """acks=0 callers never look at the outcome; keep asyncio from logging it as lost."""
    if not fut.cancelled():
        fut.exception()
