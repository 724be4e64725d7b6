"""The broker's request layer, free of any wire protocol: for a request on a topic and a
partition it finds this broker's replica (or says where the leader is), checks that the
broker has metadata, auto-creates topics, and carries out produce, fetch, list-offsets,
metadata, init-producer-id and rebuild on plain values (names, numbers, bytes), returning
plain results or raising :class:`~raftmq.broker.refusals.Refusal`.

Why apart from the gRPC service: the service (raftmq.broker.service) only translates
messages to these calls and back, so a second listener (a Kafka wire-protocol one, an HTTP
one) calls the same methods and gives the same answers and refusals. Nothing here imports
grpc or the generated messages (tests/broker/test_broker_imports.py); error codes are the
api floor's ``ErrorCode`` values, whose names every protocol can map.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from raftmq.api.error_codes import ErrorCode
from raftmq.broker.auto_create import MAX_CREATIONS, TopicCreator, unknown_topic
from raftmq.broker.controller_link import LinkRefusal
from raftmq.broker.delay_checks import check_delayed, check_mover_ids
from raftmq.broker.delay_steps import LevelPending
from raftmq.broker.producer_ids import ALLOCATE_TIMEOUT_S, ProducerIdBlocks
from raftmq.broker.refusals import Refusal, name_list, shorten
from raftmq.broker.topic_settings import expired, reported_leader
from raftmq.broker.topic_traffic import TopicTraffic
from raftmq.broker.unopened import OpenState, RebuildRefused, Unopened, UnopenedReplicas
from raftmq.controller.metadata import TOPIC_NAME, broker_addresses
from raftmq.controller.model import MetadataState, Partition
from raftmq.format import entry
from raftmq.format.delay import DELAY_TOPIC
from raftmq.log.config import LogConfig
from raftmq.partition.aborted_transactions import AbortedTransaction
from raftmq.partition.errors import PartitionError
from raftmq.partition.replica import Acks, PartitionReplica

DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 300_000
DEFAULT_FETCH_BYTES = 1 << 20
"""What a Fetch with max_bytes 0 reads at most. With one entry of the default max.message.bytes
(1 MiB) over it and the message overhead, the answer fits the 4 MiB that gRPC clients in
other languages receive by default (FETCH_OVERHEAD_BYTES, broker.proto's Fetch comment)."""
MAX_FETCH_BYTES = 64 << 20
"""The largest max_bytes a Fetch may ask for; a client asking for it must raise its receive
limit to max_bytes + max.message.bytes + FETCH_OVERHEAD_BYTES."""
FETCH_OVERHEAD_BYTES = 64 << 10
"""What a FetchResponse adds to its entries (fields, framing), with room to spare."""
CLIENT_DEFAULT_RECEIVE_BYTES = 4 << 20
"""gRPC's default receive limit in most languages (Java, Go, Node.js, C++)."""
assert (
    DEFAULT_FETCH_BYTES + LogConfig().max_message_bytes + FETCH_OVERHEAD_BYTES
    <= CLIENT_DEFAULT_RECEIVE_BYTES
), "a Fetch with the default max_bytes must fit a gRPC client's default receive limit"
MAX_WAIT_MS = 60_000
MAX_PARKED_FETCHES = 10_000
MAX_MARKERS = 1000
"""Markers in one WriteTxnMarkers request at most (broker.proto)."""

EARLIEST = 0
"""ListOffsets position: the first offset still held (broker.proto's OffsetPosition)."""
LATEST = 1
"""ListOffsets position: the high watermark."""

OPENING = "opening"
"""A replica's state beside the partition's own ("ok", "catching_up", "failed"): assigned
here and not open yet (opening, or being repaired)."""


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    broker_id: int
    state: str
    """"ok", "catching_up", "failed" (PartitionReplica.replica_states) or OPENING."""
    reason: str


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader_id: int
    replicas: list[int]
    leader_term: int
    high_watermark: int
    replica_status: list[ReplicaInfo]
    log_start_offset: int
    in_sync_replicas: list[int]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: list[PartitionInfo]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    id: int
    host: str
    port: int
    rack: str


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    cluster: str
    brokers: list[BrokerInfo]
    topics: list[TopicInfo]
    broker_id: int
    metadata_version: int


@dataclass(frozen=True, slots=True)
class Produced:
    base_offset: int
    last_offset: int
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class Fetched:
    entries: bytes
    next_offset: int
    high_watermark: int
    log_start_offset: int
    broker_id: int
    last_stable_offset: int
    aborted_transactions: list[AbortedTransaction]
    """read_committed only: the aborted transactions overlapping the entries returned."""


@dataclass(frozen=True, slots=True)
class MarkerRequest:
    """One transaction to end on one partition (broker.proto's TxnMarker)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class Offsets:
    offset: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


class DelayDescriber(Protocol):
    """The delay movers as the request layer sees them (raftmq.broker.delay_mover)."""

    async def describe(self, topic: str) -> list[LevelPending]: ...


class BrokerState(Protocol):
    """What the request layer reads of its broker (raftmq.broker.server.Broker)."""

    @property
    def id(self) -> int: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def metadata(self) -> MetadataState: ...
    @property
    def metadata_version(self) -> int: ...
    @property
    def replicas(self) -> Mapping[tuple[str, int], PartitionReplica]: ...
    @property
    def unopened(self) -> UnopenedReplicas: ...
    @property
    def topic_creator(self) -> TopicCreator | None: ...
    @property
    def delay_creator(self) -> TopicCreator:
        """Creates the internal delay topic on first use, auto-creation on or off."""

    @property
    def delay_movers(self) -> DelayDescriber: ...


def at_most(name: str, value: int, limit: int, unit: str = "") -> None:
    if value > limit:
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
            f"{name} {value} is over this broker's limit of {limit}{unit}",
        )


def _replica_status(replica: PartitionReplica) -> list[ReplicaInfo]:
    return [
        ReplicaInfo(broker_id, state, reason)
        for broker_id, (state, reason) in replica.replica_states().items()
    ]


def _unopened_status(broker_id: int, entry: Unopened | None) -> ReplicaInfo:
    """The status of a replica the metadata assigns here that is not open: failed (why),
    or opening / being repaired. Never left out, so that a replica that cannot open is
    seen (``raftmq status`` exits 1 for it)."""
    if entry is None:  # assigned by a version whose replicas are being opened right now
        return ReplicaInfo(broker_id, OPENING, "opening")
    state = "failed" if entry.state is OpenState.FAILED else OPENING
    reason = (
        entry.reason if entry.state is not OpenState.REPAIRING else f"repairing: {entry.reason}"
    )
    return ReplicaInfo(broker_id, state, reason)


class Router:
    """The requests a client sends a broker, on plain values. Each returns its result or
    raises Refusal."""

    def __init__(
        self,
        broker: BrokerState,
        allocate_producer_ids: Callable[[int], Awaitable[tuple[int, int]]],
        rebuild: Callable[[str, int, bool], Awaitable[int]],
        traffic: TopicTraffic | None = None,
    ) -> None:
        """``allocate_producer_ids(count)``: a block from the controller (first id, count);
        ``rebuild(topic, partition, force)``: rebuild this broker's replica, returning the
        bytes deleted (raftmq.broker.reconciler); ``traffic``: where produces and fetches
        are counted per topic (None: nowhere, metrics are off)."""
        self.broker = broker
        self.traffic = traffic
        self._rebuild = rebuild
        self._parked = asyncio.Semaphore(MAX_PARKED_FETCHES)
        self._producer_ids = ProducerIdBlocks(allocate_producer_ids)

    def check_has_metadata(self) -> None:
        """A broker that has no metadata yet (just started, registering with the
        controller) cannot tell an unknown topic from one it will host in a moment."""
        if self.broker.metadata_version == 0:
            raise Refusal(
                ErrorCode.ERROR_CODE_LEADER_NOT_AVAILABLE,
                f"broker {self.broker.id} has no cluster metadata yet (it is joining the "
                "controller); retry shortly",
            )

    def _check_not_stopping(self) -> None:
        if self.broker.stopping:
            raise Refusal(
                ErrorCode.ERROR_CODE_SHUTTING_DOWN,
                f"broker {self.broker.id} is shutting down; use another",
            )

    def replica(self, topic: str, partition: int) -> PartitionReplica:
        """This broker's serving replica of ``topic``/``partition``, or the refusal that
        says why there is none here (and, where it can, where to go instead)."""
        self._check_not_stopping()
        metadata = self.broker.metadata
        found = metadata.topics.get(topic)
        if found is None:
            self.check_has_metadata()
            if not TOPIC_NAME.fullmatch(topic):
                raise Refusal(
                    ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
                    f"{shorten(topic)} is not a valid topic name: use 1-200 characters of "
                    "A-Z a-z 0-9 . _ -",
                )
            raise unknown_topic(topic, name_list(sorted(metadata.topics)))
        count = len(found.partitions)
        if partition >= count:
            raise Refusal(
                ErrorCode.ERROR_CODE_UNKNOWN_PARTITION,
                f"topic {topic!r} has {count} partitions (0 to {count - 1}); "
                f"there is no partition {partition}",
            )
        replica = self.broker.replicas.get((topic, partition))
        if replica is None:
            part = found.partitions[partition]
            if expired(part, time.time_ns() // 1_000_000):
                raise Refusal(
                    ErrorCode.ERROR_CODE_PARTITION_DECOMMISSIONED,
                    f"{topic}/{partition} was decommissioned and its retention has passed: "
                    "its data is deleted; read the topic's active partitions",
                )
            if self.broker.id in part.replicas or self.broker.id in part.learners:
                entry = self.broker.unopened.get((topic, partition))
                how = entry.reason if entry is not None else "opening"
                raise Refusal(
                    ErrorCode.ERROR_CODE_REPLICA_FAILED,
                    f"broker {self.broker.id}'s replica of {topic}/{partition} is not open "
                    f"({how}); use another replica, or retry later",
                )
            owners = ", ".join(map(str, part.replicas))
            raise Refusal(
                ErrorCode.ERROR_CODE_NOT_HOSTED,
                f"broker {self.broker.id} hosts no replica of {topic}/{partition}; "
                f"its replicas are on brokers {owners}",
            )
        try:
            replica.check_serving()
        except PartitionError as exc:
            raise self.refusal(exc) from None
        return replica

    def with_leader(self, refusal: Refusal, topic: str, partition: int) -> Refusal:
        """``refusal`` with the partition's leader (as reported to the controller) named
        in its trailers, for a consumer's replica read to go there at once."""
        metadata = self.broker.metadata
        leader, _ = reported_leader(metadata, topic, partition)
        address = broker_addresses(metadata).get(leader)
        if address is None:
            return refusal
        return Refusal(
            refusal.code,
            f"{refusal.message}; its leader is broker {leader}",
            leader_id=leader,
            leader_address=address,
        )

    def refusal(self, exc: PartitionError) -> Refusal:
        return Refusal.of(exc, broker_addresses(self.broker.metadata), self.broker.id)

    async def auto_create(self, topic: str) -> None:
        """Create ``topic`` first when it does not exist and this broker auto-creates
        topics (``--auto-create-topics``); nothing otherwise."""
        creator = self.broker.delay_creator if topic == DELAY_TOPIC else self.broker.topic_creator
        if (
            creator is not None
            and topic not in self.broker.metadata.topics
            and self.broker.metadata_version
            and TOPIC_NAME.fullmatch(topic)
            and not self.broker.stopping
        ):
            await creator.ensure(topic)

    async def describe_delayed(self, topic: str) -> list[LevelPending]:
        """The delayed messages pending for ``topic`` in the levels this broker leads."""
        self._check_not_stopping()
        if topic not in self.broker.metadata.topics:
            self.check_has_metadata()
            raise unknown_topic(topic, name_list(sorted(self.broker.metadata.topics)))
        return await self.broker.delay_movers.describe(topic)

    async def produce(
        self,
        topic: str,
        partition: int,
        entries: bytes,
        acks: int,
        timeout_ms: int,
        *,
        mover: bool = False,
    ) -> Produced:
        """Append ``entries`` (a record batch) to the partition this broker leads.
        ``timeout_ms`` 0: the default. ``mover``: a delay mover's (ProduceDelayed), which
        alone may use the movers' reserved producer ids."""
        check_mover_ids(entries, mover=mover)
        await self.auto_create(topic)
        replica = self.replica(topic, partition)
        if topic == DELAY_TOPIC:
            check_delayed(entries, partition, self.broker.metadata)
        timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        at_most("timeout_ms", timeout_ms, MAX_TIMEOUT_MS, " ms")
        try:
            how = Acks(acks)
        except ValueError:
            raise Refusal(
                ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
                f"unknown acks value {acks}; use ACKS_ALL (0), ACKS_LEADER (1) or ACKS_NONE (2)",
            ) from None
        try:
            result = await replica.produce(entries, how, timeout_ms / 1000)
        except PartitionError as exc:
            raise self.refusal(exc) from None
        if self.traffic is not None and result.records_appended:
            self.traffic.produced(topic, len(entries), result.records_appended)
        return Produced(
            result.base_offset, result.last_offset, replica.high_watermark, replica.log_start_offset
        )

    def offsets_here(self, topic: str, partition: int) -> tuple[int, int]:
        """(high watermark, log start offset) of this broker's replica; (-1, -1) when it
        hosts none."""
        replica = self.broker.replicas.get((topic, partition))
        if replica is None:
            return -1, -1
        return replica.high_watermark, replica.log_start_offset

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int,
        min_bytes: int,
        replica_read: bool,
        read_committed: bool = False,
    ) -> Fetched:
        """Read from ``offset``, waiting up to ``max_wait_ms`` for ``min_bytes``
        (``max_bytes`` 0: the default); ``read_committed``: below the last stable offset,
        with the aborted transactions of the range."""
        try:
            replica = self.replica(topic, partition)
        except Refusal as refusal:
            if replica_read and refusal.code == ErrorCode.ERROR_CODE_NOT_HOSTED:
                raise self.with_leader(refusal, topic, partition) from None
            raise
        max_bytes = max_bytes or DEFAULT_FETCH_BYTES
        at_most("max_bytes", max_bytes, MAX_FETCH_BYTES, " bytes")
        at_most("max_wait_ms", max_wait_ms, MAX_WAIT_MS, " ms")
        if offset < 0:
            raise Refusal(ErrorCode.ERROR_CODE_INVALID_ARGUMENT, f"offset {offset} is negative")
        wait = max_wait_ms / 1000
        try:
            if wait and not self._parked.locked():
                async with self._parked:
                    result = await replica.fetch(
                        offset,
                        max_bytes,
                        min_bytes,
                        wait,
                        replica_read=replica_read,
                        read_committed=read_committed,
                    )
            else:
                result = replica.read(
                    offset, max_bytes, replica_read=replica_read, read_committed=read_committed
                )
            next_offset = result.next_offset if result.entries else offset
            aborted = (
                replica.aborted_transactions(offset, next_offset)
                if read_committed and result.entries
                else []
            )
        except PartitionError as exc:
            raise self.refusal(exc) from None
        if self.traffic is not None and result.entries:
            # Offsets count records (a control entry holds none): the records returned are
            # those from the first entry's base offset, read from its header, to the next.
            first_offset = entry.frame_at(result.data, 0)[3]
            self.traffic.fetched(topic, len(result.data), next_offset - first_offset)
        return Fetched(
            result.data,
            next_offset,
            replica.high_watermark,
            replica.log_start_offset,
            self.broker.id,
            replica.last_stable_offset,
            aborted,
        )

    async def write_txn_markers(
        self, markers: Sequence[MarkerRequest], timeout_ms: int
    ) -> list[Refusal | None]:
        """End transactions on partitions this broker leads, each marker on its own and
        all at once; per marker, None once it is held (appended and committed now, or
        before), else its refusal (the same a produce to that partition gets)."""
        at_most("markers", len(markers), MAX_MARKERS)
        timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        at_most("timeout_ms", timeout_ms, MAX_TIMEOUT_MS, " ms")

        async def one(marker: MarkerRequest) -> Refusal | None:
            try:
                replica = self.replica(marker.topic, marker.partition)
                await replica.write_marker(
                    marker.producer_id, marker.producer_epoch, marker.commit, timeout_ms / 1000
                )
            except Refusal as refusal:
                return refusal
            except PartitionError as exc:
                return self.refusal(exc)
            return None

        return list(await asyncio.gather(*(one(m) for m in markers)))

    def list_offsets(
        self, topic: str, partition: int, *, position: int | None, timestamp_ms: int | None
    ) -> Offsets:
        """The offset at ``position`` (EARLIEST, LATEST) or the first at or after
        ``timestamp_ms``; exactly one of them is given."""
        replica = self.replica(topic, partition)
        try:
            if timestamp_ms is not None:
                offset = replica.offset_for_timestamp(timestamp_ms)
            elif position == LATEST:
                offset = replica.high_watermark
            elif position == EARLIEST:
                offset = replica.log_start_offset
            elif position is not None:
                raise Refusal(
                    ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
                    f"unknown position {position}; use EARLIEST (0) or LATEST (1)",
                )
            else:
                raise Refusal(
                    ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
                    "the request sets neither position nor timestamp_ms; set one of them",
                )
        except PartitionError as exc:
            raise self.refusal(exc) from None
        return Offsets(
            offset, replica.log_start_offset, replica.high_watermark, replica.last_stable_offset
        )

    async def metadata(
        self, topics: Sequence[str], allow_auto_create: bool, *, routing_only: bool = False
    ) -> ClusterInfo:
        """The brokers, and ``topics`` (none: every topic) with each partition's leader,
        replicas and in-sync replicas, and unless ``routing_only`` this broker's view of
        their state (high watermark, log start, each replica's status)."""
        metadata = self.broker.metadata
        names = list(topics) or sorted(metadata.topics)
        invalid = [n for n in names if not TOPIC_NAME.fullmatch(n)]
        if invalid:
            raise Refusal(
                ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
                f"{name_list(invalid, 5)} are not valid topic names: use 1-200 characters of "
                "A-Z a-z 0-9 . _ -",
            )
        if allow_auto_create and topics:
            if len(topics) > MAX_CREATIONS:
                raise Refusal(
                    ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
                    f"a Metadata request may ask to auto-create at most {MAX_CREATIONS} "
                    f"topics, not {len(topics)}; ask in smaller groups",
                )
            for name in dict.fromkeys(topics):
                await self.auto_create(name)
            metadata = self.broker.metadata
        unknown = [n for n in names if n not in metadata.topics]
        if unknown:
            self.check_has_metadata()
            raise Refusal(
                ErrorCode.ERROR_CODE_UNKNOWN_TOPIC,
                f"unknown topics: {name_list(unknown, 5)}; "
                f"known: {name_list(sorted(metadata.topics))}",
            )
        infos = []
        for name in names:
            parts = []
            assigned = metadata.topics[name].partitions
            for p, part in enumerate(assigned):
                replica = self.broker.replicas.get((name, p))
                # No replica here: the leader as reported to the controller. A replica
                # that knows no leader says so (an election is under way: a report is
                # from before it).
                if replica is not None:
                    leader, term = replica.leader_id, replica.leader_term
                else:
                    leader, term = reported_leader(metadata, name, p)
                live = None if routing_only else replica  # whose live state is shown
                if live is not None:
                    status = _replica_status(live)
                elif routing_only:
                    status = []
                else:
                    status = self._unassigned_or_unopened(name, p, assigned)
                parts.append(
                    PartitionInfo(
                        partition=p,
                        leader_id=leader,
                        replicas=list(part.replicas),
                        leader_term=term,
                        high_watermark=live.high_watermark if live else -1,
                        replica_status=status,
                        log_start_offset=live.log_start_offset if live else -1,
                        in_sync_replicas=replica.in_sync_voters() if replica else [],
                    )
                )
            infos.append(TopicInfo(name, parts))
        brokers = [
            BrokerInfo(b.id, b.host, b.port, b.rack or "")
            for _, b in sorted(metadata.brokers.items())
        ]
        return ClusterInfo(
            metadata.cluster_name, brokers, infos, self.broker.id, self.broker.metadata_version
        )

    def _unassigned_or_unopened(
        self, topic: str, p: int, parts: Sequence[Partition]
    ) -> list[ReplicaInfo]:
        me = self.broker.id
        part = parts[p] if p < len(parts) else None
        if part is None or (me not in part.replicas and me not in part.learners):
            return []
        if expired(part, time.time_ns() // 1_000_000):
            return []
        return [_unopened_status(me, self.broker.unopened.get((topic, p)))]

    async def rebuild(self, topic: str, partition: int, force: bool) -> tuple[ReplicaInfo, int]:
        """Rebuild this broker's replica from the leader: its status after, and the bytes
        deleted."""
        self.check_has_metadata()
        try:
            deleted = await self._rebuild(topic, partition, force)
        except RebuildRefused as exc:
            code = (
                ErrorCode.ERROR_CODE_NOT_HOSTED
                if exc.kind == "not-hosted"
                else ErrorCode.ERROR_CODE_UNSAFE_REBUILD
            )
            raise Refusal(code, str(exc)) from None
        key = (topic, partition)
        replica = self.broker.replicas.get(key)
        if replica is not None:
            state, reason = replica.state
            status = ReplicaInfo(self.broker.id, state, reason)
        else:
            status = _unopened_status(self.broker.id, self.broker.unopened.get(key))
        return status, deleted

    async def init_producer_id(self) -> int:
        """A producer id never handed out before, for an idempotent producer."""
        self._check_not_stopping()
        try:
            return await self._producer_ids.next_id()
        except TimeoutError:
            raise Refusal(
                ErrorCode.ERROR_CODE_LEADER_NOT_AVAILABLE,
                f"broker {self.broker.id} could not reach a controller leader within "
                f"{ALLOCATE_TIMEOUT_S:.0f} s to take a block of producer ids; retry shortly",
            ) from None
        except LinkRefusal as exc:
            raise Refusal(exc.code, str(exc)) from None
