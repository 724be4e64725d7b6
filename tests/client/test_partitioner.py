"""The key hash must equal Kafka's bit for bit: other languages port it from
docs/partitioning.md, and these are the vectors that page gives."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from raftmq.client.partitioner import StickyPartitioner, murmur2, partition_for_key

# Apache Kafka's own vectors (UtilsTest.testMurmur2), signed as Java returns them.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
DOC = Path(__file__).resolve().parents[2] / "docs" / "partitioning.md"


@pytest.mark.parametrize(("key", "expected"), sorted(KAFKA_VECTORS.items()))
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_the_documented_vectors_are_what_the_code_computes() -> None:
    rows = re.findall(r"^\| `([^`]*)` \| (-?\d+) \| (\d+) \| (\d+) \|$", DOC.read_text(), re.M)
    assert len(rows) >= 8, "docs/partitioning.md lost its table of test vectors"
    for key, hashed, of_12, of_100 in rows:
        data = key.encode()
        assert murmur2(data) == int(hashed), key
        assert partition_for_key(data, 12) == int(of_12), key
        assert partition_for_key(data, 100) == int(of_100), key


def test_a_key_always_lands_on_the_same_partition_and_within_range() -> None:
    rng = random.Random(7)
    for _ in range(500):
        key = rng.randbytes(rng.randrange(0, 40))
        n = rng.randrange(1, 64)
        p = partition_for_key(key, n)
        assert 0 <= p < n
        assert partition_for_key(key, n) == p


def test_no_partitions_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for_key(b"k", 0)


def test_unkeyed_records_stick_until_their_batch_is_sent() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", None, 6)
    assert all(sticky.partition("t", None, 6) == first for _ in range(50))
    sticky.batch_sent("t", (first + 1) % 6, 6)  # another partition's batch: no change
    assert sticky.partition("t", None, 6) == first
    sticky.batch_sent("t", first, 6)
    assert sticky.partition("t", None, 6) != first
    assert sticky.partition("t", b"k", 6) == partition_for_key(b"k", 6)


def test_a_single_partition_topic_stays_put() -> None:
    sticky = StickyPartitioner(random.Random(1))
    assert sticky.partition("t", None, 1) == 0
    sticky.batch_sent("t", 0, 1)
    assert sticky.partition("t", None, 1) == 0
