"""The entry: the one unit the log stores, Raft replicates and clients exchange.

An entry is a fixed 74-byte header followed by an opaque payload. The byte layout is
specified in ``docs/format.md``; this module is its only implementation. The payload is
never decoded here: the hot paths (append, replicate, fetch) touch headers only, and the
CRC is checked over whole entries with one hardware CRC32C call.

The header fields a leader assigns (Raft index and term, base offset) sit *after* the CRC,
so they are protected by it: a flipped bit in a term is caught like a flipped bit in a
value. The leader therefore recomputes the CRC when it stamps a producer's batch
(:func:`stamp`); at ~25 GB/s that costs microseconds per batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

from crc32c import crc32c

from raftmq.format.errors import CorruptEntryError, InvalidEntryError

MAGIC = 1
"""Format version in every header; a reader refuses versions it does not know."""

_HEADER_FULL = struct.Struct(">II BBH qqq i qq q hi i")
"""length, crc | magic, type, attributes | index, term, base_offset | record_count |
first_timestamp, max_timestamp | producer_id, producer_epoch, base_sequence |
payload_length: all big-endian, see docs/format.md."""
HEADER_SIZE = _HEADER_FULL.size  # 74
assert HEADER_SIZE == 74

_LEN_CRC = struct.Struct(">II")
_STAMP = struct.Struct(">qqq")
_STAMP_AT = 12  # byte position of index, term, base_offset
_CRC_FROM = 8  # the CRC covers every byte from here to the end of the entry
_LENGTH_BIAS = HEADER_SIZE - 4  # length counts the bytes after the length field itself

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
MAX_SEQUENCE = (1 << 31) - 1
"""The last record of a batch may carry at most this sequence: base_sequence is a signed
32-bit header field, and producers and brokers must agree where it ends."""


class EntryType(IntEnum):
    """What an entry carries. Only DATA entries take message offsets."""

    DATA = 0
    NOOP = 1  # a new leader's first entry of its term
    CONFIG = 2  # a Raft membership configuration
    TXN_MARKER = 3  # ends a producer's transaction on a partition (COMMIT or ABORT)
    METADATA = 4  # a controller command (opaque to the log)
    SHARE_STATE = 5  # a share group's change to a share-partition (raftmq/format/share_ops.py)


# attributes bits
CODEC_MASK = (
    0x07  # 0 none; the codec ids follow Kafka's numbering (1 gzip, 2 snappy, 3 lz4, 4 zstd)
)
TIMESTAMP_LOG_APPEND = 0x08  # timestamps were set by the broker, not the producer
TRANSACTIONAL = 0x10  # the DATA entry belongs to an open transaction of its producer
TAGGED = 0x20  # the DATA entry's payload starts with a tag block (raftmq/format/tags.py)
_KNOWN_ATTRIBUTES = CODEC_MASK | TIMESTAMP_LOG_APPEND | TRANSACTIONAL | TAGGED

MAX_ENTRY_BYTES = 64 * 1024 * 1024
"""Hard cap of the format. ``max.message.bytes`` is configured below it, and a scan treats a
larger declared length as corruption instead of reading gigabytes on a flipped bit."""
MAX_PAYLOAD = MAX_ENTRY_BYTES - HEADER_SIZE


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """A decoded header plus where its entry sits in the buffer it was parsed from."""

    position: int
    size: int  # whole entry: header + payload
    crc: int
    type: EntryType
    attributes: int
    index: int
    term: int
    base_offset: int
    record_count: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    payload_length: int

    @property
    def next_offset(self) -> int:
        """The first message offset after this entry (control entries take none)."""
        return self.base_offset + self.record_count

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1

    @property
    def end(self) -> int:
        return self.position + self.size


def encode(
    payload: bytes,
    *,
    type: EntryType = EntryType.DATA,
    index: int = 0,
    term: int = 0,
    base_offset: int = 0,
    record_count: int = 0,
    first_timestamp: int = 0,
    max_timestamp: int = 0,
    attributes: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
) -> bytes:
    """Build one entry with a valid CRC. Producers call it with index/term/offset zero."""
    if type != EntryType.DATA and record_count != 0:
        raise InvalidEntryError(f"a {type.name} entry carries no records, got {record_count}")
    if type == EntryType.DATA and record_count <= 0:
        raise InvalidEntryError("a DATA entry must hold at least one record")
    if len(payload) > MAX_PAYLOAD:
        raise InvalidEntryError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    header = bytearray(HEADER_SIZE)
    _HEADER_FULL.pack_into(
        header,
        0,
        _LENGTH_BIAS + len(payload),
        0,
        MAGIC,
        int(type),
        attributes,
        index,
        term,
        base_offset,
        record_count,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(payload),
    )
    crc = crc32c(payload, crc32c(memoryview(header)[_CRC_FROM:]))
    struct.pack_into(">I", header, 4, crc)
    return bytes(header) + payload


HeaderFields = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int]
"""The header's fields in stored order (``_HEADER_FULL``): (length, crc, magic, type,
attributes, index, term, base_offset, record_count, first_timestamp, max_timestamp,
producer_id, producer_epoch, base_sequence, payload_length). ``length`` counts the bytes
after itself, so an entry's size is ``length + 4``."""

_TYPES = frozenset(int(t) for t in EntryType)
_DATA = int(EntryType.DATA)  # a plain int: comparing with the enum member costs more per entry


def decode_header(buf: bytes | bytearray | memoryview, position: int = 0) -> HeaderFields:
    """Decode and check the header at ``position`` into the plain tuple that ``struct``
    makes (no payload, no CRC).

    The append path validates every entry with it and needs no object per entry, so the
    tuple is returned as unpacked; everyone else calls :func:`parse_header`, which wraps
    the same fields. Raises InvalidEntryError if the header is cut short or internally
    inconsistent; a caller scanning a file treats that as a torn or corrupt tail.
    """
    available = len(buf) - position
    if available < HEADER_SIZE:
        raise InvalidEntryError(
            f"truncated entry header at byte {position}: {available} of {HEADER_SIZE} bytes"
        )
    fields = _HEADER_FULL.unpack_from(buf, position)
    length, _, magic, etype, attributes, _, _, _, record_count, _, _, _, _, _, payload_length = (
        fields
    )
    if length > MAX_ENTRY_BYTES - 4:
        raise InvalidEntryError(
            f"entry at byte {position} declares a length of {length} bytes; the format caps an "
            f"entry at {MAX_ENTRY_BYTES} bytes (length {MAX_ENTRY_BYTES - 4})"
        )
    if magic != MAGIC:
        raise InvalidEntryError(f"unknown entry format version {magic} at byte {position}")
    if length != _LENGTH_BIAS + payload_length:
        raise InvalidEntryError(
            f"entry at byte {position} declares length {length} but payload {payload_length}"
        )
    if etype not in _TYPES:
        raise InvalidEntryError(f"unknown entry type {etype} at byte {position}")
    if attributes & ~_KNOWN_ATTRIBUTES:
        raise InvalidEntryError(f"unknown attribute bits {attributes:#x} at byte {position}")
    if record_count < 0 or (etype == _DATA) != (record_count > 0):
        raise InvalidEntryError(
            f"{EntryType(etype).name} entry at byte {position} has record count {record_count}"
        )
    return fields


def parse_header(buf: bytes | bytearray | memoryview, position: int = 0) -> EntryHeader:
    """The header at ``position`` as an :class:`EntryHeader` (see :func:`decode_header`)."""
    return _header_of(position, decode_header(buf, position))


def _header_of(position: int, f: HeaderFields) -> EntryHeader:
    return EntryHeader(position, f[0] + 4, f[1], EntryType(f[3]), *f[4:])


_FRAME = struct.Struct(">II B x 2x qqq i")  # length, crc, magic, index, term, offset, count
_MIN_LENGTH = _LENGTH_BIAS
_MAX_LENGTH = MAX_ENTRY_BYTES - 4


def frame_at(buf: bytes | bytearray | memoryview, position: int) -> tuple[int, int, int, int, int]:
    """(size, crc, index, base_offset, record_count) of the entry at ``position``.

    The hot-path twin of :func:`parse_header`: reads and fetches walk thousands of entries
    whose CRC was checked on the way in, and need only their framing and positions; one
    ``unpack_from`` and two comparisons instead of a full decode. Raises InvalidEntryError
    on a header that cannot be an entry (wrong version, impossible length).
    """
    if len(buf) - position < HEADER_SIZE:
        raise InvalidEntryError(
            f"truncated entry header at byte {position}: {len(buf) - position} of {HEADER_SIZE}"
        )
    length, crc, magic, index, _term, base_offset, count = _FRAME.unpack_from(buf, position)
    if magic != MAGIC or not _MIN_LENGTH <= length <= _MAX_LENGTH or count < 0:
        raise InvalidEntryError(f"no valid entry header at byte {position}")
    return length + 4, crc, index, base_offset, count


def crc_matches(buf: bytes | bytearray | memoryview, position: int, size: int, crc: int) -> bool:
    return crc32c(memoryview(buf)[position + _CRC_FROM : position + size]) == crc


def first_bad_entry(buf: bytes, start: int = 0) -> tuple[int, str] | None:
    """CRC-check the whole entries from ``start`` to the end of ``buf``: None when all are
    sound, else (position, why) of the first that is not.

    For the first read of a closed segment's bytes, which recovery leaves unchecked: the
    caller knows from the segment's index that ``buf`` ends at an entry boundary, so the
    walk needs only each entry's length and CRC, not the decisions a bounded read makes
    per entry (those cost more than the CRC of a 64 KiB entry).
    """
    view = memoryview(buf)
    position, end = start, len(buf)
    while position < end:
        if end - position < HEADER_SIZE:
            return position, f"a partial entry header ({end - position} bytes) ends the read"
        length, crc = _LEN_CRC.unpack_from(buf, position)
        size = length + 4
        if not _MIN_LENGTH <= length <= _MAX_LENGTH or position + size > end:
            return position, "no valid entry header"
        if crc32c(view[position + _CRC_FROM : position + size]) != crc:
            return position, "CRC mismatch"
        position += size
    return None


def entry_size_at(buf: bytes | bytearray | memoryview, position: int) -> int:
    """Size of the entry at ``position`` from its length field alone (cheap framing)."""
    (length,) = struct.unpack_from(">I", buf, position)
    return length + 4


def crc_ok(buf: bytes | bytearray | memoryview, header: EntryHeader) -> bool:
    return crc_matches(buf, header.position, header.size, header.crc)


def iter_fields(
    buf: bytes | bytearray | memoryview, *, verify: bool = True, base: int = 0
) -> Iterator[tuple[int, HeaderFields]]:
    """Walk the whole entries in ``buf`` as (position, header tuple); raise on anything
    that is not a clean entry. The tuple form is for hot paths (Raft splits every append
    with it); :func:`iter_headers` wraps the same walk in objects.

    ``base`` is added to positions in error messages so they name file positions.
    """
    view = memoryview(buf)
    position = 0
    end = len(buf)
    while position < end:
        fields = decode_header(view, position)
        size = fields[0] + 4
        if position + size > end:
            raise InvalidEntryError(
                f"entry at byte {base + position} needs {size} bytes, only {end - position} present"
            )
        if verify and not crc_matches(view, position, size, fields[1]):
            raise CorruptEntryError(
                f"CRC mismatch in entry at byte {base + position} (index {fields[5]})",
                position=base + position,
            )
        yield position, fields
        position += size


def iter_headers(
    buf: bytes | bytearray | memoryview, *, verify: bool = True, base: int = 0
) -> Iterator[EntryHeader]:
    """Walk the whole entries in ``buf`` as :class:`EntryHeader` objects (see
    :func:`iter_fields`)."""
    for position, f in iter_fields(buf, verify=verify, base=base):
        yield _header_of(position, f)


def stamp(
    entry: bytes | bytearray | memoryview, *, index: int, term: int, base_offset: int
) -> bytes:
    """Assign a leader's index, term and base offset to a verified entry; recompute its CRC.

    The caller has already checked the incoming CRC (through :func:`iter_headers`).

    Only the header is rebuilt; the payload is copied once, into the result (a leader
    stamps every produced entry, so a copy into a scratch buffer and another out of it
    were two passes over every byte produced).
    """
    payload = memoryview(entry)[HEADER_SIZE:]
    header = bytearray(memoryview(entry)[:HEADER_SIZE])
    _STAMP.pack_into(header, _STAMP_AT, index, term, base_offset)
    crc = crc32c(payload, crc32c(memoryview(header)[_CRC_FROM:]))
    _LEN_CRC.pack_into(header, 0, len(entry) - 4, crc)
    return b"".join((header, payload))


def payload_of(buf: bytes | bytearray | memoryview, header: EntryHeader) -> memoryview:
    """The whole payload (a DATA entry's tag block included: readers of records use
    ``tags.records_region``)."""
    return memoryview(buf)[header.position + HEADER_SIZE : header.end]


# -- transaction markers -------------------------------------------------------------------

_MARKER = struct.Struct(">hh")
"""A TXN_MARKER's payload: version (0), then 0 ABORT or 1 COMMIT (Kafka's control key)."""
MARKER_ABORT = 0
MARKER_COMMIT = 1


def encode_marker(
    *, commit: bool, producer_id: int, producer_epoch: int, timestamp_ms: int
) -> bytes:
    """A TXN_MARKER entry as a partition leader proposes it (index, term and offset 0: the
    log stamps them). It carries no records, so it takes no offset: its base_offset is the
    offset of the next record, as for every control entry."""
    if producer_id < 0 or producer_epoch < 0:
        raise InvalidEntryError(
            f"a marker needs a producer, got id {producer_id} epoch {producer_epoch}"
        )
    return encode(
        _MARKER.pack(0, MARKER_COMMIT if commit else MARKER_ABORT),
        type=EntryType.TXN_MARKER,
        first_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )


def marker_commits(payload: bytes | bytearray | memoryview) -> bool:
    """Whether a TXN_MARKER's payload says COMMIT (else ABORT). Raises InvalidEntryError on
    any other payload."""
    if len(payload) != _MARKER.size:
        raise InvalidEntryError(f"a marker's payload is {_MARKER.size} bytes, got {len(payload)}")
    version, kind = _MARKER.unpack_from(payload)
    if version != 0 or kind not in (MARKER_ABORT, MARKER_COMMIT):
        raise InvalidEntryError(f"unknown marker version {version} or kind {kind}")
    return kind == MARKER_COMMIT
