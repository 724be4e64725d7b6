"""The transactional workload's checks (``raftmq chaos run --transactions``): the
properties Jepsen's Kafka workload checks, on the ``txn*`` ops of the history
(chaos/history.py says what each holds; chaos/txn_workload.py records them).

Like chaos/checker.py, a pure function of the history: :func:`transaction_reports` is
called by ``checker.check`` whenever the history holds transactional ops, and gives one
report per property, each with counts and a few self-explaining examples:

1. ``txn-aborted-read`` (G1a): no read_committed reader, live or final, returns a write
   of an aborted transaction.
2. ``txn-uncommitted-read``: no read_committed reader returns a write before its
   transaction was even asked to commit, and a transaction whose commit's outcome never
   came back is, in the final read_committed read, wholly visible or wholly invisible,
   and invisible there only if no live read_committed reader returned any of it.
3. ``txn-torn``: a live read_committed reader that read past a write of a committed
   transaction returned it: none that saw part of a transaction skipped the rest
   (``torn``), and none skipped a committed write altogether (``skipped-committed``).
4. ``txn-lost``: every write of a committed transaction is in the final read_committed
   read, at its offset.
5. ``txn-exactly-once``: the pipeline's committed outputs hold at most one output per
   input record, and every input record below the group's final committed offset has one.
6. ``txn-offsets``: the input position a committed transaction carried is one past its
   last input in that partition, and the group's final committed offset is one past the
   largest input with a committed output.
7. ``txn-positions``: a worker's consumed offsets only go forward within one tenure of
   a partition (between its seeks), and the group's committed offset, whenever read,
   is never behind what an acknowledged transaction committed before.
8. ``txn-polls``: each output reader's offsets on a partition strictly increase between
   its seeks (no non-monotonic poll); a read_uncommitted reader skips no offset; every
   value read was written, at the offset it was read.

A transaction whose commit's outcome is unknown (``txn`` status ``info``) is *resolved*
by the final read: committed when any of its writes is there, aborted when the final read
covered every offset it wrote without finding one, else unresolved (retention deleted its
offsets, or the final read stopped short): the checks count on neither outcome for it.

Retention (runs with ``snapshot``): a write below the output partition's final log start
(``txn-range``) may be gone, and an input below the main topic's (``unreadable``) may have
been skipped by the workers; neither is then held against the run.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.checker import CheckReport, _Findings, _History
from chaos.history import Op, parse_txn_value

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

COMMITTED = "committed"
ABORTED = "aborted"
UNRESOLVED = "unresolved"


def isolation_of(process: str) -> str:
    """A reader's isolation level, from its name (``read_committed-0``)."""
    return process.rsplit("-", 1)[0]


@dataclass
class Txn:
    """One transaction as the history tells it."""

    id: str
    process: str
    status: str = "info"
    """The ``txn`` op's status; ``info`` (unknown) when there was none."""
    start: float = math.inf
    """When its commit (or abort) was asked for."""
    end: float = math.inf
    error: str | None = None
    writes: list[Op] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)
    """Input partition -> the position it carried (``txn-offsets`` ops the coordinator took)."""
    outcome: str = UNRESOLVED
    """committed / aborted / unresolved: the status, or for an unknown one, the final read's
    verdict."""

    @property
    def pipeline(self) -> bool:
        return any(_source(w) is not None for w in self.writes) or bool(self.offsets)

    def inputs(self) -> dict[int, int]:
        """Input partition -> the largest input offset it has an output for."""
        top: dict[int, int] = {}
        for w in self.writes:
            src = _source(w)
            if src is not None:
                top[src[0]] = max(src[1], top.get(src[0], -1))
        return top

    def summary(self) -> dict[str, Any]:
        return {
            "txn": self.id,
            "status": self.status,
            "outcome": self.outcome,
            "asked_at": None if math.isinf(self.start) else round(self.start, 3),
            "known_at": None if math.isinf(self.end) else round(self.end, 3),
            "error": self.error,
            "writes": [{"partition": w.partition, "offset": w.offset} for w in self.writes][:8],
            "write_count": len(self.writes),
            "offsets": dict(sorted(self.offsets.items())),
        }


class TxnHistory:
    """The transactional ops indexed once (``h``: the run's whole history index, for the
    main topic's records and retention)."""

    def __init__(self, h: _History) -> None:
        self.h = h
        self.txns: dict[str, Txn] = {}
        self.writes: dict[str, Op] = {}  # value -> its txn-write op
        self.reads: list[Op] = []
        self.finals: list[Op] = []
        self.final_at: dict[tuple[int, int], str] = {}
        self.final_values: set[str] = set()
        self.final_start: dict[int, int] = {}  # output partition -> largest log start
        self.final_end: dict[int, int] = {}  # output partition -> position reached
        self.final_hw: dict[int, int] = {}
        self.final_errors: dict[int, str] = {}
        self.workers: dict[str, list[Op]] = defaultdict(list)  # consume/seek/assign in order
        self.reader_ops: dict[str, list[Op]] = defaultdict(list)  # read/seek in order
        self.committed: dict[int, int] = {}
        self.committed_ops: list[Op] = []
        self.committed_unread: list[Op] = []
        self.errors: list[Op] = []
        self.malformed: list[Op] = []
        for op in h.txn_ops:
            self._add(op)
        self._resolve()

    def _txn(self, txn_id: str, process: str) -> Txn:
        found = self.txns.get(txn_id)
        if found is None:
            found = self.txns[txn_id] = Txn(txn_id, process)
        return found

    def _add(self, op: Op) -> None:
        kind = op.kind
        if kind == "txn":
            if op.value is None:
                self.malformed.append(op)
                return
            t = self._txn(op.value, op.process)
            t.status, t.start, t.end, t.error = op.status, op.start, op.end, op.error
        elif kind == "txn-write":
            parsed = parse_txn_value(op.value or "")
            if parsed is None:
                self.malformed.append(op)
                return
            self._txn(parsed[0], op.process).writes.append(op)
            self.writes[op.value or ""] = op
        elif kind == "txn-offsets":
            if op.value is None or op.offset is None:
                self.malformed.append(op)
            elif op.status == "ok":
                self._txn(op.value, op.process).offsets[op.partition] = op.offset
        elif kind in ("txn-read", "txn-final"):
            if op.value is None or op.offset is None:
                self.malformed.append(op)
            elif kind == "txn-final":
                self.finals.append(op)
                self.final_at[(op.partition, op.offset)] = op.value
                self.final_values.add(op.value)
            else:
                self.reads.append(op)
                self.reader_ops[op.process].append(op)
        elif kind == "txn-seek":
            if op.offset is None:
                self.malformed.append(op)
            elif isolation_of(op.process) in (READ_COMMITTED, READ_UNCOMMITTED):
                self.reader_ops[op.process].append(op)
            else:
                self.workers[op.process].append(op)
        elif kind in ("txn-consume", "txn-assign"):
            self.workers[op.process].append(op)
        elif kind == "txn-committed":
            if op.status != "ok" or op.offset is None:
                self.committed_unread.append(op)
            else:
                self.committed[op.partition] = op.offset
                self.committed_ops.append(op)
        elif kind == "txn-range":
            self._add_range(op)
        elif kind == "txn-error":
            self.errors.append(op)

    def _add_range(self, op: Op) -> None:
        try:
            reached = int(op.value or "")
        except ValueError:
            self.malformed.append(op)
            return
        p = op.partition
        self.final_start[p] = max(op.offset or 0, self.final_start.get(p, 0))
        self.final_end[p] = max(reached, self.final_end.get(p, reached))
        if op.hw is not None:
            self.final_hw[p] = max(op.hw, self.final_hw.get(p, op.hw))
        if op.error:
            self.final_errors[p] = op.error

    def _resolve(self) -> None:
        for t in self.txns.values():
            if t.status == "ok":
                t.outcome = COMMITTED
            elif t.status == "fail":
                t.outcome = ABORTED
            elif any(w.value in self.final_values for w in t.writes):
                t.outcome = COMMITTED
            elif all(self.final_covers(w) for w in t.writes):
                t.outcome = ABORTED
            else:
                t.outcome = UNRESOLVED

    # --- questions ----------------------------------------------------------------------

    def deleted(self, partition: int, offset: int) -> bool:
        """Whether retention may have deleted this output offset before it was read."""
        return offset < self.final_start.get(partition, 0)

    def final_covers(self, w: Op) -> bool:
        """Whether the final read would have returned write ``w`` had it been committed:
        it read past its offset and retention had not deleted it. A write whose offset
        is unknown is covered when the final read reached its partition's high watermark."""
        p = w.partition
        end = self.final_end.get(p)
        if end is None:
            return False
        if w.offset is None:
            return end >= self.final_hw.get(p, math.inf)
        return end > w.offset and not self.deleted(p, w.offset)

    def txn_of(self, value: str) -> Txn | None:
        parsed = parse_txn_value(value)
        return None if parsed is None else self.txns.get(parsed[0])

    def with_outcome(self, outcome: str) -> list[Txn]:
        return [t for t in self.txns.values() if t.outcome == outcome]

    def summary(self) -> dict[str, Any]:
        statuses: dict[str, int] = defaultdict(int)
        for t in self.txns.values():
            statuses[t.status] += 1
        return {
            "committed": statuses.get("ok", 0),
            "aborted": statuses.get("fail", 0),
            "unknown": len(self.txns) - statuses.get("ok", 0) - statuses.get("fail", 0),
            "unknown_resolved_committed": sum(
                1 for t in self.txns.values() if t.status == "info" and t.outcome == COMMITTED
            ),
            "unresolved": len(self.with_outcome(UNRESOLVED)),
            "writes": len(self.writes),
            "reads": len(self.reads),
            "finals": len(self.finals),
            "errors": len(self.errors),
            "malformed_ops": len(self.malformed),
        }


def _source(w: Op) -> tuple[int, int] | None:
    parsed = parse_txn_value(w.value or "")
    return None if parsed is None else parsed[2]


def _read_example(op: Op, t: Txn, why: str) -> dict[str, Any]:
    return {
        "reader": op.process,
        "partition": op.partition,
        "offset": op.offset,
        "value": op.value,
        "read_at": round(op.end, 3),
        "transaction": t.summary(),
        "explanation": f"{op.process} read {op.value!r} at partition {op.partition} offset "
        f"{op.offset} ({op.end:.1f} s): {why}",
    }


# --------------------------------------------------------------------------- checks


def check_aborted_read(t: TxnHistory) -> CheckReport:
    """1. G1a: a read_committed reader returned a write of an aborted transaction."""
    f = _Findings("aborted-read")
    committed_reads = [op for op in t.reads if isolation_of(op.process) == READ_COMMITTED]
    for op in [*committed_reads, *t.finals]:
        txn = t.txn_of(op.value or "")
        if txn is not None and txn.status == "fail":
            why = f"transaction {txn.id} was aborted ({txn.error or 'on purpose'})"
            f.add("aborted-read", functools.partial(_read_example, op, txn, why))
    aborted = [x for x in t.txns.values() if x.status == "fail"]
    return f.report(
        "txn-aborted-read",
        "no read_committed reader returns a write of an aborted transaction (G1a)",
        {
            "read_committed_reads": len(committed_reads),
            "final_reads": len(t.finals),
            "aborted_txns": len(aborted),
            "aborted_writes": sum(len(x.writes) for x in aborted),
        },
        applicable=bool(t.txns),
    )


def check_uncommitted_read(t: TxnHistory) -> CheckReport:
    """2. No read_committed read of an uncommitted write: none returns a write before its
    transaction was asked to commit; an unknown one is never partly visible in the final
    read (some writes there, another that the read covered missing), nor returned by a
    live reader and then wholly missing from the final read."""
    f = _Findings("read-before-commit", "unknown-partly-visible", "unknown-seen-then-gone")
    for op in t.reads:
        if isolation_of(op.process) != READ_COMMITTED:
            continue
        txn = t.txn_of(op.value or "")
        if txn is None or txn.status == "fail":
            continue  # aborted ones: check 1
        if op.end < txn.start:
            why = (
                f"transaction {txn.id} was asked to commit only at {txn.start:.1f} s, after "
                "this read returned"
            )
            f.add("read-before-commit", functools.partial(_read_example, op, txn, why))
        elif txn.status == "info" and txn.outcome == ABORTED:
            why = (
                f"transaction {txn.id}'s commit got no answer, and the final read_committed "
                "read, which covered every offset it wrote, holds none of its writes"
            )
            f.add("unknown-seen-then-gone", functools.partial(_read_example, op, txn, why))
    unknown = [x for x in t.txns.values() if x.status == "info"]
    for txn in unknown:
        if txn.outcome != COMMITTED:
            continue
        missing = [
            w
            for w in txn.writes
            if w.offset is not None and w.value not in t.final_values and t.final_covers(w)
        ]
        if missing:
            f.add("unknown-partly-visible", functools.partial(_partly_example, t, txn, missing))
    return f.report(
        "txn-uncommitted-read",
        "no read_committed read of an uncommitted write: none before the commit was asked "
        "for, and a transaction of unknown outcome is wholly visible or wholly invisible",
        {
            "unknown_txns": len(unknown),
            "resolved_committed": sum(1 for x in unknown if x.outcome == COMMITTED),
            "resolved_aborted": sum(1 for x in unknown if x.outcome == ABORTED),
            "unresolved": sum(1 for x in unknown if x.outcome == UNRESOLVED),
        },
        applicable=bool(t.txns),
    )


def _partly_example(t: TxnHistory, txn: Txn, missing: list[Op]) -> dict[str, Any]:
    seen = [w for w in txn.writes if w.value in t.final_values]
    return {
        "transaction": txn.summary(),
        "visible": [{"partition": w.partition, "offset": w.offset} for w in seen][:8],
        "missing": [
            {
                "partition": w.partition,
                "offset": w.offset,
                "value": w.value,
                "final_holds": t.final_at.get((w.partition, w.offset or -1)),
            }
            for w in missing
        ][:8],
        "explanation": f"transaction {txn.id}'s commit got no answer; the final "
        f"read_committed read holds {len(seen)} of its writes but not {len(missing)} others "
        "it read past: it is partly visible",
    }


def check_torn(t: TxnHistory) -> CheckReport:
    """3. A live read_committed reader never reads past a committed write without
    returning it: ``torn`` when it returned other writes of that transaction,
    ``skipped-committed`` when none. Transactions of unknown outcome count once they are
    seen (by this reader, or resolved committed by the final read)."""
    f = _Findings("torn", "skipped-committed")
    readers: dict[str, list[Op]] = defaultdict(list)
    for op in t.reads:
        if isolation_of(op.process) == READ_COMMITTED:
            readers[op.process].append(op)
    checked = 0
    for reader, ops in sorted(readers.items()):
        seen = {op.value for op in ops}
        past: dict[int, int] = {}
        for op in ops:
            past[op.partition] = max(op.offset or 0, past.get(op.partition, -1))
        for txn in t.txns.values():
            if txn.outcome == ABORTED:
                continue
            saw_part = any(w.value in seen for w in txn.writes)
            if txn.outcome != COMMITTED and not saw_part:
                continue
            for w in txn.writes:
                if w.offset is None or w.offset >= past.get(w.partition, -1):
                    continue
                checked += 1
                if w.value in seen or t.deleted(w.partition, w.offset):
                    continue
                kind = "torn" if saw_part else "skipped-committed"
                f.add(kind, functools.partial(_torn_example, reader, txn, w, seen, past, kind))
    return f.report(
        "txn-torn",
        "a read_committed reader that read past a committed transaction's write returned "
        "it: no transaction seen in part, no committed write skipped",
        {"readers": len(readers), "writes_read_past": checked},
        applicable=bool(readers),
    )


def _torn_example(
    reader: str, txn: Txn, w: Op, seen: set[str | None], past: dict[int, int], kind: str
) -> dict[str, Any]:
    returned = [x for x in txn.writes if x.value in seen]
    what = (
        f"returned {len(returned)} of its {len(txn.writes)} writes"
        if returned
        else "returned none of its writes"
    )
    return {
        "reader": reader,
        "transaction": txn.summary(),
        "missing": {"partition": w.partition, "offset": w.offset, "value": w.value},
        "reader_reached": past.get(w.partition),
        "returned": [{"partition": x.partition, "offset": x.offset} for x in returned][:8],
        "explanation": f"{reader} read partition {w.partition} up to offset "
        f"{past.get(w.partition)} but never returned {w.value!r} at offset {w.offset} of "
        f"transaction {txn.id} ({txn.outcome}); it {what}",
    }


def check_lost(t: TxnHistory) -> CheckReport:
    """4. Every write of a committed transaction is in the final read_committed read at its
    offset (unless retention deleted it). ``unread``: the final read stopped before it
    (a transaction left open holds the last stable offset back)."""
    f = _Findings("lost", "unread", "committed-without-offset")
    committed = [x for x in t.txns.values() if x.status == "ok"]
    deleted = writes = 0
    for txn in committed:
        for w in txn.writes:
            writes += 1
            if w.offset is None:
                f.add("committed-without-offset", functools.partial(_lost_example, t, txn, w))
            elif w.value in t.final_values and t.final_at.get((w.partition, w.offset)) == w.value:
                continue
            elif t.deleted(w.partition, w.offset):
                deleted += 1
            elif t.final_end.get(w.partition, -1) <= w.offset:
                f.add("unread", functools.partial(_lost_example, t, txn, w))
            else:
                f.add("lost", functools.partial(_lost_example, t, txn, w))
    return f.report(
        "txn-lost",
        "every write of a committed transaction is in the final read_committed read, at its offset",
        {
            "committed_txns": len(committed),
            "committed_writes": writes,
            "final_reads": len(t.finals),
            "deleted_by_retention": deleted,
        },
        applicable=bool(committed),
    )


def _lost_example(t: TxnHistory, txn: Txn, w: Op) -> dict[str, Any]:
    p = w.partition
    if w.offset is None:
        why = f"its send's future reported no offset ({w.error}), yet the commit succeeded"
    elif t.final_end.get(p, -1) <= w.offset:
        why = (
            f"the final read_committed read of partition {p} stopped at "
            f"{t.final_end.get(p)} (high watermark {t.final_hw.get(p)}"
            + (f"; {t.final_errors[p]}" if p in t.final_errors else "")
            + ")"
        )
    else:
        why = (
            f"the final read_committed read passed offset {w.offset} and holds "
            f"{t.final_at.get((p, w.offset))!r} there"
        )
    return {
        "partition": p,
        "offset": w.offset,
        "value": w.value,
        "transaction": txn.summary(),
        "final_end": t.final_end.get(p),
        "explanation": f"{w.value!r} of committed transaction {txn.id} is not in the final "
        f"read: {why}",
    }


def check_exactly_once(t: TxnHistory) -> CheckReport:
    """5. The pipeline's committed outputs: at most one per input record (``duplicate``),
    and one for every input record below the group's final committed offset
    (``missing``), except inputs retention may have deleted before a worker read them and
    inputs an unresolved transaction covered."""
    f = _Findings("duplicate", "missing")
    pipeline = [x for x in t.txns.values() if x.pipeline]
    outputs: dict[tuple[int, int], list[tuple[Txn, Op]]] = defaultdict(list)
    unresolved: set[tuple[int, int]] = set()
    for txn in pipeline:
        for w in txn.writes:
            src = _source(w)
            if src is None:
                continue
            if txn.outcome == COMMITTED:
                outputs[src].append((txn, w))
            elif txn.outcome == UNRESOLVED:
                unresolved.add(src)
    for src, outs in sorted(outputs.items()):
        if len(outs) > 1 and src not in unresolved:
            f.add("duplicate", functools.partial(_duplicate_example, src, outs))
    h = t.h
    inputs = _input_offsets(t)
    below = 0
    for p, committed in sorted(t.committed.items()):
        for o in sorted(inputs.get(p, ())):
            if o >= committed:
                break
            below += 1
            if (p, o) in outputs or (p, o) in unresolved or h.unreadable(p, o):
                continue
            f.add(
                "missing",
                {
                    "input_partition": p,
                    "input_offset": o,
                    "group_committed": committed,
                    "explanation": f"input record at partition {p} offset {o} lies below the "
                    f"group's final committed offset {committed}, but no committed "
                    "transaction has an output for it",
                },
            )
    return f.report(
        "txn-exactly-once",
        "the pipeline's committed outputs hold exactly one output per input record below "
        "the group's committed offsets, and never two for one input",
        {
            "pipeline_txns_committed": sum(1 for x in pipeline if x.outcome == COMMITTED),
            "inputs_with_output": len(outputs),
            "inputs_below_commit": below,
        },
        applicable=bool(pipeline),
    )


def _input_offsets(t: TxnHistory) -> dict[int, set[int]]:
    """Per input partition, every offset known to hold a record: acknowledged, read by a
    final read of the main topic, or consumed by a worker."""
    found: dict[int, set[int]] = defaultdict(set)
    for op in [*t.h.acks, *t.h.finals]:
        if op.offset is not None:
            found[op.partition].add(op.offset)
    for ops in t.workers.values():
        for op in ops:
            if op.kind == "txn-consume" and op.offset is not None:
                found[op.partition].add(op.offset)
    return found


def _duplicate_example(src: tuple[int, int], outs: list[tuple[Txn, Op]]) -> dict[str, Any]:
    return {
        "input_partition": src[0],
        "input_offset": src[1],
        "outputs": [
            {"txn": txn.id, "status": txn.status, "partition": w.partition, "offset": w.offset}
            for txn, w in outs
        ][:8],
        "explanation": f"input record at partition {src[0]} offset {src[1]} has "
        f"{len(outs)} committed outputs, in transactions "
        f"{sorted({txn.id for txn, _ in outs})}",
    }


def check_offsets(t: TxnHistory) -> CheckReport:
    """6. Offsets committed with a transaction match its outputs.

    - A committed pipeline transaction carried, for each input partition it has outputs
      from, the position one past the last of them, and no position for another one
      (``txn-offset-mismatch``).
    - The group's final committed offset of each input partition is one past the largest
      input offset with a committed output: not at or behind it
      (``commit-behind-output``: that input would be processed again) and not past it
      (``commit-past-outputs``: inputs committed without outputs), unless an unresolved
      transaction carried exactly that offset.
    """
    f = _Findings(
        "txn-offset-mismatch", "commit-behind-output", "commit-past-outputs", "committed-unread"
    )
    committed = [x for x in t.txns.values() if x.pipeline and x.outcome == COMMITTED]
    top: dict[int, int] = {}
    for txn in committed:
        inputs = txn.inputs()
        for p, o in inputs.items():
            top[p] = max(o, top.get(p, -1))
        if txn.status != "ok":
            continue  # resolved by the final read: its offsets ops may be unrecorded
        expected = {p: o + 1 for p, o in inputs.items()}
        if expected != txn.offsets:
            f.add(
                "txn-offset-mismatch",
                {
                    "transaction": txn.summary(),
                    "expected": dict(sorted(expected.items())),
                    "explanation": f"committed transaction {txn.id} carried input positions "
                    f"{dict(sorted(txn.offsets.items()))}, but its outputs call for "
                    f"{dict(sorted(expected.items()))}",
                },
            )
    unresolved_offsets = {(p, o) for x in t.with_outcome(UNRESOLVED) for p, o in x.offsets.items()}
    if committed and not t.committed:
        f.add(
            "committed-unread",
            {
                "errors": [op.error for op in t.committed_unread][:6],
                "explanation": "transactions committed input positions but the group's "
                "committed offsets were never read after the run",
            },
        )
    for p, c in sorted(t.committed.items()):
        want = top.get(p, -1) + 1
        if c == want or (p, c) in unresolved_offsets or (c == -1 and want == 0):
            continue
        kind = "commit-behind-output" if c < want else "commit-past-outputs"
        f.add(
            kind,
            {
                "input_partition": p,
                "group_committed": c,
                "largest_input_with_output": top.get(p),
                "explanation": f"the group's final committed offset of input partition {p} "
                f"is {c}, but the largest input with a committed output is "
                f"{top.get(p)}: it should be {want}",
            },
        )
    return f.report(
        "txn-offsets",
        "the input positions committed with a transaction are one past its outputs' "
        "inputs, and the group's final offsets one past the last input with an output",
        {
            "pipeline_txns_committed": len(committed),
            "partitions_committed": len(t.committed),
        },
        applicable=bool(committed or t.committed),
    )


def check_positions(t: TxnHistory) -> CheckReport:
    """7. Consumer positions never go backwards.

    - A worker's consumed offsets on a partition strictly increase within one tenure of
      it (from an assignment to a revocation), except across its own seeks
      (``position-backwards``).
    - The group's committed offset of a partition, read by a worker (to seek back after
      an abort) or after the run, is never behind what a transaction acknowledged as
      committed before the read began (``committed-went-back``).
    """
    f = _Findings("position-backwards", "committed-went-back")
    steps = 0
    reads: list[Op] = list(t.committed_ops)
    for process, ops in sorted(t.workers.items()):
        last: dict[int, int | None] = {}
        prev: dict[int, Op] = {}
        for op in ops:
            p = op.partition
            if op.kind == "txn-assign":
                last[p] = None
            elif op.kind == "txn-seek":
                last[p] = None if (op.offset or 0) < 0 else (op.offset or 0) - 1
                prev[p] = op
                if op.value == "committed":
                    reads.append(op)
            elif op.kind == "txn-consume" and op.offset is not None:
                before = last.get(p)
                if before is not None:
                    steps += 1
                    if op.offset <= before:
                        f.add(
                            "position-backwards",
                            functools.partial(_backwards_example, process, prev[p], op),
                        )
                last[p], prev[p] = op.offset, op
    acked = sorted((x for x in t.txns.values() if x.status == "ok"), key=lambda x: x.end)
    for r in reads:
        behind = [
            x for x in acked if x.end < r.start and x.offsets.get(r.partition, -1) > (r.offset or 0)
        ]
        if behind:
            top = max(behind, key=lambda x: x.offsets[r.partition])
            f.add("committed-went-back", functools.partial(_went_back_example, r, top))
    return f.report(
        "txn-positions",
        "a worker's positions only go forward within a tenure (but for its seeks), and the "
        "group's committed offsets never fall behind an acknowledged transaction's",
        {"worker_steps": steps, "committed_reads": len(reads), "workers": len(t.workers)},
        applicable=bool(t.workers or t.committed_ops),
    )


def _backwards_example(process: str, prev: Op, op: Op) -> dict[str, Any]:
    return {
        "process": process,
        "partition": op.partition,
        "previous": {"kind": prev.kind, "offset": prev.offset, "at": round(prev.start, 3)},
        "next": {"offset": op.offset, "at": round(op.start, 3)},
        "explanation": f"{process} consumed input partition {op.partition} offset "
        f"{op.offset} after {prev.kind} {prev.offset}, in the same tenure and with no seek "
        "between",
    }


def _went_back_example(r: Op, top: Txn) -> dict[str, Any]:
    who = "after the run" if r.kind == "txn-committed" else f"by {r.process}"
    return {
        "input_partition": r.partition,
        "read": {"by": r.process, "offset": r.offset, "at": round(r.start, 3)},
        "transaction": top.summary(),
        "explanation": f"the group's committed offset of input partition {r.partition}, read "
        f"{who} at {r.start:.1f} s, was {r.offset}, but transaction {top.id} had committed "
        f"{top.offsets[r.partition]} for it, acknowledged at {top.end:.1f} s",
    }


def check_polls(t: TxnHistory) -> CheckReport:
    """8. What the output readers returned.

    - Each reader's offsets on a partition strictly increase between its seeks
      (``nonmonotonic``).
    - A read_uncommitted reader returns every offset in turn (``skip``), but where
      retention may have moved the log start past it.
    - Every value read (live or final) was written by a transaction (``phantom``), at
      the offset its write was acknowledged at (``offset-mismatch``).
    """
    f = _Findings("nonmonotonic", "skip", "phantom", "offset-mismatch")
    steps = 0
    for process, ops in sorted(t.reader_ops.items()):
        uncommitted = isolation_of(process) == READ_UNCOMMITTED
        last: dict[int, int] = {}
        for op in ops:
            p, o = op.partition, op.offset or 0
            if op.kind == "txn-seek":
                last[p] = o - 1 if o >= 0 else -1
                continue
            before = last.get(p, -1)
            steps += 1
            if o <= before:
                f.add("nonmonotonic", functools.partial(_poll_example, op, before, "went back"))
            elif uncommitted and o > before + 1 and o > t.final_start.get(p, 0):
                f.add("skip", functools.partial(_poll_example, op, before, "skipped offsets"))
            last[p] = max(o, before)
    for op in [*t.reads, *t.finals]:
        w = t.writes.get(op.value or "")
        if w is None:
            f.add("phantom", functools.partial(_poll_example, op, None, "no transaction wrote it"))
        elif w.offset is not None and (w.offset, w.partition) != (op.offset, op.partition):
            f.add(
                "offset-mismatch",
                functools.partial(
                    _poll_example,
                    op,
                    None,
                    f"its write was stored at partition {w.partition} offset {w.offset}",
                ),
            )
    return f.report(
        "txn-polls",
        "the output readers' offsets strictly increase (read_uncommitted ones skip none), "
        "and each value read was written, where it was read",
        {"readers": len(t.reader_ops), "read_steps": steps, "values_read": len(t.reads)},
        applicable=bool(t.reader_ops or t.finals),
    )


def _poll_example(op: Op, before: int | None, why: str) -> dict[str, Any]:
    after = "" if before is None else f" after offset {before}"
    return {
        "reader": op.process,
        "partition": op.partition,
        "offset": op.offset,
        "value": op.value,
        "previous_offset": before,
        "explanation": f"{op.process} returned {op.value!r} at partition {op.partition} "
        f"offset {op.offset}{after}: {why}",
    }


TxnCheck = Callable[[TxnHistory], CheckReport]
TXN_CHECKS: list[TxnCheck] = [
    check_aborted_read,
    check_uncommitted_read,
    check_torn,
    check_lost,
    check_exactly_once,
    check_offsets,
    check_positions,
    check_polls,
]
"""The transactional checks, in report order."""


def transaction_reports(h: _History) -> tuple[list[CheckReport], dict[str, Any]]:
    """Every transactional check's report, and the summary's ``transactions`` counts."""
    t = TxnHistory(h)
    return [fn(t) for fn in TXN_CHECKS], t.summary()
