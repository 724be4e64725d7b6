"""Driver-side planning for the Spark source: which partitions a query reads, where each
one starts and ends, and how the work is cut into Spark tasks.

Every range ends at or below the partition's high watermark as its leader reported it at
planning time, so a task only ever asks for committed records: a batch query over fixed
offsets is repeatable, and a stream never shows a record that a failover could still take
back. Offsets travel through Spark's checkpoints as JSON, ``{"topic": {"0": next_offset}}``
(string keys: JSON has no others).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import ClientError, ErrorCode, LowLevelClient
from raftmq.client.errors import error_of
from raftmq.spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, SourceError

TopicPartition = tuple[str, int]
JsonOffsets = dict[str, dict[str, int]]
"""topic -> partition (as a string) -> next offset to read, as Spark's checkpoint holds it."""

LIST_OFFSETS_TRIES = 20
RPC_TIMEOUT_S = 10.0
LEADERS_TIMEOUT_S = 2.0
"""Per broker, when asking every broker for leaders: a stopped one must not hold planning."""


def data_lost(tp: TopicPartition, wanted: int, log_start: int) -> str:
    """The sentence for offsets deleted (by retention) before this query read them."""
    return (
        f"{tp[0]}/{tp[1]}: offsets {wanted} to {log_start - 1} were deleted (retention) before "
        f"this query read them; the partition now starts at {log_start}. Set "
        "failOnDataLoss=false to skip what is gone and read on from there."
    )


@dataclass(frozen=True, slots=True)
class PartitionEnds:
    """One partition as its leader saw it: offsets [log_start, high_watermark) are readable.
    With isolationLevel=read_committed ``high_watermark`` is the last stable offset: a
    read_committed query never plans past a transaction still open."""

    topic: str
    partition: int
    log_start: int
    high_watermark: int
    replicas: tuple[str, ...]  # client addresses, for readFromReplicas


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """One Spark task's work: records [start, end) of one partition. Picklable, small."""

    topic: str
    partition: int
    start: int
    end: int
    replicas: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Cut ranges into more pieces until there are at least ``min_partitions``: each range
    gets pieces in proportion to its size, rounded up (Kafka's source rounds to nearest,
    which can give fewer than asked), at least one and at most one per record."""
    total = sum(r.size for r in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    out = []
    for r in ranges:
        pieces = max(1, min(r.size, math.ceil(r.size * min_partitions / total)))
        step, extra = divmod(r.size, pieces)
        start = r.start
        for i in range(pieces):
            end = start + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, start, end, r.replicas))
            start = end
        assert start == r.end
    return out


def apportion(
    begin: Mapping[TopicPartition, int], upto: Mapping[TopicPartition, int], max_rows: int
) -> dict[TopicPartition, int]:
    """New ends so that at most ``max_rows`` records are read in all, shared in proportion to
    each partition's backlog (maxOffsetsPerTrigger); the remainder goes one by one to the
    partitions furthest behind, so a limit of 1 still moves."""
    lag = {k: upto[k] - begin[k] for k in upto}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(upto)
    give = {k: lag[k] * max_rows // total for k in lag}
    spare = max_rows - sum(give.values())
    for k in sorted(lag, key=lambda k: (give[k] - lag[k], k)):
        if spare == 0:
            break
        if give[k] < lag[k]:
            give[k] += 1
            spare -= 1
    return {k: begin[k] + give[k] for k in upto}


def to_json(offsets: Mapping[TopicPartition, int]) -> JsonOffsets:
    out: JsonOffsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


class Planner:
    """Asks the cluster (Metadata, ListOffsets at each leader) and turns options into ranges.
    Lives on the driver; its client is opened on first use and never pickled."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: LowLevelClient | None = None
        self._leaders: Mapping = {}  # from the last describe()

    def __getstate__(self) -> dict[str, ReadOptions]:
        return {"options": self.options}  # channels are per process: never pickled

    def __setstate__(self, state: dict[str, ReadOptions]) -> None:
        self.options = state["options"]
        self._client = None
        self._leaders = {}

    @property
    def client(self) -> LowLevelClient:
        if self._client is None:
            self._client = LowLevelClient(
                list(self.options.bootstrap), retries=10, **self.options.client_tls()
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # --- what the cluster holds -------------------------------------------------------------

    def describe(self) -> dict[TopicPartition, PartitionEnds]:
        """Every partition this query reads, with its log start and high watermark now."""
        md = self._metadata()
        brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers}
        known = {t.name: t for t in md.topics}
        opts = self.options
        missing = [t for t in (*opts.subscribe, *(t for t, _ in opts.assign)) if t not in known]
        if missing:
            raise SourceError(
                f"topic {missing[0]!r} does not exist in the cluster at "
                f"{','.join(opts.bootstrap)}; its topics are: {', '.join(sorted(known)) or 'none'}"
            )
        assigned = set(opts.assign)
        self._leaders = leaders = self.client.refresh_leaders(timeout=LEADERS_TIMEOUT_S)
        out = {}
        for name in sorted(known):
            if not opts.wants(name):
                continue
            for p in known[name].partitions:
                tp = (name, p.partition)
                if assigned and tp not in assigned:
                    continue
                _, log_start, hw, lso = self._list_offsets(
                    tp,
                    leaders,
                    pb.ListOffsetsRequest(topic=name, partition=p.partition, position=pb.LATEST),
                )
                if opts.read_committed:
                    hw = min(hw, lso)
                replicas = tuple(brokers[r] for r in p.replicas if r in brokers)
                out[tp] = PartitionEnds(name, p.partition, log_start, hw, replicas)
        absent = sorted(assigned - set(out))
        if absent:
            t, p = absent[0]
            count = len(known[t].partitions)
            raise SourceError(f"assign names {t}/{p}, but topic {t!r} has {count} partitions")
        return out

    def _metadata(self) -> pb.MetadataResponse:
        try:
            return self.client.metadata(timeout=RPC_TIMEOUT_S)
        except ClientError as exc:
            raise SourceError(
                f"no raftmq broker answered at {','.join(self.options.bootstrap)} ({exc}); "
                "check the bootstrap option and that the cluster runs (`raftmq status`)"
            ) from None

    def _list_offsets(
        self, tp: TopicPartition, leaders: Mapping, request: pb.ListOffsetsRequest
    ) -> tuple[int, int, int, int]:
        """(offset, log start, high watermark, last stable offset) from the partition's
        leader, following
        leadership changes for a bounded time. Only the leader's high watermark is the
        partition's commit point; a follower's may lag it."""
        last: ClientError | None = None
        for attempt in range(LIST_OFFSETS_TRIES):
            leader = leaders.get(tp)
            if leader is not None:
                try:
                    r = self.client.stub(leader.address).ListOffsets(request, timeout=RPC_TIMEOUT_S)
                    return r.offset, r.log_start_offset, r.high_watermark, r.last_stable_offset
                except grpc.RpcError as exc:
                    last = error_of(exc)
                    if last.code in (
                        ErrorCode.ERROR_CODE_UNKNOWN_TOPIC,
                        ErrorCode.ERROR_CODE_UNKNOWN_PARTITION,
                    ):
                        raise SourceError(f"{tp[0]}/{tp[1]}: {last}") from None
            time.sleep(min(1.0, 0.05 * 1.5**attempt))
            leaders = self.client.refresh_leaders(timeout=LEADERS_TIMEOUT_S)
        raise SourceError(
            f"{tp[0]}/{tp[1]} has no leader that answers ({last or 'none elected'}); "
            "is a majority of its replicas running? (`raftmq status`)"
        )

    # --- offsets -------------------------------------------------------------------------------

    def resolve(
        self,
        spec: OffsetSpec | None,
        default: str,
        ends: Mapping[TopicPartition, PartitionEnds],
        *,
        starting: bool,
    ) -> dict[TopicPartition, int]:
        """Concrete offsets for ``startingOffsets``/``startingTimestamp`` or ``endingOffsets``.
        Partitions the JSON leaves out take ``default``; a starting offset that retention
        deleted is data loss (see :meth:`check_start`)."""
        opts = self.options
        if starting and opts.starting_timestamp_ms is not None:
            return {
                tp: min(self._offset_for_time(tp, opts.starting_timestamp_ms), e.high_watermark)
                for tp, e in ends.items()
            }
        spec = default if spec is None else spec
        name = "startingOffsets" if starting else "endingOffsets"
        if isinstance(spec, dict):
            listed = {(t, p) for t, parts in spec.items() for p in parts}
            stray = sorted(listed - set(ends))
            if stray:
                raise SourceError(
                    f"{name} names {stray[0][0]}/{stray[0][1]}, which this query does not read "
                    f"(it reads {', '.join(f'{t}/{p}' for t, p in sorted(ends)) or 'nothing'})"
                )
        fallback = (
            EARLIEST if (spec if isinstance(spec, str) else default) == "earliest" else LATEST
        )
        out = {}
        for tp, e in ends.items():
            wanted = (
                spec.get(tp[0], {}).get(tp[1], fallback) if isinstance(spec, dict) else fallback
            )
            offset = {EARLIEST: e.log_start, LATEST: e.high_watermark}.get(wanted, wanted)
            if offset > e.high_watermark:
                raise SourceError(
                    f"{name} gives offset {offset} for {tp[0]}/{tp[1]}, past its committed end "
                    f"{e.high_watermark}: only committed records can be read"
                )
            out[tp] = self.check_start(tp, offset, e) if starting else offset
        return out

    def check_start(self, tp: TopicPartition, offset: int, e: PartitionEnds) -> int:
        """Where reading really starts: ``offset``, or the log start when retention deleted
        what lies before it and failOnDataLoss is off (else the query fails, naming them)."""
        if offset >= e.log_start:
            return offset
        if self.options.fail_on_data_loss:
            raise SourceError(data_lost(tp, offset, e.log_start))
        return e.log_start

    def _offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """The first offset at or after ``timestamp_ms`` (the high watermark if none is)."""
        request = pb.ListOffsetsRequest(topic=tp[0], partition=tp[1], timestamp_ms=timestamp_ms)
        return self._list_offsets(tp, self._leaders, request)[0]

    def ranges(
        self,
        begin: Mapping[TopicPartition, int],
        end: Mapping[TopicPartition, int],
        ends: Mapping[TopicPartition, PartitionEnds],
    ) -> list[OffsetRange]:
        """The tasks for reading [begin, end) of every partition, split for minPartitions."""
        out = []
        for tp in sorted(end):
            start = begin.get(tp, 0)
            if end[tp] > start:
                replicas = ends[tp].replicas if tp in ends else ()
                out.append(OffsetRange(tp[0], tp[1], start, end[tp], replicas))
        return split_ranges(out, self.options.min_partitions)
