"""The checks of the message features under faults (chaos/feature_workload.py; the ops are
described in chaos/history.py), reported with the other checks by chaos.checker.check.

- ``delayed``: every acknowledged delayed record is delivered (``delayed-lost``), never
  before it was due (``delayed-early``), with idempotence at most once
  (``delayed-duplicate``), and, when no fault was under way from its due time to the bound,
  late by at most :data:`LATE_BOUND_MS` (``delayed-late``); nothing is delivered that was
  never sent (``delayed-phantom``). The lateness percentiles are reported.
- ``tag-filter``: the consumer with the tag filter gets every acknowledged matching record
  below where it stopped (``tag-missed``; records retention deleted before it got there
  excepted) and none that does not match (``tag-mismatch``).
- ``feature-consumers``: none of these consumers raised out of poll
  (``feature-consumer-broke``): they must ride out faults with their retries.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from chaos.feature_workload import TAG_FILTER, due_of, matches

if TYPE_CHECKING:
    from chaos.checker import CheckReport, _History
    from chaos.history import Op

LATE_BOUND_MS = 3_000
"""How late a delayed record may arrive outside fault windows: the delivery bound of
docs/delayed-delivery.md (a level's unit plus the mover's poll) with room for a 2-core
machine running three brokers, the clients and the proxies at once."""
SETTLE_S = 10.0
"""After a fault ends, how long its effects may last (elections, reconnections, movers
resuming from their cursors) before lateness counts again."""


def feature_reports(h: _History, *, idempotent: bool) -> tuple[list[CheckReport], dict[str, Any]]:
    delayed = [op for op in h.feature_ops if op.kind.startswith("delayed-")]
    tagged = [op for op in h.feature_ops if op.kind.startswith("tag-")]
    reports = []
    summary: dict[str, Any] = {}
    if delayed:
        report, summary["delayed"] = _check_delayed(h, delayed, idempotent)
        reports.append(report)
    if tagged:
        reports.append(_check_tags(h, tagged))
    reports.append(_check_consumers(h))
    return reports, summary


def _windows(h: _History) -> list[tuple[float, float]]:
    """The run's fault windows (recorder seconds), each stretched by SETTLE_S."""
    started: dict[str, list[float]] = defaultdict(list)
    windows = []
    for op in h.faults:
        if op.status == "start":
            started[op.value or ""].append(op.start)
        elif op.status == "end":
            # The run ends a fault under its own description; otherwise the oldest open one.
            opened = started[op.value or ""] or min(
                (v for v in started.values() if v), key=lambda v: v[0], default=[]
            )
            if opened:
                windows.append((opened.pop(0), op.start + SETTLE_S))
    for opened in started.values():  # never ended: for good
        windows += [(t, float("inf")) for t in opened]
    return windows


def _quiet(windows: list[tuple[float, float]], lo: float, hi: float) -> bool:
    return not any(start < hi and lo < end for start, end in windows)


def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


def _check_delayed(
    h: _History, ops: list[Op], idempotent: bool
) -> tuple[CheckReport, dict[str, Any]]:
    from chaos.checker import _Findings

    f = _Findings(
        "delayed-lost", "delayed-early", "delayed-duplicate", "delayed-late", "delayed-phantom"
    )
    sends = {op.value: op for op in ops if op.kind == "delayed-send" and op.value}
    status: dict[str, str] = {}
    for op in ops:
        if op.kind == "delayed-send" and op.value and status.get(op.value) != "ok":
            status[op.value] = op.status
    seen: dict[str, dict[int, Op]] = defaultdict(dict)
    for op in ops:
        if op.kind == "delayed-consume" and op.value is not None and op.offset is not None:
            seen[op.value].setdefault(op.offset, op)
    windows = _windows(h)
    lateness: list[int] = []
    quiet_checked = 0
    for value, at in seen.items():
        sent = sends.get(value)
        due = due_of(value)
        first = min(at.values(), key=lambda o: o.wall_ms or 0)
        if sent is None or due is None:
            f.add(
                "delayed-phantom",
                {
                    "value": value,
                    "offset": first.offset,
                    "explanation": f"{value!r} was delivered but never sent",
                },
            )
            continue
        if len(at) > 1 and idempotent:
            f.add(
                "delayed-duplicate",
                {
                    "value": value,
                    "offsets": sorted(at),
                    "explanation": f"{value!r} was delivered at offsets {sorted(at)} of "
                    f"partition {first.partition}: a delayed record moved twice",
                },
            )
        arrived = first.wall_ms
        if arrived is None or sent.wall_ms is None:
            continue
        late_ms = arrived - due
        lateness.append(late_ms)
        if late_ms < 0:
            f.add(
                "delayed-early",
                {
                    "value": value,
                    "offset": first.offset,
                    "early_ms": -late_ms,
                    "explanation": f"{value!r} arrived {-late_ms} ms before it was due",
                },
            )
            continue
        due_at = sent.start + (due - sent.wall_ms) / 1000
        if _quiet(windows, due_at, due_at + LATE_BOUND_MS / 1000):
            quiet_checked += 1
            if late_ms > LATE_BOUND_MS:
                f.add(
                    "delayed-late",
                    {
                        "value": value,
                        "offset": first.offset,
                        "late_ms": late_ms,
                        "explanation": f"{value!r} arrived {late_ms} ms after it was due, "
                        f"with no fault under way (bound {LATE_BOUND_MS} ms)",
                    },
                )
    acked = [v for v, s in status.items() if s == "ok"]
    for value in acked:
        if value not in seen:
            f.add(
                "delayed-lost",
                {
                    "value": value,
                    "partition": sends[value].partition,
                    "explanation": f"{value!r} was acknowledged but never delivered",
                },
            )
    counts: dict[str, float] = {
        "sent_acked": len(acked),
        "sent_indeterminate": sum(1 for s in status.values() if s == "info"),
        "delivered": len(seen),
        "late_checked": quiet_checked,
        "lateness_p50_ms": _percentile(lateness, 0.5),
        "lateness_p99_ms": _percentile(lateness, 0.99),
        "lateness_max_ms": max(lateness, default=0),
    }
    if not idempotent:
        f.counts.pop("delayed-duplicate")
    report = f.report(
        "delayed",
        "every acknowledged delayed record is delivered"
        + (" once" if idempotent else "")
        + f", never early, and outside faults at most {LATE_BOUND_MS} ms late",
        counts,
    )
    return report, counts


def _seq(value: str) -> int | None:
    last = value.rsplit(":", 1)[-1]
    return int(last) if last.isdigit() else None


def _check_tags(h: _History, ops: list[Op]) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("tag-mismatch", "tag-missed")
    consumed: dict[int, set[int]] = defaultdict(set)
    for op in ops:
        if op.kind != "tag-consume" or op.value is None or op.offset is None:
            continue
        consumed[op.partition].add(op.offset)
        seq = _seq(op.value)
        if not op.value.startswith("producer-") or seq is None or not matches(seq):
            f.add(
                "tag-mismatch",
                {
                    "partition": op.partition,
                    "offset": op.offset,
                    "value": op.value,
                    "explanation": f"{op.value!r} at partition {op.partition} offset "
                    f"{op.offset} does not match {TAG_FILTER!r} but was delivered",
                },
            )
    stopped = {
        op.partition: op.offset for op in ops if op.kind == "tag-position" and op.offset is not None
    }
    for partition, offsets in consumed.items():
        stopped.setdefault(partition, max(offsets) + 1)
    checked = 0
    for op in h.acks:
        seq = _seq(op.value or "")
        if not op.process.startswith("producer-") or seq is None or not matches(seq):
            continue
        offset = op.offset if op.offset is not None else -1
        if offset >= stopped.get(op.partition, 0) or h.unreadable(op.partition, offset):
            continue
        checked += 1
        if offset not in consumed[op.partition]:
            f.add(
                "tag-missed",
                {
                    "partition": op.partition,
                    "offset": offset,
                    "value": op.value,
                    "explanation": f"{op.value!r} at partition {op.partition} offset {offset} "
                    f"matches {TAG_FILTER!r} and lies below where the filtered consumer "
                    f"stopped ({stopped.get(op.partition)}), but it never got it",
                },
            )
    return f.report(
        "tag-filter",
        f"a consumer filtering {TAG_FILTER!r} gets every matching record and no other",
        {
            "consumed": sum(len(v) for v in consumed.values()),
            "matching_checked": checked,
            "partitions": len(stopped),
        },
    )


def _check_consumers(h: _History) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("feature-consumer-broke")
    for op in h.feature_ops:
        if op.kind == "feature-error":
            f.add(
                "feature-consumer-broke",
                {
                    "process": op.process,
                    "at": op.start,
                    "error": op.error,
                    "explanation": f"{op.process} raised out of poll at {op.start:.1f} s: "
                    f"{op.error}",
                },
            )
    return f.report(
        "feature-consumers",
        "the delayed and filtered consumers ride out every fault",
        {"errors": sum(1 for op in h.feature_ops if op.kind == "feature-error")},
    )
