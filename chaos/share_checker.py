"""The checks of share groups under faults (chaos/share_workload.py; the ops are described
in chaos/history.py), reported with the other checks by chaos.checker.check.

- ``share-settled``: every acknowledged record is, by the end, accepted (a committed
  ACCEPT) or dead-lettered (in the group's dead-letter topic); poison records, which no
  member accepts, all dead-lettered (``share-lost``); nothing delivered that was never
  sent, and one offset always the same value (``share-phantom``).
- ``share-exclusive``: no record acquired by a member while another held it: a delivery
  arrives only after the previous holder's lock deadline or the start of its release
  (``share-double-acquired``); equal delivery counts for one record are two acquisitions
  of the same delivery, and are that too.
- ``share-delivery-counts``: a record's delivery counts grow with every delivery, never go
  back (``share-count-back``), and never pass the group's limit (``share-over-limit``).
- ``share-accepts-kept``: a record whose ACCEPT was committed is never delivered again and
  never dead-lettered (``share-accept-lost``), across any failover; a dead-lettered record
  was rejected or delivered up to the limit (``share-dead-lettered-early``).
- ``share-members``: no member's consumer raised (``share-member-broke``): it must ride
  out faults with its retries.

Clocks: ``wall_ms``, ``start_ms`` and lock deadlines are one machine's wall clock (the
members, the brokers and the workload run on it), so they compare directly.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from chaos.share_workload import DELIVERY_LIMIT, is_poison

if TYPE_CHECKING:
    from chaos.checker import CheckReport, _History
    from chaos.history import Op

Key = tuple[int, int]  # partition, offset


def share_reports(h: _History) -> tuple[list[CheckReport], dict[str, Any]]:
    ops = h.share_ops
    receives: dict[Key, list[Op]] = defaultdict(list)
    for op in ops:
        if op.kind == "share-receive" and op.offset is not None:
            receives[(op.partition, op.offset)].append(op)
    for seen in receives.values():
        seen.sort(key=lambda op: (op.wall_ms or 0, op.count or 0))
    acks = _acks_by_record(ops, "ok")
    maybe = _acks_by_record(ops, "info")  # of unknown outcome: applied, perhaps
    dead = {op.value for op in ops if op.kind == "share-dlq"}
    reports = [
        _check_settled(ops, receives, acks, maybe, dead),
        _check_exclusive(receives, {k: acks.get(k, []) + maybe.get(k, []) for k in receives}),
        _check_counts(receives),
        _check_accepts(ops, receives, acks, maybe),
        _check_members(ops),
    ]
    sends = [op for op in ops if op.kind == "share-send"]
    summary = {
        "sent_ok": sum(1 for op in sends if op.status == "ok"),
        "deliveries": sum(len(v) for v in receives.values()),
        "records_delivered": len(receives),
        "redeliveries": sum(len(v) - 1 for v in receives.values()),
        "accepted": sum(1 for v in acks.values() if any(a.value == "ACCEPT" for a in v)),
        "dead_lettered": len(dead),
        "crashes": sum(1 for op in ops if op.kind == "share-crash"),
    }
    return reports, summary


def _acks_by_record(ops: list[Op], status: str) -> dict[Key, list[Op]]:
    """The ``share-ack`` ops of ``status``, under each record their range covers."""
    by_record: dict[Key, list[Op]] = defaultdict(list)
    for op in ops:
        if op.kind == "share-ack" and op.status == status and op.offset is not None:
            last = op.last_offset if op.last_offset is not None else op.offset
            for offset in range(op.offset, last + 1):
                by_record[(op.partition, offset)].append(op)
    return by_record


def _check_settled(
    ops: list[Op],
    receives: dict[Key, list[Op]],
    acks: dict[Key, list[Op]],
    maybe: dict[Key, list[Op]],
    dead: set[str | None],
) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("share-lost", "share-phantom")
    value_at: dict[Key, str | None] = {}
    for key, seen in receives.items():
        values = {op.value for op in seen}
        value_at[key] = seen[0].value
        if len(values) > 1:
            f.add(
                "share-phantom",
                {
                    "partition": key[0],
                    "offset": key[1],
                    "values": sorted(v or "" for v in values),
                    "explanation": f"partition {key[0]} offset {key[1]} was delivered with "
                    f"different values: {sorted(v or '' for v in values)}",
                },
            )
    sent = {op.value for op in ops if op.kind == "share-send" and op.status != "fail"}
    for key, value in value_at.items():
        if value not in sent:
            f.add(
                "share-phantom",
                {
                    "partition": key[0],
                    "offset": key[1],
                    "value": value,
                    "explanation": f"{value!r} was delivered at partition {key[0]} offset "
                    f"{key[1]} but never sent",
                },
            )
    accepted_values = {
        value_at.get(key) for key, done in acks.items() if any(a.value == "ACCEPT" for a in done)
    }
    # An ACCEPT or REJECT of unknown outcome settled its record if nothing delivered it
    # again after it was sent (else it was accepted or rejected later, or it is lost).
    for key, unknown in maybe.items():
        settling = [a.start_ms or 0 for a in unknown if a.value in ("ACCEPT", "REJECT")]
        if settling and not any((r.wall_ms or 0) > min(settling) for r in receives.get(key, [])):
            accepted_values.add(value_at.get(key))
    checked = 0
    for op in ops:
        if op.kind != "share-send" or op.status != "ok":
            continue
        checked += 1
        value = op.value or ""
        if value in dead or (value in accepted_values and not is_poison(value)):
            continue
        delivered = [r for k, rs in receives.items() for r in rs if r.value == value]
        f.add(
            "share-lost",
            {
                "partition": op.partition,
                "offset": op.offset,
                "value": value,
                "deliveries": [
                    {"process": r.process, "count": r.count, "wall_ms": r.wall_ms}
                    for r in delivered[: DELIVERY_LIMIT + 2]
                ],
                "explanation": f"{value!r} (partition {op.partition} offset {op.offset}) was "
                "acknowledged to its producer but never "
                + (
                    "dead-lettered (it is poison: no member accepts it)"
                    if is_poison(value)
                    else "accepted nor dead-lettered"
                )
                + f"; delivered {len(delivered)} time(s)",
            },
        )
    return f.report(
        "share-settled",
        "every acknowledged record is accepted once or dead-lettered; nothing is invented",
        {"sent_ok": checked, "delivered": len(receives), "dead_lettered": len(dead)},
    )


def _hold_end(delivery: Op, acks: list[Op]) -> float:
    """When ``delivery``'s member stopped holding it at the latest: its lock deadline, or
    the start of a committed release/accept/reject of it sent after it arrived (the leader
    cannot have freed it before the request was sent)."""
    end = float(delivery.deadline_ms if delivery.deadline_ms is not None else 0)
    for a in acks:
        if (
            a.process == delivery.process
            and a.start_ms is not None
            and a.start_ms >= (delivery.wall_ms or 0)
        ):
            end = min(end, float(a.start_ms))
    return end


def _check_exclusive(receives: dict[Key, list[Op]], acks: dict[Key, list[Op]]) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("share-double-acquired")
    pairs = 0
    for key, seen in receives.items():
        for before, after in itertools.pairwise(seen):
            pairs += 1
            held_until = _hold_end(before, acks.get(key, []))
            same_delivery = before.count == after.count and before.process != after.process
            if (after.wall_ms or 0) < held_until or same_delivery:
                f.add(
                    "share-double-acquired",
                    {
                        "partition": key[0],
                        "offset": key[1],
                        "first": {
                            "process": before.process,
                            "count": before.count,
                            "wall_ms": before.wall_ms,
                            "deadline_ms": before.deadline_ms,
                        },
                        "second": {
                            "process": after.process,
                            "count": after.count,
                            "wall_ms": after.wall_ms,
                        },
                        "explanation": f"partition {key[0]} offset {key[1]}: {after.process} "
                        f"got it (delivery {after.count}) at {after.wall_ms} while "
                        f"{before.process} held it (delivery {before.count}) until "
                        f"{held_until:.0f}",
                    },
                )
    return f.report(
        "share-exclusive",
        "no record is acquired by two members at once, outside lock expiry",
        {"redeliveries_checked": pairs},
    )


def _check_counts(receives: dict[Key, list[Op]]) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("share-count-back", "share-over-limit")
    for key, seen in receives.items():
        for op in seen:
            if (op.count or 0) > DELIVERY_LIMIT:
                f.add(
                    "share-over-limit",
                    {
                        "partition": key[0],
                        "offset": key[1],
                        "count": op.count,
                        "process": op.process,
                        "explanation": f"partition {key[0]} offset {key[1]} was delivered a "
                        f"{op.count}th time; the group's limit is {DELIVERY_LIMIT}",
                    },
                )
        for before, after in itertools.pairwise(seen):
            if (after.count or 0) < (before.count or 0):
                f.add(
                    "share-count-back",
                    {
                        "partition": key[0],
                        "offset": key[1],
                        "counts": [op.count for op in seen],
                        "explanation": f"partition {key[0]} offset {key[1]}: delivery count "
                        f"{after.count} ({after.process}) came after {before.count} "
                        f"({before.process})",
                    },
                )
    return f.report(
        "share-delivery-counts",
        "delivery counts grow with each delivery and stay within the limit",
        {"records": len(receives)},
    )


def _check_accepts(
    ops: list[Op],
    receives: dict[Key, list[Op]],
    acks: dict[Key, list[Op]],
    maybe: dict[Key, list[Op]],
) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("share-accept-lost", "share-dead-lettered-early")
    accepted_at: dict[Key, Op] = {}
    for key, done in acks.items():
        accepts = [a for a in done if a.value == "ACCEPT"]
        if accepts:
            accepted_at[key] = min(accepts, key=lambda a: a.wall_ms or 0)
    for key, accept in accepted_at.items():
        for op in receives.get(key, []):
            if (op.wall_ms or 0) > (accept.wall_ms or 0):
                f.add(
                    "share-accept-lost",
                    {
                        "partition": key[0],
                        "offset": key[1],
                        "accepted_by": accept.process,
                        "accepted_ms": accept.wall_ms,
                        "delivered_to": op.process,
                        "delivered_ms": op.wall_ms,
                        "count": op.count,
                        "explanation": f"partition {key[0]} offset {key[1]} was accepted by "
                        f"{accept.process} (committed by {accept.wall_ms}) and delivered again "
                        f"to {op.process} at {op.wall_ms} (delivery {op.count})",
                    },
                )
    # A REJECT of unknown outcome may have been done: its dead letter is no surprise.
    rejected = {
        key
        for source in (acks, maybe)
        for key, done in source.items()
        if any(a.value == "REJECT" for a in done)
    }
    for op in ops:
        if op.kind != "share-dlq" or op.offset is None:
            continue
        key = (op.partition, op.offset)
        if key in accepted_at:
            f.add(
                "share-accept-lost",
                {
                    "partition": key[0],
                    "offset": key[1],
                    "value": op.value,
                    "explanation": f"partition {key[0]} offset {key[1]} was accepted by "
                    f"{accepted_at[key].process} and also dead-lettered",
                },
            )
        elif key not in rejected and (op.count or 0) < DELIVERY_LIMIT:
            f.add(
                "share-dead-lettered-early",
                {
                    "partition": key[0],
                    "offset": key[1],
                    "value": op.value,
                    "attempts": op.count,
                    "explanation": f"partition {key[0]} offset {key[1]} was dead-lettered "
                    f"after {op.count} deliveries and no committed REJECT; the limit is "
                    f"{DELIVERY_LIMIT}",
                },
            )
    return f.report(
        "share-accepts-kept",
        "a committed ACCEPT is kept across failover; dead letters only past the limit",
        {"accepted": len(accepted_at)},
    )


def _check_members(ops: list[Op]) -> CheckReport:
    from chaos.checker import _Findings

    f = _Findings("share-member-broke")
    for op in ops:
        if op.kind == "share-error":
            f.add(
                "share-member-broke",
                {
                    "process": op.process,
                    "at": op.start,
                    "error": op.error,
                    "explanation": f"{op.process}'s share consumer raised at {op.start:.1f} s: "
                    f"{op.error}",
                },
            )
    return f.report(
        "share-members",
        "share consumers ride out every fault",
        {"errors": sum(1 for op in ops if op.kind == "share-error")},
    )
