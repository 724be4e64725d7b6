"""Failure isolation in the broker's control loop (docs/driver.md): each per-partition pass
the broker runs (opening replicas, leader reports, the moves driver, retention, the
preferred-leader hand-back) meets one partition that raises, and still serves every other.

Stand-ins play the replicas and the host, each with only the fields the pass reads; the
real paths with broker processes are in test_control_loop_isolation.py and the tests of
each feature."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from raftmq.broker.leader_reports import LeaderReports
from raftmq.broker.leadership import hand_back, hand_back_due
from raftmq.broker.membership_driver import MembershipDriver
from raftmq.broker.retention import compact_each
from raftmq.broker.unopened import OPEN_RETRY_FIRST_S, OPEN_RETRY_MAX_S, OpenState, UnopenedReplicas
from raftmq.controller.leadership import HandBack
from raftmq.controller.model import MetadataState, Partition, Topic
from raftmq.raft.host.host import GroupStatus, PeerProgress
from raftmq.raft.progress import ProgressState
from raftmq.raft.ready import Role

ME = 1
BAD = ("t", 1)


def state(partitions: int) -> MetadataState:
    parts = tuple(Partition((2, 1, 3)) for _ in range(partitions))
    return MetadataState("c", 10, topics={"t": Topic("t", 1, 3, {}, parts)})


@dataclass
class Replica:
    topic: str
    partition: int
    term: int = 2
    broken: bool = False

    @property
    def led_term(self) -> int:
        if self.broken:
            raise OSError("injected: this replica's state cannot be read")
        return self.term

    @property
    def is_leader(self) -> bool:
        if self.broken:
            raise OSError("injected: this replica's state cannot be read")
        return True

    def retention_floor(self) -> int | None:
        return None


def replicas(n: int) -> dict[tuple[str, int], Replica]:
    out = {("t", p): Replica("t", p) for p in range(n)}
    out[BAD].broken = True
    return out


@dataclass
class Host:
    """Fails every call for group t/1; records the others."""

    node_id: int = ME
    compacted: list[str] = field(default_factory=list)
    transferred: list[tuple[str, int]] = field(default_factory=list)

    def _check(self, name: str) -> None:
        if name == "t/1":
            raise OSError(f"injected: group {name} fails")

    def compact(self, name: str, *, keep_from: int | None = None) -> int:
        self._check(name)
        self.compacted.append(name)
        return 0

    def status(self, name: str) -> GroupStatus:
        self._check(name)
        follower = PeerProgress(match=10, state=ProgressState.REPLICATE)
        return GroupStatus(
            leader=ME,
            term=2,
            commit=10,
            last_index=10,
            role=Role.LEADER,
            failed=None,
            leader_commit=10,
            followers={2: follower},
        )

    def transfer_leadership(self, name: str, to: int) -> None:
        self._check(name)
        self.transferred.append((name, to))


def test_unopened_replicas_back_off_doubling_and_are_forgotten_once_unassigned() -> None:
    unopened = UnopenedReplicas()
    unopened.opening(("t", 0))
    assert unopened.may_open(("t", 0), now_s=0.0)
    delays = [unopened.failed(("t", 0), "cannot open: boom", now_s=0.0) for _ in range(10)]
    assert delays[:3] == [OPEN_RETRY_FIRST_S, 2 * OPEN_RETRY_FIRST_S, 4 * OPEN_RETRY_FIRST_S]
    assert max(delays) == OPEN_RETRY_MAX_S
    entry = unopened.get(("t", 0))
    assert entry is not None and entry.state is OpenState.FAILED and entry.failures == 10
    assert not unopened.may_open(("t", 0), now_s=1.0)
    assert unopened.due(now_s=1.0) == []
    assert unopened.due(now_s=OPEN_RETRY_MAX_S) == [("t", 0)]
    unopened.repairing(("t", 1), "a CONFIG entry failed its checksum")
    assert not unopened.may_open(("t", 1), now_s=10**9)  # a repair runs: not opened meanwhile
    assert unopened.due(now_s=10**9) == [("t", 0)]
    assert unopened.keep_only({("t", 1)}) == [("t", 0)]
    assert unopened.keys() == [("t", 1)]
    unopened.opened(("t", 1))
    assert len(unopened) == 0


async def test_leader_reports_skip_a_replica_that_raises_and_report_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    async def report(topic: str, partition: int, leader: int, term: int) -> int:
        calls.append(partition)
        return 11

    meta = state(4)
    reports = LeaderReports(ME, report, replicas(4), lambda: meta, lambda: 0)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR):
        reports.scan()
        for _ in range(5):
            await asyncio.sleep(0)
    assert sorted(calls) == [0, 2, 3]
    assert "t/1: reading its leadership failed" in caplog.text


def test_the_moves_driver_checks_every_other_group_when_one_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    host = SimpleNamespace(node_id=ME)
    driver = MembershipDriver(
        host,  # type: ignore[arg-type]
        replicas(4),  # type: ignore[arg-type]
        report=None,  # type: ignore[arg-type]
        leave=None,  # type: ignore[arg-type]
        alive=lambda peer: True,
    )
    checked: list[tuple[str, int]] = []

    def check_one(key: tuple[str, int], replica: object, part: object, version: int) -> bool:
        if key == BAD:
            raise OSError("injected: this group fails")
        checked.append(key)
        return True

    monkeypatch.setattr(driver, "_check_one", check_one)
    driver.update(state(4))
    with caplog.at_level(logging.ERROR):
        driver.check()
        driver.check()
    assert checked == [("t", 0), ("t", 2), ("t", 3)] * 2
    assert caplog.text.count("following t/1's replica set failed") == 1  # said once


def test_retention_compacts_every_other_replica_when_one_raises() -> None:
    host = Host()
    failed = compact_each(host, replicas(4).values())
    assert failed == 1
    assert host.compacted == ["t/0", "t/2", "t/3"]


def test_the_hand_back_goes_on_past_a_replica_or_a_transfer_that_raises() -> None:
    host = Host()
    reps = replicas(4)
    for broken in (True, False):  # t/1 itself raises, then its group's status does
        reps[BAD].broken = broken
        policy = HandBack()
        for _ in range(2):  # the policy wants two checks in a row
            due = hand_back_due(ME, reps.values(), lambda t, p: 2, host, lambda b: True, policy)
        assert sorted(g.name for g in due) == ["t/0", "t/2", "t/3"]
    hand_back(host, [*due, dataclasses.replace(due[0], name="t/1")])
    assert sorted(host.transferred) == [("t/0", 2), ("t/2", 2), ("t/3", 2)]
