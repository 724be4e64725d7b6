"""The records inside a DATA entry's payload: built by producers, read by consumers and
tools. The broker never decodes them, but checks their framing on produce
(:func:`check_records`, which reads only the length prefixes).

Layout (docs/format.md, "Records"): each record is a varint length followed by attributes,
timestamp delta and offset delta (relative to the entry header), key, value and headers.
Tags are headers named ``tag`` (raftmq/format/tags.py: a tagged entry's payload starts
with their union, the tag block, before the records); a delayed message carries a
``deliver-at`` header.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from raftmq.format import compression, entry, tags
from raftmq.format.compression import Codec
from raftmq.format.entry import EntryHeader, EntryType
from raftmq.format.errors import InvalidEntryError
from raftmq.format.tags import InvalidTagsError

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


_U64 = 1 << 64


class _VarintError(InvalidEntryError):
    """A malformed varint; :func:`check_records` says which record holds it."""


def _uvarint_at(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the unsigned varint at ``pos``, which must end before
    ``end``: at most 10 bytes and a value that fits 64 bits, as protobuf and Kafka define it."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # the usual one-byte case, without the loop
            return b, pos + 1
    result = shift = 0
    while True:
        if pos >= end:
            raise _VarintError("a varint is cut short")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise _VarintError("a varint is longer than 10 bytes")
    if result >= _U64:
        raise _VarintError("a varint does not fit 64 bits")
    return result, pos


_MIN_RECORD_BYTES = 6  # attributes, timestamp delta, offset delta, key, value, header count


def _refuse_length(raw: int, n: int, field: str) -> None:
    """A zigzag length ``raw`` that is negative: refuse it unless it is -1 (null)."""
    if raw != 1:
        raise InvalidEntryError(
            f"record {n} has {field} length {(raw >> 1) ^ -1}; a length is -1 (null) or more"
        )


def _refuse_record_start(
    buf: bytes | bytearray | memoryview,
    start: int,
    pos: int,
    end: int,
    n: int,
    length: int,
    record_count: int,
) -> None:
    """Raise the error for a record whose length or attributes are wrong, or that should not
    be there at all (the slow path of :func:`check_records`)."""
    if n == record_count:
        raise InvalidEntryError(
            f"record_count is {record_count} but the payload holds more records "
            f"(record {n} starts at payload byte {pos - start})"
        )
    if pos + length > end:
        raise InvalidEntryError(
            f"record {n} declares {length} bytes but only {end - pos} remain in the payload"
        )
    if length < _MIN_RECORD_BYTES:
        raise InvalidEntryError(
            f"record {n} declares {length} bytes; a record takes at least {_MIN_RECORD_BYTES}"
        )
    raise InvalidEntryError(
        f"record {n} has attributes {buf[pos]}; record attributes are reserved and must be 0"
    )


def _walk_headers(
    buf: bytes | bytearray | memoryview, pos: int, stop: int, n: int, found: set[bytes] | None
) -> int:
    """Check the header count and headers of record ``n`` starting at ``pos``; the position
    after them. ``found``: collect the record's tags (headers named ``tag``) into it and
    check them against the limits of docs/format.md, "Tags" (the broker's produce check)."""
    count, pos = _uvarint_at(buf, pos, stop)
    if count > MAX_HEADERS:
        raise InvalidEntryError(
            f"record {n} declares {count} headers; a record carries at most {MAX_HEADERS}"
        )
    record_tags = 0
    for _ in range(count):
        size, pos = _uvarint_at(buf, pos, stop)
        if pos + size > stop:
            raise InvalidEntryError(f"record {n}'s header name runs past its end")
        name = buf[pos : pos + size]
        try:
            str(name, "utf-8")
        except UnicodeDecodeError:
            raise InvalidEntryError(f"record {n} has a header name that is not UTF-8") from None
        raw, pos = _uvarint_at(buf, pos + size, stop)
        if raw & 1:
            if found is not None and name == tags.TAG_HEADER_BYTES and raw == 1:
                raise InvalidTagsError(
                    f"record {n} has a tag header with a null value; a tag is 1 to "
                    f"{tags.MAX_TAG_BYTES} bytes of {tags.TAG_CHARACTERS}"
                )
            _refuse_length(raw, n, "header value")
        else:
            value_at = pos
            pos += raw >> 1
            if pos > stop:
                raise InvalidEntryError(f"record {n}'s header value runs past its end")
            if found is not None and name == tags.TAG_HEADER_BYTES:
                _collect_tag(bytes(buf[value_at:pos]), n, found)
                record_tags += 1
                if record_tags > tags.MAX_TAGS_PER_RECORD:
                    raise InvalidTagsError(
                        f"record {n} carries more than {tags.MAX_TAGS_PER_RECORD} tags; a "
                        f"record carries at most {tags.MAX_TAGS_PER_RECORD}"
                    )
    return pos


def _collect_tag(tag: bytes, n: int, found: set[bytes]) -> None:
    problem = tags.tag_problem(tag)
    if problem is not None:
        raise InvalidTagsError(f"record {n}: {problem}")
    found.add(tag)


def check_records(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    found: set[bytes] | None = None,
) -> None:
    """Check that ``buf[start:end]``, the payload of a DATA entry whose header declares
    ``record_count``, ``first_timestamp`` and ``max_timestamp``, holds exactly that many
    well-framed records (docs/format.md, "Records"); raise InvalidEntryError saying what is
    wrong otherwise.

    This is the one definition of record framing. The broker runs it on every produced
    entry without creating an object per record or copying a key or value (it reads only
    the varints and skips the bytes they measure, as Kafka's broker does), and
    :func:`decode_records` runs it before decoding: what a broker accepts a consumer can
    read, and what a consumer refuses no broker accepted.

    Rules: records fill the payload exactly and each record's fields fill its length
    exactly; record ``i`` has offset delta ``i``; the first record's timestamp delta is 0
    (``first_timestamp`` is its timestamp); ``max_timestamp`` equals the largest record
    timestamp; no record timestamp is negative; record attributes are 0; key and value
    lengths are -1 (null) or more; at most MAX_HEADERS headers; header names are UTF-8.
    ``found``: also collect the records' tags into it, checking each (the broker's check,
    :func:`check_payload`).
    """
    n, top, _, low = _walk_records(
        buf, start, end, record_count, (0, 0, 0), partial=False, found=found
    )
    _check_totals(n, top, low, record_count, first_timestamp, max_timestamp)


def check_payload(
    attributes: int,
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    *,
    check_tags: bool = True,
) -> None:
    """Check the payload ``buf[start:end]`` of a DATA entry with ``attributes``: its tag
    block when the tagged bit is set, then its records (:func:`check_records`, or
    :func:`check_compressed_records` as the codec bits say), and that the block is exactly
    the union of the records' tags, every tag within the limits (docs/format.md, "Tags").
    The check for a payload read from a request or a segment; raises InvalidTagsError for
    a rule about tags, InvalidEntryError for any other. ``check_tags`` False (an untagged
    entry stored before tag blocks existed): the tag rules are left out."""
    block: list[bytes] = []
    if attributes & entry.TAGGED:
        block, start = tags.read_block(buf, start, end)
    found: set[bytes] | None = set() if check_tags else None
    codec = attributes & entry.CODEC_MASK
    if codec:
        payload = memoryview(buf)[start:end]
        check_compressed_records(
            codec, payload, record_count, first_timestamp, max_timestamp, found
        )
    else:
        check_records(buf, start, end, record_count, first_timestamp, max_timestamp, found)
    if found is None:
        return
    if attributes & entry.TAGGED:
        if found != set(block):
            raise InvalidTagsError(
                f"the tag block lists {_names(block)} but the records carry the tags "
                f"{_names(found)}; the block is exactly the union of the records' tags"
            )
    elif found:
        raise InvalidTagsError(
            f"the records carry tags {_names(found)} but the tagged bit (0x20) is unset; an "
            "entry whose records carry tags sets it and starts its payload with their tag "
            'block (docs/format.md, "Tags")'
        )


def _names(found: Iterable[bytes]) -> str:
    """Tags for an error sentence: sorted, at most 8 named."""
    ordered = sorted(found)
    shown = ", ".join(repr(t.decode()) for t in ordered[:8])
    return f"[{shown}{', ...' if len(ordered) > 8 else ''}]"


def check_compressed_records(
    codec: int,
    payload: bytes | memoryview,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    found: set[bytes] | None = None,
) -> None:
    """:func:`check_records` for a compressed payload, decompressed a chunk at a time: the
    memory it takes is a chunk plus the largest record, not the payload, so a small request
    that inflates a lot costs the broker little (Kafka's broker validates the same way)."""
    window = bytearray()
    state = (0, 0, 0)  # records seen, largest and smallest timestamp delta
    for chunk in compression.iter_decompressed(codec, payload):
        window += chunk
        n, top, used, low = _walk_records(
            window, 0, len(window), record_count, state, partial=True, found=found
        )
        state = (n, top, low)
        del window[:used]
    n, top, _, low = _walk_records(
        window, 0, len(window), record_count, state, partial=False, found=found
    )
    _check_totals(n, top, low, record_count, first_timestamp, max_timestamp)


_LONGEST_VARINT = 10


def _walk_records(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    record_count: int,
    state: tuple[int, int, int],
    *,
    partial: bool,
    found: set[bytes] | None = None,
) -> tuple[int, int, int, int]:
    """Walk the records of ``buf[start:end]`` that follow the ``state`` (records seen,
    largest and smallest timestamp delta) of a walk so far; return the new state with the
    position where the walk stopped as (n, top, position, low). ``partial``: ``buf`` ends
    mid-payload (a decompressed chunk), so stop before a record that may not be whole."""
    # The hot loop of the produce path: one-byte varints are read inline, and a record's
    # fields are walked optimistically and compared with its declared length once at the
    # end (positions only move forward, so a field that ran past it is caught there).
    uv = _uvarint_at
    pos = start
    n, top, low = state
    limit = end - _LONGEST_VARINT if partial else end  # a length prefix may be cut short
    try:
        while pos < limit:
            rec = pos
            b = buf[pos]
            if b < 0x80:
                length = b
                pos += 1
            else:
                length, pos = uv(buf, pos, end)
            stop = pos + length
            if stop > end or n == record_count or length < _MIN_RECORD_BYTES or buf[pos]:
                if partial and stop > end and n < record_count:
                    pos = rec  # not whole yet: the next chunk brings the rest
                    break
                _refuse_record_start(buf, start, pos, end, n, length, record_count)
            b = buf[pos + 1]
            if b < 0x80:
                raw = b
                pos += 2
            else:
                raw, pos = uv(buf, pos + 1, end)
            delta = (raw >> 1) ^ -(raw & 1)
            if delta > top:
                top = delta
            elif delta < low:
                low = delta
            b = buf[pos]
            if b < 0x80:
                offset_delta = b
                pos += 1
            else:
                offset_delta, pos = uv(buf, pos, end)
            if offset_delta != n or (n == 0 and delta != 0):
                raise InvalidEntryError(
                    f"record {n} has offset delta {offset_delta}; record i must have offset delta i"
                    if offset_delta != n
                    else f"record 0 has timestamp delta {delta}; first_timestamp is the first "
                    "record's timestamp, so its delta must be 0"
                )
            b = buf[pos]  # key length
            if b < 0x80:
                raw = b
                pos += 1
            else:
                raw, pos = uv(buf, pos, end)
            if raw & 1:  # negative: only -1 (null) is allowed
                _refuse_length(raw, n, "key")
            else:
                pos += raw >> 1
            b = buf[pos]  # value length
            if b < 0x80:
                raw = b
                pos += 1
            else:
                raw, pos = uv(buf, pos, end)
            if raw & 1:
                _refuse_length(raw, n, "value")
            else:
                pos += raw >> 1
            b = buf[pos]
            if b:  # headers: rare, so read carefully
                pos = _walk_headers(buf, pos, stop, n, found)
            else:
                pos += 1
            if pos != stop:
                raise InvalidEntryError(
                    f"record {n} declares {length} bytes but its fields "
                    + (
                        f"end {stop - pos} bytes before that"
                        if pos < stop
                        else "run past that length"
                    )
                )
            n += 1
    except _VarintError as exc:
        raise InvalidEntryError(f"record {n}: {exc}") from None
    except IndexError:
        raise InvalidEntryError(f"record {n}'s fields run past the end of the payload") from None
    return n, top, pos, low


def _check_totals(
    n: int, top: int, low: int, record_count: int, first_timestamp: int, max_timestamp: int
) -> None:
    """What the whole payload must add up to, once every record is walked."""
    if n != record_count:
        raise InvalidEntryError(f"record_count is {record_count} but the payload holds {n} records")
    if first_timestamp + top != max_timestamp:
        raise InvalidEntryError(
            f"max_timestamp is {max_timestamp} but the largest record timestamp is "
            f"{first_timestamp + top}; max_timestamp must equal it"
        )
    if first_timestamp + low < 0:
        raise InvalidEntryError(
            f"a record has timestamp {first_timestamp + low}; timestamps are ms since the "
            "epoch and cannot be negative"
        )


def encode_records(
    records: Sequence[Record], *, base_timestamp: int, found: set[bytes] | None = None
) -> bytes:
    """The records region for ``records``; timestamps are stored as deltas from
    ``base_timestamp``. ``found``: collect the records' tags into it (build_batch's block)."""
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
            if name == tags.TAG_HEADER and found is not None:
                if value is None or tags.tag_problem(value) is not None:
                    raise ValueError(
                        f"record {delta}: "
                        + ("a tag is not null" if value is None else str(tags.tag_problem(value)))
                    )
                found.add(value)
        _put_uvarint(out, len(body))
        out += body
    return bytes(out)


def build_batch(
    records: Sequence[Record],
    *,
    producer_id: int = entry.NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = entry.NO_SEQUENCE,
    compression_codec: Codec = Codec.NONE,
    transactional: bool = False,
) -> bytes:
    """A producer's DATA entry for ``records`` (index, term and offset left for the leader),
    its records payload compressed with ``compression_codec`` (docs/format.md, "Codecs");
    ``transactional`` sets the attribute bit of a batch inside a transaction of its
    producer (docs/format.md, "Transaction markers"). Records with tags (headers named
    ``tag``) make a tagged entry: their union goes first, in the tag block (docs/format.md,
    "Tags")."""
    if not records:
        raise ValueError("a batch needs at least one record")
    stamps = [r.timestamp for r in records]
    if min(stamps) < 0:
        raise ValueError(f"record timestamp {min(stamps)} is negative; use ms since the epoch")
    first = stamps[0]
    found: set[bytes] = set()
    payload = encode_records(records, base_timestamp=first, found=found)
    if compression_codec != Codec.NONE:
        if len(payload) > compression.MAX_UNCOMPRESSED_PAYLOAD_BYTES:
            raise ValueError(
                f"the records take {len(payload)} bytes uncompressed; one entry holds at most "
                f"{compression.MAX_UNCOMPRESSED_PAYLOAD_BYTES}: build smaller batches"
            )
        payload = compression.compress(compression_codec, payload)
    attributes = int(compression_codec) | (entry.TRANSACTIONAL if transactional else 0)
    if found:
        try:
            payload = tags.encode_block(found) + payload
        except InvalidTagsError as exc:
            raise ValueError(str(exc)) from None
        attributes |= entry.TAGGED
    return entry.encode(
        payload,
        record_count=len(records),
        first_timestamp=first,
        max_timestamp=max(stamps),
        attributes=attributes,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def decode_records(buf: bytes | bytearray | memoryview, header: EntryHeader) -> list[Record]:
    """The records of the DATA entry described by ``header`` inside ``buf``.

    :func:`check_records` proves the framing first, so the decoding below reads without
    bounds checks, with one-byte varints inline: consumers (the Spark reader among them)
    decode every record they fetch, and this loop is most of their CPU."""
    if header.type != EntryType.DATA:
        return []
    payload = tags.records_region(buf, header)
    codec = header.attributes & entry.CODEC_MASK
    if codec:
        # The consumer takes the whole entry at once; the broker checked it inflates to
        # at most MAX_UNCOMPRESSED_PAYLOAD_BYTES, and iter_decompressed checks it again.
        payload = memoryview(compression.decompress(codec, payload))
    check_records(
        payload, 0, len(payload), header.record_count, header.first_timestamp, header.max_timestamp
    )
    # Slices of bytes are bytes: one copy per key or value, none for the walk.
    if codec:
        data, pos, end = payload.obj, 0, len(payload)
        assert isinstance(data, bytes)
    elif isinstance(buf, bytes):
        data, pos, end = buf, header.end - len(payload), header.end
    else:
        data, pos, end = bytes(payload), 0, len(payload)
    uv = _uvarint_at
    first_ts = header.first_timestamp
    offset = header.base_offset
    records = []
    while pos < end:
        b = data[pos]
        if b < 0x80:
            stop = pos + 1 + b
            pos += 2  # length and attributes
        elif data[pos + 1] < 0x80:  # two bytes: records of 128 B to 16 KiB
            stop = pos + 2 + ((b & 0x7F) | (data[pos + 1] << 7))
            pos += 3
        else:
            length, pos = uv(data, pos, end)
            stop = pos + length
            pos += 1
        b = data[pos]
        if b < 0x80:
            raw = b
            pos += 1
        else:
            raw, pos = uv(data, pos, stop)
        ts = first_ts + ((raw >> 1) ^ -(raw & 1))
        pos = pos + 1 if data[pos] < 0x80 else uv(data, pos, stop)[1]  # offset delta: checked
        key, pos = _bytes_at(data, pos, stop)
        value, pos = _bytes_at(data, pos, stop)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if data[pos]:
            headers = _decode_headers(data, pos, stop)
        records.append(Record(key, value, ts, headers, offset))
        offset += 1
        pos = stop
    assert len(records) == header.record_count, "check_records let a count mismatch through"
    return records


def _bytes_at(data: bytes, pos: int, stop: int) -> tuple[bytes | None, int]:
    """The key or value at ``pos`` of a record whose framing is proved, and the position
    after it; lengths under 16 KiB (one or two varint bytes) without a loop."""
    b = data[pos]
    if b < 0x80:
        raw = b
        pos += 1
    elif data[pos + 1] < 0x80:
        raw = (b & 0x7F) | (data[pos + 1] << 7)
        pos += 2
    else:
        raw, pos = _uvarint_at(data, pos, stop)
    if raw & 1:
        return None, pos  # -1: null (check_records refused other negative lengths)
    end = pos + (raw >> 1)
    return data[pos:end], end


def _decode_headers(data: bytes, pos: int, stop: int) -> tuple[tuple[str, bytes | None], ...]:
    """The headers of a record whose framing :func:`check_records` has proved."""
    c = _Cursor(memoryview(data), pos, stop)
    out = []
    for _ in range(_get_uvarint(c)):
        n = _get_uvarint(c)
        name = str(c.buf[c.pos : c.pos + n], "utf-8")  # checked UTF-8
        c.pos += n
        out.append((name, _get_bytes(c)))
    return tuple(out)


def iter_records(buf: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Every record of every DATA entry in a buffer of whole entries (e.g. a fetch answer)."""
    for header in entry.iter_headers(buf):
        yield from decode_records(buf, header)


def records_from_values(values: Iterable[bytes], *, timestamp: int) -> list[Record]:
    return [Record(None, v, timestamp) for v in values]
