"""What a Raft host counts about itself, for monitoring (the broker exports it:
raftmq.broker.metrics_collector, docs/metrics.md): how long a round's durable write took,
how long a local proposal took to commit, how many elections its groups won, how many
snapshots they installed, how many damaged ranges its repairs mended or could not.

Updated on the host's event loop only (a round's durable write is timed on the loop
around it, whether its fsyncs ran there or in the pool), so plain integers and lists, no
locks; a scrape from another thread reads them through the loop. Per host, not per group:
bounded whatever the partition count.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
"""From a page-cache write (half a millisecond) to a disk that stalls for seconds."""


class Histogram:
    """Counts per bucket of LATENCY_BUCKETS_S (the last one above them all) and the sum."""

    __slots__ = ("buckets", "sum_s")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds


class HostStats:
    def __init__(self) -> None:
        self.persist = Histogram()
        """Each round's durable write: its groups' log fsyncs and the state store's sync."""
        self.commit = Histogram()
        """Each local proposal, from :meth:`RaftHost.propose` to its commit here."""
        self.elections_won = 0
        self.snapshots_installed = 0
        self.damage_found = 0
        """Damaged ranges a repair set out to mend (found by a read, the scrubber or an
        open): most end :attr:`repaired`, some :attr:`unrepaired`; the others were
        released instead (retention had passed them on every peer) or refused."""
        self.repaired = 0
        """Damaged ranges patched with a peer's copy."""
        self.unrepaired = 0
        """Damaged ranges no peer could supply (they stay unreadable here)."""

    def proposed(self, done: asyncio.Future[int]) -> None:
        """Time ``done`` (a proposal's outcome) from now to its commit; a proposal that
        fails is not a commit and is not counted."""
        start_s = time.perf_counter()
        commit = self.commit

        def committed(fut: asyncio.Future[int]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                commit.observe(time.perf_counter() - start_s)

        done.add_done_callback(committed)
