"""The broker's state as Prometheus metric families, read at scrape time: each hosted
partition replica's offsets, size and leadership, the replicas in trouble, traffic per
topic, the controller voter's standing, and the disk.

Why a collector and not gauges set as things change: everything here is already kept by
the broker (its replicas, the Raft host's status, the metadata, the controller quorum);
reading it when Prometheus asks keeps nothing per series between scrapes and costs the
produce and fetch paths nothing.

Why read on the event loop: prometheus-client serves scrapes from its own thread, while
the replicas, the Raft host and the metadata are the loop's and change under it (a dict
iterated while a replica opens, a group quarantined between two reads). The scrape thread
hands the reading to the loop and waits (docs/metrics.md estimates the cost per replica).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Iterator, Mapping
from itertools import accumulate
from pathlib import Path
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from raftmq.broker.routing import BrokerState
from raftmq.broker.topic_traffic import TopicTraffic
from raftmq.broker.unopened import OpenState
from raftmq.controller.quorum import ControllerQuorum
from raftmq.log.preallocate import BUDGET
from raftmq.partition.share_state import RecordState
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.stats import LATENCY_BUCKETS_S, Histogram

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 5.0
"""How long a scrape waits for the event loop to read the broker's state. A loop that
cannot spare a few milliseconds in 5 s is a broker in trouble: the scrape fails (HTTP
500), which Prometheus records as the target being down."""
PARTITION_LABELS = ("topic", "partition")


class BrokerView(BrokerState, Protocol):
    """What the collector reads of its broker (raftmq.broker.server.Broker): what the
    request layer reads, and its data folder and controller voter."""

    @property
    def data_dir(self) -> Path: ...
    @property
    def quorum(self) -> ControllerQuorum | None: ...
    @property
    def host(self) -> RaftHost: ...


class BrokerCollector(Collector):
    """Registered on the broker's own registry; ``loop`` is the broker's event loop."""

    def __init__(
        self, broker: BrokerView, traffic: TopicTraffic, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.broker = broker
        self.traffic = traffic
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:  # a caller on the loop itself (a test calling generate_latest)
            yield from self.read()
            return
        done: concurrent.futures.Future[list[Metric]]
        done = concurrent.futures.Future()

        def read_on_loop() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(self.read())
                except BaseException as exc:  # handed to the scrape thread, raised there
                    done.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(read_on_loop)
        except RuntimeError:  # the loop is closed: the broker has stopped
            return
        try:
            families = done.result(timeout=READ_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            done.cancel()
            log.warning(
                "broker %d: a metrics scrape found the event loop busy for %.0f s",
                self.broker.id,
                READ_TIMEOUT_S,
            )
            raise
        yield from families

    def read(self) -> list[Metric]:
        """Every family, read now (call it on the broker's event loop)."""
        families: list[Metric] = []
        families += self._partitions()
        families += self._topics()
        families += self._groups()
        families += self._shares()
        families += self._raft()
        families += self._controller()
        families += self._disk()
        return families

    def _partitions(self) -> list[GaugeMetricFamily]:
        broker = self.broker
        log_end = GaugeMetricFamily(
            "raftmq_partition_log_end_offset",
            "Offset after the last record in this broker's replica (committed or not)",
            labels=PARTITION_LABELS,
        )
        high_watermark = GaugeMetricFamily(
            "raftmq_partition_high_watermark",
            "Offset after the last committed record, as this broker's replica knows it",
            labels=PARTITION_LABELS,
        )
        size = GaugeMetricFamily(
            "raftmq_partition_log_size_bytes",
            "Bytes of this broker's replica's segments",
            labels=PARTITION_LABELS,
        )
        leader = GaugeMetricFamily(
            "raftmq_partition_leader",
            "1 while this broker's replica leads the partition, else 0",
            labels=PARTITION_LABELS,
        )
        under_replicated = leaderless = failed = 0
        for (topic, partition), replica in sorted(broker.replicas.items()):
            labels = (topic, str(partition))
            log_end.add_metric(labels, replica.log_end_offset)
            high_watermark.add_metric(labels, replica.high_watermark)
            size.add_metric(labels, replica.log_size_bytes)
            leads = replica.is_leader
            leader.add_metric(labels, 1 if leads else 0)
            if replica.group.failure is not None:
                failed += 1
            elif replica.leader_id == 0:
                leaderless += 1
            elif leads and replica.under_replicated():
                under_replicated += 1
        failed += broker.unopened.count(OpenState.FAILED)
        return [
            log_end,
            high_watermark,
            size,
            leader,
            _gauge(
                "raftmq_broker_under_replicated_partitions",
                "Partitions this broker leads with fewer in-sync voters than voters",
                under_replicated,
            ),
            _gauge(
                "raftmq_broker_leaderless_partitions",
                "Partitions hosted here whose replica knows no leader (an election is due "
                "or under way)",
                leaderless,
            ),
            _gauge(
                "raftmq_broker_failed_replicas",
                "Replicas assigned here that are quarantined or failed to open",
                failed,
            ),
            _gauge(
                "raftmq_broker_hosted_replicas",
                "Partition replicas open on this broker",
                len(broker.replicas),
            ),
            _gauge(
                "raftmq_broker_metadata_version",
                "The newest cluster metadata version this broker applied",
                broker.metadata_version,
            ),
        ]

    def _topics(self) -> list[CounterMetricFamily]:
        traffic = self.traffic
        topics = self.broker.metadata.topics
        if self.broker.metadata_version:  # before the first metadata, every name is unknown
            traffic.forget_except(topics)
        return [
            _per_topic(
                "raftmq_topic_produced_bytes",
                "Bytes of entries appended by produce requests this broker led",
                traffic.produced_bytes,
            ),
            _per_topic(
                "raftmq_topic_produced_records",
                "Records appended by produce requests this broker led",
                traffic.produced_records,
            ),
            _per_topic(
                "raftmq_topic_fetched_bytes",
                "Bytes of entries this broker returned to Fetch requests",
                traffic.fetched_bytes,
            ),
            _per_topic(
                "raftmq_topic_fetched_records",
                "Records in the entries this broker returned to Fetch requests",
                traffic.fetched_records,
            ),
            _fetch_read_bytes(traffic),
        ]

    def _groups(self) -> list[GaugeMetricFamily]:
        """Consumer-group lag, exported by each partition's leader: its own high watermark
        minus the group's committed offset, which every broker's copy of the metadata
        holds. No broker asks another (the controller knows the offsets, only the leader
        the high watermark), and summed over the brokers each (group, partition) appears
        once. A partition with no commit of the group has no series."""
        lag = GaugeMetricFamily(
            "raftmq_group_lag_records",
            "Records between a group's committed offset and the high watermark, for the "
            "partitions this broker leads",
            labels=("group", *PARTITION_LABELS),
        )
        led = {key: r.high_watermark for key, r in self.broker.replicas.items() if r.is_leader}
        if led:
            for group_id, group in sorted(self.broker.metadata.consumer_groups.items()):
                for topic, partitions in sorted(group.committed_offsets.items()):
                    for partition, committed in sorted(partitions.items()):
                        high_watermark = led.get((topic, partition))
                        if high_watermark is not None:
                            lag.add_metric(
                                (group_id, topic, str(partition)),
                                max(0, high_watermark - committed.offset),
                            )
        return [lag]

    def _raft(self) -> list[Metric]:
        """The Raft host's own figures (raftmq.raft.host.stats): every group of this
        broker (partitions and the controller's) together, so bounded by nothing but
        the histograms' buckets."""
        stats = self.broker.host.stats
        return [
            _histogram(
                "raftmq_raft_persist_seconds",
                "Each Raft round's durable write on this broker: its logs' fsyncs and the "
                "state store's sync, before the round's messages go out",
                stats.persist,
            ),
            _histogram(
                "raftmq_raft_commit_seconds",
                "Each proposal of a leader here, from its append to its commit (a majority "
                "holds it durably)",
                stats.commit,
            ),
            CounterMetricFamily(
                "raftmq_raft_elections_won",
                "Times a Raft group on this broker became its leader",
                value=stats.elections_won,
            ),
            CounterMetricFamily(
                "raftmq_raft_snapshots_installed",
                "Snapshots a Raft group on this broker installed from its leader (a follower "
                "too far behind for the leader's log)",
                value=stats.snapshots_installed,
            ),
            CounterMetricFamily(
                "raftmq_repair_damaged_ranges",
                "Damaged log ranges a repair on this broker set out to mend (found by a "
                "read, the scrubber or an open)",
                value=stats.damage_found,
            ),
            CounterMetricFamily(
                "raftmq_repair_repaired_ranges",
                "Damaged log ranges patched with a peer's copy",
                value=stats.repaired,
            ),
            CounterMetricFamily(
                "raftmq_repair_unrepaired_ranges",
                "Damaged log ranges no peer could supply: they stay unreadable here",
                value=stats.unrepaired,
            ),
            CounterMetricFamily(
                "raftmq_scrub_bytes",
                "Bytes of sealed segments the background scrubber re-read and checked",
                value=self.broker.host.scrubbed_bytes,
            ),
            CounterMetricFamily(
                "raftmq_scrub_audited_ranges",
                "Sealed ranges a leader here compared with its followers' copies (the "
                "scrubber's audit)",
                value=self.broker.host.audited_ranges,
            ),
        ]

    def _shares(self) -> list[GaugeMetricFamily]:
        """Share groups' state on the partitions this broker leads, summed: a few series
        whatever the group and partition counts (per share-partition series would be
        unbounded; `raftmq share-group describe` shows each)."""
        states = [
            st
            for replica in self.broker.replicas.values()
            if replica.is_leader
            for st in replica.shares.states.groups.values()
        ]
        acquired = sum(st.count(RecordState.ACQUIRED) for st in states)
        return [
            GaugeMetricFamily(
                "raftmq_share_partitions",
                "Share-partitions (a share group's state on a partition) this broker leads",
                value=len(states),
            ),
            GaugeMetricFamily(
                "raftmq_share_records_in_flight",
                "Records in flight (acquired, available again, or archived and waiting for "
                "the dead-letter topic) in the share-partitions this broker leads",
                value=sum(st.in_flight() for st in states),
            ),
            GaugeMetricFamily(
                "raftmq_share_records_acquired",
                "Records acquired by share group members (locked) in the share-partitions "
                "this broker leads",
                value=acquired,
            ),
        ]

    def _controller(self) -> list[GaugeMetricFamily]:
        quorum = self.broker.quorum
        if quorum is None:
            return []
        version, _ = quorum.local_state()
        lag = max(0, quorum.raft_status().commit - quorum.rsm.applied_index)
        return [
            _gauge(
                "raftmq_controller_leader",
                "1 while this node's controller voter leads the quorum, else 0",
                1 if quorum.is_leader else 0,
            ),
            _gauge(
                "raftmq_controller_metadata_version",
                "The metadata version this controller voter applied",
                version,
            ),
            _gauge(
                "raftmq_controller_apply_lag_entries",
                "Committed metadata entries this voter has not applied yet",
                lag,
            ),
        ]

    def _disk(self) -> list[GaugeMetricFamily]:
        families = [
            _gauge(
                "raftmq_log_reserved_bytes",
                "Disk reserved ahead of the active segments' ends by the logs of this process",
                BUDGET.used_bytes,
            ),
            _gauge(
                "raftmq_log_reserve_budget_bytes",
                "The most the logs of this process may hold reserved at once",
                BUDGET.total_bytes,
            ),
        ]
        try:
            stat = os.statvfs(self.broker.data_dir)
        except OSError:  # the folder is gone (the broker is being removed): skip the figures
            return families
        families.append(
            _gauge(
                "raftmq_data_disk_total_bytes",
                "Size of the file system holding this broker's data folder",
                stat.f_blocks * stat.f_frsize,
            )
        )
        families.append(
            _gauge(
                "raftmq_data_disk_free_bytes",
                "Bytes free for this broker on the file system of its data folder",
                stat.f_bavail * stat.f_frsize,
            )
        )
        return families


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _per_topic(name: str, documentation: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=("topic",))
    for topic, value in sorted(counts.items()):
        family.add_metric((topic,), value)
    return family


def _histogram(name: str, documentation: str, histogram: Histogram) -> HistogramMetricFamily:
    buckets = list(accumulate(histogram.buckets))
    bounds = [floatToGoString(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]
    return HistogramMetricFamily(
        name,
        documentation,
        buckets=list(zip(bounds, buckets, strict=True)),
        sum_value=histogram.sum_s,
    )


def _fetch_read_bytes(traffic: TopicTraffic) -> CounterMetricFamily:
    family = CounterMetricFamily(
        "raftmq_fetch_read_bytes",
        "Bytes Fetch requests read from segment files, by whether they had a tag filter",
        labels=["filtered"],
    )
    for filtered, value in traffic.fetch_read_bytes.items():
        family.add_metric([filtered], value)
    return family
