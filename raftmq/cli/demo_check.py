"""How ``raftmq demo`` tells its own records from everyone else's and says what differs.

Every record a demo run writes carries the header ``raftmq-demo-run`` = the run's id (8
random bytes). The check looks only at the offsets the broker acknowledged for this run
and at records carrying this run's id: records of other writers in the same topic (a
second demo, ``raftmq dev``'s own demo, any producer) are not this run's business.
Why: a check that compared everything it read with what it wrote failed whenever two
demos shared a topic, and then said only "differs".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.format.records import Record

RUN_HEADER = "raftmq-demo-run"
SHOWN_BYTES = 24
"""How much of a value a report quotes."""


def new_run_id() -> bytes:
    return os.urandom(8)


def run_of(record: Record) -> bytes | None:
    """The demo run id a record carries, None when it carries none."""
    for name, value in record.headers:
        if name == RUN_HEADER:
            return value
    return None


def shown(value: bytes | None) -> str:
    """``value`` as a report quotes it: at most SHOWN_BYTES, then its length."""
    if value is None:
        return "null"
    if len(value) <= SHOWN_BYTES:
        return repr(value)
    return f"{value[:SHOWN_BYTES]!r}... ({len(value)} bytes)"


@dataclass
class PartitionCheck:
    """What one partition holds of one run, against what the broker acknowledged."""

    partition: int
    run_id: bytes
    produced: int
    read_back: int = 0
    missing: list[int] = field(default_factory=list)
    """Acknowledged offsets at which no record was read."""
    differing: list[tuple[int, bytes, Record]] = field(default_factory=list)
    """(offset, the value written, the record found there instead)."""
    duplicates: list[int] = field(default_factory=list)
    """Offsets holding a record of this run that was acknowledged elsewhere (or not at
    all): a second copy, e.g. from a retried write."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.differing or self.duplicates)

    def problems(self, limit: int = 10) -> list[str]:
        """Sentences naming the partition, offset, expected and found, at most ``limit``."""
        p = self.partition
        out = []
        for offset, expected, found in self.differing[:limit]:
            whose = "" if run_of(found) == self.run_id else " (another writer's record)"
            out.append(
                f"partition {p} offset {offset}: expected {shown(expected)}, "
                f"found {shown(found.value)}{whose}"
            )
        if self.missing:
            first = ", ".join(map(str, self.missing[:limit]))
            more = f" and {len(self.missing) - limit} more" if len(self.missing) > limit else ""
            out.append(
                f"partition {p}: {len(self.missing)} acknowledged records missing, "
                f"at offsets {first}{more}"
            )
        if self.duplicates:
            first = ", ".join(map(str, self.duplicates[:limit]))
            out.append(
                f"partition {p}: {len(self.duplicates)} duplicates of this run's records, "
                f"at offsets {first}"
            )
        return out


def check_partition(
    partition: int, run_id: bytes, written: list[tuple[int, bytes]], read: Iterable[Record]
) -> PartitionCheck:
    """Compare what the broker acknowledged for this run (``written``: offset and value of
    each record) with the records read back over that range."""
    at = {r.offset: r for r in read}
    check = PartitionCheck(partition, run_id, len(written))
    expected_at = dict(written)
    for offset, value in written:
        found = at.get(offset)
        if found is None:
            check.missing.append(offset)
        elif run_of(found) != run_id or found.value != value:
            check.differing.append((offset, value, found))
        else:
            check.read_back += 1
    first_seen: dict[bytes | None, int] = {}
    for offset in sorted(at):
        record = at[offset]
        if run_of(record) != run_id:
            continue  # another writer's: not ours to check
        if offset not in expected_at or record.value in first_seen:
            check.duplicates.append(offset)
        first_seen.setdefault(record.value, offset)
    return check
