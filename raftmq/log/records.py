"""The records inside a DATA entry's payload: built by producers, read by consumers and
tools, never by the broker's produce or fetch path.

Layout (docs/format.md, "Records"): each record is a varint length followed by attributes,
timestamp delta and offset delta (relative to the entry header), key, value and headers.
Tags are headers named ``tag``; a delayed message carries a ``deliver-at`` header.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from raftmq.log import entry
from raftmq.log.entry import EntryHeader, EntryType
from raftmq.log.errors import InvalidEntryError

MAX_HEADERS = 1024


@dataclass(frozen=True, slots=True)
class Record:
    key: bytes | None
    value: bytes | None
    timestamp: int = 0
    headers: tuple[tuple[str, bytes | None], ...] = ()
    offset: int = -1  # known once read back from a log


@dataclass(slots=True)
class _Cursor:
    buf: memoryview
    pos: int
    end: int


def _put_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise ValueError(f"uvarint cannot encode {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_varint(out: bytearray, value: int) -> None:
    _put_uvarint(out, (value << 1) ^ (value >> 63))  # zigzag, as in protobuf and Kafka


def _get_uvarint(c: _Cursor) -> int:
    result = shift = 0
    while True:
        if c.pos >= c.end:
            raise InvalidEntryError("record payload ends inside a varint")
        b = c.buf[c.pos]
        c.pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise InvalidEntryError("varint longer than 10 bytes in record payload")


def _get_varint(c: _Cursor) -> int:
    raw = _get_uvarint(c)
    return (raw >> 1) ^ -(raw & 1)


def _put_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _put_varint(out, -1)
        return
    _put_varint(out, len(data))
    out += data


def _get_bytes(c: _Cursor) -> bytes | None:
    n = _get_varint(c)
    if n < 0:
        return None
    if c.pos + n > c.end:
        raise InvalidEntryError("record field runs past the end of the record")
    data = bytes(c.buf[c.pos : c.pos + n])
    c.pos += n
    return data


def encode_records(records: Sequence[Record], *, base_timestamp: int) -> bytes:
    """The payload for ``records``; timestamps are stored as deltas from ``base_timestamp``."""
    out = bytearray()
    body = bytearray()
    for delta, rec in enumerate(records):
        if len(rec.headers) > MAX_HEADERS:
            raise ValueError(f"a record may carry at most {MAX_HEADERS} headers")
        body.clear()
        body.append(0)  # attributes: reserved
        _put_varint(body, rec.timestamp - base_timestamp)
        _put_uvarint(body, delta)
        _put_bytes(body, rec.key)
        _put_bytes(body, rec.value)
        _put_uvarint(body, len(rec.headers))
        for name, value in rec.headers:
            encoded = name.encode()
            _put_uvarint(body, len(encoded))
            body += encoded
            _put_bytes(body, value)
        _put_uvarint(out, len(body))
        out += body
    return bytes(out)


def build_batch(
    records: Sequence[Record],
    *,
    producer_id: int = entry.NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = entry.NO_SEQUENCE,
    attributes: int = 0,
) -> bytes:
    """A producer's DATA entry for ``records`` (index, term and offset left for the leader)."""
    if not records:
        raise ValueError("a batch needs at least one record")
    stamps = [r.timestamp for r in records]
    first = stamps[0]
    return entry.encode(
        encode_records(records, base_timestamp=first),
        record_count=len(records),
        first_timestamp=first,
        max_timestamp=max(stamps),
        attributes=attributes,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def decode_records(buf: bytes | bytearray | memoryview, header: EntryHeader) -> list[Record]:
    """The records of the DATA entry described by ``header`` inside ``buf``."""
    if header.type != EntryType.DATA:
        return []
    payload = entry.payload_of(buf, header)
    c = _Cursor(payload, 0, len(payload))
    records = []
    while c.pos < c.end:
        length = _get_uvarint(c)
        stop = c.pos + length
        if stop > c.end:
            raise InvalidEntryError(f"record of {length} bytes runs past the entry payload")
        inner = _Cursor(c.buf, c.pos, stop)
        inner.pos += 1  # attributes
        ts = header.first_timestamp + _get_varint(inner)
        offset = header.base_offset + _get_uvarint(inner)
        key = _get_bytes(inner)
        value = _get_bytes(inner)
        count = _get_uvarint(inner)
        if count > MAX_HEADERS:
            raise InvalidEntryError(f"record declares {count} headers, over {MAX_HEADERS}")
        headers = []
        for _ in range(count):
            n = _get_uvarint(inner)
            if inner.pos + n > inner.end:
                raise InvalidEntryError("header name runs past the end of the record")
            name = bytes(inner.buf[inner.pos : inner.pos + n]).decode()
            inner.pos += n
            headers.append((name, _get_bytes(inner)))
        records.append(Record(key, value, ts, tuple(headers), offset))
        c.pos = stop
    if len(records) != header.record_count:
        raise InvalidEntryError(
            f"entry declares {header.record_count} records but its payload holds {len(records)}"
        )
    return records


def iter_records(buf: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Every record of every DATA entry in a buffer of whole entries (e.g. a fetch answer)."""
    for header in entry.iter_headers(buf):
        yield from decode_records(buf, header)


def records_from_values(values: Iterable[bytes], *, timestamp: int) -> list[Record]:
    return [Record(None, v, timestamp) for v in values]
