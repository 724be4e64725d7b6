"""The broker's check of what is produced to the internal delay topic
(docs/delayed-delivery.md): never trust the client. Each record must carry a well-formed
route (deliver-at, target topic and partition, hop-at) to a partition that exists, due no
further ahead than the target topic's ``delivery.max.delay.ms``, and must not hold its
level longer than the level's wait (a record's hop-at blocks every record behind it).

Only produces to the delay topic pay for this: it decodes their records (headers only are
used), which no other produce does.
"""

from __future__ import annotations

import time

from raftmq.api.error_codes import ErrorCode
from raftmq.broker.refusals import Refusal, shorten
from raftmq.controller.model import MetadataState
from raftmq.format import delay, entry
from raftmq.format.errors import FormatError
from raftmq.format.records import Record, build_batch, decode_records

MAX_CLOCK_AHEAD_MS = 5_000
"""How far a producer's clock may run ahead of the broker's in a hop-at: a level's head
holds the records behind it, so this much skew adds to their lateness at most."""


def check_mover_ids(entries: bytes, *, mover: bool) -> None:
    """Refuse a client's batch that names a delay mover's producer id (from 2^62), and a
    mover's call with anything else: the partitions store the movers' batches by another
    rule (docs/delayed-delivery.md). Only the first entry is read, as the produce path
    reads it: a batch with a producer id is a request's only entry."""
    try:
        producer_id = entry.parse_header(entries).producer_id if entries else -1
    except FormatError:
        return  # the produce's own checks refuse it with a sentence
    if delay.is_mover(producer_id) != mover:
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_BATCH,
            f"producer id {producer_id} is reserved for the brokers' delay movers; use the id "
            "InitProducerId gave"
            if not mover
            else "ProduceDelayed takes the delay movers' batches only; use Produce",
        )


def check_delayed(entries: bytes, level: int, metadata: MetadataState) -> None:
    """Raise Refusal (DELAY_TOO_LONG, INVALID_DELAY) unless every record of ``entries``,
    produced to level ``level``, is a delayed record the movers can deliver."""
    now_ms = time.time_ns() // 1_000_000
    try:
        for header in entry.iter_headers(entries):
            if delay.is_mover(header.producer_id):
                # A mover's hop: its records were checked when they first came, and a
                # maximum lowered since must not drop them; decoding every hop again
                # would be most of the brokers' CPU under delayed load.
                continue
            for record in decode_records(entries, header):
                _check_record(record, level, metadata, now_ms)
    except FormatError:
        return  # the produce's own checks refuse it with INVALID_BATCH and a sentence


def _check_record(record: Record, level: int, metadata: MetadataState, now_ms: int) -> None:
    headers = record.headers
    try:
        topic, partition, deliver_at, hop_at = delay.parse_route(headers)
    except delay.DelayHeaderError as exc:
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_DELAY,
            f"{exc}; send delayed messages with the producer's delay_ms or deliver_at",
        ) from None
    target = metadata.topics.get(topic)
    if target is None or topic == delay.DELAY_TOPIC:
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_DELAY,
            f"a delayed record names target topic {shorten(topic)}, which does not exist",
        )
    if partition >= len(target.partitions):
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_DELAY,
            f"a delayed record names partition {partition} of {shorten(topic)}, which has "
            f"{len(target.partitions)} partitions",
        )
    if hop_at > deliver_at:
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_DELAY,
            f"a delayed record's hop-at ({hop_at}) is after its deliver-at ({deliver_at})",
        )
    longest_hold_ms = (delay.UNIT_MS << level) + MAX_CLOCK_AHEAD_MS
    if hop_at - now_ms > longest_hold_ms:
        raise Refusal(
            ErrorCode.ERROR_CODE_INVALID_DELAY,
            f"a delayed record in level {level} has hop-at {hop_at}, {hop_at - now_ms} ms "
            f"ahead; that level holds a record at most {delay.UNIT_MS << level} ms (is the "
            "producer's clock right?)",
        )
    _check_fits(record, topic, target.settings.log_config.max_message_bytes)
    max_delay_ms = target.settings.delivery_max_delay_ms
    if deliver_at - now_ms > max_delay_ms:
        raise Refusal(
            ErrorCode.ERROR_CODE_DELAY_TOO_LONG,
            f"the record is due in {deliver_at - now_ms} ms, beyond topic {shorten(topic)}'s "
            f"delivery.max.delay.ms of {max_delay_ms} ms; send it with a shorter delay, or "
            "raise the topic's delivery.max.delay.ms",
        )


def _check_fits(record: Record, topic: str, max_message_bytes: int) -> None:
    """Refuse a record its target could never take: acknowledged now, it would be dropped
    when due (a mover cannot deliver it, and holding it would block its level)."""
    delivered = Record(
        record.key,
        record.value,
        record.timestamp,
        tuple(h for h in record.headers if h[0] not in delay.INTERNAL_HEADERS),
    )
    size = len(build_batch([delivered]))
    if size > max_message_bytes:
        raise Refusal(
            ErrorCode.ERROR_CODE_BATCH_TOO_LARGE,
            f"the delayed record takes {size} bytes as a batch of its own, over topic "
            f"{shorten(topic)}'s max.message.bytes of {max_message_bytes}; send a smaller "
            "record, or raise the topic's max.message.bytes",
        )
