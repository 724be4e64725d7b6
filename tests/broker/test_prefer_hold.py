"""A new group's non-preferred replica keeps holding its first election back while its
preferred replica has not led yet and that broker is reachable and not fenced, up to
PREFER_HOLD_MAX_SECONDS; a reopened group (a term already) is never held past the first
window; and either stops holding back once the transport does not reach the preferred
broker (the controller may not have fenced a dead one yet). On the real Leadership, with a
stand-in for the host's calls it makes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from raftmq.broker import leadership
from raftmq.broker.leadership import Leadership
from raftmq.controller.model import Broker, MetadataState, Partition, Topic

ME, PREFERRED = 2, 1


@dataclass
class Host:
    delays: list[tuple[str, float]] = field(default_factory=list)
    ended: int = 0

    def delay_election(self, name: str, seconds: float) -> None:
        self.delays.append((name, seconds))

    def end_election_delay(self, name: str) -> None:
        self.ended += 1

    def campaign(self, name: str) -> None:
        raise AssertionError("only the preferred replica campaigns")


@dataclass
class Group:
    term: int


@dataclass
class Replica:
    term: int
    topic: str = "t"
    partition: int = 0
    replicas: tuple[int, ...] = (PREFERRED, ME, 3)
    leader_id: int = 0
    group: Group = field(init=False)

    def __post_init__(self) -> None:
        self.group = Group(self.term)


def state(fenced: bool = False) -> MetadataState:
    brokers = {
        b: Broker(b, "h", 1, "h", 2, None, 1, 1, 0, fenced=fenced and b == PREFERRED)
        for b in (1, 2, 3)
    }
    topic = Topic("t", 5, 3, {}, (Partition((PREFERRED, ME, 3)),))
    return MetadataState("c", version=9, topics={"t": topic}, brokers=brokers)


async def held(replica: Replica, *, alive: bool = True, fenced: bool = False) -> Host:
    host = Host()
    replicas = {("t", 0): replica}
    lead = Leadership(
        ME,
        host,  # type: ignore[arg-type]
        replicas,  # type: ignore[arg-type]
        lambda: state(fenced),
        lambda _broker: alive,
        lambda: False,
        5.0,
    )
    lead.prefer(replica)  # type: ignore[arg-type]
    await asyncio.sleep(0.35)
    return host


@pytest.fixture(autouse=True)
def short_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leadership, "PREFER_WINDOW_SECONDS", 0.04)
    monkeypatch.setattr(leadership, "PREFER_HOLD_MAX_SECONDS", 0.2)
    monkeypatch.setattr(leadership, "PREFER_CHECK_SECONDS", 0.02)


async def test_a_new_group_holds_for_its_preferred_replica_up_to_the_cap() -> None:
    host = await held(Replica(term=0))
    # the first delay at open, then renewals every half window until the cap (~0.2 s)
    assert 4 <= len(host.delays) <= 12, host.delays
    assert all(seconds <= 0.04 for _, seconds in host.delays)
    assert host.ended == 0


async def test_no_hold_once_a_leader_is_known_or_for_a_reopened_group() -> None:
    replica = Replica(term=0)
    replica.leader_id = 3
    assert len((await held(replica)).delays) == 1  # the first window only
    assert len((await held(Replica(term=4))).delays) == 1


async def test_no_hold_when_the_preferred_broker_is_away_or_fenced() -> None:
    away = await held(Replica(term=0), alive=False)
    assert len(away.delays) == 1 and away.ended == 1  # held at open, released at the look
    reopened_away = await held(Replica(term=4), alive=False)
    assert len(reopened_away.delays) == 1 and reopened_away.ended == 1
    assert (await held(Replica(term=0), fenced=True)).delays == []  # not even the first
