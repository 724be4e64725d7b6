"""The consumer's fetcher: for each assigned, unpaused partition one long-poll Fetch at a
time, run ahead of ``poll`` so records are ready when asked for, into a bounded buffer.

Bounded twice: a partition stops fetching while it holds ``partition_buffer_bytes`` not
yet polled, and every partition stops while the consumer holds ``max_buffer_bytes`` in
all, so memory does not grow with a slow ``poll`` loop nor, past the cap, with the number
of partitions. Entries are kept as the broker sent them; records are decoded by ``poll``,
in the caller's thread, only as far as it takes them.

With a ``client_rack``, a partition is read from its in-sync follower in that rack when
it has one (Kafka's KIP-392: FetchRequest.replica_read). Whatever that follower refuses,
a failure to reach it, or its leader not counting it in sync, sends the partition to its
leader for FOLLOWER_RETRY_S, after which the choice is made again on fresh metadata.

Positions have generations: a ``seek`` (or a reset after the log start moved past the
position) bumps the partition's generation and drops its buffer, and an answer to a fetch
started under an older generation is thrown away when it lands.

A partition's ``floor`` is an offset the consumer knows its log once reached: the group's
committed offset it started from, a high watermark or a list-offsets answer (a reset,
seek_to_beginning, seek_to_end) a broker gave; a plain ``seek`` does not raise it, so a
seek past the end still resets. A broker whose
committed log ends below the floor is behind (a leader just elected and still learning
its commit, a replica restarted or rebuilt from a snapshot), not the consumer: its "out
of range" above its end is asked again after a backoff, never answered with the reset
policy, which would move the position (and so a group's committed progress) back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.backoff import backoff
from raftmq.client.cluster_view import Leader
from raftmq.client.connections import Connections
from raftmq.client.errors import ClientError, error_of
from raftmq.format.tag_filter import TagFilter

log = logging.getLogger(__name__)

OffsetReset = Literal["earliest", "latest", "error"]
TopicPartition = tuple[str, int]
RPC_SLACK_S = 10.0
"""How much longer than its long poll a Fetch may take before the client gives up."""
FOLLOWER_RETRY_S = 5.0
"""How long a partition reads from its leader after its rack's follower failed a fetch."""
VIEW_MAX_AGE_S = 30.0
"""How old the metadata behind a follower choice may be (which replicas are in sync)."""
MIN_REFRESH_S = 1.0
"""Follower choices made again at once share one Metadata round within this time."""


class NoOffsetError(ClientError):
    """auto_offset_reset='error' and the partition has no position (or the log start moved
    past it): the caller must seek."""


@dataclass(slots=True)
class Chunk:
    generation: int
    entries: bytes
    next_offset: int
    aborted: dict[int, list[tuple[int, int]]] | None = None
    """read_committed: per producer id, the [first, last) offset ranges of its aborted
    transactions overlapping these entries (FetchResponse.aborted_transactions); its
    transactional entries in them are dropped by ``poll``."""

    def drops(self, producer_id: int, base_offset: int) -> bool:
        """Is a transactional entry of ``producer_id`` at ``base_offset`` part of an
        aborted transaction?"""
        ranges = self.aborted.get(producer_id) if self.aborted else None
        return ranges is not None and any(lo <= base_offset < hi for lo, hi in ranges)


@dataclass(slots=True)
class PartitionState:
    fetch_offset: int | None = None
    """The next offset to fetch; None until the reset policy or a seek gives one."""
    position: int | None = None
    """The next offset ``poll`` returns."""
    generation: int = 0
    floor: int = 0
    """An offset this partition's log is known to have reached (the group's committed
    offset, a high watermark or list-offsets answer a broker gave): a fetch at or below
    it that a broker calls past its end is retried, not reset (the module says why)."""
    paused: bool = False
    buffered: deque[Chunk] = field(default_factory=deque)
    buffered_bytes: int = 0
    error: ClientError | None = None
    """Raised by the next ``poll`` (a NoOffsetError, or a refusal a retry cannot mend)."""
    high_watermark: int = -1
    served_by: int = 0
    """The broker that answered the last fetch (FetchResponse.broker_id)."""
    leader_until_s: float = 0.0
    """Until then (monotonic) the partition reads from its leader, not its rack's follower."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Fetcher:
    """Runs on one event loop; ``lock`` guards the partition states, which ``poll`` reads
    from another thread in the synchronous consumer."""

    def __init__(
        self,
        bootstrap: tuple[str, ...],
        *,
        auto_offset_reset: OffsetReset,
        fetch_max_wait_ms: int,
        partition_buffer_bytes: int,
        max_buffer_bytes: int,
        on_data: Callable[[], None],
        client_rack: str | None = None,
        read_committed: bool = False,
        tag_filter: TagFilter | None = None,
        security: net.Security = net.PLAINTEXT,
        headers: net.Headers = (),
    ) -> None:
        self.bootstrap = bootstrap
        self.tag_filter = tag_filter
        """Sent with every fetch; ``poll`` drops the records of a batch that do not match."""
        self.client_rack = client_rack
        self.isolation = pb.READ_COMMITTED if read_committed else pb.READ_UNCOMMITTED
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.partition_buffer_bytes = partition_buffer_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.on_data = on_data
        self.lock = threading.Lock()
        self.states: dict[TopicPartition, PartitionState] = {}
        self.total_bytes = 0
        self.links = Connections(bootstrap, security=security, headers=headers)
        self._room = asyncio.Event()
        self._view_at_s = 0.0

    # --- offsets ---------------------------------------------------------------------------

    async def list_offset(self, tp: TopicPartition, spec: pb.ListOffsetsRequest) -> int:
        """ListOffsets at the partition's leader, following redirects and elections. The
        end of a read_committed consumer's partition (LATEST) is its last stable offset,
        as in Kafka: nothing past an open transaction is its to read yet."""
        spec.topic, spec.partition = tp
        for attempt in range(60):
            try:
                address = await self.links.leader(*tp)
                answer = await self.links.stub(address).ListOffsets(spec, timeout=10)
                latest = spec.WhichOneof("spec") == "position" and spec.position == pb.LATEST
                if latest and self.isolation == pb.READ_COMMITTED:
                    return int(min(answer.offset, answer.last_stable_offset))
                return int(answer.offset)
            except grpc.aio.AioRpcError as exc:
                err = error_of(exc)
                if not (err.retriable or err.unreachable or err.timed_out):
                    raise err from None
                self.links.learn(*tp, err)
                await backoff(attempt)
            except ClientError as err:  # no leader yet
                if not err.retriable:
                    raise
                await backoff(attempt)
        raise ClientError(
            f"no leader of {tp[0]}/{tp[1]} answered ListOffsets",
            pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
            grpc.StatusCode.UNAVAILABLE,
            {},
            "LEADER_NOT_AVAILABLE",
        )

    # --- assignment -------------------------------------------------------------------------

    def assign(self, partitions: list[TopicPartition]) -> None:
        wanted = set(partitions)
        for tp in list(self.states):
            if tp not in wanted:
                self._drop(tp)
        for tp in partitions:
            if tp not in self.states:
                state = PartitionState()
                self.states[tp] = state
                state.task = asyncio.get_running_loop().create_task(self._fetch_loop(tp, state))

    def _drop(self, tp: TopicPartition) -> None:
        state = self.states.pop(tp)
        if state.task is not None:
            state.task.cancel()
        with self.lock:
            self.total_bytes -= state.buffered_bytes
        self._room.set()

    def seek(self, tp: TopicPartition, offset: int | None, *, reached: bool = False) -> None:
        """Start ``tp`` over at ``offset`` (None: where the reset policy says).
        ``reached``: the log is known to have reached ``offset`` (the group committed it),
        so a broker that says it ends below it is behind and is asked again."""
        state = self.states[tp]
        with self.lock:
            if reached and offset is not None:
                state.floor = max(state.floor, offset)
            state.generation += 1
            self.total_bytes -= state.buffered_bytes
            state.buffered.clear()
            state.buffered_bytes = 0
            state.fetch_offset = state.position = offset
            state.error = None
        state.wake.set()
        self._room.set()

    def set_paused(self, tp: TopicPartition, paused: bool) -> None:
        state = self.states[tp]
        state.paused = paused
        state.wake.set()

    def consumed(self, freed_bytes: int) -> None:
        """``poll`` took chunks worth ``freed_bytes``: fetching may go on."""
        self._room.set()
        for state in self.states.values():
            state.wake.set()
        del freed_bytes

    # --- fetching -------------------------------------------------------------------------

    async def _fetch_loop(self, tp: TopicPartition, state: PartitionState) -> None:
        attempt = 0
        while True:
            if state.paused or state.error is not None or self._full(state):
                state.wake.clear()
                await state.wake.wait()
                continue
            generation = state.generation
            try:
                if state.fetch_offset is None:
                    offset = await self._reset_offset(tp, state)
                    if offset is None:
                        continue
                    with self.lock:
                        if state.generation == generation:
                            state.fetch_offset = state.position = offset
                            state.floor = max(state.floor, offset)  # a broker's own answer
                    continue
                answer = await self._fetch(tp, state, state.fetch_offset)
                if answer is None:
                    continue  # the follower failed: again at once, at the leader
                attempt = 0
            except ClientError as err:
                if err.code == pb.ERROR_CODE_OFFSET_OUT_OF_RANGE:
                    if self._out_of_range(tp, state, generation, err):
                        self.links.learn(*tp, err)
                        await backoff(attempt)
                        attempt += 1
                    continue
                if not (err.retriable or err.unreachable or err.timed_out):
                    self._fail(state, generation, err)
                    continue
                # A timed-out fetch (a broker frozen or cut off) is a read: ask again,
                # after fresh metadata, as for an unreachable one.
                self.links.learn(*tp, err)
                await backoff(attempt)
                attempt += 1
                continue
            self._deliver(state, generation, answer)

    def _full(self, state: PartitionState) -> bool:
        with self.lock:
            return (
                state.buffered_bytes >= self.partition_buffer_bytes
                or self.total_bytes >= self.max_buffer_bytes
            )

    async def _fetch(
        self, tp: TopicPartition, state: PartitionState, offset: int
    ) -> pb.FetchResponse | None:
        """One Fetch, at the partition's leader or its rack's follower; None when that
        follower failed it (the partition then reads from its leader for a while)."""
        follower = await self._closest(tp, state)
        address = follower.address if follower else await self.links.leader(*tp)
        request = pb.FetchRequest(
            topic=tp[0],
            partition=tp[1],
            offset=offset,
            max_bytes=self.partition_buffer_bytes,
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=1,
            replica_read=follower is not None,
            isolation_level=self.isolation,
            tag_filter="" if self.tag_filter is None else self.tag_filter.expression,
        )
        await self.links.throttle(address)
        try:
            answer: pb.FetchResponse = await self.links.stub(address).Fetch(
                request, timeout=self.fetch_max_wait_ms / 1000 + RPC_SLACK_S
            )
            self.links.hold_back(address, answer.throttle_time_ms)
            return answer
        except grpc.aio.AioRpcError as exc:
            err = error_of(exc)
            if follower is None:
                raise err from None
        # Whatever the follower said (not in sync, behind the position, gone), the leader
        # answers for the partition; its hint, if it gave one, is the freshest news.
        state.leader_until_s = time.monotonic() + FOLLOWER_RETRY_S
        log.debug(
            "%s/%d: reading from the leader for %.0f s; broker %d refused a replica read: %s",
            *tp,
            FOLLOWER_RETRY_S,
            follower.broker_id,
            err,
        )
        if err.meta.get("raftmq-leader-address"):
            self.links.learn(*tp, err)
        return None

    async def _closest(self, tp: TopicPartition, state: PartitionState) -> Leader | None:
        """The in-sync follower in the consumer's rack to read ``tp`` from, or None: no
        client_rack, none in the rack, the leader is there, or a fallback is running."""
        if self.client_rack is None:
            return None
        now = time.monotonic()
        if now < state.leader_until_s:
            return None
        stale = now - self._view_at_s > VIEW_MAX_AGE_S
        if (stale or state.leader_until_s) and now - self._view_at_s > MIN_REFRESH_S:
            self._view_at_s = now  # before the await: the other partitions share it
            await self.links.refresh()
        state.leader_until_s = 0.0
        view = self.links.view
        follower = view.closest_replica(*tp, self.client_rack)
        if follower is None and view.rack_follower(*tp, self.client_rack) is not None:
            # The rack's replica is out of sync: the leader, and a look again later.
            state.leader_until_s = now + FOLLOWER_RETRY_S
        return follower

    def _deliver(self, state: PartitionState, generation: int, answer: pb.FetchResponse) -> None:
        with self.lock:
            if state.generation != generation:
                return  # a seek came in meanwhile
            state.high_watermark = answer.high_watermark
            state.floor = max(state.floor, answer.high_watermark)
            state.served_by = answer.broker_id
            if not answer.entries:
                if state.fetch_offset is None or answer.next_offset <= state.fetch_offset:
                    return
                # A filtered fetch that matched nothing moves on past what the broker
                # looked at: an empty chunk takes the position there when it is polled.
                state.buffered.append(Chunk(generation, b"", answer.next_offset))
                state.fetch_offset = answer.next_offset
            else:
                self._buffer(state, generation, answer)
        self.on_data()

    def _buffer(self, state: PartitionState, generation: int, answer: pb.FetchResponse) -> None:
        """Keep the entries of ``answer`` for ``poll`` (the caller holds the lock)."""
        aborted: dict[int, list[tuple[int, int]]] | None = None
        for txn in answer.aborted_transactions:
            aborted = aborted or {}
            aborted.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        state.buffered.append(Chunk(generation, answer.entries, answer.next_offset, aborted))
        state.buffered_bytes += len(answer.entries)
        self.total_bytes += len(answer.entries)
        state.fetch_offset = answer.next_offset

    async def _reset_offset(self, tp: TopicPartition, state: PartitionState) -> int | None:
        if self.auto_offset_reset == "error":
            self._fail(
                state,
                state.generation,
                NoOffsetError(
                    f"{tp[0]}/{tp[1]} has no position and auto_offset_reset is 'error'; seek "
                    "it (seek, seek_to_beginning or seek_to_end) before polling",
                    pb.ERROR_CODE_OFFSET_OUT_OF_RANGE,
                    None,
                    {},
                    "",
                ),
            )
            return None
        where = pb.EARLIEST if self.auto_offset_reset == "earliest" else pb.LATEST
        return await self.list_offset(tp, pb.ListOffsetsRequest(position=where))

    def _out_of_range(
        self, tp: TopicPartition, state: PartitionState, generation: int, err: ClientError
    ) -> bool:
        """The position fell below the log start (retention) or past the end: start over
        where the reset policy says, or, with 'error', tell the caller. Returns True (ask
        again later, nothing changed) when the broker's log ends below an offset the
        partition is known to have reached: that broker is behind, and a reset would move
        the position back below records already consumed (and committed)."""
        with self.lock:
            offset = state.fetch_offset
            floor = state.floor
        end = _int_meta(err, "raftmq-high-watermark")
        if offset is not None and end is not None and end < offset <= floor:
            log.info(
                "%s/%d: a broker says its log ends at %d, below offset %d this consumer "
                "knows was reached; asking again rather than resetting",
                *tp,
                end,
                offset,
            )
            return True
        if self.auto_offset_reset == "error":
            sentence = (
                f"{err}; auto_offset_reset is 'error', so {tp[0]}/{tp[1]} waits for a seek "
                "(seek, seek_to_beginning or seek_to_end) before polling on"
            )
            self._fail(
                state,
                generation,
                NoOffsetError(sentence, err.code, err.status, err.meta, err.code_name),
            )
            return False
        with self.lock:
            if state.generation == generation:
                state.fetch_offset = None  # the next loop resets it
        return False

    def _fail(self, state: PartitionState, generation: int, err: ClientError) -> None:
        with self.lock:
            if state.generation == generation:
                state.error = err
        self.on_data()

    async def close(self) -> None:
        tasks = [s.task for s in self.states.values() if s.task is not None]
        for tp in list(self.states):
            self._drop(tp)
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        await self.links.close()


def _int_meta(err: ClientError, key: str) -> int | None:
    """An integer the broker put in the error's trailing metadata, or None."""
    try:
        return int(err.meta[key])
    except (KeyError, ValueError):
        return None
