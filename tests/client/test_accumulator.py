"""The producer's accumulator alone: batches roll when full and leave when their linger
runs out, a failed batch goes back ahead of later ones, the buffer bound blocks and frees,
and batches past their delivery timeout come out."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from raftmq.client.accumulator import Accumulator, BufferFullError, record_size
from raftmq.format.records import Record

NOW = 1_700_000_000_000


def acc(**kw: float) -> Accumulator:
    settings = {
        "batch_size_bytes": 1000,
        "linger_s": 0.05,
        "buffer_bytes": 10_000,
        "delivery_s": 60,
    }
    settings.update(kw)
    return Accumulator(**settings, new_outcome=concurrent.futures.Future)  # type: ignore[arg-type]


def rec(n: int) -> Record:
    return Record(None, b"v" * n, NOW)


def always(key: tuple[str, int]) -> bool:
    return True


def test_a_full_batch_rolls_and_an_open_one_waits_for_its_linger() -> None:
    a = acc()
    assert a.append("t", 0, rec(400), 0)[2:] == (True, False)  # new batch: linger starts
    assert a.append("t", 0, rec(400), 0)[2:] == (False, False)
    assert a.append("t", 0, rec(400), 0)[2:] == (True, True)  # over 1000: rolled
    batches, due = a.drain(time.monotonic(), always, flush=False)
    assert [len(b.records) for b in batches] == [2]
    assert due is not None and due > time.monotonic()
    batches, _ = a.drain(time.monotonic() + 0.06, always, flush=False)
    assert [len(b.records) for b in batches] == [1]


def test_claim_limits_what_drains_and_a_retry_goes_first() -> None:
    a = acc(linger_s=0)
    for _ in range(3):
        a.append("t", 0, rec(900), 0)
    taken, _ = a.drain(time.monotonic(), lambda key: False, flush=True)
    assert taken == []
    claims = iter([True, False])
    first, _ = a.drain(time.monotonic(), lambda key: next(claims), flush=True)
    assert len(first) == 1
    a.retry_first(first[0])
    again, _ = a.drain(time.monotonic(), always, flush=True)
    assert again[0] is first[0] and len(again) == 3


def test_a_full_buffer_blocks_until_room_is_released() -> None:
    one = record_size(rec(4000))
    a = acc(batch_size_bytes=one, buffer_bytes=2 * one)
    a.append("t", 0, rec(4000), 0)
    a.append("t", 1, rec(4000), 0)
    with pytest.raises(BufferFullError):
        a.append("t", 2, rec(4000), 0.05)
    batches, _ = a.drain(time.monotonic(), always, flush=True)
    threading.Timer(0.1, a.release, [batches[0]]).start()
    started = time.monotonic()
    a.append("t", 2, rec(4000), 5)
    assert 0.05 < time.monotonic() - started < 4
    assert a.used_bytes == 2 * one


def test_batches_past_their_delivery_timeout_come_out() -> None:
    a = acc(delivery_s=0.01, linger_s=10)
    a.append("t", 0, rec(10), 0)
    a.append("t", 1, rec(10), 0)
    assert a.expired(time.monotonic()) == []
    expired = a.expired(time.monotonic() + 1)
    assert sorted(b.partition for b in expired) == [0, 1]
    assert not a.waiting


def test_a_batch_is_settled_once_for_all_its_records() -> None:
    a = acc(linger_s=0)
    placed = [a.append("t", 0, Record(None, b"x", NOW + i), 0)[:2] for i in range(3)]
    assert [i for _, i in placed] == [0, 1, 2]
    assert len({id(o) for o, _ in placed}) == 1  # one outcome for the batch
    (batch,), _ = a.drain(time.monotonic(), always, flush=True)
    batch.finish(40, None)
    batch.finish(-1, RuntimeError("too late"))  # settled already: ignored
    assert placed[0][0].result() == 40  # type: ignore[attr-defined]


def test_batches_are_tag_uniform() -> None:
    """A record whose tags differ from its partition's open batch's closes it (without
    counting as a full batch: the sticky partitioner stays), so every batch's tag block is
    exactly each of its records' tags."""
    a = acc(batch_size_bytes=100_000, buffer_bytes=100_000)

    def tagged(*tags: bytes) -> Record:
        return Record(None, b"v", NOW, (*(("tag", t) for t in tags), ("other", b"x")))

    plan = [rec(1), rec(1), tagged(b"a"), tagged(b"a"), tagged(b"a", b"b"), tagged(b"b", b"a")]
    plan += [Record(None, b"v", NOW, (("other", b"x"),)), rec(1)]
    wakes = [a.append("t", 0, r, 0)[2:] for r in plan]
    new, joined = (True, False), (False, False)  # (wake, rolled) of each append
    assert wakes == [new, joined] * 4
    out, _ = a.drain(time.monotonic(), always, flush=True)
    assert [len(b.records) for b in out] == [2, 2, 2, 2]
    assert [sorted(t for t in b.tags if t) for b in out] == [[], [b"a"], [b"a", b"b"], []]
