"""Which partition a record goes to, decided in the client.

Keyed records: ``murmur2(key) & 0x7FFFFFFF`` modulo the partition count, Kafka's
default (``Utils.murmur2`` with seed 0x9747B28C, then ``toPositive``). Why Kafka's and not
a hash of our own: a key must land on the same partition from every process and every
language (docs/partitioning.md gives the function and test vectors to port), and with
Kafka's function a team moving from Kafka keeps its keys where they were and can check
any port against a dozen existing implementations.

Records without a key stick to one partition until the batch being built for it is sent
(Kafka's sticky partitioner, KIP-480): one full batch instead of one record per
partition per linger, which matters far more for throughput than spreading each record.
The producer owns the batches, so it calls :meth:`StickyPartitioner.batch_sent`.
"""

from __future__ import annotations

import random
from typing import Protocol

MURMUR2_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` as a signed int (what Java returns)."""
    length = len(data)
    h = (MURMUR2_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed record among ``partitions``."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Partitioner(Protocol):
    """Pluggable: the producer asks this for every record sent without a partition."""

    def partition(self, topic: str, key: bytes | None, partitions: int) -> int: ...


class StickyPartitioner:
    """The default: keyed records by :func:`partition_for_key`, the others on one partition
    per topic until :meth:`batch_sent` says its batch left, then on another at random."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int) -> int:
        if key is not None:
            return partition_for_key(key, partitions)
        current = self._sticky.get(topic)
        if current is None or current >= partitions:
            current = self._rng.randrange(partitions)
            self._sticky[topic] = current
        return current

    def batch_sent(self, topic: str, partition: int, partitions: int) -> None:
        """A batch for ``partition`` left: unkeyed records of ``topic`` move on, to a
        different partition when there is one."""
        if self._sticky.get(topic) != partition:
            return
        if partitions <= 1:
            return
        choice = self._rng.randrange(partitions - 1)
        self._sticky[topic] = choice if choice < partition else choice + 1
