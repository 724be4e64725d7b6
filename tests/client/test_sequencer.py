"""The idempotent producer's bookkeeping alone: sequences per partition, resends going
back in sequence order whichever failed first, an OUT_OF_ORDER that only means "arrived
first", and a new session after a batch failed for good, held back per partition until
that partition's older batches are settled."""

from __future__ import annotations

import concurrent.futures
import time

from raftmq.client.accumulator import Accumulator, Batch
from raftmq.client.idempotence import Sequencer
from raftmq.format.records import Record

NOW = 1_700_000_000_000


def batch(partition: int, records: int) -> Batch:
    b = Batch("t", partition, time.monotonic(), time.monotonic() + 60, concurrent.futures.Future())
    b.records = [Record(None, b"v", NOW)] * records
    return b


def test_sequences_count_records_per_partition() -> None:
    s = Sequencer()
    assert not s.may_send_fresh(("t", 0))  # no session yet
    s.start(7, 0)
    a, b, c = batch(0, 3), batch(0, 2), batch(1, 4)
    for x in (a, b, c):
        s.assign(x)
    assert [(x.producer_id, x.sequence) for x in (a, b, c)] == [(7, 0), (7, 3), (7, 0)]
    assert s.earlier_unsettled(b) and not s.earlier_unsettled(a)
    s.settled(a, failed=False)
    assert not s.earlier_unsettled(b) and not s.renew


def test_a_batch_failed_for_good_starts_a_new_session_after_its_partition_settles() -> None:
    s = Sequencer()
    s.start(7, 0)
    a, b = batch(0, 1), batch(0, 1)
    s.assign(a)
    s.assign(b)
    s.settled(a, failed=True)
    assert s.renew and not s.may_send_fresh(("t", 0))
    s.start(8, 0)
    assert not s.may_send_fresh(("t", 0))  # b of the old session is still unsettled
    assert s.may_send_fresh(("t", 1))
    s.settled(b, failed=True)  # an old session's failure does not renew the new one
    assert not s.renew and s.may_send_fresh(("t", 0))
    fresh = batch(0, 1)
    s.assign(fresh)
    assert (fresh.producer_id, fresh.sequence) == (8, 0)


def test_resends_go_back_in_sequence_order_whichever_failed_first() -> None:
    acc = Accumulator(
        batch_size_bytes=1000,
        linger_s=0,
        buffer_bytes=10_000,
        delivery_s=60,
        new_outcome=concurrent.futures.Future,
    )
    s = Sequencer()
    s.start(1, 0)
    sent = [batch(0, 1) for _ in range(3)]
    for b in sent:
        s.assign(b)
    acc.append("t", 0, Record(None, b"new", NOW), 0)  # a fresh batch waits behind them
    for b in (sent[2], sent[0], sent[1]):  # failures come back in any order
        acc.retry_first(b)
    taken, _ = acc.drain(time.monotonic() + 1, lambda b: True, flush=True)
    assert [b.sequence for b in taken] == [0, 1, 2, -1]
