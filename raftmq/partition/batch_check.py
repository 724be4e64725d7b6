"""What a producer's entries must satisfy before anything is proposed: the client edge.

"Accepted means consumable": every header field the broker stores or acts on is checked
against the payload and against bounds here, so no produce can put into the log an entry
that a consumer cannot read, that breaks time lookups, or that overflows a segment index.
There are three trust boundaries and each validates once:

- client edge (this module): a producer's request, before it is proposed to Raft;
- peer edge: a follower's Raft core checks the CRC of what the leader replicates, and its
  ``Log.append`` framing and index/offset contiguity (the leader already checked the
  records; neither the leader's core nor its log repeats this module's CRC check);
- disk read: the log checks each entry's CRC when it first reads it.

Refusals speak the producer's language (entries, fields, offsets, records), name the entry,
the field, the value and the limit.
"""

from __future__ import annotations

from raftmq.format import compression, entry
from raftmq.format.entry import EntryType
from raftmq.format.errors import CorruptEntryError, InvalidEntryError
from raftmq.format.records import check_payload
from raftmq.format.tags import InvalidTagsError
from raftmq.partition import errors
from raftmq.partition.errors import BatchTooLargeError, CorruptBatchError, InvalidBatchError

MAX_ENTRIES_PER_PRODUCE = 10_000
_DATA = int(EntryType.DATA)
_TRANSACTIONAL = entry.TRANSACTIONAL
_I16_MAX = (1 << 15) - 1


def check_produce(entries: bytes, *, max_entry_bytes: int, max_future_ms: int, now_ms: int) -> int:
    """Check every entry of a produce request; return how many there are.

    Raises InvalidBatchError, CorruptBatchError or BatchTooLargeError naming the first
    entry that is refused; then nothing of the request may be kept."""
    if not entries:
        raise InvalidBatchError("the produce request holds no entries")
    count = 0
    first_producer = entry.NO_PRODUCER_ID
    try:
        # iter_fields checks framing and each entry's CRC32C before we look at its fields.
        for position, fields in entry.iter_fields(entries):
            if count == MAX_ENTRIES_PER_PRODUCE:
                raise InvalidBatchError(
                    f"more than {MAX_ENTRIES_PER_PRODUCE} entries in one produce request; "
                    "send at most that many per request"
                )
            _check_entry(count, position, fields, entries, max_entry_bytes, max_future_ms, now_ms)
            if not count:
                first_producer = fields[11]
            elif first_producer >= 0 or fields[11] >= 0:
                # The leader checks one producer batch per request (its sequence, its
                # epoch): a producer's entry behind another would be stored unchecked. So
                # the entries of a request are also all transactional or none (a
                # transactional entry names its producer).
                raise InvalidBatchError(
                    f"entry {count} (byte {position} of the request) follows another, and "
                    f"entry {0 if first_producer >= 0 else count} names a producer: an "
                    "idempotent or transactional producer's request holds exactly one "
                    "entry; send its batches one per request"
                )
            count += 1
    except CorruptEntryError as exc:
        raise CorruptBatchError(f"a batch failed its CRC32C check: {exc}") from None
    except InvalidEntryError as exc:
        raise InvalidBatchError(f"malformed batch: {exc}") from None
    return count


def _check_entry(
    n: int,
    position: int,
    f: entry.HeaderFields,
    buf: bytes,
    max_entry_bytes: int,
    max_future_ms: int,
    now_ms: int,
) -> None:
    (length, _, _, etype, attributes, index, term, base_offset, record_count, first_ts, max_ts,
     producer_id, producer_epoch, base_sequence, payload_length) = f  # fmt: skip
    where = f"entry {n} (byte {position} of the request)"

    def refuse(sentence: str) -> InvalidBatchError:
        return InvalidBatchError(f"{where}: {sentence}")

    if etype != _DATA:
        raise refuse(f"is a {EntryType(etype).name} entry; producers send DATA entries (type 0)")
    size = length + 4
    if size > max_entry_bytes:
        raise BatchTooLargeError(
            f"{where} is {size} bytes; this topic's max.message.bytes is {max_entry_bytes}. "
            "Send smaller batches."
        )
    if index or term or base_offset:
        field, value = next(
            (k, v) for k, v in (("index", index), ("term", term), ("base_offset", base_offset)) if v
        )
        raise refuse(
            f"{field} is {value}; the broker assigns offsets; send {field} 0 (index, term "
            "and base_offset are all 0 in a produced entry)"
        )
    codec = attributes & entry.CODEC_MASK
    unsupported = compression.unsupported_reason(codec)
    if unsupported is not None:
        raise refuse(f"attributes {attributes:#x} select a compression codec: {unsupported}")
    if attributes & entry.TIMESTAMP_LOG_APPEND:
        raise refuse(
            f"attributes {attributes:#x} set the log-append-time bit (0x8); that bit is "
            "reserved for the broker: producers send create time (0)"
        )
    # Timestamps: time lookups trust max_timestamp, so it is bounded by the broker's clock.
    if first_ts < 0:
        raise refuse(f"first_timestamp is {first_ts}; timestamps are ms since the epoch, >= 0")
    if max_ts < first_ts:
        raise refuse(
            f"max_timestamp {max_ts} is below first_timestamp {first_ts}; max_timestamp is the "
            "largest record timestamp"
        )
    if max_ts > now_ms + max_future_ms:
        raise refuse(
            f"max_timestamp {max_ts} is {max_ts - now_ms} ms ahead of the broker's clock "
            f"({now_ms}); message.timestamp.after.max.ms allows {max_future_ms} ms"
        )
    # Producer id/epoch/sequence: either none at all, or a well-formed triple; a
    # transactional batch (docs/transactions.md) needs one.
    none = (entry.NO_PRODUCER_ID, -1, entry.NO_SEQUENCE)
    if attributes & _TRANSACTIONAL and (producer_id, producer_epoch, base_sequence) == none:
        raise refuse(
            f"attributes {attributes:#x} set the transactional bit (0x10) but the entry "
            "names no producer (producer_id, producer_epoch and base_sequence are -1): a "
            "transactional batch carries its producer id >= 0, epoch >= 0 and "
            "base_sequence >= 0"
        )
    if (producer_id, producer_epoch, base_sequence) != none:
        if producer_id < 0 or not 0 <= producer_epoch <= _I16_MAX or base_sequence < 0:
            raise refuse(
                f"producer_id {producer_id}, producer_epoch {producer_epoch}, base_sequence "
                f"{base_sequence}: send all three -1 (no producer), or producer_id >= 0, "
                f"producer_epoch 0 to {_I16_MAX} and base_sequence >= 0"
            )
        if base_sequence + record_count - 1 > entry.MAX_SEQUENCE:
            raise refuse(
                f"base_sequence {base_sequence} + record_count {record_count} - 1 exceeds "
                f"{entry.MAX_SEQUENCE}; the sequence of the last record must fit 32 bits"
            )
    # record_count and timestamps against the records themselves: only the length
    # prefixes are read, keys and values are skipped (check_records); a compressed payload
    # is inflated a chunk at a time to do so (check_compressed_records). Tags too: the
    # tag block must be the union of the records' tag headers (docs/format.md, "Tags").
    start = position + entry.HEADER_SIZE
    try:
        check_payload(
            attributes, buf, start, start + payload_length, record_count, first_ts, max_ts
        )
    except InvalidTagsError as exc:
        raise errors.InvalidTagsError(f"{where}: {exc}") from None
    except InvalidEntryError as exc:
        raise refuse(str(exc)) from None
