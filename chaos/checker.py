"""Checks a chaos run's history against raftmq's promises.

The checker reads only the history (see ``chaos/history.py``), never the cluster, so a run
can be re-checked later from its ``history.jsonl`` and the checker itself can be tested on
handcrafted histories. It is a pure function: ``check(ops)`` returns a ``CheckResult``.

Promises checked (one report per check, each with counts and up to ``MAX_EXAMPLES``
self-explaining examples):

1. ``lost``: an acknowledged record (``send`` status ``ok``) is in the final reads of some
   replica of its partition, at its acknowledged offset, with its value, unless retention
   deleted it (its offset is below every healthy replica's log start). Lost means no
   replica holds it.
2. ``replicas``: every replica holds every acknowledged record of its partition from its
   log start, and the replicas' digests agree. A record some replicas lack while another
   holds it is ``under-replicated``: a violation only when the replica had not caught up
   within ``recovery_limit_s`` of healing; a replica whose final high watermark passed a
   record it does not hold is ``missing-below-hw``.
3. ``one-value-per-offset``: acks, live reads and final reads never disagree about the
   value at a (partition, offset).
4. ``duplicates``: no value appears at two offsets (a violation only with idempotence).
5. ``phantoms``: nothing read was never sent, was definitely refused, sat at or above the
   high watermark of its own fetch answer, or was read live and then vanished (dirty read;
   not if retention has deleted it everywhere since).
6. ``order``: a producer's acks to a partition have increasing offsets in send order; a
   reader's successive offsets on a partition increase by exactly one, except across its
   own ``reset`` to the log start.
7. ``consumer-groups``: what the real clients' consumers saw (``consume``, ``commit``,
   ``committed`` ops, chaos/client_workload.py): a consumer with a fixed assignment
   advances one offset at a time; a group's committed offset never goes back, and the
   finding names the side (``commit-went-back-client``: a member committed older
   progress after newer was acknowledged; ``commit-went-back-coordinator``: the
   coordinator's FetchOffsets answer was older than an acknowledged commit), never
   passes the log end, and no acknowledged record below it went unconsumed (unless
   retention deleted it on a healthy replica first). Consumed records are also held to
   checks 3, 4 and 5 (redelivery at the same offset is not a duplicate).
8. ``recovery``: after healing, the cluster recovered, within ``recovery_limit_s``.
9. ``leaderless``, 10. ``health``: see their functions (``health`` also holds every
   replica the metadata assigns to being reported by its broker, and not still opening).
11. ``replication``: in runs that killed a broker for good, every partition was back at
    its replication factor of in-sync voters on live brokers within ``heal_limit_s`` of
    the end of the fault window.
12. With the transactional workload's ops (``--transactions``): the eight checks of
    ``chaos/txn_checker.py`` (aborted and uncommitted reads, torn transactions, lost
    committed writes, exactly-once output, offsets, positions, polls).

Indeterminate sends (status ``info``) never cause a violation by themselves (they may or
may not have been written), but once one is read it is held to checks 3, 4 and 5 like any
other record.

Retention: ``range`` ops give each replica's log start at the final read. Records below a
replica's start are not expected on it; a record below every healthy replica's start was
deleted, not lost (a replica that did not answer, or reports itself failed or opening, has
no start that counts). A history without ``range`` ops has every start at 0, i.e. no
exemption at all.

Examples name each replica involved and its state as its broker reported it (ok,
catching_up, failed, opening, with the reason; unreported when its broker listed none).

Histories can hold about a million operations, so every check is one or two passes over
dicts and sets built once in ``_History`` (sorting only per producer/reader, O(n log n)),
and examples are gathered lazily: extra passes happen only when a violation was found.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from chaos import history
from chaos.history import FEATURE_KINDS, SHARE_KINDS, TXN_KINDS, Op

OK = "ok"
VIOLATED = "violated"
NOT_APPLICABLE = "not-applicable"

MAX_EXAMPLES = 10
"""Examples kept per check: enough to debug, small enough to print and to store."""

MAX_SOURCES = 6
"""Who-saw-it entries kept per value in an example; the total is always given."""

KNOWN_KINDS = frozenset(
    {
        "send",
        "read",
        "final",
        "digest",
        "recovery",
        "fault",
        "range",
        "reset",
        "replication",
        "consume",
        "commit",
        "committed",
        "consumer-error",
        "leader",
        "status",
        "assignment",
        "metrics",
    }
)


# --------------------------------------------------------------------------- results


@dataclass
class CheckReport:
    """The outcome of one check: status, counts (checked and violating) and examples."""

    name: str
    description: str
    status: str
    counts: dict[str, float] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        """Not-applicable counts as ok: only a violation makes a run invalid."""
        return self.status != VIOLATED

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "status": self.status,
            "counts": dict(self.counts),
            "examples": list(self.examples),
            "note": self.note,
        }


@dataclass
class CheckResult:
    """Every check's report plus summary counts; ``valid`` iff no check is violated."""

    valid: bool
    checks: list[CheckReport]
    summary: dict[str, Any]

    def get(self, name: str) -> CheckReport:
        """The report of the check called ``name`` (KeyError if there is none)."""
        for report in self.checks:
            if report.name == name:
                return report
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "summary": dict(self.summary),
            "checks": [c.to_dict() for c in self.checks],
        }


@dataclass(frozen=True)
class CheckOptions:
    """What a check may depend on besides the history."""

    idempotent: bool = False
    recovery_limit_s: float = 30.0
    heal_limit_s: float = 60.0


class _Findings:
    """Counts violations by kind and keeps a few examples of each kind.

    Examples are kept per kind and interleaved when reported, so a rare kind of violation
    is not crowded out of the examples by a frequent one.
    """

    def __init__(self, *kinds: str) -> None:
        self.counts: dict[str, int] = dict.fromkeys(kinds, 0)
        self._examples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(
        self, kind: str, example: dict[str, Any] | Callable[[], dict[str, Any]] | None = None
    ) -> None:
        """Count one violation of ``kind``; keep its example while fewer than the cap are kept.

        ``example`` may be a function, called only when the example is kept, so a history
        with a million violations does not build a million explanations.
        """
        self.counts[kind] = self.counts.get(kind, 0) + 1
        kept = self._examples[kind]
        if example is not None and len(kept) < MAX_EXAMPLES:
            kept.append({"kind": kind, **(example() if callable(example) else example)})

    def total(self) -> int:
        return sum(self.counts.values())

    def examples(self) -> list[dict[str, Any]]:
        lists = [v for v in self._examples.values() if v]
        out: list[dict[str, Any]] = []
        i = 0
        while len(out) < MAX_EXAMPLES and any(i < len(v) for v in lists):
            out.extend(v[i] for v in lists if i < len(v))
            i += 1
        return out[:MAX_EXAMPLES]

    def report(
        self,
        name: str,
        description: str,
        checked: dict[str, float],
        *,
        applicable: bool = True,
        violation_kinds: Iterable[str] | None = None,
        note: str = "",
    ) -> CheckReport:
        """Build the report; only ``violation_kinds`` (default: all) make it violated."""
        kinds = self.counts.keys() if violation_kinds is None else violation_kinds
        violated = any(self.counts.get(k, 0) for k in kinds)
        if violated:
            status = VIOLATED
        elif not applicable:
            status = NOT_APPLICABLE
        else:
            status = OK
        return CheckReport(
            name=name,
            description=description,
            status=status,
            counts={**checked, **self.counts},
            examples=self.examples(),
            note=note,
        )


# --------------------------------------------------------------------------- index

STATE_WORDS = {
    "REPLICA_OK": "ok",
    "REPLICA_CATCHING_UP": "catching_up",
    "REPLICA_FAILED": "failed",
    "REPLICA_OPENING": "opening",
    "REPLICA_STATE_UNSPECIFIED": "unspecified",
}
"""How examples name the states of broker.proto's ReplicaState."""

UNSOUND_STATES = frozenset({"REPLICA_FAILED", "REPLICA_OPENING"})
"""States in which a replica serves nothing: its log start does not count for retention."""


def _who(op: Op) -> str:
    """A short, human description of who saw a value (for examples)."""
    if op.kind == "send":
        return f"producer {op.process} (ack)"
    if op.kind == "final":
        return f"replica {op.replica} (final, reader {op.process})"
    if op.kind == "consume":
        return f"consumer {op.process}"
    return f"reader {op.process}"


_STATUS_RANK = {"ok": 2, "info": 1, "fail": 0}


class _History:
    """The history split by kind and indexed once, so that every check is a cheap pass.

    Values are unique per send, but should a history hold several send ops of one value
    (a retried write logged twice), the value's status is the most hopeful of them: a value
    counts as definitely failed only if every attempt definitely failed.
    """

    def __init__(self, ops: Iterable[Op]) -> None:
        self.sends: list[Op] = []
        self.acks: list[Op] = []  # ok sends with an offset
        self.reads: list[Op] = []
        self.consumes: list[Op] = []  # records the real clients' consumers polled
        self.commits: list[Op] = []
        self.committed: list[Op] = []  # the group's committed offsets read after the run
        self.consumer_errors: list[Op] = []
        self.txn_ops: list[Op] = []  # the transactional workload's (chaos/txn_checker.py)
        self.feature_ops: list[Op] = []  # the message features' (chaos/feature_checker.py)
        self.share_ops: list[Op] = []  # the share group workload's (chaos/share_checker.py)
        self.finals: list[Op] = []
        self.digests: list[Op] = []
        self.recoveries: list[Op] = []
        self.replications: list[Op] = []
        self.faults: list[Op] = []
        self.leaders: dict[int, list[Op]] = defaultdict(list)  # partition -> monitor's ops
        self.statuses: list[Op] = []
        # (partition, replica) -> (state, reason) as the replica's own broker reported it.
        self.replica_state: dict[tuple[int, int], tuple[str, str | None]] = {}
        # broker -> its grpc health answer after healing.
        self.broker_health: dict[int, str] = {}
        # broker -> what else the status sweep noted (its Metadata call got no answer).
        self.broker_note: dict[int, str] = {}
        # partition -> the assignment ops (what each broker's metadata said hosts it).
        self.assignments: dict[int, list[Op]] = defaultdict(list)
        # (partition, replica) -> when its final read ended (range op), for the heal bound.
        self.read_at: dict[tuple[int, int], float] = {}
        # (partition, replica) whose final read got no answer at all (range status fail).
        self.unanswered: set[tuple[int, int]] = set()
        self.range_hw: dict[tuple[int, int], int] = {}
        # (partition, replica) -> why its final read stopped short (range ops' error).
        self.range_error: dict[tuple[int, int], str] = {}
        self.last_time = 0.0
        self.other: dict[str, int] = defaultdict(int)
        self.malformed: list[Op] = []
        self.send_status: dict[str, str] = {}
        # (partition, replica) -> offset -> value: one replica's final log.
        self.replica_logs: dict[tuple[int, int], dict[int, str]] = defaultdict(dict)
        # Rare second values of one replica at one offset: (partition, replica, offset, value).
        self.replica_extra: set[tuple[int, int, int, str]] = set()
        self.replica_hw: dict[tuple[int, int], int] = {}
        self.replicas: dict[int, set[int]] = defaultdict(set)
        # (partition, replica) -> that replica's log start at its final read (range ops).
        self.replica_start: dict[tuple[int, int], int] = {}
        # (reader, partition) -> {offset it jumped from: offset it jumped to} (reset ops).
        self.resets: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
        self.reset_count = 0
        # The brokers' scraped gauges (chaos.metrics_watch), in the order recorded.
        self.metrics: list[Op] = []

        for op in ops:
            kind = op.kind
            self.last_time = max(self.last_time, op.end)
            if kind == "send":
                self._add_send(op)
            elif kind in ("read", "final", "consume"):
                if op.offset is None or op.value is None:
                    self.malformed.append(op)
                elif kind == "read":
                    self.reads.append(op)
                elif kind == "consume":
                    self.consumes.append(op)
                else:
                    self._add_final(op)
            elif kind in ("commit", "committed"):
                if op.offset is None and op.status == "ok":
                    self.malformed.append(op)
                else:
                    (self.commits if kind == "commit" else self.committed).append(op)
            elif kind == "consumer-error":
                self.consumer_errors.append(op)
            elif kind == "digest":
                self.digests.append(op)
                if op.replica is not None:
                    self.replicas[op.partition].add(op.replica)
            elif kind == "range":
                self._add_range(op)
            elif kind == "reset":
                self._add_reset(op)
            elif kind == "recovery":
                self.recoveries.append(op)
            elif kind == "replication":
                self.replications.append(op)
            elif kind == "fault":
                self.faults.append(op)
            elif kind == "leader":
                self.leaders[op.partition].append(op)
            elif kind == "status":
                self._add_status(op)
            elif kind == "assignment":
                self.assignments[op.partition].append(op)
            elif kind == "metrics":
                self.metrics.append(op)
            elif kind in TXN_KINDS:
                self.txn_ops.append(op)
            elif kind in FEATURE_KINDS:
                self.feature_ops.append(op)
            elif kind in SHARE_KINDS:
                self.share_ops.append(op)
            else:
                self.other[kind] += 1

        self.healed_at: float | None = min((op.start for op in self.recoveries), default=None)
        # Retention floor per partition: the smallest log start among its healthy replicas
        # (a replica without a range op starts at 0); below it no replica holds anything
        # any more. A replica that did not answer its final read, or that says it is failed
        # or still opening, reports no log start: counting it at 0 would turn every record
        # retention deleted on the healthy ones into a "lost" one.
        # The largest log start among them bounds what a consumer could still read.
        self.floor: dict[int, int] = {}
        self.retained_from: dict[int, int] = {}
        for p in {p for p, _ in self.replica_start}:
            starts = [self.replica_start.get((p, r), 0) for r in self.healthy_replicas(p)]
            self.floor[p] = min(starts, default=0)
            self.retained_from[p] = max(starts, default=0)

    def healthy_replicas(self, partition: int) -> list[int]:
        """The replicas of ``partition`` whose log start counts: they answered their final
        read and do not say they are failed or still opening. All of them when none is."""
        every = sorted(self.replicas.get(partition, ()))
        healthy = [
            r
            for r in every
            if (partition, r) not in self.unanswered
            and self.replica_state.get((partition, r), ("", None))[0] not in UNSOUND_STATES
        ]
        return healthy or every

    def state_of(self, partition: int, replica: int) -> str:
        """The replica's state in a few words, for examples: ok, catching_up, failed or
        opening (with the reason its broker gave), unreported, or unknown (no status ops)."""
        found = self.replica_state.get((partition, replica))
        if found is None:
            if not self.statuses:
                return "unknown (no status reports)"
            health = self.broker_health.get(replica)
            if health is not None and health != "SERVING":
                return f"unreported (broker {replica} answers health {health})"
            if replica in self.broker_note:
                return f"unreported (broker {replica} serves, but {self.broker_note[replica]})"
            return "unreported (its broker does not list it)"
        state, reason = found
        words = STATE_WORDS.get(state, state)
        return f"{words}: {reason}" if reason else words

    def _add_status(self, op: Op) -> None:
        self.statuses.append(op)
        if op.replica is None:
            self.malformed.append(op)
        elif op.partition < 0:
            self.broker_health[op.replica] = op.value or ""
            if op.error:
                self.broker_note[op.replica] = op.error
        else:
            self.replica_state[(op.partition, op.replica)] = (op.value or "", op.error)

    def assigned(self, partition: int) -> tuple[set[int], Op | None]:
        """The replicas the metadata assigns to ``partition`` after healing, and the op that
        said so: the answer of the broker that leads it (the freshest view), else the
        assignment most brokers gave. (Empty when no assignment op was recorded.)"""
        ops = self.assignments.get(partition, [])
        if not ops:
            return set(), None
        leading = [op for op in ops if op.offset is not None and op.offset == op.replica]
        if leading:
            chosen = leading[-1]
        else:
            votes: dict[str, list[Op]] = defaultdict(list)
            for op in ops:
                votes[op.value or ""].append(op)
            chosen = max(votes.values(), key=len)[-1]
        return {int(r) for r in (chosen.value or "").split(",") if r.strip()}, chosen

    def _add_send(self, op: Op) -> None:
        self.sends.append(op)
        if op.value is None:
            self.malformed.append(op)
            return
        previous = self.send_status.get(op.value)
        if previous is None or _STATUS_RANK.get(op.status, 1) > _STATUS_RANK.get(previous, 1):
            self.send_status[op.value] = op.status
        if op.status == "ok":
            if op.offset is None:
                self.malformed.append(op)
            else:
                self.acks.append(op)

    def _add_final(self, op: Op) -> None:
        assert op.offset is not None and op.value is not None
        self.finals.append(op)
        replica = -1 if op.replica is None else op.replica
        key = (op.partition, replica)
        self.replicas[op.partition].add(replica)
        log = self.replica_logs[key]
        held = log.setdefault(op.offset, op.value)
        if held != op.value:
            self.replica_extra.add((op.partition, replica, op.offset, op.value))
        if op.hw is not None:
            self.replica_hw[key] = max(op.hw, self.replica_hw.get(key, op.hw))

    def _add_range(self, op: Op) -> None:
        if op.offset is None or op.replica is None:
            self.malformed.append(op)
            return
        key = (op.partition, op.replica)
        self.replicas[op.partition].add(op.replica)
        self.read_at[key] = max(op.end, self.read_at.get(key, op.end))
        if op.status == "fail":
            self.unanswered.add(key)
        # Several reads of one replica: the lowest start is what it was shown to hold.
        self.replica_start[key] = min(op.offset, self.replica_start.get(key, op.offset))
        if op.hw is not None:
            self.range_hw[key] = max(op.hw, self.range_hw.get(key, op.hw))
        if op.error:
            self.range_error[key] = op.error

    def _add_reset(self, op: Op) -> None:
        try:
            to = int(op.value or "")
        except ValueError:
            to = None
        if op.offset is None or to is None:
            self.malformed.append(op)
            return
        self.reset_count += 1
        self.resets[(op.process, op.partition)][op.offset] = to

    def deleted(self, partition: int, offset: int) -> bool:
        """Whether retention deleted ``offset`` on every healthy replica (False without
        range ops)."""
        return offset < self.floor.get(partition, 0)

    def unreadable(self, partition: int, offset: int) -> bool:
        """Whether retention deleted ``offset`` on some healthy replica, so a consumer may
        have found it gone (and reset to the log start) before it got there."""
        return offset < self.retained_from.get(partition, 0)

    def replica_start_of(self, partition: int, replica: int) -> int:
        return self.replica_start.get((partition, replica), 0)

    def reset_path(self, process: str, partition: int, frm: int, to: int) -> bool:
        """Whether the reader's resets lead from offset ``frm`` exactly to ``to`` (a chain
        when the start moved again before the reader could read)."""
        jumps = self.resets.get((process, partition))
        if not jumps:
            return False
        at, seen = frm, 0
        while at in jumps and seen <= len(jumps):
            nxt = jumps[at]
            if nxt <= at:
                return False
            at, seen = nxt, seen + 1
            if at == to:
                return True
        return False

    def replica_holds(self, partition: int, replica: int, offset: int, value: str) -> bool:
        """Whether ``replica``'s final reads hold ``value`` at ``offset``."""
        log = self.replica_logs.get((partition, replica))
        if log is not None and log.get(offset) == value:
            return True
        return (partition, replica, offset, value) in self.replica_extra

    def finals_hold(self, partition: int, offset: int, value: str) -> bool:
        """Whether any replica's final reads hold ``value`` at ``offset``."""
        return any(
            self.replica_holds(partition, r, offset, value)
            for r in self.replicas.get(partition, ())
        )

    def finals_at(self, partition: int, offset: int) -> dict[str, Any]:
        """What each replica's final reads hold at ``offset``, and its state (for examples)."""
        out: dict[str, Any] = {}
        for r in sorted(self.replicas.get(partition, ())):
            log = self.replica_logs.get((partition, r), {})
            out[str(r)] = {"value": log.get(offset), "hw": self.replica_hw.get((partition, r))}
            if self.statuses:
                out[str(r)]["state"] = self.state_of(partition, r)
        return out

    def final_hw(self, partition: int, replica: int) -> int | None:
        """How far the replica's final read reached: its range op's hw, else its finals'."""
        key = (partition, replica)
        return self.range_hw.get(key, self.replica_hw.get(key))

    def final_positions(self, values: set[str]) -> dict[str, list[dict[str, int | None]]]:
        """Where the finals hold each of ``values``: an extra pass, used for examples only."""
        found: dict[str, list[dict[str, int | None]]] = defaultdict(list)
        if not values:
            return found
        for op in self.finals:
            if op.value in values:
                found[op.value].append({"offset": op.offset, "replica": op.replica})
        return found


# --------------------------------------------------------------------------- checks

CheckFn = Callable[[_History, CheckOptions], CheckReport]


def check_lost(h: _History, opts: CheckOptions) -> CheckReport:
    """1. Every acknowledged record survives, at its acknowledged offset, on some replica.

    Lost means no replica's final read holds it: "some replica" rather than "the leader"
    because a record on one replica can still be restored to the others (check 2 says
    whether that happened in time). Records below every healthy replica's log start were
    deleted by retention, not lost; a replica that did not answer, or says it is failed
    or opening, has no log start to count (see ``_History.floor``).
    """
    f = _Findings("lost", "acked-without-offset")
    lost: list[Op] = []
    deleted = 0
    for op in h.acks:
        if h.finals_hold(op.partition, _off(op), _val(op)):
            continue
        if h.deleted(op.partition, _off(op)):
            deleted += 1
        else:
            lost.append(op)
    positions = h.final_positions({_val(op) for op in lost[:MAX_EXAMPLES]})

    def example(op: Op) -> dict[str, Any]:
        elsewhere = positions.get(_val(op), [])[:MAX_SOURCES]
        where = (
            f"the finals hold it elsewhere: {elsewhere}"
            if elsewhere
            else "no final read holds it anywhere"
        )
        states = "; ".join(
            f"replica {r} {h.state_of(op.partition, r)}"
            for r in sorted(h.replicas.get(op.partition, ()))
        )
        return {
            "partition": op.partition,
            "offset": op.offset,
            "value": op.value,
            "process": op.process,
            "status": op.status,
            "finals_at_offset": h.finals_at(op.partition, _off(op)),
            "found_elsewhere": elsewhere,
            "explanation": (
                f"{op.value!r} was acknowledged to producer {op.process} at partition "
                f"{op.partition} offset {op.offset}, but no replica's final read holds it "
                f"there; {where}" + (f" (replicas: {states})" if h.statuses and states else "")
            ),
        }

    for op in lost:
        f.add("lost", functools.partial(example, op))
    for op in h.malformed:
        if op.kind == "send" and op.status == "ok" and op.value is not None:
            f.add(
                "acked-without-offset",
                {
                    "partition": op.partition,
                    "value": op.value,
                    "process": op.process,
                    "status": op.status,
                    "explanation": (
                        f"{op.value!r} was acknowledged to producer {op.process} without an "
                        "offset, so it cannot be looked up: the history is malformed"
                    ),
                },
            )
    checked: dict[str, float] = {"acked": len(h.acks)}
    if h.replica_start:
        checked["deleted-by-retention"] = deleted
    return f.report(
        "lost",
        "every acknowledged send is held by some replica at its acknowledged offset"
        + (" (or below every healthy replica's log start)" if h.replica_start else ""),
        checked,
        applicable=bool(h.acks),
    )


@dataclass
class _Short:
    """One replica's shortfall: the acknowledged records other replicas hold and it lacks."""

    partition: int
    replica: int
    offsets: list[int] = field(default_factory=list)
    first: Op | None = None


def check_replicas(h: _History, opts: CheckOptions) -> CheckReport:
    """2. Every replica holds every acknowledged record from its log start, and the
    replicas' digests of the common range agree.

    A record missing on some replicas but held by others is under-replicated: nothing is
    lost while one copy remains, and a replica behind (catching up, repairing, or unable
    to open) is expected right after faults. It is a violation (``under-replicated``)
    only when the replica had not caught up by the recovery bound: its final read ended
    ``recovery_limit_s`` or more after healing (the run waits that long for it) and its
    high watermark still stopped short of the record (or it did not answer at all).
    Read earlier and short, it is counted (``under-replicated-healing``), not blamed.

    A replica whose final high watermark passed a record but does not hold it says it has
    what it does not: ``missing-below-hw``, a violation whenever it is seen. A replica
    known only from its digest (no final reads) holds nothing. Records no replica holds
    are check 1's (lost), not counted here again.
    """
    f = _Findings(
        "under-replicated",
        "missing-below-hw",
        "partition-without-replicas",
        "digest-mismatch",
        "under-replicated-healing",
    )
    pairs = 0
    below_start = 0
    bare_partitions: set[int] = set()
    short: dict[tuple[int, int], _Short] = {}
    ordered = {p: tuple(sorted(rs)) for p, rs in h.replicas.items()}
    for op in h.acks:
        p, o, v = op.partition, _off(op), _val(op)
        replicas = ordered.get(p)
        if not replicas:
            if p not in bare_partitions:
                bare_partitions.add(p)
                f.add(
                    "partition-without-replicas",
                    {
                        "partition": p,
                        "explanation": (
                            f"partition {p} has acknowledged records (e.g. {v!r} at offset {o})"
                            " but no replica reported final reads or a digest"
                        ),
                    },
                )
            continue
        held_somewhere: bool | None = None
        for r in replicas:
            if o < h.replica_start_of(p, r):
                below_start += 1  # deleted there by retention or skipped by a snapshot
                continue
            pairs += 1
            hw = h.final_hw(p, r)
            if (hw is None or o < hw) and h.replica_holds(p, r, o, v):
                continue
            if held_somewhere is None:
                held_somewhere = h.finals_hold(p, o, v)
            if not held_somewhere:
                continue  # lost: check 1 reports it
            behind = (
                hw is None
                or o >= hw
                or (p, r) in h.unanswered
                or (p, r) in h.range_error
                or (p, r) not in h.replica_logs
            )
            if not behind:
                f.add("missing-below-hw", functools.partial(_missing_example, h, op, r, hw))
                continue
            gap = short.setdefault((p, r), _Short(p, r))
            gap.offsets.append(o)
            gap.first = gap.first or op

    under = 0
    for (p, r), gap in sorted(short.items()):
        under += len(gap.offsets)
        read_at = h.read_at.get((p, r), max((op.end for op in h.finals), default=0.0))
        waited = None if h.healed_at is None else read_at - h.healed_at
        healing = waited is not None and waited < opts.recovery_limit_s
        kind = "under-replicated-healing" if healing else "under-replicated"
        f.add(kind, functools.partial(_short_example, h, gap, waited, opts.recovery_limit_s))
        f.counts[kind] += len(gap.offsets) - 1  # counts are records; examples per replica

    groups: dict[tuple[int, int | None], dict[str | None, list[int | None]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for op in h.digests:
        groups[(op.partition, op.offset)][op.value].append(op.replica)
    for (p, at), by_value in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if len(by_value) > 1:
            f.add(
                "digest-mismatch",
                {
                    "partition": p,
                    "offset": at,
                    "values": {str(v): sorted(rs, key=str) for v, rs in by_value.items()},
                    "explanation": (
                        f"partition {p}: replicas disagree on the digest of offsets below {at}: "
                        + "; ".join(
                            f"replicas {sorted(rs, key=str)} have {str(v)[:16]}…"
                            for v, rs in by_value.items()
                        )
                    ),
                },
            )
    checked: dict[str, float] = {
        "replica_record_pairs": pairs,
        "digest_groups": len(groups),
        "under-replicated-replicas": len(short),
    }
    if h.replica_start:
        checked["below-replica-start"] = below_start
    return f.report(
        "replicas",
        "every replica holds every acknowledged record"
        + (" from its log start" if h.replica_start else "")
        + f" within {opts.recovery_limit_s:g} s of healing; digests agree",
        checked,
        applicable=bool(h.acks) or bool(h.digests),
        violation_kinds=[
            "under-replicated",
            "missing-below-hw",
            "partition-without-replicas",
            "digest-mismatch",
        ],
    )


def _short_example(
    h: _History, gap: _Short, waited: float | None, limit_s: float
) -> dict[str, Any]:
    """One replica's under-replication, in a sentence: which replica, in what state, how
    many records it lacks that others hold, and how long after healing it was read."""
    p, r = gap.partition, gap.replica
    first = gap.first
    assert first is not None
    holders = [
        x
        for x in sorted(h.replicas.get(p, ()))
        if x != r and h.replica_holds(p, x, _off(first), _val(first))
    ]
    hw = h.final_hw(p, r)
    if (p, r) in h.unanswered:
        reach = "it did not answer its final read"
    elif (p, r) in h.range_error:
        reach = f"its final read was refused: {h.range_error[(p, r)]}"
    elif (p, r) not in h.replica_logs:
        reach = "it reported no final reads (only a digest)"
    else:
        reach = f"its final high watermark is {hw}"
    when = (
        "no recovery op says when healing ended"
        if waited is None
        else f"read {waited:.1f} s after healing"
        + (
            f", within the recovery limit of {limit_s:g} s: it may still catch up"
            if waited < limit_s
            else f", past the recovery limit of {limit_s:g} s"
        )
    )
    state = h.state_of(p, r)
    return {
        "partition": p,
        "replica": r,
        "state": state,
        "records": len(gap.offsets),
        "first_offset": min(gap.offsets),
        "last_offset": max(gap.offsets),
        "replica_hw": hw,
        "held_by": holders,
        "waited_s": None if waited is None else round(waited, 3),
        "offset": first.offset,
        "value": first.value,
        "explanation": (
            f"replica {r} of partition {p} (state {state}) lacks {len(gap.offsets)} "
            f"acknowledged record(s), offsets {min(gap.offsets)}-{max(gap.offsets)}, that "
            f"replica(s) {holders} hold: under-replicated, not lost; {reach}; {when}"
        ),
    }


def _missing_example(h: _History, op: Op, r: int, hw: int | None) -> dict[str, Any]:
    held = h.replica_logs.get((op.partition, r), {}).get(_off(op))
    why = (
        "its final reads have nothing at that offset"
        if held is None
        else f"it holds {held!r} there instead"
    )
    return {
        "partition": op.partition,
        "offset": op.offset,
        "value": op.value,
        "process": op.process,
        "status": op.status,
        "replica": r,
        "state": h.state_of(op.partition, r),
        "replica_hw": hw,
        "replica_value": held,
        "explanation": (
            f"{op.value!r} (acknowledged to {op.process} at partition {op.partition} offset "
            f"{op.offset}) is missing on replica {r} (state {h.state_of(op.partition, r)}) "
            f"although its final hw {hw} is past it: {why}"
        ),
    }


def _value_sources(
    ops: Iterable[Op], wanted: set[tuple[int, int]]
) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    """For each wanted (partition, offset): every value seen there, who saw it, how often.

    An extra pass over the ops, done only for the few positions shown as examples.
    """
    out: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    if not wanted:
        return out
    for op in ops:
        key = (op.partition, op.offset)
        if key in wanted:
            entry = out[(op.partition, _off(op))].setdefault(_val(op), {"count": 0, "seen_by": []})
            entry["count"] += 1
            who = _who(op)
            if len(entry["seen_by"]) < MAX_SOURCES and who not in entry["seen_by"]:
                entry["seen_by"].append(who)
    return out


def check_one_value(h: _History, opts: CheckOptions) -> CheckReport:
    """3. One value per (partition, offset) across acks, live reads and final reads.

    Two values at one offset means two different logs were committed (or shown) at the
    same point: the heart of a split brain. One pass keeps the first value per position;
    only conflicting positions are revisited for the example's who-saw-what.
    """
    f = _Findings("conflict")
    # Offsets and values are never None here (_History set malformed ops apart); the hot
    # loops read the attributes directly rather than through _off/_val.
    claims: dict[tuple[int, int | None], str | None] = {}
    conflicts: set[tuple[int, int]] = set()
    for ops in (h.acks, h.reads, h.consumes, h.finals):
        for op in ops:
            key = (op.partition, op.offset)
            if claims.setdefault(key, op.value) != op.value:
                conflicts.add((op.partition, _off(op)))
    shown = set(sorted(conflicts)[:MAX_EXAMPLES])
    sources = _value_sources(
        (op for ops in (h.acks, h.reads, h.consumes, h.finals) for op in ops), shown
    )
    for key in sorted(conflicts):

        def example(key: tuple[int, int] = key) -> dict[str, Any]:
            values = sources.get(key, {})
            for v, entry in values.items():
                entry["send_status"] = h.send_status.get(v, "never sent")
            return {
                "partition": key[0],
                "offset": key[1],
                "values": values,
                "explanation": (
                    f"partition {key[0]} offset {key[1]} holds {len(values)} values: "
                    + "; ".join(f"{v!r} seen by {e['seen_by']}" for v, e in values.items())
                ),
            }

        f.add("conflict", example)
    return f.report(
        "one-value-per-offset",
        "acks, reads and finals agree on the single value at each (partition, offset)",
        {"positions": len(claims)},
        applicable=bool(claims),
    )


def check_duplicates(h: _History, opts: CheckOptions) -> CheckReport:
    """4. A value read at more than one offset was written twice.

    Without idempotence a producer retry may legitimately write a record twice, so the
    duplicates are only counted and shown; with idempotence they are a violation.
    """
    f = _Findings("duplicate")
    first: dict[str | None, tuple[int, int | None]] = {}
    dups: dict[str, set[tuple[int, int | None]]] = {}
    for ops in (h.reads, h.consumes, h.finals):
        for op in ops:
            pos = (op.partition, op.offset)
            seen = first.setdefault(op.value, pos)
            if seen != pos:
                dups.setdefault(_val(op), {seen}).add(pos)
    shown = sorted(dups)[:MAX_EXAMPLES]
    wanted = {(p, o) for v in shown for p, o in dups[v] if o is not None}
    sources: dict[Any, dict[str, dict[str, Any]]] = _value_sources(
        (op for ops in (h.reads, h.consumes, h.finals) for op in ops), wanted
    )
    acked = {_val(op): op for op in h.acks if op.value in dups}
    for v in sorted(dups):

        def example(v: str = v) -> dict[str, Any]:
            positions = sorted(dups[v])
            ack = acked.get(v)
            return {
                "partition": positions[0][0],
                "value": v,
                "offsets": [o for _, o in positions],
                "positions": [
                    {"partition": p, "offset": o, "seen_by": sources[(p, o)][v]["seen_by"]}
                    for p, o in positions
                    if v in sources.get((p, o), {})
                ],
                "status": h.send_status.get(v, "never sent"),
                "acked_offset": None if ack is None else ack.offset,
                "process": None if ack is None else ack.process,
                "explanation": (
                    f"{v!r} (send status {h.send_status.get(v, 'never sent')}) appears at "
                    f"{len(positions)} positions (partition, offset): {positions}"
                ),
            }

        f.add("duplicate", example)
    extra = sum(len(p) - 1 for p in dups.values())
    return f.report(
        "duplicates",
        "no value is read at more than one offset"
        + (" (idempotent producers)" if opts.idempotent else " (counted; ok without idempotence)"),
        {"values_read": len(first), "extra_copies": extra},
        applicable=bool(first),
        violation_kinds=["duplicate"] if opts.idempotent else [],
        note="" if opts.idempotent or not dups else "duplicates are allowed without idempotence",
    )


def check_phantoms(h: _History, opts: CheckOptions) -> CheckReport:
    """5. Nothing is read that was not (or not yet durably) written.

    A value never sent is invented; a value whose send definitely failed was refused yet
    stored; a record at or above its own answer's hw was shown before it was committed; a
    record read live but absent from the finals was shown and then lost (dirty read).
    """
    f = _Findings("never-sent", "failed-send-read", "at-or-above-hw", "dirty-read")
    no_hw = 0

    def example(op: Op, why: str, **extra: Any) -> Callable[[], dict[str, Any]]:
        def build() -> dict[str, Any]:
            return {
                "partition": op.partition,
                "offset": op.offset,
                "value": op.value,
                "process": op.process,
                "replica": op.replica,
                "hw": op.hw,
                "read_kind": op.kind,
                "status": h.send_status.get(_val(op), "never sent"),
                **{k: (v() if callable(v) else v) for k, v in extra.items()},
                "explanation": f"{_who(op)} read {op.value!r} at partition {op.partition} "
                f"offset {op.offset}: {why}",
            }

        return build

    for ops in (h.reads, h.consumes, h.finals):
        for op in ops:
            status = h.send_status.get(op.value or "")
            if status is None:
                f.add("never-sent", example(op, "no producer ever sent this value"))
            elif status == "fail":
                f.add("failed-send-read", example(op, "its send definitely failed"))
            if op.hw is None:
                no_hw += 1
            elif (op.offset or 0) >= op.hw:
                f.add(
                    "at-or-above-hw",
                    example(
                        op,
                        f"the same answer's high watermark was {op.hw}, so it was "
                        "not committed yet",
                    ),
                )
            if (
                op.kind != "final"
                and not h.finals_hold(op.partition, _off(op), _val(op))
                and not h.deleted(op.partition, _off(op))
            ):
                f.add(
                    "dirty-read",
                    example(
                        op,
                        "no replica's final read holds it there: it was read, then lost",
                        finals_at_offset=lambda op=op: h.finals_at(op.partition, _off(op)),
                    ),
                )
    return f.report(
        "phantoms",
        "nothing read was never sent, definitely failed, uncommitted (>= hw) or later lost",
        {
            "reads": len(h.reads),
            "consumed": len(h.consumes),
            "finals": len(h.finals),
            "without_hw": no_hw,
        },
        applicable=bool(h.reads) or bool(h.consumes) or bool(h.finals),
    )


def check_order(h: _History, opts: CheckOptions) -> CheckReport:
    """6. Per partition, producers' acks and readers' offsets follow the order of the log.

    A producer sends to a partition one record at a time, so a later send acknowledged at
    an offset not above every earlier ack was reordered. A reader reads a partition in
    order and the log is contiguous, so each read must be exactly one past the previous
    one: a repeat or step back means it was shown another history, a gap means it missed
    a committed record. Ops are sorted by start time; Python's sort is stable, so records
    of one fetch (same start) keep their order in the history.
    """
    f = _Findings("producer-reorder", "reader-backwards", "reader-skip")
    producers: dict[tuple[str, int], list[Op]] = defaultdict(list)
    for op in h.acks:
        producers[(op.process, op.partition)].append(op)
    pairs = 0
    for ops in producers.values():
        ops.sort(key=_start)
        top = ops[0]
        for op in ops[1:]:
            pairs += 1
            if _off(op) > _off(top):
                top = op
                continue

            def example(op: Op = op, top: Op = top) -> dict[str, Any]:
                return {
                    "partition": op.partition,
                    "process": op.process,
                    "earlier": {"value": top.value, "offset": top.offset, "start": top.start},
                    "later": {"value": op.value, "offset": op.offset, "start": op.start},
                    "explanation": (
                        f"producer {op.process} sent {op.value!r} after {top.value!r} to "
                        f"partition {op.partition}, but it was acknowledged at offset "
                        f"{op.offset}, not above {top.offset}"
                    ),
                }

            f.add("producer-reorder", example)

    steps, uneven = _uneven_steps(h.reads)
    resets_crossed = 0
    for prev, op in uneven:
        if _off(op) > _off(prev) + 1 and h.reset_path(
            op.process, op.partition, _off(prev) + 1, _off(op)
        ):
            resets_crossed += 1
            continue
        kind = "reader-backwards" if _off(op) <= _off(prev) else "reader-skip"

        def rexample(op: Op = op, prev: Op = prev, kind: str = kind) -> dict[str, Any]:
            what = (
                "went back"
                if kind == "reader-backwards"
                else f"skipped {_off(op) - _off(prev) - 1} record(s)"
            )
            return {
                "partition": op.partition,
                "process": op.process,
                "previous": {"offset": prev.offset, "value": prev.value, "start": prev.start},
                "next": {"offset": op.offset, "value": op.value, "start": op.start},
                "explanation": (
                    f"reader {op.process} on partition {op.partition} read offset "
                    f"{op.offset} ({op.value!r}) right after offset {prev.offset}: it {what}"
                ),
            }

        f.add(kind, rexample)
    checked: dict[str, float] = {"producer_pairs": pairs, "reader_steps": steps}
    if h.reset_count:
        checked["reader_resets"] = h.reset_count
        checked["skips_across_resets"] = resets_crossed
    return f.report(
        "order",
        "producers' acks increase in send order; readers advance one offset at a time"
        + (" (or jump to the log start by a reset)" if h.reset_count else ""),
        checked,
        applicable=pairs > 0 or steps > 0,
    )


def check_consumer_groups(h: _History, opts: CheckOptions) -> CheckReport:
    """7. The real clients' consumers (chaos/client_workload.py).

    - A consumer that commits nothing has a fixed assignment and reads it in order: each
      record it polls from a partition is exactly one past the one before.
    - The group's committed offset never goes back, and the finding says which side moved
      it back. Client side (``commit-went-back-client``): a member committed an offset
      older than one already acknowledged (its ``commit`` op started after the newer one's
      ended) and the coordinator acknowledged it: a stale member overwrote newer progress.
      Coordinator side (``commit-went-back-coordinator``): the coordinator answered a
      FetchOffsets (the ``committed`` ops: the group's offsets read after the run) with an
      offset older than a commit it had acknowledged before the question was asked: it
      lost acknowledged progress.
    - None passes the log end (the largest final high watermark of the partition).
    - The group's committed offsets were read at all after the run, when there were
      acknowledged commits (``committed-unread``).
    - Nothing acknowledged below that committed offset went unconsumed by every member
      (at-least-once: the group never commits past a record nobody processed), unless
      retention had deleted it on a healthy replica (below the largest log start the
      healthy replicas report): a consumer reaching it then was reset past it.
    - A consumer that raised out of poll (it must ride out faults with its retries).
    - Records were acknowledged but no consumer (nor low-level reader) polled a single
      one in the whole run (``nothing-read``): consumers that never reached the cluster
      (seed 7411's, under TLS) otherwise passed every check above with nothing to check.
    """
    f = _Findings(
        "consumer-skip",
        "consumer-backwards",
        "commit-went-back-client",
        "commit-went-back-coordinator",
        "commit-past-end",
        "committed-unread",
        "unconsumed-below-commit",
        "consumer-broke",
        "nothing-read",
    )
    read_nothing = bool(h.acks) and not h.consumes and not h.reads
    applicable = bool(h.consumes or h.commits or h.committed or h.consumer_errors or read_nothing)
    if read_nothing:
        f.add(
            "nothing-read",
            {
                "acked": len(h.acks),
                "explanation": f"{len(h.acks)} records were acknowledged, but no consumer "
                "or reader polled any record in the whole run",
            },
        )
    committing = {op.process for op in h.commits}
    steps = _check_fixed_consumers(h, f, committing)
    ends = _final_ends(h)
    acked_commits = [op for op in h.commits if op.status == "ok"]
    by_partition: dict[int, list[Op]] = defaultdict(list)
    for op in acked_commits:
        by_partition[op.partition].append(op)
    for ops in by_partition.values():
        _check_commits_forward(ops, f)
    for op in [*acked_commits, *(c for c in h.committed if c.status == "ok")]:
        end = ends.get(op.partition)
        if end is not None and _off(op) > end:
            f.add(
                "commit-past-end",
                {
                    "partition": op.partition,
                    "offset": op.offset,
                    "process": op.process,
                    "final_end": end,
                    "explanation": f"{op.process} saw offset {op.offset} committed on "
                    f"partition {op.partition}, past its log end {end}",
                },
            )
    final = {c.partition: _off(c) for c in h.committed if c.status == "ok"}
    if acked_commits and not final:
        f.add(
            "committed-unread",
            {
                "errors": [c.error for c in h.committed][:MAX_SOURCES],
                "explanation": "commits were acknowledged but the group's committed offsets "
                "were never read after the run, so none can be shown kept",
            },
        )
    elif final:
        _check_committed_answers(h, by_partition, f)
        consumed = {(op.partition, op.offset) for op in h.consumes}
        for op in h.acks:
            key = (op.partition, op.offset)
            if _off(op) < final.get(op.partition, -1) and key not in consumed:
                if h.unreadable(op.partition, _off(op)):
                    continue  # retention deleted it before a consumer got there
                f.add(
                    "unconsumed-below-commit",
                    {
                        "partition": op.partition,
                        "offset": op.offset,
                        "value": op.value,
                        "final_committed": final[op.partition],
                        "explanation": f"{op.value!r} at partition {op.partition} offset "
                        f"{op.offset} was acknowledged and lies below the group's committed "
                        f"offset {final[op.partition]}, but no member consumed it",
                    },
                )
    for op in h.consumer_errors:
        f.add(
            "consumer-broke",
            {
                "process": op.process,
                "at": op.start,
                "error": op.error,
                "explanation": f"consumer {op.process} raised out of poll at "
                f"{op.start:.1f} s: {op.error}",
            },
        )
    return f.report(
        "consumer-groups",
        "consumers read in order; a group's committed offsets never go back (neither a "
        "member's commit nor the coordinator's answer), past the log end or past an "
        "unconsumed record",
        {
            "consumed": len(h.consumes),
            "fixed_consumer_steps": steps,
            "commits_acked": len(acked_commits),
            "commits_unknown": len(h.commits) - len(acked_commits),
            "committed_answers": sum(1 for c in h.committed if c.status == "ok"),
            "partitions_committed": len(final),
        },
        applicable=applicable,
        note="" if applicable else "no consumer ops (the low-level workload has none)",
    )


def _check_fixed_consumers(h: _History, f: _Findings, committing: set[str]) -> int:
    """Consumers that commit nothing: each partition's records polled one offset apart."""
    steps, uneven = _uneven_steps(op for op in h.consumes if op.process not in committing)
    for prev, op in uneven:
        kind = "consumer-backwards" if _off(op) <= _off(prev) else "consumer-skip"
        f.add(
            kind,
            {
                "partition": op.partition,
                "process": op.process,
                "previous": {"offset": prev.offset, "value": prev.value},
                "next": {"offset": op.offset, "value": op.value},
                "explanation": f"consumer {op.process} polled partition {op.partition} "
                f"offset {op.offset} right after {prev.offset}",
            },
        )
    return steps


def _uneven_steps(ops: Iterable[Op]) -> tuple[int, list[tuple[Op, Op]]]:
    """Each process's records of each partition in the order it saw them (by start;
    the sort is stable, so the records of one answer keep their order): how many
    successive pairs there are, and the pairs not exactly one offset apart."""
    seen: dict[tuple[str, int], list[Op]] = defaultdict(list)
    for op in ops:
        seen[(op.process, op.partition)].append(op)
    steps = 0
    uneven: list[tuple[Op, Op]] = []
    for mine in seen.values():
        mine.sort(key=_start)
        steps += len(mine) - 1
        uneven += [(a, b) for a, b in itertools.pairwise(mine) if _off(b) != _off(a) + 1]
    return steps, uneven


def _check_commits_forward(ops: list[Op], f: _Findings) -> None:
    """One partition's acknowledged commits: each at least every one acknowledged before
    it started (commits overlapping in time are not ordered). A later, lower one is the
    client side going back: a member committed older progress (and was not fenced)."""
    by_end = sorted(ops, key=lambda op: op.end)
    top: Op | None = None
    i = 0
    for op in sorted(ops, key=_start):
        while i < len(by_end) and by_end[i].end < op.start:
            if top is None or _off(by_end[i]) > _off(top):
                top = by_end[i]
            i += 1
        if top is not None and _off(op) < _off(top):
            f.add(
                "commit-went-back-client",
                functools.partial(_backwards_example, top, op),
            )


def _backwards_example(earlier: Op, later: Op) -> dict[str, Any]:
    return {
        "partition": later.partition,
        "side": "client",
        "earlier": {"process": earlier.process, "offset": earlier.offset, "end": earlier.end},
        "later": {"process": later.process, "offset": later.offset, "start": later.start},
        "explanation": f"client side: member {later.process} committed offset {later.offset} "
        f"on partition {later.partition} at {later.start:.1f} s, after "
        f"{earlier.process}'s commit of {earlier.offset} had been acknowledged at "
        f"{earlier.end:.1f} s, and the coordinator acknowledged it: the group's progress "
        "went back",
    }


def _check_committed_answers(h: _History, by_partition: dict[int, list[Op]], f: _Findings) -> None:
    """The coordinator side: every answer it gave about a partition's committed offset
    (``committed`` ops) is at least the highest commit it acknowledged before the question
    was asked; a partition it has no answer for counts as answered "none" (-1)."""
    answers: dict[int, list[Op]] = defaultdict(list)
    for c in h.committed:
        if c.status == "ok":
            answers[c.partition].append(c)
    asked_at = min((c.start for cs in answers.values() for c in cs), default=h.last_time)
    for p, ops in sorted(by_partition.items()):
        mine = answers.get(p) or [Op("committed", "final-group", p, None, -1, "ok", asked_at)]
        for answer in mine:
            before = [op for op in ops if op.end < answer.start]
            if not before:
                continue
            top = max(before, key=_off)
            if _off(answer) < _off(top):
                f.add(
                    "commit-went-back-coordinator",
                    functools.partial(_coordinator_example, top, answer),
                )


def _coordinator_example(top: Op, answer: Op) -> dict[str, Any]:
    said = "no committed offset" if _off(answer) < 0 else f"offset {answer.offset}"
    return {
        "partition": answer.partition,
        "side": "coordinator",
        "acknowledged": top.offset,
        "process": top.process,
        "acknowledged_at": top.end,
        "answered": answer.offset,
        "asked_by": answer.process,
        "asked_at": answer.start,
        "explanation": f"coordinator side: {top.process}'s commit of offset {top.offset} on "
        f"partition {answer.partition} was acknowledged at {top.end:.1f} s, but asked at "
        f"{answer.start:.1f} s (FetchOffsets, by {answer.process}) the coordinator answered "
        f"{said}: it lost acknowledged progress",
    }


def _final_ends(h: _History) -> dict[int, int]:
    """Per partition, the largest high watermark any replica's final read reached."""
    ends: dict[int, int] = {}
    for (p, _), hw in itertools.chain(h.range_hw.items(), h.replica_hw.items()):
        ends[p] = max(hw, ends.get(p, hw))
    return ends


def check_recovery(h: _History, opts: CheckOptions) -> CheckReport:
    """8. After healing, every partition had a leader and took a write within the limit.

    A missing recovery op is a violation: the run never showed the cluster recovered.
    """
    f = _Findings("missing", "failed", "slow", "no-duration")
    if not h.recoveries:
        f.add(
            "missing",
            {"explanation": "the history has no recovery op: recovery was never confirmed"},
        )
    for op in h.recoveries:
        seconds = _seconds(op.value)
        base = {"process": op.process, "status": op.status, "seconds": seconds}
        if op.status != "ok":
            f.add(
                "failed",
                {
                    **base,
                    "error": op.error,
                    "explanation": f"recovery failed (status {op.status!r}, after "
                    f"{op.value} s, error {op.error!r})",
                },
            )
        elif seconds is None:
            f.add(
                "no-duration",
                {**base, "explanation": f"recovery op has no duration in seconds: {op.value!r}"},
            )
        elif seconds > opts.recovery_limit_s:
            f.add(
                "slow",
                {
                    **base,
                    "limit_s": opts.recovery_limit_s,
                    "explanation": f"recovery took {seconds:g} s, over the limit of "
                    f"{opts.recovery_limit_s:g} s",
                },
            )
    return f.report(
        "recovery",
        f"the cluster recovered after healing within {opts.recovery_limit_s:g} s",
        {
            "recoveries": len(h.recoveries),
            "max_seconds": max(
                (s for s in map(_seconds, (r.value for r in h.recoveries)) if s is not None),
                default=0,
            ),
        },
    )


def check_leaderless(h: _History, opts: CheckOptions) -> CheckReport:
    """9. No partition was without a leader for longer than the recovery limit, faults or
    not: an election takes a timeout or two, and even a majority killed for a fault's
    hold comes back within it. From the monitor's ``leader`` ops (which brokers claim to
    lead each partition, whenever that changed); a span with no claim lasts until the next
    op of that partition or the end of the history."""
    f = _Findings("leaderless-too-long")
    longest = 0.0
    for partition, ops in sorted(h.leaders.items()):
        ops = sorted(ops, key=_start)
        for i, op in enumerate(ops):
            if op.value:
                continue
            until = ops[i + 1].start if i + 1 < len(ops) else h.last_time
            span = until - op.start
            longest = max(longest, span)
            if span > opts.recovery_limit_s:
                f.add(
                    "leaderless-too-long",
                    {
                        "partition": partition,
                        "from_s": round(op.start, 3),
                        "seconds": round(span, 3),
                        "explanation": f"partition {partition} had no leader for {span:.1f} s "
                        f"from {op.start:.1f} s, over the limit of {opts.recovery_limit_s:g} s",
                    },
                )
    return f.report(
        "leaderless",
        f"no partition was without a leader for more than {opts.recovery_limit_s:g} s",
        {"partitions": len(h.leaders), "longest_leaderless_s": round(longest, 3)},
        applicable=bool(h.leaders),
    )


def check_health(h: _History, opts: CheckOptions) -> CheckReport:
    """10. After healing, every broker says it serves and every replica says it is sound,
    and none says so falsely: a replica that reports ok while its final high watermark is
    behind the other replicas', or while its final read was refused part way (say, by a
    checksum failure nobody repaired), is a broker alive but failed without saying so.
    From the ``status`` ops recorded after the final reads.

    Every replica the metadata assigns (``assignment`` ops: PartitionInfo.replicas) must
    be reported by its own broker: one that is not (``replica-unreported``) is a replica
    that vanished from view, which is how a replica that could not open went unnoticed.
    A replica still ``REPLICA_OPENING`` after healing (``replica-opening``: not opened
    yet, or being repaired from a peer first) serves nothing, like a failed one."""
    f = _Findings(
        "not-serving", "replica-failed", "replica-opening", "replica-unreported", "silent-failure"
    )
    best_hw: dict[int, int] = {}
    for (p, _), hw in h.range_hw.items():
        best_hw[p] = max(hw, best_hw.get(p, hw))
    replicas = 0
    for op in h.statuses:
        who = op.replica
        if op.partition < 0:
            if op.value != "SERVING":
                f.add(
                    "not-serving",
                    {
                        "broker": who,
                        "health": op.value,
                        "explanation": f"broker {who} answers health {op.value} after healing",
                    },
                )
            continue
        replicas += 1
        p = op.partition
        if op.value in UNSOUND_STATES:
            kind = "replica-failed" if op.value == "REPLICA_FAILED" else "replica-opening"
            still = "still failed" if op.value == "REPLICA_FAILED" else "still opening"
            f.add(
                kind,
                {
                    "partition": p,
                    "replica": who,
                    "state": STATE_WORDS[op.value or ""],
                    "reason": op.error,
                    "explanation": f"replica {who} of partition {p} is {still} after "
                    f"healing: {op.error or 'no reason given'}",
                },
            )
            continue
        final_hw = h.range_hw.get((p, who if who is not None else -1))
        refused = h.range_error.get((p, who if who is not None else -1))
        if op.value == "REPLICA_OK" and refused:
            f.add(
                "silent-failure",
                {
                    "partition": p,
                    "replica": who,
                    "error": refused,
                    "explanation": f"replica {who} of partition {p} says it is ok, but its "
                    f"final read was refused: {refused}",
                },
            )
        elif (
            op.value == "REPLICA_OK"
            and final_hw is not None
            and final_hw < best_hw.get(p, final_hw)
        ):
            f.add(
                "silent-failure",
                {
                    "partition": p,
                    "replica": who,
                    "replica_hw": final_hw,
                    "best_hw": best_hw[p],
                    "explanation": f"replica {who} of partition {p} says it is ok, but its "
                    f"high watermark {final_hw} stayed behind {best_hw[p]}",
                },
            )
    assigned = unasked = 0
    for p in sorted(h.assignments):
        members, said = h.assigned(p)
        assigned += len(members)
        for r in sorted(members):
            if (p, r) in h.replica_state:
                continue
            if r not in h.broker_health:
                # The sweep asks every broker but one killed for good; a partition still
                # assigned to it is the replication check's finding, not a silent replica.
                unasked += 1
                continue

            def example(p: int = p, r: int = r, said: Op | None = said) -> dict[str, Any]:
                source = "" if said is None else f" (per broker {said.replica}'s metadata)"
                return {
                    "partition": p,
                    "replica": r,
                    "assigned": sorted(h.assigned(p)[0]),
                    "state": h.state_of(p, r),
                    "explanation": f"partition {p} is assigned to brokers "
                    f"{sorted(h.assigned(p)[0])}{source}, but broker {r} does not report "
                    f"its replica after healing: {h.state_of(p, r)}",
                }

            f.add("replica-unreported", example)
    return f.report(
        "health",
        "after healing every broker serves, every assigned replica is reported, open and "
        "sound, and none says so falsely",
        {
            "brokers": sum(1 for op in h.statuses if op.partition < 0),
            "replicas": replicas,
            "assigned": assigned,
            "assigned-to-unasked-brokers": unasked,
        },
        applicable=bool(h.statuses),
    )


def check_replication(h: _History, opts: CheckOptions) -> CheckReport:
    """11. After a broker was killed for good, the controller healed every partition back
    to its replication factor of in-sync voters on live brokers, within ``heal_limit_s``
    of the end of the fault window. From the ``replication`` ops (one per partition,
    recorded only in runs with the ``decommission`` fault)."""
    f = _Findings("not-healed", "slow")
    longest = 0.0
    for op in sorted(h.replications, key=lambda o: o.partition):
        seconds = op.end - op.start
        longest = max(longest, seconds)
        base = {"partition": op.partition, "voters": op.value, "seconds": round(seconds, 3)}
        if op.status != "ok":
            f.add(
                "not-healed",
                {
                    **base,
                    "error": op.error,
                    "explanation": f"partition {op.partition} was not back at its replication "
                    f"factor {seconds:.1f} s after the faults: {op.error}",
                },
            )
        elif seconds > opts.heal_limit_s:
            f.add(
                "slow",
                {
                    **base,
                    "explanation": f"partition {op.partition} took {seconds:.1f} s to heal, "
                    f"over the limit of {opts.heal_limit_s:g} s",
                },
            )
    return f.report(
        "replication",
        "after a broker died for good, every partition was back at its replication factor "
        f"on live brokers within {opts.heal_limit_s:g} s",
        {"partitions": len(h.replications), "seconds": round(longest, 3)},
        applicable=bool(h.replications),
    )


CHECKS: list[CheckFn] = [
    check_lost,
    check_replicas,
    check_one_value,
    check_duplicates,
    check_phantoms,
    check_order,
    check_consumer_groups,
    check_recovery,
    check_leaderless,
    check_health,
    check_replication,
]
"""The checks, in report order. A new check is a function ``(_History, CheckOptions) ->
CheckReport`` appended here."""


# --------------------------------------------------------------------------- entry points


def check(
    ops: Iterable[Op],
    *,
    idempotent: bool = False,
    recovery_limit_s: float = 30.0,
    heal_limit_s: float = 60.0,
) -> CheckResult:
    """Check a history; ``valid`` is False iff some check found a violation.

    ``ops`` is consumed once (a generator over a history file is fine).
    """
    h = _History(ops)
    opts = CheckOptions(
        idempotent=idempotent, recovery_limit_s=recovery_limit_s, heal_limit_s=heal_limit_s
    )
    reports = [fn(h, opts) for fn in CHECKS]
    summary = _summary(h)
    if h.txn_ops:
        # Imported here: chaos.txn_checker builds on this module's reports and index.
        from chaos.txn_checker import transaction_reports

        txn_reports, summary["transactions"] = transaction_reports(h)
        reports += txn_reports
    if h.feature_ops:
        from chaos.feature_checker import feature_reports

        feature, summary["features"] = feature_reports(h, idempotent=idempotent)
        reports += feature
    if h.share_ops:
        from chaos.share_checker import share_reports

        shared, summary["share_group"] = share_reports(h)
        reports += shared
    return CheckResult(valid=all(r.ok for r in reports), checks=reports, summary=summary)


def check_file(
    path: Path, *, idempotent: bool = False, recovery_limit_s: float = 30.0
) -> CheckResult:
    """Check a ``history.jsonl`` written by ``chaos.history.write``."""
    return check(history.read(path), idempotent=idempotent, recovery_limit_s=recovery_limit_s)


def _summary(h: _History) -> dict[str, Any]:
    statuses: dict[str, int] = defaultdict(int)
    for op in h.sends:
        statuses[op.status] += 1
    partitions = {op.partition for op in h.sends} | set(h.replicas)
    return {
        "sends_attempted": len(h.sends),
        "sends_acked": statuses.get("ok", 0),
        "sends_failed": statuses.get("fail", 0),
        "sends_indeterminate": statuses.get("info", 0),
        "reads": len(h.reads),
        "finals": len(h.finals),
        "digests": len(h.digests),
        "faults_started": sum(1 for op in h.faults if op.status == "start"),
        "faults_ended": sum(1 for op in h.faults if op.status == "end"),
        "recoveries": len(h.recoveries),
        "partitions": len(partitions),
        "malformed_ops": len(h.malformed),
        "unknown_kinds": dict(sorted(h.other.items())),
        "metrics": _metrics_summary(h),
    }


def _metrics_summary(h: _History) -> dict[str, Any]:
    """What the brokers' own gauges said while the faults ran and after healing: the
    cluster-wide sums (each broker's latest scrape) of under-replicated partitions,
    leaderless partitions and failed replicas, at most, before and after everything healed,
    and at the last scrape. Figures only: a gauge's timing is no promise to check."""
    latest: dict[str, tuple[int, ...]] = {}
    series: list[tuple[float, tuple[int, ...]]] = []
    malformed = 0
    for op in sorted(h.metrics, key=_start):
        try:
            values = tuple(int(x) for x in (op.value or "").split(","))
        except ValueError:
            values = ()
        if len(values) != 3:
            malformed += 1
            continue
        latest[op.process] = values
        series.append((op.start, tuple(map(sum, zip(*latest.values(), strict=True)))))
    if not series:
        return {"samples": 0}
    healed = h.healed_at if h.healed_at is not None else h.last_time
    names = ("under_replicated", "leaderless", "failed_replicas")

    def most(rows: list[tuple[float, tuple[int, ...]]]) -> dict[str, int]:
        return {n: max((r[1][i] for r in rows), default=0) for i, n in enumerate(names)}

    return {
        "samples": len(series),
        "malformed": malformed,
        "max_during_faults": most([r for r in series if r[0] < healed]),
        "max_after_healing": most([r for r in series if r[0] >= healed]),
        "last": dict(zip(names, series[-1][1], strict=True)),
    }


# --------------------------------------------------------------------------- output

_STYLE = {OK: "green", VIOLATED: "bold red", NOT_APPLICABLE: "dim"}


def _counts_text(counts: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in counts.items()
    )


def format_lines(result: CheckResult) -> list[str]:
    """Plain-text summary (logs, CI output): verdict, summary, one line per check."""
    verdict = "VALID" if result.valid else "INVALID"
    lines = [
        f"chaos check: {verdict}",
        "summary: "
        + _counts_text({k: v for k, v in result.summary.items() if not isinstance(v, dict)}),
    ]
    for c in result.checks:
        lines.append(f"  {c.name:<22} {c.status:<15} {_counts_text(c.counts)}")
        if c.status == VIOLATED and c.examples:
            lines.append(f"    e.g. {c.examples[0].get('explanation', '')}")
        if c.note:
            lines.append(f"    note: {c.note}")
    return lines


def format_table(result: CheckResult) -> Table:
    """A rich table for ``raftmq chaos run``: one row per check with its first example."""
    verdict = "[green]VALID[/]" if result.valid else "[bold red]INVALID[/]"
    s = result.summary
    table = Table(
        title=f"chaos check: {verdict}",
        caption=(
            f"sends {s['sends_attempted']} (acked {s['sends_acked']}, failed "
            f"{s['sends_failed']}, indeterminate {s['sends_indeterminate']}), reads "
            f"{s['reads']}, finals {s['finals']}, faults {s['faults_started']}"
            + _metrics_caption(s.get("metrics", {}))
        ),
    )
    table.add_column("check")
    table.add_column("status")
    table.add_column("counts")
    table.add_column("example / note", overflow="fold")
    for c in result.checks:
        detail = c.examples[0].get("explanation", "") if c.examples else ""
        if c.note:
            detail = f"{detail}\n({c.note})" if detail else f"({c.note})"
        table.add_row(
            c.name,
            f"[{_STYLE.get(c.status, '')}]{c.status}[/]",
            _counts_text(c.counts),
            detail,
        )
    return table


def _metrics_caption(m: dict[str, Any]) -> str:
    if not m.get("samples"):
        return ""
    during, last = m["max_during_faults"], m["last"]
    return (
        f"\nmetrics ({m['samples']} scrapes): under-replicated at most "
        f"{during['under_replicated']} during faults, {last['under_replicated']} at the end; "
        f"leaderless at most {during['leaderless']}, {last['leaderless']} at the end; "
        f"failed replicas at most {during['failed_replicas']}, {last['failed_replicas']} at "
        "the end"
    )


# --------------------------------------------------------------------------- helpers


def _off(op: Op) -> int:
    """The offset of an op the index has already checked to carry one."""
    assert op.offset is not None
    return op.offset


def _val(op: Op) -> str:
    """The value of an op the index has already checked to carry one."""
    assert op.value is not None
    return op.value


def _start(op: Op) -> float:
    return op.start


def _seconds(value: object) -> float | None:
    """A recovery duration: the harness may store it as a number or as its text."""
    if value is None:
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) else None
