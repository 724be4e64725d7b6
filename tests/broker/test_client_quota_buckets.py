"""One broker's client-quota enforcement without a cluster: throttle times from the token
buckets, a caller in debt held before it is served, request time counted as what a call
keeps the loop busy (not what it waits), and a bucket table bounded whatever the number
of clients."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

from raftmq.broker.client_quotas import FETCH, PRODUCE, REQUEST, WINDOW_S, ClientQuotas, Timed
from raftmq.controller.model import ClientQuota, MetadataState
from raftmq.controller.quotas import DEFAULT
from raftmq.limits import CLIENT_ID_HEADER
from raftmq.log_records import CallContext, bind_call, unbind_call


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _state(*quotas: ClientQuota) -> MetadataState:
    return MetadataState("q", client_quotas=tuple(quotas))


async def _as(user: str, client_id: str, quotas: ClientQuotas, kind: str, size: int) -> int:
    """One call of ``size`` bytes by ``User:user`` with ``client_id``; its throttle ms."""
    call = CallContext("Produce", lambda: ((CLIENT_ID_HEADER, client_id),))
    call.principal = f"User:{user}"
    token = bind_call(call)
    try:

        async def work() -> int:
            return size

        _, throttle_ms = await quotas.call(kind, work(), size if kind == PRODUCE else lambda n: n)
        return throttle_ms
    finally:
        unbind_call(token)


async def test_no_quota_costs_nothing_and_counts_nothing() -> None:
    quotas = ClientQuotas(lambda: _state())
    assert await _as("alice", "app", quotas, PRODUCE, 10**9) == 0
    assert not quotas.buckets


async def test_a_byte_rate_throttles_past_the_burst_and_recovers() -> None:
    clock = Clock()
    state = _state(ClientQuota("alice", "", {"producer_byte_rate": 1000}))
    quotas = ClientQuotas(lambda: state, clock=clock)
    assert await _as("alice", "app", quotas, PRODUCE, 1000) == 0  # one window's burst
    assert await _as("alice", "app", quotas, PRODUCE, 500) == 500  # 500 bytes of debt
    assert await _as("bob", "app", quotas, PRODUCE, 10**6) == 0  # no quota for bob
    assert await _as("alice", "app", quotas, FETCH, 10**6) == 0  # fetch is not limited
    clock.now_s += 0.5
    assert await _as("alice", "other", quotas, PRODUCE, 250) == 250  # a user quota: shared
    assert quotas.throttle_s[PRODUCE] == 0.75


async def test_a_caller_in_debt_is_held_before_it_is_served() -> None:
    state = _state(ClientQuota("", DEFAULT, {"producer_byte_rate": 10_000}))
    quotas = ClientQuotas(lambda: state)
    assert await _as("u", "a", quotas, PRODUCE, 12_000) == 200  # 2,000 bytes: 0.2 s
    started = time.monotonic()
    assert await _as("u", "b", quotas, PRODUCE, 1) == 0  # another client id: own bucket
    assert time.monotonic() - started < 0.1
    await _as("u", "a", quotas, PRODUCE, 1)  # held until the debt is paid
    assert time.monotonic() - started >= 0.15


async def test_request_time_is_the_loop_time_a_call_takes_not_its_waits() -> None:
    async def work() -> None:
        await asyncio.sleep(0.2)
        deadline = time.perf_counter() + 0.03
        while time.perf_counter() < deadline:
            pass

    timed = Timed(work())
    await timed
    assert 0.03 <= timed.busy_s < 0.1

    clock = Clock()
    state = _state(ClientQuota("", "spinner", {"request_percentage": 10}))
    quotas = ClientQuotas(lambda: state, clock=clock)
    call = CallContext("Metadata", lambda: ((CLIENT_ID_HEADER, "spinner"),))
    token = bind_call(call)
    try:
        _, throttle_ms = await quotas.call(REQUEST, work())
    finally:
        unbind_call(token)
    assert throttle_ms == 0  # 30 ms of loop time within the 100 ms a window holds
    assert quotas.buckets[(REQUEST, "", "spinner")].tokens < 0.1 * WINDOW_S


async def test_a_cancelled_call_is_cancelled_through_the_timer() -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(60)

    timed = Timed(work())
    task = asyncio.ensure_future(timed)
    await started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_the_bucket_table_is_bounded_and_drops_full_buckets() -> None:
    clock = Clock()
    state = _state(ClientQuota("", DEFAULT, {"producer_byte_rate": 100}))
    quotas = ClientQuotas(lambda: state, clock=clock, max_buckets=50)
    for i in range(500):  # every client id in debt: the least recently used go
        await _as("u", f"c{i}", quotas, PRODUCE, 1000)
    assert len(quotas.buckets) == 50
    assert (PRODUCE, "", "c499") in quotas.buckets
    clock.now_s += 60  # every bucket filled up again: the next new one sweeps them out
    await _as("u", "late", quotas, PRODUCE, 1)
    assert list(quotas.buckets) == [(PRODUCE, "", "late")]


async def test_a_changed_quota_applies_at_once_and_a_deleted_one_frees_the_table() -> None:
    clock = Clock()
    holder = {"state": _state(ClientQuota("alice", "", {"producer_byte_rate": 1000}))}
    quotas = ClientQuotas(lambda: holder["state"], clock=clock)
    assert await _as("alice", "x", quotas, PRODUCE, 2000) == 1000
    holder["state"] = dataclasses.replace(
        holder["state"], client_quotas=(ClientQuota("alice", "", {"producer_byte_rate": 4000}),)
    )
    assert await _as("alice", "x", quotas, PRODUCE, 0) == 250  # same debt, faster rate
    holder["state"] = _state()
    assert await _as("alice", "x", quotas, PRODUCE, 10**6) == 0
    assert not quotas.buckets
