"""The raftmq Spark source against a real local[2] Spark and a real 3-broker cluster: batch
reads equal what was produced, streams resume exactly once from a checkpoint, uncommitted
records are never read, maxOffsetsPerTrigger caps micro-batches, and mistakes fail with a
sentence that says what to fix."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.admin import AdminClient
from raftmq.client.lowlevel import LowLevelClient
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.devtools.ports import reserve
from raftmq.format.records import Record, build_batch
from raftmq.spark.fetching import arrow_schema, read_range
from raftmq.spark.options import SourceError, parse_options
from raftmq.spark.planning import OffsetRange
from raftmq.spark.source import HEADERS_COLUMN, KAFKA_SCHEMA, RaftmqStreamReader
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import wait_until

pytestmark = pytest.mark.serial  # Spark gives a Python worker 10 s to connect back
T0_MS = int(time.time() * 1000) - 3_600_000
"""Recent: older records would be deleted by the brokers' time retention (14 days)."""


def produce(client: LowLevelClient, topic: str, partition: int, records: list[Record], **kw):
    """Produce in batches of 50; the records as stored, with their offsets."""
    out = []
    for i in range(0, len(records), 50):
        chunk = records[i : i + 50]
        ack = client.produce(topic, partition, build_batch(chunk), **kw)
        out += [
            Record(r.key, r.value, r.timestamp, r.headers, ack.base_offset + j)
            for j, r in enumerate(chunk)
        ]
    return out


def records(tag: str, n: int, *, headers: bool = False) -> list[Record]:
    return [
        Record(
            None if i % 7 == 0 else f"key-{i % 5}".encode(),
            f"{tag}-{i}".encode(),
            T0_MS + i * 10,
            (("n", str(i).encode()), ("empty", None)) if headers else (),
        )
        for i in range(n)
    ]


def load(builder, cluster: LocalCluster, topic: str, **options):
    """``builder`` (spark.read or spark.readStream) on the raftmq source, reading ``topic``."""
    r = builder.format("raftmq").option("bootstrap", ",".join(cluster.addresses))
    r = r.option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def reader(spark, cluster: LocalCluster, topic: str, **options):
    return load(spark.read, cluster, topic, **options)


def rows_by_partition(rows) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for row in sorted(rows, key=lambda r: (r.partition, r.offset)):
        out.setdefault(row.partition, []).append(row)
    return out


@pytest.fixture
def dead_address():
    """An address nobody listens on: a port held bound but not listening, so a connection
    is refused at once and no other process can start serving there meanwhile."""
    with reserve() as sock:
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_arrow_schema_is_what_spark_expects(spark):
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    for headers, ddl in ((False, KAFKA_SCHEMA), (True, f"{KAFKA_SCHEMA}, {HEADERS_COLUMN}")):
        schema = spark.createDataFrame([], ddl).schema
        assert isinstance(schema, StructType)
        assert arrow_schema(headers) == to_arrow_schema(schema, timezone="UTC")


def test_batch_read_equals_what_was_produced_in_offset_order(spark, cluster: LocalCluster):
    with cluster.client() as client:
        sent = {
            p: produce(client, "batch", p, records(f"p{p}", 120 + 40 * p, headers=True))
            for p in range(3)
        }
    df = reader(spark, cluster, "batch", includeHeaders="true", minPartitions=5)
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert df.rdd.getNumPartitions() >= 5
    got = rows_by_partition(df.collect())
    assert sorted(got) == [0, 1, 2]
    for p, expected in sent.items():
        assert [r.offset for r in got[p]] == [r.offset for r in expected]
        assert [(r.key, r.value) for r in got[p]] == [(r.key, r.value) for r in expected]
        assert [int(r.timestamp.timestamp() * 1000) for r in got[p]] == [
            r.timestamp for r in expected
        ]
        assert {r.topic for r in got[p]} == {"batch"} and {r.timestampType for r in got[p]} == {0}
        assert [[(h.key, h.value) for h in r.headers] for r in got[p]] == [
            list(r.headers) for r in expected
        ]
    # The same from follower replicas too (each range from one of its replicas).
    spread = reader(spark, cluster, "batch", readFromReplicas="true", minPartitions=6)
    assert sorted((r.partition, r.offset, r.value) for r in spread.collect()) == sorted(
        (r.partition, r.offset, r.value) for p, rows in got.items() for r in rows
    )
    # A range given as JSON: offsets [10, 30) of partition 1 only; -1 is the committed end.
    part = reader(
        spark,
        cluster,
        "batch",
        startingOffsets='{"batch": {"0": -1, "1": 10, "2": -1}}',
        endingOffsets='{"batch": {"1": 30}}',
    )
    assert [r.offset for r in part.orderBy("offset").collect()] == list(range(10, 30))
    # By time: the first record at or after the 50th one's timestamp, in every partition.
    timed = reader(spark, cluster, "batch", startingTimestamp=T0_MS + 50 * 10)
    assert timed.count() == sum(len(v) for v in sent.values()) - 3 * 50


def test_stream_restarted_from_checkpoint_delivers_every_record_once(
    spark, cluster: LocalCluster, tmp_path: Path
):
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    with cluster.client() as client:
        first = {p: produce(client, "stream", p, records(f"a{p}", 300)) for p in range(2)}

    def start(**trigger):
        stream = load(
            spark.readStream,
            cluster,
            "stream",
            startingOffsets="earliest",
            maxOffsetsPerTrigger=100,
        )
        return (
            stream.select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    query = start(processingTime="0 seconds")
    deadline = time.monotonic() + 120
    while len(query.recentProgress) < 2 and time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        time.sleep(0.2)
    query.stop()  # mid-way: 600 records at most 100 a batch, two or three batches in
    done = sum(p["numInputRows"] for p in query.recentProgress)
    assert 0 < done < 600
    with cluster.client() as client:
        second = {p: produce(client, "stream", p, records(f"b{p}", 150)) for p in range(2)}
    query = start(availableNow=True)
    assert query.awaitTermination(180)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress]
    assert sizes and max(sizes) <= 100  # maxOffsetsPerTrigger caps every micro-batch
    got = rows_by_partition(spark.read.parquet(str(out)).collect())
    for p in range(2):
        expected = first[p] + second[p]
        assert [(r.offset, r.value) for r in got[p]] == [(r.offset, r.value) for r in expected]


def test_max_offsets_per_trigger_caps_micro_batches(spark, cluster: LocalCluster, tmp_path):
    with cluster.client() as client:
        for p in range(2):
            produce(client, "capped", p, records(f"c{p}", 90 + 60 * p))
    stream = load(
        spark.readStream, cluster, "capped", startingOffsets="earliest", maxOffsetsPerTrigger=70
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("capped")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [70, 70, 70, 30]
    assert spark.sql("select count(*) as n from capped").collect()[0].n == 240


def test_partitions_are_re_read_at_every_trigger(cluster: LocalCluster):
    """A partition missing from the last offsets (added to the topic since) is planned from
    its first offset; driven directly, as Spark's planner process does."""
    with cluster.client() as client:
        for p in range(2):
            produce(client, "grown", p, records(f"g{p}", 30))
    stream = RaftmqStreamReader(
        parse_options(
            {"bootstrap": ",".join(cluster.addresses), "subscribe": "grown"}, streaming=True
        )
    )
    start = {"grown": {"0": 10}}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {"grown": {"0": 30, "1": 30}}
    ranges = sorted(
        (p.value.partition, p.value.start, p.value.end) for p in stream.partitions(start, end)
    )
    assert ranges == [(0, 10, 30), (1, 0, 30)]
    # A read limit is shared in proportion to each partition's backlog (20 and 30).
    assert stream.latestOffset(start, ReadMaxRows(5)) == {"grown": {"0": 12, "1": 3}}
    stream.stop()


def test_a_stream_picks_up_partitions_added_later_from_their_first_offset(
    spark, cluster: LocalCluster, tmp_path: Path
):
    """The end to end twin of the test above: a partition added through the admin API
    between two runs of a checkpointed stream is read from offset 0, once."""
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"

    def run_once() -> None:
        query = (
            load(spark.readStream, cluster, "added", startingOffsets="earliest")
            .select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)
        assert query.exception() is None, query.exception()

    with cluster.client() as client:
        sent = {0: produce(client, "added", 0, records("before", 20))}
    run_once()
    with AdminClient(cluster.addresses) as admin:
        admin.add_partitions("added", 2)
    with cluster.client() as client:
        wait_until(lambda: ("added", 1) in client.refresh_leaders(), 30, "added/1 to be led")
        sent[1] = produce(client, "added", 1, records("new", 15))
        sent[0] += produce(client, "added", 0, records("after", 5))
    run_once()
    got = rows_by_partition(spark.read.parquet(str(out)).collect())
    for p in (0, 1):
        assert [(r.offset, r.value) for r in got[p]] == [(r.offset, r.value) for r in sent[p]]


def test_replica_reads_are_whole_from_a_follower_or_a_dead_address(
    cluster: LocalCluster, dead_address: str
):
    """readFromReplicas: a range naming a follower, or an address where nothing listens (so
    the leader must take over), still yields every record of the range once, in order."""
    with cluster.client() as client:
        sent = produce(client, "spread", 0, records("s", 80))
    options = parse_options(
        {
            "bootstrap": ",".join(cluster.addresses),
            "subscribe": "spread",
            "readFromReplicas": "true",
        },
        streaming=False,
    )
    follower = cluster.spec.brokers[cluster.spec.topics["spread"].replicas[0][1]].address
    for replica in (follower, dead_address):
        batches = list(read_range(OffsetRange("spread", 0, 5, 80, (replica,)), options))
        got = [(b.column("offset").to_pylist(), b.column("value").to_pylist()) for b in batches]
        assert [o for offsets, _ in got for o in offsets] == list(range(5, 80))
        assert [v for _, values in got for v in values] == [r.value for r in sent[5:]]


def test_records_not_yet_committed_are_never_read(spark, make_cluster: ClusterFactory):
    """The followers of the only partition are stopped, so the leader appends but cannot
    commit: Spark must read up to the high watermark only, then the rest once it commits."""
    # A 30 s election timeout: the leader keeps leading (check-quorum) while Spark plans.
    cluster = make_cluster({"held": 1}, extra_args=["--tick-ms", "500"], election_ticks=60)
    leader_id = cluster.spec.topics["held"].replicas[0][0]
    leader = cluster.spec.brokers[leader_id].address
    with LowLevelClient([leader]) as client:
        produce(client, "held", 0, records("committed", 100))
        for bid in cluster.spec.brokers:
            if bid != leader_id:
                cluster.signal(bid, signal.SIGSTOP)
        try:
            ack = client.produce(
                "held", 0, build_batch(records("uncommitted", 20)), acks=pb.ACKS_LEADER
            )
            assert ack.last_offset == 119
            listed = client.stub(leader).ListOffsets(
                pb.ListOffsetsRequest(topic="held", partition=0, position=pb.LATEST), timeout=10
            )
            assert listed.high_watermark == 100, "the leader committed without a majority"
            df = (
                spark.read.format("raftmq")
                .option("bootstrap", leader)
                .option("subscribe", "held")
                .load()
            )
            values = [r.value for r in df.orderBy("offset").collect()]
            assert values == [f"committed-{i}".encode() for i in range(100)]
            stream = RaftmqStreamReader(
                parse_options({"bootstrap": leader, "subscribe": "held"}, streaming=True)
            )
            assert stream.initialOffset() == {"held": {"0": 100}}
            assert stream.latestOffset({"held": {"0": 0}}, ReadAllAvailable()) == {
                "held": {"0": 100}
            }
            stream.stop()
        finally:
            for bid in cluster.spec.brokers:
                cluster.signal(bid, signal.SIGCONT)
    cluster.wait_for_leaders(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        count = reader(spark, cluster, "held").count()
        if count == 120 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert count == 120  # once committed, they are read: the check above could fail


def test_mistakes_fail_with_a_sentence_that_says_what_to_fix(
    spark, cluster: LocalCluster, dead_address: str
):
    assert reader(spark, cluster, "errors").count() == 0  # an empty topic is no mistake
    with pytest.raises(Exception, match="topic 'nope' does not exist"):
        reader(spark, cluster, "nope").collect()
    with pytest.raises(Exception, match=r"no raftmq broker answered at 127\.0\.0\.1"):
        spark.read.format("raftmq").option("bootstrap", dead_address).option(
            "subscribe", "errors"
        ).load().collect()
    with pytest.raises(Exception, match="minPartitions must be at least 1"):
        reader(spark, cluster, "errors", minPartitions=0).collect()
    with pytest.raises(Exception, match="unknown raftmq option"):
        reader(spark, cluster, "errors", startingOffset="earliest").collect()
    with pytest.raises(Exception, match="past its committed end"):
        reader(spark, cluster, "errors", endingOffsets='{"errors": {"0": 5}}').collect()


def test_data_deleted_by_retention_is_named_or_skipped(spark, cluster: LocalCluster):
    with cluster.client() as client:
        value = b"x" * 1024
        for i in range(40):  # 400 KiB: past retention.bytes, so the oldest segments go
            client.produce("gone", 0, build_batch([Record(None, value, T0_MS + i)] * 10))
        deadline = time.monotonic() + 30
        while True:
            start = client.stub(cluster.addresses[0]).ListOffsets(
                pb.ListOffsetsRequest(topic="gone", partition=0, position=pb.EARLIEST), timeout=10
            )
            if start.offset > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    log_start, hw = start.offset, start.high_watermark
    assert 0 < log_start < hw == 400
    # Retention may move on meanwhile, so the exact offsets named are not known in advance.
    with pytest.raises(Exception, match=r"gone/0: offsets 0 to \d+ were deleted \(retention\)"):
        reader(spark, cluster, "gone", startingOffsets='{"gone": {"0": 0}}').collect()
    skipped = reader(
        spark, cluster, "gone", startingOffsets='{"gone": {"0": 0}}', failOnDataLoss="false"
    )
    offsets = [r.offset for r in skipped.select("offset").collect()]
    # What is read runs without a gap from where the log started to the end.
    assert offsets and offsets[0] >= log_start and sorted(offsets) == list(range(offsets[0], 400))
    assert reader(spark, cluster, "gone").count() <= hw - log_start
    # A stream whose checkpoint is behind the log start: named, or skipped on both sides
    # (the driver plans from the log start, the executor reads on from it).
    options = {"bootstrap": ",".join(cluster.addresses), "subscribe": "gone"}
    stream = RaftmqStreamReader(parse_options(options, streaming=True))
    with pytest.raises(SourceError, match=r"gone/0: offsets 0 to \d+ were deleted"):
        stream.latestOffset({"gone": {"0": 0}}, ReadAllAvailable())
    stream.stop()
    lenient = parse_options({**options, "failOnDataLoss": "false"}, streaming=True)
    assert RaftmqStreamReader(lenient).latestOffset({"gone": {"0": 0}}, ReadAllAvailable()) == {
        "gone": {"0": 400}
    }
    batches = list(read_range(OffsetRange("gone", 0, 0, 400), lenient))
    read = [o for b in batches for o in b.column("offset").to_pylist()]
    assert read and read[0] >= log_start and read == list(range(read[0], 400))
    with pytest.raises(SourceError, match=r"gone/0: offsets 0 to \d+ were deleted"):
        list(read_range(OffsetRange("gone", 0, 0, 400), stream.options))


def test_read_committed_skips_aborted_and_open_transactions(spark, cluster: LocalCluster):
    """isolationLevel=read_committed: committed transactions' records, none of an aborted
    one (whose offsets are a gap, not data loss), and nothing from an open one on."""
    from raftmq.client import Producer

    with Producer(cluster.addresses, transactional_id="spark-txn") as producer:
        producer.init_transactions()
        for tag, commit in (("c1", True), ("a1", False), ("c2", True)):
            producer.begin_transaction()
            for i in range(20):
                producer.send("txn", f"{tag}-{i}".encode(), partition=i % 2)
            if commit:
                producer.commit_transaction()
            else:
                producer.flush()
                producer.abort_transaction()
        producer.begin_transaction()
        for i in range(4):
            producer.send("txn", f"open-{i}".encode(), partition=i % 2).result(10)
        committed = reader(spark, cluster, "txn", isolationLevel="read_committed")
        values = sorted(r.value.decode() for r in committed.collect())
        assert values == sorted(f"{t}-{i}" for t in ("c1", "c2") for i in range(20))
        everything = reader(spark, cluster, "txn", **{"kafka.isolation.level": "read_uncommitted"})
        assert everything.count() == 64
        producer.abort_transaction()


def test_tag_filter_reads_only_matching_records_and_refuses_a_bad_expression(
    spark, cluster: LocalCluster
):
    """tagFilter: the brokers skip batches that cannot match, the reader drops the records
    of a mixed batch that do not, and every range still reaches its end."""
    sent = []
    with cluster.client() as client:
        for p in range(2):
            for k in range(30):
                tags = {0: (("tag", b"paid"), ("tag", b"eu")), 1: (("tag", b"debug"),)}.get(
                    k % 5, ()
                )
                batch = [Record(None, f"p{p}-{k}-{i}".encode(), T0_MS + k, tags) for i in range(4)]
                sent += produce(client, "tagged", p, batch)
            # A batch mixing tags (another producer's): only its matching record is read.
            mixed = [
                Record(
                    None, f"p{p}-mixed-paid".encode(), T0_MS, (("tag", b"paid"), ("tag", b"eu"))
                ),
                Record(None, f"p{p}-mixed-plain".encode(), T0_MS),
            ]
            sent += produce(client, "tagged", p, mixed)
    want = sorted(r.value for r in sent if {b"paid", b"eu"} <= {v for _, v in r.headers})
    df = reader(spark, cluster, "tagged", tagFilter="paid && eu", minPartitions=3)
    assert sorted(r.value for r in df.collect()) == want
    assert len(want) == 2 * (6 * 4 + 1)
    with pytest.raises(SourceError, match="tagFilter: tag filter 'paid &&'"):
        parse_options(
            {"bootstrap": "h:1", "subscribe": "t", "tagFilter": "paid &&"}, streaming=False
        )
