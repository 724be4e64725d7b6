"""The bounds of leader reports (raftmq.broker.leader_reports): only what the metadata
does not show is reported, one report per partition in flight with the newest term after
it, at most MAX_IN_FLIGHT per broker, failures retried with backoff, stale ones dropped.

The replicas here are stand-ins with the two fields the reporter reads; the controller is
a function that records the calls (the real path is in test_topic_ops.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker import leader_reports
from raftmq.broker.controller_link import LinkRefusal
from raftmq.broker.leader_reports import MAX_IN_FLIGHT, LeaderReports
from raftmq.controller.model import MetadataState, Partition, Topic

ME = 1


@dataclass
class Led:
    led_term: int = 2
    """The term it leads in; 0: a follower."""


def state(partitions: int, leader: int | None = None, term: int = 0) -> MetadataState:
    parts = tuple(Partition((1, 2, 3), leader=leader, leader_term=term) for _ in range(partitions))
    return MetadataState("c", 10, topics={"t": Topic("t", 1, 3, {}, parts)})


class Controller:
    """Records reports; each waits until released (to hold reports in flight)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, int]] = []
        self.release = asyncio.Event()
        self.refuse: int | None = None

    async def report(self, topic: str, partition: int, leader: int, term: int) -> int:
        self.calls.append((topic, partition, leader, term))
        await self.release.wait()
        if self.refuse is not None:
            raise LinkRefusal(self.refuse, "refused")
        return 11


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_reports_are_bounded_coalesced_and_not_repeated() -> None:
    controller = Controller()
    replicas = {("t", p): Led() for p in range(3 * MAX_IN_FLIGHT)}
    meta = state(3 * MAX_IN_FLIGHT)
    changes = [0]
    reports = LeaderReports(ME, controller.report, replicas, lambda: meta, lambda: changes[0])  # type: ignore[arg-type]
    reports.scan()
    await settle()
    assert len(controller.calls) == MAX_IN_FLIGHT  # the rest wait for room
    replicas["t", 0].led_term = 3  # a newer term while term 2 is in flight
    changes[0] += 1
    reports.scan()
    await settle()
    assert len(controller.calls) == MAX_IN_FLIGHT  # one in flight per partition, still
    controller.release.set()
    await settle()
    for _ in range(4):
        reports.scan()
        await settle()
    sent = [(p, term) for _, p, _, term in controller.calls]
    assert sent.count((0, 3)) == 1 and sent.count((0, 2)) == 1  # the newest term after
    assert sorted({p for p, _ in sent}) == list(range(3 * MAX_IN_FLIGHT))
    before = len(controller.calls)
    reports.scan()
    await settle()
    assert len(controller.calls) == before  # nothing new: nothing sent


async def test_a_scan_looks_only_when_a_leadership_or_the_metadata_changed() -> None:
    controller = Controller()
    controller.release.set()
    replicas = {("t", 0): Led(led_term=0)}
    meta = state(1)
    changes = [0]
    reports = LeaderReports(ME, controller.report, replicas, lambda: meta, lambda: changes[0])  # type: ignore[arg-type]
    reports.scan()
    await settle()
    assert controller.calls == []
    replicas["t", 0].led_term = 4  # not yet delivered by its round: no change counted
    reports.scan()
    await settle()
    assert controller.calls == []
    changes[0] += 1
    reports.scan()
    await settle()
    assert [term for *_, term in controller.calls] == [4]


async def test_what_the_metadata_shows_is_not_reported_and_followers_never() -> None:
    controller = Controller()
    controller.release.set()
    replicas = {("t", 0): Led(led_term=5), ("t", 1): Led(led_term=0)}
    meta = state(2, leader=ME, term=5)
    reports = LeaderReports(ME, controller.report, replicas, lambda: meta, lambda: 0)  # type: ignore[arg-type]
    reports.scan()
    await settle()
    assert controller.calls == []


async def test_a_stale_report_is_dropped_and_a_failed_one_retried_after_a_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    controller = Controller()
    controller.release.set()
    controller.refuse = pb.ERROR_CODE_STALE_LEADER_TERM
    replicas = {("t", 0): Led()}
    meta = state(1)
    changes = [0]
    reports = LeaderReports(ME, controller.report, replicas, lambda: meta, lambda: changes[0])  # type: ignore[arg-type]
    reports.scan()
    await settle()
    reports.scan()
    await settle()
    assert len(controller.calls) == 1  # dropped, not retried

    controller.calls.clear()
    controller.refuse = pb.ERROR_CODE_INVALID_ARGUMENT  # anything else: retried later
    monkeypatch.setattr(leader_reports, "RETRY_FIRST_S", 0.05)
    replicas["t", 0].led_term = 3
    changes[0] += 1
    reports.scan()
    await settle()
    reports.scan()
    await settle()
    assert len(controller.calls) == 1  # backing off
    controller.refuse = None
    await asyncio.sleep(0.08)
    reports.scan()
    await settle()
    assert len(controller.calls) == 2 and reports.sent == 1
