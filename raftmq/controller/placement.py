"""Where a topic's partitions get their replicas: written once, here, for the cluster
file, the local cluster launcher and the chaos harness alike."""

from __future__ import annotations

from collections.abc import Sequence


def round_robin(
    broker_ids: Sequence[int], partitions: int, replication: int
) -> tuple[tuple[int, ...], ...]:
    """Replica lists for ``partitions`` partitions, ``replication`` brokers each, placed
    round-robin over ``broker_ids`` (sorted by the caller). The first broker of each list
    (the preferred leader) rotates with the partition, so leaders spread evenly."""
    assert 1 <= replication <= len(broker_ids), (replication, broker_ids)
    n = len(broker_ids)
    return tuple(
        tuple(broker_ids[(p + k) % n] for k in range(replication)) for p in range(partitions)
    )
