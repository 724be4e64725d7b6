"""The ``raftmq`` data source for Spark (PySpark 4.2+'s Python Data Source API): batch
reads with ``spark.read.format("raftmq")`` and Structured Streaming with
``spark.readStream.format("raftmq")``, in the schema of Spark's Kafka source.

Spark pickles the source, the readers and the partitions: they hold only options and
offset ranges. Planning (Metadata, ListOffsets) runs on the driver; ``read`` runs in
executors' Python workers on a different instance and depends only on its partition and
the options (raftmq.spark.fetching).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from raftmq.spark.fetching import read_range
from raftmq.spark.options import ReadOptions, SourceError, parse_options, wants_headers
from raftmq.spark.planning import (
    OffsetRange,
    PartitionEnds,
    Planner,
    TopicPartition,
    apportion,
    from_json,
    to_json,
)

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
"""Spark's Kafka source's columns, in its order: a Kafka pipeline ports by one word."""
HEADERS_COLUMN = "headers array<struct<key:string,value:binary>>"


class RangePartition(InputPartition):
    """One Spark task: an :class:`OffsetRange` (its ``value``)."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)


class RaftmqDataSource(DataSource):
    """``spark.read.format("raftmq")`` / ``spark.readStream.format("raftmq")``; options in
    raftmq.spark.options."""

    @classmethod
    def name(cls) -> str:
        return "raftmq"

    def schema(self) -> str:
        if wants_headers(self.options):
            return f"{KAFKA_SCHEMA}, {HEADERS_COLUMN}"
        return KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftmqBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaftmqStreamReader(parse_options(self.options, streaming=True))


def _read(partition: InputPartition, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    rng = partition.value
    if rng is None:
        return  # nothing to read: Spark plans one InputPartition(None) for an empty list
    assert isinstance(rng, OffsetRange), f"not a raftmq partition: {partition!r}"
    yield from read_range(rng, options)


class RaftmqBatchReader(DataSourceReader):
    """Plans once, up to each partition's high watermark (or endingOffsets)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = Planner(self.options)
        try:
            ends = planner.describe()
            begin = planner.resolve(self.options.starting_offsets, "earliest", ends, starting=True)
            end = planner.resolve(self.options.ending_offsets, "latest", ends, starting=False)
            for tp, offset in begin.items():
                if offset > end[tp]:
                    raise SourceError(
                        f"{tp[0]}/{tp[1]} would start at {offset}, after its end {end[tp]}: "
                        "startingOffsets must not be past endingOffsets"
                    )
            return [RangePartition(r) for r in planner.ranges(begin, end, ends)]
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options)


class RaftmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over committed offsets. The checkpoint's offsets are the only state
    that matters: ``commit`` is called late or never, ``stop`` may never run, and a
    restarted query replays its last planned batch from the offsets alone."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.planner = Planner(options)
        self._target: dict[TopicPartition, int] | None = None  # availableNow's end
        self._ends: dict[TopicPartition, PartitionEnds] = {}

    def _describe(self) -> dict[TopicPartition, PartitionEnds]:
        """Partitions are re-read at every trigger: ones added later are picked up."""
        self._ends = self.planner.describe()
        return self._ends

    def initialOffset(self) -> dict:
        ends = self._describe()
        return to_json(
            self.planner.resolve(self.options.starting_offsets, "latest", ends, starting=True)
        )

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: e.high_watermark for tp, e in self._describe().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = self._describe()
        begin = from_json(start)
        gone = sorted(set(begin) - set(ends))
        if gone and self.options.fail_on_data_loss:
            raise SourceError(
                f"{gone[0][0]}/{gone[0][1]} was read before but the cluster no longer has it; "
                "set failOnDataLoss=false to go on without it"
            )
        base, upto = {}, {}
        for tp, e in ends.items():
            if self._target is not None and tp not in self._target and tp not in begin:
                continue  # availableNow: nothing that appeared after the query started
            # A partition seen for the first time is read from its first offset, 0: if
            # retention already deleted some, that is data loss, as in Kafka's source.
            base[tp] = first = self.planner.check_start(tp, begin.get(tp, 0), e)
            end = e.high_watermark
            if self._target is not None:
                end = min(end, self._target.get(tp, first))
            upto[tp] = max(end, first)
        if isinstance(limit, ReadMaxRows):
            upto = apportion(base, upto, limit.max_rows)
        return to_json(upto)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ends = self._ends or self._describe()
        ranges = self.planner.ranges(from_json(start), from_json(end), ends)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.options)

    def commit(self, end: dict) -> None:
        """Nothing to do: the broker keeps no consumer state for this source."""

    def stop(self) -> None:
        self.planner.close()
