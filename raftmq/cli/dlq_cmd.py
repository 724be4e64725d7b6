"""``raftmq dlq list|replay TOPIC --group G``: the dead letters a RetryingConsumer of group G
left for TOPIC (in ``TOPIC.G.dlq``, raftmq.client.retrying), shown, or sent back to their
original topics to be consumed afresh.

Replay reads the dead-letter topic as the consumer group ``G.dlq-replay`` from its
committed offsets, up to the end the topic had when the replay started (so letters that
fail again during it wait for the next replay instead of going round for ever), and
commits after each batch is acknowledged (acks=all, idempotent): a second replay sends
nothing twice, and one interrupted goes on where it stopped (a crash between a batch's
acknowledgement and its commit sends that batch again). ``list`` marks what a replay sent
already. Errors read as sentences, exit status 1 (2 for bad usage).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
    console,
)
from raftmq.cli.connection import client_tls
from raftmq.cli.topic_cmd import JsonFlag
from raftmq.client import ClientError, Consumer, ConsumerRecord, LowLevelClient, Producer
from raftmq.client.producer import RecordFuture
from raftmq.format import retry_headers as rh
from raftmq.format.retry_headers import RetryInfo

app = typer.Typer(
    help="Dead letters of a retrying consumer's group: list them, replay them to their "
    "original topics."
)

TopicArg = Annotated[str, typer.Argument(help="The topic the group consumes with retries.")]
GroupOption = Annotated[
    str,
    typer.Option(
        "--group", help="The retrying consumer's group: its dead letters are in TOPIC.GROUP.dlq."
    ),
]
ERROR_CELL_CHARS = 60
"""How much of the last error the table shows (--json has all of it)."""
PROGRESS_EVERY_S = 0.5
POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class DeadLetter:
    partition: int
    """Where it is in the dead-letter topic."""
    offset: int
    info: RetryInfo
    replayed: bool
    """A replay sent it back already (it lies below the replay group's committed offset)."""

    def as_json(self) -> dict[str, object]:
        """Flat: its place, its history's fields, and whether it was replayed."""
        return {
            "partition": self.partition,
            "offset": self.offset,
            **asdict(self.info),
            "replayed": self.replayed,
        }


@dataclass(frozen=True, slots=True)
class _Span:
    """The dead-letter topic's offsets to read: per partition, from where to where."""

    topic: str
    start: dict[int, int]
    end: dict[int, int]
    log_start: dict[int, int]

    @property
    def total(self) -> int:
        return sum(max(0, self.end[p] - self.start[p]) for p in self.end)


def _fail(message: str, code: int = 1) -> typer.Exit:
    console.print(f"[red]{message}[/]", highlight=False)
    return typer.Exit(code)


def _names(topic: str, group: str) -> tuple[str, str]:
    """The dead-letter topic and the replay group (exit 2 when they cannot exist)."""
    try:
        return rh.dead_letter_topic(topic, group), rh.replay_group(group)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None


def _span(addresses: list[str], consumer: Consumer, dlq: str, topic: str, group: str) -> _Span:
    """From the replay group's committed offsets (the log start where it has none) to the
    log end now."""
    partitions = consumer.partitions_for(dlq)
    if not partitions:
        raise _fail(
            f"topic {dlq} does not exist: no retrying consumer of group {group} has consumed "
            f"{topic} yet ('raftmq topic list' shows the topics)"
        )
    consumer.assign([(dlq, p) for p in partitions])
    committed = consumer.committed()
    start, end, log_start = {}, {}, {}
    with LowLevelClient(addresses, retries=10, **client_tls()) as client:
        for p in partitions:
            answer = client.list_offsets(dlq, p, position=pb.EARLIEST)
            log_start[p] = answer.offset
            start[p] = max(answer.offset, committed.get((dlq, p)) or 0)
            end[p] = answer.high_watermark
    return _Span(dlq, start, end, log_start)


def _read(consumer: Consumer, span: _Span) -> Iterator[list[ConsumerRecord]]:
    """The records of ``span``, a poll's worth at a time."""
    left = {p: end for p, end in span.end.items() if span.start[p] < end}
    for p in span.end:
        consumer.seek((span.topic, p), span.start[p])
    for p in set(span.end) - set(left):
        consumer.pause((span.topic, p))
    while left:
        batch = [
            r for r in consumer.poll(POLL_S) if r.partition in left and r.offset < left[r.partition]
        ]
        for p, end in list(left.items()):
            position = consumer.position((span.topic, p))
            if position is not None and position >= end:  # past control entries too
                del left[p]
                consumer.pause((span.topic, p))
        if batch:
            yield batch


def _letter(r: ConsumerRecord, replayed: bool) -> DeadLetter | None:
    try:
        info = rh.decode(r.headers)
    except ValueError:
        info = None
    if info is None:
        return None
    return DeadLetter(r.partition, r.offset, info, replayed)


def _consumer(addresses: list[str], replay_group: str) -> Consumer:
    return Consumer(
        addresses,
        group_id=replay_group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **client_tls(),
    )


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.command("list")
def list_dead_letters(
    topic: TopicArg,
    group: GroupOption,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 100,
    all_letters: Annotated[
        bool, typer.Option("--all", help="Also those a replay sent back already.")
    ] = False,
    json_out: JsonFlag = False,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """The dead letters of TOPIC for group GROUP, oldest first: where each came from
    (original topic, partition, offset), how many attempts failed, when the first did,
    and the last error. Without --all only those no replay has sent back yet."""
    dlq, replay_group = _names(topic, group)
    addresses = cluster_addresses(data, bootstrap)
    letters: list[DeadLetter] = []
    unreadable = 0
    try:
        with _consumer(addresses, replay_group) as consumer:
            pending = _span(addresses, consumer, dlq, topic, group)
            span = _Span(dlq, pending.log_start, pending.end, pending.log_start)
            for batch in _read(consumer, span if all_letters else pending):
                for r in batch:
                    letter = _letter(r, r.offset < pending.start[r.partition])
                    if letter is None:
                        unreadable += 1
                    elif len(letters) < limit:
                        letters.append(letter)
                if len(letters) >= limit:
                    break
    except ClientError as exc:
        raise _fail(f"{exc} ({exc.label})") from None
    if json_out:
        print(
            json.dumps(
                {
                    "topic": dlq,
                    "pending": pending.total,
                    "dead_letters": [x.as_json() for x in letters],
                },
                indent=2,
            )
        )
        return
    if not letters:
        console.print(f"No dead letters in {dlq}" + ("." if all_letters else " to replay."))
        return
    table = Table(title=f"{dlq}: {pending.total} to replay")
    for col in ("dlq offset", "original", "attempts", "first failure", "replayed"):
        table.add_column(col)
    table.add_column("last error", overflow="ellipsis", no_wrap=True, max_width=ERROR_CELL_CHARS)
    for x in letters:
        table.add_row(
            f"{x.partition}/{x.offset}",
            f"{x.info.original_topic}/{x.info.original_partition}@{x.info.original_offset}",
            str(x.info.attempts),
            _when(x.info.first_failure_ms),
            "yes" if x.replayed else "no",
            x.info.last_error,
        )
    console.print(table)
    if unreadable:
        console.print(f"{unreadable} record(s) of {dlq} carry no readable retry headers.")


@app.command()
def replay(
    topic: TopicArg,
    group: GroupOption,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Send the dead letters of TOPIC for group GROUP back to where they came from (their
    original topic and partition, with their key, value and own headers, without the
    retry headers: they start afresh), each once: up to the dead-letter topic's end when
    the replay starts, committing as it goes."""
    dlq, replay_group = _names(topic, group)
    addresses = cluster_addresses(data, bootstrap)
    sent: dict[str, int] = {}
    skipped = done = 0
    started = last_report = time.monotonic()
    try:
        with (
            _consumer(addresses, replay_group) as consumer,
            Producer(addresses, acks="all", linger_ms=5, **client_tls()) as producer,
        ):
            span = _span(addresses, consumer, dlq, topic, group)
            for batch in _read(consumer, span):
                futures: list[RecordFuture] = []
                for r in batch:
                    letter = _letter(r, False)
                    if letter is None:
                        skipped += 1
                        continue
                    origin = letter.info.original_topic
                    futures.append(
                        producer.send(
                            origin,
                            r.value,
                            key=r.key,
                            headers=rh.strip(r.headers),
                            partition=letter.info.original_partition,
                        )
                    )
                    sent[origin] = sent.get(origin, 0) + 1
                producer.flush()
                for future in futures:
                    future.result()  # raises what stopped it: this batch is not committed
                consumer.commit({(dlq, r.partition): r.offset + 1 for r in batch})
                done += len(batch)
                now = time.monotonic()
                if now - last_report >= PROGRESS_EVERY_S:
                    last_report = now
                    print(f"\r{done:,} of {span.total:,} replayed", end="", file=sys.stderr)
    except ClientError as exc:
        raise _fail(
            f"the replay stopped: {exc} ({exc.label}); what was sent before is committed, "
            "run it again to go on"
        ) from None
    elapsed = time.monotonic() - started
    where = ", ".join(f"{n:,} to {t}" for t, n in sorted(sent.items())) or "nothing to replay"
    console.print(
        f"replayed {sum(sent.values()):,} dead letters of {dlq} in {elapsed:.1f} s: {where}",
        highlight=False,
    )
    if skipped:
        console.print(
            f"{skipped} record(s) without readable retry headers were skipped (no original "
            "topic to send them to)"
        )


__all__ = ["DeadLetter", "app"]
