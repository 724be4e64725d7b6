"""Tag filtering against real brokers (docs/tags.md): a filtered consumer gets exactly the
matching records and moves (and commits) past the rest; bad tags are refused at send and
by the broker with INVALID_TAGS; a bad expression at Consumer construction and at Fetch
with INVALID_TAG_FILTER; a long poll that matches nothing answers with next_offset moved
on; the CLI's --tags; and the tag index on a restarted broker and a new leader."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import grpc
import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client.consumer import Consumer, ConsumerRecord
from raftmq.client.errors import ClientError
from raftmq.client.lowlevel import LowLevelClient
from raftmq.client.producer import Producer
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.format import entry, tags
from raftmq.format.records import Record, build_batch, encode_records
from raftmq.format.tag_filter import parse
from tests.broker.conftest import ClusterFactory
from tests.broker.test_broker_cluster import assert_error, rpc_error, wait_until
from tests.client.test_records_cli import raftmq as run_cli

pytestmark = pytest.mark.timeout(180)


def tags_for(i: int) -> list[str] | None:
    """A plan: about 1% "paid" with a region, some "debug", most untagged."""
    if i % 97 == 5:
        return ["paid", "eu"]
    if i % 97 == 50:
        return ["paid", "us"]
    if i % 97 == 70:
        return ["paid", "jp"]
    if i % 13 == 0:
        return ["debug"]
    return None


def produce_plan(cluster: LocalCluster, topic: str, n: int) -> dict[int, list[str]]:
    """Offsets of the tagged records sent, with their tags."""
    with Producer(cluster.addresses, linger_ms=5, batch_size=16 * 1024) as producer:
        futures = [
            (producer.send(topic, f"r{i}".encode() * 10, tags=tags_for(i), partition=0), i)
            for i in range(n)
        ]
    return {f.result(timeout=0).offset: tags_for(i) or [] for f, i in futures}


def poll_all(consumer: Consumer, topic: str, end: int, timeout: float = 60) -> list[ConsumerRecord]:
    """Poll until the position reaches ``end`` (filtered records are passed too)."""
    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while consumer.position((topic, 0)) is None or consumer.position((topic, 0)) < end:
        assert time.monotonic() < deadline, f"position {consumer.position((topic, 0))} < {end}"
        out += consumer.poll(0.3)
    return out


def high_watermark(client: LowLevelClient, topic: str) -> int:
    return int(client.list_offsets(topic, 0, position=pb.LATEST).high_watermark)


def test_a_filtered_consumer_gets_exactly_the_matching_records_and_commits_near_the_end(
    cluster: LocalCluster,
) -> None:
    sent = produce_plan(cluster, "tg", 3000)
    # Another producer's batch mixing tags: it comes whole, the client drops the rest.
    now = int(time.time() * 1000)
    mixed = [
        Record(None, b"m-paid-eu", now, (("tag", b"paid"), ("tag", b"eu"))),
        Record(None, b"m-debug", now, (("tag", b"debug"),)),
        Record(None, b"m-plain", now),
    ]
    with cluster.client() as client:
        base = client.produce("tg", 0, build_batch(mixed)).base_offset
        end = high_watermark(client, "tg")
    sent.update({base: ["paid", "eu"], base + 1: ["debug"], base + 2: []})
    expression = "paid && (eu || us)"
    flt = parse(expression)
    want = sorted(o for o, t in sent.items() if flt.matches(set(t)))
    assert 50 < len(want) < 100
    with Consumer(
        cluster.addresses,
        group_id="tag-readers",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        tag_filter=expression,
    ) as consumer:
        consumer.assign([("tg", 0)])
        got = poll_all(consumer, "tg", end)
        assert [r.offset for r in got] == want
        assert all(flt.matches(tags.record_tags(r)) for r in got)  # type: ignore[arg-type]
        # The position passed every record the filter dropped, up to the log end.
        assert consumer.position(("tg", 0)) == end
        consumer.commit()
        assert consumer.committed({("tg", 0)})[("tg", 0)] == end
    # A filter true on the empty set reads untagged records too, tagged ones it rules out not.
    with Consumer(cluster.addresses, auto_offset_reset="earliest", tag_filter="!debug") as c:
        c.assign([("tg", 0)])
        got = poll_all(c, "tg", end)
        assert [r.offset for r in got] == sorted(o for o, t in sent.items() if "debug" not in t)


def test_a_filtered_fetch_reads_a_fraction_of_an_unfiltered_one(cluster: LocalCluster) -> None:
    """What the broker returns for 1% matching records, fetch by fetch to the end."""
    with cluster.client() as client:
        end = high_watermark(client, "tg")
        total = {"": 0, "paid && eu": 0}
        for expression in total:
            offset = 0
            while offset < end:
                answer = client.fetch("tg", 0, offset, max_bytes=1 << 20, tag_filter=expression)
                assert answer.next_offset > offset
                total[expression] += len(answer.entries)
                offset = answer.next_offset
        assert total["paid && eu"] * 20 < total[""]


def test_bad_tags_are_refused_at_send_and_by_the_broker(cluster: LocalCluster) -> None:
    with Producer(cluster.addresses) as producer:
        cases = {
            "x" * 65: "is 65 bytes; a tag is at most 64 bytes",
            "has space": "has a character outside A-Z a-z 0-9 _ . : / -",
            "": "a tag is empty",
        }
        for bad, words in cases.items():
            with pytest.raises(ValueError, match=words.split(";")[0][:20]):
                producer.send("tgbad", b"v", tags=[bad])
        with pytest.raises(ValueError, match="at most 16 are allowed"):
            producer.send("tgbad", b"v", tags=[f"t{i}" for i in range(17)])
        with pytest.raises(ValueError, match="pass a list of tags"):
            producer.send("tgbad", b"v", tags="paid")  # type: ignore[arg-type]
    now = int(time.time() * 1000)
    headers = (("tag", b"paid"),)
    region = encode_records([Record(None, b"v", now, headers)], base_timestamp=now)
    fields = {"record_count": 1, "first_timestamp": now, "max_timestamp": now}
    long_tag = encode_records([Record(None, b"v", now, (("tag", b"y" * 70),))], base_timestamp=now)
    refused = {
        "tag headers without the tagged bit": (
            entry.encode(region, **fields),  # type: ignore[arg-type]
            ("carry tags ['paid'] but the tagged bit (0x20) is unset",),
        ),
        "a block that is not the union": (
            entry.encode(
                tags.encode_block([b"eu", b"paid"]) + region,
                attributes=entry.TAGGED,
                **fields,  # type: ignore[arg-type]
            ),
            ("the tag block lists ['eu', 'paid'] but the records carry the tags ['paid']",),
        ),
        "the tagged bit with no tags": (
            entry.encode(
                b"\x00" + encode_records([Record(None, b"v", now)], base_timestamp=now),
                attributes=entry.TAGGED,
                **fields,  # type: ignore[arg-type]
            ),
            ("declares 0 tags",),
        ),
        "a tag over 64 bytes": (
            entry.encode(long_tag, **fields),  # type: ignore[arg-type]
            ("record 0: tag", "is 70 bytes; a tag is at most 64 bytes"),
        ),
    }
    with cluster.client() as client:
        for what, (batch, words) in refused.items():
            err = rpc_error(lambda b=batch: client.produce("tgbad", 0, b))
            assert_error(err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TAGS", *words)
            assert "entry 0" in str(err), what
        assert high_watermark(client, "tgbad") == 0  # nothing was kept


def test_a_bad_expression_is_refused_with_its_position(cluster: LocalCluster) -> None:
    with pytest.raises(ValueError, match="at position 8"):
        Consumer(cluster.addresses, tag_filter="paid && ")
    with pytest.raises(ValueError, match="expected '&&', '\\|\\|' or the end at position 5"):
        Consumer(cluster.addresses, tag_filter="paid & eu")
    with cluster.client() as client:
        err = rpc_error(lambda: client.fetch("tg", 0, 0, tag_filter="(paid || eu"))
        assert_error(
            err,
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_TAG_FILTER",
            "expected ')'",
            "position 11",
        )


def test_a_long_poll_that_matches_nothing_waits_then_moves_on(cluster: LocalCluster) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(200):
            producer.send("tgpoll", b"plain %d" % i, partition=0)
    with cluster.client() as client:
        end = high_watermark(client, "tgpoll")
        started = time.monotonic()
        answer = client.fetch("tgpoll", 0, 0, max_wait_ms=400, min_bytes=1, tag_filter="paid")
        assert time.monotonic() - started >= 0.35
        assert (answer.entries, answer.next_offset) == (b"", end)
        # A match produced while the fetch waits ends the wait with it.
        with Producer(cluster.addresses, linger_ms=1) as producer:
            started = time.monotonic()
            future = producer.send("tgpoll", b"late", tags=["paid"], partition=0)
            answer = client.fetch(
                "tgpoll", 0, end, max_wait_ms=10_000, min_bytes=1, tag_filter="paid"
            )
        assert time.monotonic() - started < 8
        found = [r.value for r in entries_records(answer.entries)]
        assert found == [b"late"] and answer.next_offset == future.result().offset + 1


def entries_records(data: bytes) -> list[Record]:
    from raftmq.format.records import iter_records

    return list(iter_records(data))


def test_the_cli_produces_and_consumes_with_tags(cluster: LocalCluster) -> None:
    def raftmq(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return run_cli(cluster, *args, stdin=stdin)

    assert raftmq("produce", "tgcli", stdin=b"a\nb\n").returncode == 0
    done = raftmq("produce", "tgcli", "--tags", "paid,eu", stdin=b"c\nd\n")
    assert done.returncode == 0, done.stderr
    assert raftmq("produce", "tgcli", "--tags", "debug", stdin=b"e\n").returncode == 0
    bad = raftmq("produce", "tgcli", "--tags", "no spaces")
    assert bad.returncode == 2 and b"has a character outside" in bad.stderr
    out = raftmq(
        "consume", "tgcli", "--from-beginning", "--tags", "paid && eu", "--idle-timeout-ms", "2000"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [b"c", b"d"]
    bad = raftmq("consume", "tgcli", "--tags", "paid &&", "--idle-timeout-ms", "100")
    assert bad.returncode == 2 and b"at position 7" in bad.stderr
    # As a member of a group, it commits past the records the filter dropped: the last one
    # (offset 4, "e", tagged debug) was never printed, and the commit is at the log end.
    member = raftmq(
        "consume",
        "tgcli",
        "--group",
        "tgcli-g",
        "--from-beginning",
        "--tags",
        "paid",
        "--idle-timeout-ms",
        "2000",
    )
    assert member.returncode == 0, member.stderr
    assert member.stdout.splitlines() == [b"c", b"d"]
    with Consumer(cluster.addresses, group_id="tgcli-g") as consumer:
        assert consumer.committed([("tgcli", 0)]) == {("tgcli", 0): 5}


@pytest.mark.timeout(240)
def test_the_tag_index_survives_a_restart_and_serves_from_a_new_leader(
    make_cluster: ClusterFactory,
) -> None:
    cluster = make_cluster({"tr": 1})
    with cluster.admin() as admin:  # several segments: sealed ones and an active one
        admin.alter_topic_config("tr", {"segment.bytes": "65536"})
    sent = produce_plan(cluster, "tr", 4000)
    flt = parse("paid")
    want = sorted(o for o, t in sent.items() if flt.matches(set(t)))

    def filtered(client: LowLevelClient, address: str | None) -> list[int]:
        end = high_watermark(client, "tr")
        got: list[int] = []
        offset = 0
        while offset < end:
            answer = client.fetch("tr", 0, offset, tag_filter="paid", address=address)
            got += [r.offset for r in entries_records(answer.entries) if flt.matches(set(_t(r)))]
            assert answer.next_offset > offset
            offset = answer.next_offset
        return got

    with cluster.client() as client:
        assert filtered(client, None) == want
        old = client.refresh_leaders()["tr", 0].broker_id
        cluster.kill(old)
        # A follower elected leader serves from the tag index it built on append.
        wait_until(lambda: answers(lambda: filtered(client, None)) == want, 30, "a new leader")
        cluster.start(old)  # recovery rebuilds the active segment's tag slots
        cluster.wait_ready(timeout=60)
        address = cluster.spec.brokers[old].address
        wait_until(
            lambda: answers(lambda: filtered(client, address)) == want, 30, "the restarted broker"
        )


def answers(call: Callable[[], list[int]]) -> list[int] | None:
    """``call()``, or None while the cluster cannot answer it yet (an election, a start)."""
    try:
        return call()
    except ClientError:
        return None


def _t(r: Record) -> set[str]:
    return set(tags.record_tags(r))


def test_read_committed_and_a_followers_replica_read_filter_alike(cluster: LocalCluster) -> None:
    with Producer(cluster.addresses, linger_ms=1) as producer:
        for i in range(300):
            producer.send("tgpoll", b"x%d" % i, tags=["paid"] if i % 50 == 7 else None, partition=0)
    with cluster.client() as client:
        end = high_watermark(client, "tgpoll")
        leader = client.refresh_leaders()["tgpoll", 0].broker_id
        follower = next(b for b in cluster.spec.brokers if b != leader)
        plain = client.fetch("tgpoll", 0, 0, tag_filter="paid", max_bytes=1 << 22)
        committed = client.fetch(
            "tgpoll", 0, 0, tag_filter="paid", max_bytes=1 << 22, read_committed=True
        )
        assert committed.entries == plain.entries and committed.next_offset == end

        def at_follower() -> pb.FetchResponse | None:
            request = pb.FetchRequest(
                topic="tgpoll", partition=0, offset=0, max_bytes=1 << 22, replica_read=True,
                tag_filter="paid",
            )  # fmt: skip
            try:
                return client.stub(cluster.spec.brokers[follower].address).Fetch(
                    request, timeout=10
                )
            except grpc.RpcError:
                return None  # not in sync yet

        answer = wait_until(
            lambda: (a := at_follower()) is not None and a.next_offset == end and a, 30, "follower"
        )
        assert isinstance(answer, pb.FetchResponse) and answer.entries == plain.entries
        assert len([r for r in entries_records(plain.entries) if tags.record_tags(r)]) >= 6
