"""Who leads each partition of a topic, polled from every broker until a condition holds
or a deadline passes: what the many-partitions benchmark times.

A partition counts as led only when its leader says so in its own Metadata answer (a
follower may still name a leader that died or stepped down). Every leadership seen that
way is kept per partition as its Raft term, so a partition whose leader changed between
two polls shows two terms. Polling can miss a leadership that came and went between two
polls, so the count is a lower bound; the highest term reached is printed beside it (each
election, won or not, takes a new term).

Balance is each broker's share of the led partitions against a third (with three
brokers), within a relative tolerance: ±5% of a third is 31.7% to 35.0%.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from benchmarks.harness import say
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import LowLevelClient

METADATA_TIMEOUT_S = 5.0
PROGRESS_S = 10.0
"""How often a long wait says how far it got (on stderr)."""


@dataclass
class Phase:
    """What one wait saw, in seconds from its start (None: not reached by its end)."""

    partitions: int
    led_s: float | None = None
    balanced_s: float | None = None
    watched_s: float = 0.0
    led_at_end: int = 0
    preferred_at_end: int = 0
    leaders_at_end: dict[int, int] = field(default_factory=dict)
    """Broker id: partitions it leads at the end."""
    terms: dict[int, set[int]] = field(default_factory=dict)
    """Partition (once seen led): the terms of every leadership seen during the wait."""
    max_term: int = 0
    polls: int = 0
    unanswered: int = 0
    """Metadata requests a running broker did not answer within the timeout."""

    def changes(self) -> list[int]:
        """Leaderships seen per partition (the first leader counts as one change; a
        partition seen led only with an unknown term, 0, counts one)."""
        return [
            max(len(self.terms[p]), 1) if p in self.terms else 0 for p in range(self.partitions)
        ]

    def summary(self) -> dict[str, object]:
        changes = self.changes()
        return {
            "led_s": self.led_s,
            "balanced_s": self.balanced_s,
            "watched_s": round(self.watched_s, 1),
            "led_at_end": self.led_at_end,
            "preferred_at_end": self.preferred_at_end,
            "leaders_at_end": self.leaders_at_end,
            "leader_changes_max": max(changes, default=0),
            "leader_changes_total": sum(changes),
            "partitions_changed_twice_or_more": sum(1 for c in changes if c >= 2),
            "max_term": self.max_term,
            "polls": self.polls,
            "unanswered": self.unanswered,
        }


def balanced(leaders: dict[int, int], brokers: int, tolerance: float) -> bool:
    """Whether every broker leads a share within ``tolerance`` (relative) of 1/brokers."""
    total = sum(leaders.values())
    if total == 0:
        return False
    fair = total / brokers
    return len(leaders) == brokers and all(
        abs(n - fair) <= tolerance * fair for n in leaders.values()
    )


class LeaderWatch:
    def __init__(self, addresses: dict[int, str], topic: str, partitions: int) -> None:
        """``addresses``: broker id to client address, every broker that may answer."""
        self.addresses = addresses
        self.topic = topic
        self.partitions = partitions
        self.client = LowLevelClient(list(addresses.values()))
        self.interval_s = 0.25 if partitions <= 1000 else 1.0
        """Polls of 10,000 partitions cost the brokers real work: fewer of them."""
        self.pool = ThreadPoolExecutor(max_workers=len(addresses))

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()

    def _metadata(self, address: str) -> pb.MetadataResponse | grpc.StatusCode:
        try:
            return self.client.stub(address).Metadata(
                pb.MetadataRequest(topics=[self.topic], routing_only=True),
                timeout=METADATA_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            return exc.code()

    def poll(
        self, brokers: list[int], last: dict[str, pb.MetadataResponse], phase: Phase
    ) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
        """(partition: (term, leader) as its leader reports it, partition: preferred).
        ``brokers`` are asked at once: a poll lasts as long as the slowest answer. One that
        is up but does not answer in time (busy) counts with its ``last`` answer of this
        wait, if any, so that one slow answer does not read as its leaders gone; one that
        is not listening (down, or not started yet) counts as leading nothing."""
        led: dict[int, tuple[int, int]] = {}
        preferred: dict[int, int] = {}
        addresses = [self.addresses[b] for b in brokers]
        answers = self.pool.map(self._metadata, addresses)
        for address, answer in zip(addresses, answers, strict=True):
            if isinstance(answer, pb.MetadataResponse):
                last[address] = answer
            elif answer == grpc.StatusCode.DEADLINE_EXCEEDED:
                phase.unanswered += 1
            else:
                last.pop(address, None)
            md = last.get(address)
            if md is None:
                continue
            for t in md.topics:
                if t.name != self.topic:
                    continue
                for p in t.partitions:
                    if p.replicas:
                        preferred.setdefault(p.partition, p.replicas[0])
                    if p.leader_id and p.leader_id == md.broker_id:
                        seen = led.get(p.partition)
                        if seen is None or p.leader_term > seen[0]:
                            led[p.partition] = (p.leader_term, p.leader_id)
        return led, preferred

    def wait(
        self,
        deadline_s: float,
        *,
        among: set[int] | None = None,
        balance: tuple[int, float] | None = None,
        linger_s: float = 0.0,
    ) -> Phase:
        """Poll until every partition is led (by one of ``among`` if given: only those are
        asked), and with
        ``balance`` = (brokers, tolerance) until the leaders are balanced too; then go on
        watching for ``linger_s`` more (late leader changes count). Returns at ``deadline_s``
        from now at the latest, whatever was reached."""
        phase = Phase(self.partitions)
        last: dict[str, pb.MetadataResponse] = {}
        asked = sorted(self.addresses if among is None else among)
        start = time.monotonic()
        next_say = start + PROGRESS_S
        stop_at = start + deadline_s
        while True:
            now = time.monotonic()
            led, preferred = self.poll(asked, last, phase)
            phase.polls += 1
            elapsed = time.monotonic() - start
            counted = {p: tl for p, tl in led.items() if among is None or tl[1] in among}
            for p, (term, _) in counted.items():
                terms = phase.terms.setdefault(p, set())
                if term > 0:  # a leader that does not know its term yet says 0
                    terms.add(term)
                phase.max_term = max(phase.max_term, term)
            leaders = Counter(leader for _, leader in counted.values())
            all_led = len(counted) == self.partitions
            if all_led and phase.led_s is None:
                phase.led_s = round(elapsed, 1)
            if (
                all_led
                and balance is not None
                and phase.balanced_s is None
                and balanced(dict(leaders), *balance)
            ):
                phase.balanced_s = round(elapsed, 1)
            if now >= next_say:
                next_say = now + PROGRESS_S
                say(
                    f"{len(counted)} of {self.partitions} led {elapsed:.0f} s in, by "
                    f"{dict(sorted(leaders.items()))}; {phase.unanswered} unanswered"
                )
            phase.led_at_end = len(counted)
            phase.leaders_at_end = dict(sorted(leaders.items()))
            phase.preferred_at_end = sum(
                1 for p, (_, leader) in counted.items() if preferred.get(p) == leader
            )
            settled_s = phase.led_s
            if balance is not None and settled_s is not None:
                settled_s = phase.balanced_s
            if settled_s is not None and elapsed >= settled_s + linger_s:
                break
            if now >= stop_at:
                break
            time.sleep(max(0.0, self.interval_s - (time.monotonic() - now)))
        phase.watched_s = time.monotonic() - start
        return phase
