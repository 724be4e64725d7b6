"""Bytes and records produced to and fetched from each topic on this broker, counted in the
request path and read by the metrics collector at scrape time.

Why plain dicts and not prometheus-client counters: the produce and fetch paths are the
broker's hot paths, and a labelled counter costs a label lookup and a lock per update.
Here an update is two dict increments per request (never per record: the record counts
come from what the path already knows, the offsets a produce was given and the offsets a
fetch returns). The event loop is the only writer; the collector reads on the loop too
(:mod:`raftmq.broker.metrics_collector`), so no lock is needed.
"""

from __future__ import annotations

from collections.abc import Container


class TopicTraffic:
    """Counters per topic name, from zero at the broker's start (Prometheus counters)."""

    __slots__ = (
        "fetch_read_bytes",
        "fetched_bytes",
        "fetched_records",
        "produced_bytes",
        "produced_records",
    )

    def __init__(self) -> None:
        self.produced_bytes: dict[str, int] = {}
        self.produced_records: dict[str, int] = {}
        self.fetched_bytes: dict[str, int] = {}
        self.fetched_records: dict[str, int] = {}
        self.fetch_read_bytes = {"false": 0, "true": 0}
        """Bytes fetches read from segment files, by whether they had a tag filter."""

    def produced(self, topic: str, size_bytes: int, records: int) -> None:
        """A produce request appended ``records`` records in ``size_bytes`` bytes of
        entries to a partition of ``topic``."""
        self.produced_bytes[topic] = self.produced_bytes.get(topic, 0) + size_bytes
        self.produced_records[topic] = self.produced_records.get(topic, 0) + records

    def fetched(self, topic: str, size_bytes: int, records: int) -> None:
        """A fetch returned ``records`` records in ``size_bytes`` bytes of entries."""
        self.fetched_bytes[topic] = self.fetched_bytes.get(topic, 0) + size_bytes
        self.fetched_records[topic] = self.fetched_records.get(topic, 0) + records

    def fetch_read(self, size_bytes: int, *, filtered: bool) -> None:
        """A fetch read ``size_bytes`` from segment files (an unfiltered one: what it
        returned; a filtered one: its index walk's header, block and entry reads too)."""
        self.fetch_read_bytes["true" if filtered else "false"] += size_bytes

    def forget_except(self, topics: Container[str]) -> None:
        """Drop the counters of topics not in ``topics`` (deleted ones), so that the series
        this broker exports follow the topics that exist, not every name ever seen."""
        for counts in (
            self.produced_bytes,
            self.produced_records,
            self.fetched_bytes,
            self.fetched_records,
        ):
            for gone in [t for t in counts if t not in topics]:
                del counts[gone]
