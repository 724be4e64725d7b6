"""The durable log as the core sees it, and an in-memory version for the simulator.

The protocol names match ``raftmq.log.log.Log`` so the real segmented log plugs in
unchanged. The core only *reads* storage; all writes are the driver's, made while it
handles a Ready, so the driver alone decides what is durable and when.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from raftmq.format import entry
from raftmq.log.errors import NotContiguousError, OutOfRangeError


class Storage(Protocol):
    @property
    def start_index(self) -> int: ...

    @property
    def last_index(self) -> int: ...

    @property
    def next_offset(self) -> int: ...

    def term_at(self, index: int) -> int: ...

    def read_entries(self, lo: int, max_bytes: int, hi: int | None = None) -> bytes: ...

    def append(self, buf: bytes, *, crc_checked: bool = False) -> object: ...

    def truncate_suffix(self, index: int) -> None: ...

    def truncate_prefix(
        self, index: int, *, offset: int | None = None, prev_term: int | None = None
    ) -> None: ...


@dataclass(slots=True)
class _State:
    start_index: int = 1
    prev_term: int = 0
    start_offset: int = 0
    entries: list[bytes] = field(default_factory=list)
    terms: list[int] = field(default_factory=list)
    next_offsets: list[int] = field(default_factory=list)

    def copy(self) -> _State:
        return _State(
            self.start_index,
            self.prev_term,
            self.start_offset,
            list(self.entries),
            list(self.terms),
            list(self.next_offsets),
        )


class MemoryStorage:
    """Storage in memory with an explicit durability line.

    Writes are visible at once (as in a page cache) but survive :meth:`crash` only after
    :meth:`sync`. That lets the simulator model exactly what a power cut loses.
    """

    def __init__(self) -> None:
        self._s = _State()
        self._durable = self._s.copy()
        self._ops: list[tuple[str, tuple[object, ...]]] = []
        self.syncs = 0

    # --- reads -----------------------------------------------------------------
    @property
    def start_index(self) -> int:
        return self._s.start_index

    @property
    def last_index(self) -> int:
        return self._s.start_index + len(self._s.entries) - 1

    @property
    def next_offset(self) -> int:
        return self._s.next_offsets[-1] if self._s.entries else self._s.start_offset

    def term_at(self, index: int) -> int:
        s = self._s
        if index == s.start_index - 1:
            return s.prev_term
        if not s.start_index <= index <= self.last_index:
            raise OutOfRangeError(
                f"term of index {index} outside [{s.start_index - 1}, {self.last_index}]",
                start=s.start_index,
                end=self.last_index + 1,
            )
        return s.terms[index - s.start_index]

    def read_entries(self, lo: int, max_bytes: int, hi: int | None = None) -> bytes:
        s = self._s
        end = self.last_index + 1 if hi is None else hi
        if not s.start_index <= lo < end <= self.last_index + 1:
            raise OutOfRangeError(
                f"read [{lo}, {end}) outside [{s.start_index}, {self.last_index + 1})",
                start=s.start_index,
                end=self.last_index + 1,
            )
        out: list[bytes] = []
        size = 0
        for i in range(lo - s.start_index, end - s.start_index):
            e = s.entries[i]
            if out and size + len(e) > max_bytes:
                break
            out.append(e)
            size += len(e)
        return b"".join(out)

    def offset_at(self, index: int) -> int:
        """Message offset of the first record at or after ``index``."""
        s = self._s
        if index == s.start_index:
            return s.start_offset
        return s.next_offsets[index - s.start_index - 1]

    # --- writes ----------------------------------------------------------------
    def append(self, buf: bytes, *, crc_checked: bool = False) -> int:
        self._ops.append(("append", (buf,)))
        s = self._s
        for h in entry.iter_headers(buf, verify=not crc_checked):
            if h.index != self.last_index + 1:
                raise NotContiguousError(f"append of index {h.index} after {self.last_index}")
            if h.base_offset != self.next_offset:
                raise NotContiguousError(
                    f"append of offset {h.base_offset} at index {h.index}, "
                    f"expected {self.next_offset}"
                )
            assert h.term >= (s.terms[-1] if s.terms else s.prev_term), "terms never decrease"
            s.entries.append(bytes(buf[h.position : h.end]))
            s.terms.append(h.term)
            s.next_offsets.append(h.next_offset)
        return self.last_index

    def truncate_suffix(self, index: int) -> None:
        self._ops.append(("truncate_suffix", (index,)))
        s = self._s
        if index < s.start_index:
            raise OutOfRangeError(
                f"cannot truncate below start {s.start_index}",
                start=s.start_index,
                end=self.last_index + 1,
            )
        keep = index - s.start_index
        del s.entries[keep:], s.terms[keep:], s.next_offsets[keep:]

    def truncate_prefix(
        self, index: int, *, offset: int | None = None, prev_term: int | None = None
    ) -> None:
        self._ops.append(("truncate_prefix", (index, offset, prev_term)))
        s = self._s
        if index <= s.start_index:
            return
        if index == self.last_index + 1 and offset is None:
            offset, prev_term = self.next_offset, self.term_at(self.last_index)
        if index > self.last_index:
            assert offset is not None and prev_term is not None, "restart needs offset/term"
            s.entries.clear()
            s.terms.clear()
            s.next_offsets.clear()
            s.start_index, s.start_offset, s.prev_term = index, offset, prev_term
            return
        drop = index - s.start_index
        s.prev_term = s.terms[drop - 1]
        s.start_offset = s.next_offsets[drop - 1]
        del s.entries[:drop], s.terms[:drop], s.next_offsets[:drop]
        s.start_index = index

    # --- durability --------------------------------------------------------------
    def sync(self) -> None:
        """Make everything written so far survive a crash (an fsync)."""
        self._durable = self._s.copy()
        self._ops.clear()
        self.syncs += 1

    @property
    def unsynced_ops(self) -> int:
        return len(self._ops)

    def crash(self, keep_ops: int = 0) -> None:
        """Lose the writes since the last sync, as a power cut would.

        ``keep_ops`` of them (in order) happen to have reached the disk anyway: a
        crash may persist any prefix of unsynced writes, never a later write without
        an earlier one (the real log must uphold that ordering too, or recover a
        torn tail by CRC, which is equivalent).
        """
        ops = self._ops[:keep_ops]
        self._s = self._durable.copy()
        for name, args in ops:
            if name == "append":
                self.append(*args)  # type: ignore[arg-type]
            elif name == "truncate_suffix":
                self.truncate_suffix(*args)  # type: ignore[arg-type]
            else:
                index, offset, prev_term = args
                self.truncate_prefix(index, offset=offset, prev_term=prev_term)  # type: ignore[arg-type]
        self.sync()
