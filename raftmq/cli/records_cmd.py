"""``raftmq produce`` and ``raftmq consume``: records from lines and back, with the
Producer and the Consumer (raftmq.client), for shells and scripts.

produce: one record per input line (stdin or ``--file``), the line's bytes as the value,
or ``key<SEP>value`` with ``--key-separator``; a progress line with the rate on stderr
while it runs, and a summary at the end. Exit 1, with the reason, if any record failed.

consume: the records of a topic from the start, an offset or from now on, as values (one
per line) or JSON lines; until ``--max-messages`` records or ``--idle-timeout-ms`` without
one, or Ctrl-C. With ``--group`` it consumes as a member of that consumer group: the
group assigns the partitions, reading starts at the group's committed offsets, and what
was printed is committed after each batch is written (at-least-once: a crash between
printing and committing prints those records again next time).

Where reading starts is said on stderr as soon as it is known (a new group reading from
the log end would otherwise wait in silence for records that may never come).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, BinaryIO, Literal

import typer

from raftmq.cli.cluster_cmd import (
    DEFAULT_DATA,
    BootstrapAddresses,
    RunningClusterData,
    cluster_addresses,
)
from raftmq.cli.connection import client_tls
from raftmq.client import (
    AcknowledgeType,
    ClientError,
    CommitFailedError,
    Consumer,
    ConsumerRecord,
    Producer,
    ShareConsumer,
    TopicPartition,
)
from raftmq.client.fetcher import OffsetReset
from raftmq.client.producer import Acks, RecordFuture
from raftmq.format.tags import check_record_tags

PROGRESS_EVERY_S = 0.5
MAX_PENDING = 10_000
"""Futures held before produce waits for the oldest: bounds its memory on long inputs."""


def _err(message: str) -> None:
    print(message, file=sys.stderr)


def _lines(source: BinaryIO) -> Iterator[bytes]:
    for line in source:
        yield line.rstrip(b"\r\n")


ClientIdOption = Annotated[
    str | None,
    typer.Option(
        "--client-id",
        help="Kafka's client.id, sent on every call (quotas may be set per client id).",
    ),
]


def _acks(text: str) -> Acks:
    if text == "all":
        return "all"
    if text in ("0", "1"):
        return 0 if text == "0" else 1
    raise typer.BadParameter("--acks is all, 1 or 0")


def produce(
    topic: Annotated[str, typer.Argument(help="The topic to write to.")],
    file: Annotated[
        Path | None, typer.Option("--file", help="Read lines from this file, not stdin.")
    ] = None,
    key_separator: Annotated[
        str,
        typer.Option(
            "--key-separator",
            help="Split each line at the first SEP into key and value (no SEP: no key).",
        ),
    ] = "",
    acks: Annotated[str, typer.Option(help="all (a majority fsynced), 1 (the leader), 0.")] = "all",
    partition: Annotated[
        int | None, typer.Option(min=0, help="Write every record to this partition.")
    ] = None,
    compression: Annotated[
        str | None, typer.Option(help="Compress batches: gzip, lz4 or zstd.")
    ] = None,
    linger_ms: Annotated[int, typer.Option(min=0, help="How long a batch waits to fill.")] = 5,
    tags: Annotated[
        str | None,
        typer.Option(
            "--tags",
            help="Tag every record with these comma-separated tags (docs/tags.md), e.g. paid,eu.",
        ),
    ] = None,
    client_id: ClientIdOption = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Write one record per input line to TOPIC, batched, and report each failure."""
    addresses = cluster_addresses(data, bootstrap)
    separator = key_separator.encode()
    tag_list = [t.strip() for t in tags.split(",")] if tags is not None else None
    try:
        if tag_list is not None:
            check_record_tags(tag_list)
        producer = Producer(
            addresses,
            acks=_acks(acks),
            compression=compression,
            linger_ms=linger_ms,
            client_id=client_id,
            **client_tls(),
        )
    except ValueError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(2) from None
    pending: list[RecordFuture] = []
    sent = failed = 0
    first_error = ""
    started = last_report = time.monotonic()

    def settle(fut: RecordFuture) -> None:
        nonlocal failed, first_error
        exc = fut.exception()
        if exc is not None:
            failed += 1
            first_error = first_error or str(exc)

    source = file.open("rb") if file is not None else sys.stdin.buffer
    try:
        for line in _lines(source):
            key = None
            if separator and separator in line:
                key, line = line.split(separator, 1)
            pending.append(producer.send(topic, line, key=key, partition=partition, tags=tag_list))
            sent += 1
            if len(pending) >= MAX_PENDING:
                settle(pending.pop(0))
            now = time.monotonic()
            if now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                rate = sent / max(now - started, 1e-9)
                print(f"\r{sent:,} records sent ({rate:,.0f}/s)", end="", file=sys.stderr)
        producer.flush()
        for fut in pending:
            settle(fut)
    except (ClientError, ValueError, TimeoutError) as exc:
        _err(f"\nerror: {exc}")
        raise typer.Exit(1) from None
    finally:
        if file is not None:
            source.close()
        producer.close(timeout=5)
    elapsed = max(time.monotonic() - started, 1e-9)
    print(
        f"\r{sent - failed:,} records written to {topic} in {elapsed:.1f} s "
        f"({(sent - failed) / elapsed:,.0f}/s)" + (f", {failed:,} failed" if failed else ""),
        file=sys.stderr,
    )
    if failed:
        _err(f"the first failure: {first_error}")
        raise typer.Exit(1)


def _text(data: bytes | None) -> str | None:
    """JSON output: UTF-8 text, with any other byte as a \\x escape (so a line is always
    valid JSON and text round-trips unchanged)."""
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def _json_line(r: ConsumerRecord) -> str:
    line = {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": _text(r.key),
        "value": _text(r.value),
        "headers": [[name, _text(value)] for name, value in r.headers],
    }
    if r.delivery_count is not None:
        line["delivery_count"] = r.delivery_count
    return json.dumps(line)


def _write(out: BinaryIO, r: ConsumerRecord, output: str) -> None:
    if output == "json":
        out.write(_json_line(r).encode() + b"\n")
    else:
        out.write((r.value or b"") + b"\n")


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in sorted(partitions))


def start_notes(
    group: str, committed: dict[TopicPartition, int | None], reset: OffsetReset
) -> list[str]:
    """What ``consume --group`` says on stderr once the group assigned ``committed``'s
    partitions: where each starts, and why."""
    fresh = [tp for tp, offset in committed.items() if offset is None]
    resumed = sorted((tp, offset) for tp, offset in committed.items() if offset is not None)
    notes = []
    if resumed:
        at = ", ".join(f"{t}/{p} at offset {offset}" for (t, p), offset in resumed)
        notes.append(f"group {group} resumes {at} (its committed offsets)")
    if fresh and reset == "latest":
        notes.append(
            f"no committed offset for {_names(fresh)}: starting at the log end "
            "(auto_offset_reset=latest); use --from-beginning to read from the start"
        )
    elif fresh:
        notes.append(
            f"no committed offset for {_names(fresh)}: starting at the log start "
            "(auto_offset_reset=earliest)"
        )
    return notes


def consume(
    topic: Annotated[str, typer.Argument(help="The topic to read.")],
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest record kept.")
    ] = False,
    offset: Annotated[
        int | None, typer.Option(min=0, help="Start at this offset (needs --partition).")
    ] = None,
    partition: Annotated[int | None, typer.Option(min=0, help="Read only this partition.")] = None,
    max_messages: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many records.")
    ] = None,
    idle_timeout_ms: Annotated[
        int | None,
        typer.Option(min=1, help="Stop when no record came for this long (default: wait)."),
    ] = None,
    output: Annotated[
        Literal["value", "json"],
        typer.Option("--format", help="value: one value per line; json: a JSON object per line."),
    ] = "value",
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="Consume as a member of this consumer group, from its committed offsets, "
            "committing what was printed.",
        ),
    ] = None,
    share_group: Annotated[
        str | None,
        typer.Option(
            "--share-group",
            help="Consume as a member of this share group (docs/share-groups.md): records "
            "are shared out with its other members, and each one printed is accepted.",
        ),
    ] = None,
    reject: Annotated[
        bool,
        typer.Option(
            "--reject",
            help="With --share-group: REJECT each record printed instead of accepting it "
            "(it goes to the group's dead-letter topic when it has one).",
        ),
    ] = False,
    isolation: Annotated[
        Literal["read_uncommitted", "read_committed"],
        typer.Option(
            "--isolation",
            help="read_committed: only committed transactions' records, up to the last "
            "stable offset; read_uncommitted (the default): every record.",
        ),
    ] = "read_uncommitted",
    tags: Annotated[
        str | None,
        typer.Option(
            "--tags",
            help="Only records whose tags match this expression (docs/tags.md), e.g. "
            "'paid && (eu || us)'; the brokers send only batches that may match.",
        ),
    ] = None,
    client_id: ClientIdOption = None,
    data: RunningClusterData = DEFAULT_DATA,
    bootstrap: BootstrapAddresses = "",
) -> None:
    """Print the records of TOPIC: from now on, --from-beginning, or --offset N of one
    --partition; with --group, from the group's committed offsets (--from-beginning then
    says where a partition without one starts). JSON lines carry topic, partition,
    offset, timestamp, key, value and headers (and delivery_count with --share-group);
    bytes that are not UTF-8 show as \\x escapes. With --share-group, records are shared
    out among the group's members (no order is promised) and each one printed is
    accepted (--reject: rejected) once written."""
    if share_group is not None or reject:
        _consume_share(
            topic,
            share_group,
            reject=reject,
            conflicts=group is not None
            or offset is not None
            or partition is not None
            or from_beginning
            or tags is not None
            or isolation != "read_uncommitted",
            max_messages=max_messages,
            idle_timeout_ms=idle_timeout_ms,
            output=output,
            client_id=client_id,
            addresses=cluster_addresses(data, bootstrap),
        )
        return
    if group is not None and (offset is not None or partition is not None):
        _err(
            "error: with --group the group assigns the partitions and its committed offsets "
            "say where to start; leave out --partition and --offset"
        )
        raise typer.Exit(2)
    if offset is not None and partition is None:
        _err("error: --offset needs --partition (an offset belongs to one partition)")
        raise typer.Exit(2)
    if offset is not None and from_beginning:
        _err("error: give --offset or --from-beginning, not both")
        raise typer.Exit(2)
    addresses = cluster_addresses(data, bootstrap)
    reset: OffsetReset = "earliest" if from_beginning else "latest"
    out = sys.stdout.buffer
    count = 0
    try:
        consumer = Consumer(
            addresses,
            auto_offset_reset=reset,
            group_id=group,
            enable_auto_commit=False,
            isolation_level=isolation,
            tag_filter=tags,
            client_id=client_id,
            **client_tls(),
        )
    except ValueError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(2) from None
    with consumer:
        partitions = consumer.partitions_for(topic)
        if not partitions:
            _err(f"error: topic {topic!r} does not exist; 'raftmq topic list' shows the topics")
            raise typer.Exit(1)
        if partition is not None and partition not in partitions:
            _err(f"error: topic {topic} has partitions 0-{len(partitions) - 1}, not {partition}")
            raise typer.Exit(1)
        if group is not None:

            def say_where(assigned: set[TopicPartition]) -> None:
                """on_assign: the group's committed offsets say where reading starts."""
                try:
                    committed = consumer.committed(assigned)
                except ClientError as exc:  # only the note is lost: reading goes on
                    _err(f"warning: could not read group {group}'s committed offsets: {exc}")
                    return
                for note in start_notes(group, committed, reset):
                    _err(note)

            consumer.subscribe([topic], on_assign=say_where)
        else:
            chosen = [(topic, p) for p in partitions if partition is None or p == partition]
            consumer.assign(chosen)
            if offset is not None:
                consumer.seek(chosen[0], offset)
            elif not from_beginning:
                where = topic if partition is None else _names(chosen)
                _err(
                    f"reading {where} from the log end: new records only; "
                    "use --from-beginning to read from the start"
                )
        last_record = time.monotonic()
        joined = group is None
        committed_at: dict[tuple[str, int], int] = {}
        try:
            while max_messages is None or count < max_messages:
                records = consumer.poll(0.2)
                joined = joined or bool(consumer.assignment())
                if not records:
                    if group is not None and tags is not None:
                        _commit_positions(consumer, committed_at)
                    if not joined:  # the idle clock starts once the group gave partitions
                        last_record = time.monotonic()
                    idle_ms = (time.monotonic() - last_record) * 1000
                    if idle_timeout_ms is not None and idle_ms >= idle_timeout_ms:
                        break
                    continue
                last_record = time.monotonic()
                printed: dict[tuple[str, int], int] = {}
                shown = records[: None if max_messages is None else max_messages - count]
                for r in shown:
                    _write(out, r, output)
                    printed[(r.topic, r.partition)] = r.offset + 1
                    count += 1
                out.flush()
                if group is not None:
                    try:
                        consumer.commit(printed)
                        committed_at.update(printed)
                    except CommitFailedError as exc:  # the group moved on: rejoining
                        _err(f"warning: {exc}; another member may print those records again")
                    if tags is not None and len(shown) == len(records):
                        _commit_positions(consumer, committed_at)
        except ClientError as exc:
            _err(f"error: {exc}")
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            pass
    _err(f"{count:,} records read from {topic}")


def _consume_share(
    topic: str,
    group: str | None,
    *,
    reject: bool,
    conflicts: bool,
    max_messages: int | None,
    idle_timeout_ms: int | None,
    output: str,
    client_id: str | None,
    addresses: list[str],
) -> None:
    """``consume --share-group``: print the records the group gives this member, each
    acknowledged (ACCEPT, or REJECT) once written, and the acknowledgements committed
    after each batch; a record polled past --max-messages is released unprinted."""
    if group is None:
        _err("error: --reject needs --share-group (only a share group's records are rejected)")
        raise typer.Exit(2)
    if conflicts:
        _err(
            "error: with --share-group the group shares the partitions out and keeps where "
            "reading stands (its share.auto.offset.reset says where a new group starts; "
            "reads are read_committed); leave out --group, --partition, --offset, "
            "--from-beginning, --tags and --isolation"
        )
        raise typer.Exit(2)
    kind = AcknowledgeType.REJECT if reject else AcknowledgeType.ACCEPT
    out = sys.stdout.buffer
    count = refused = 0
    try:
        consumer = ShareConsumer(
            addresses,
            group,
            acknowledgement_mode="explicit",
            client_id=client_id,
            **client_tls(),
        )
    except ValueError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(2) from None
    with consumer:
        if not consumer.partitions_for(topic):
            _err(f"error: topic {topic!r} does not exist; 'raftmq topic list' shows the topics")
            raise typer.Exit(1)
        consumer.subscribe([topic])
        _err(f"consuming {topic} as a member of share group {group}")
        last_record = time.monotonic()
        try:
            while max_messages is None or count < max_messages:
                records = consumer.poll(0.2)
                if not records:
                    if not consumer.assignment():  # the idle clock starts once joined
                        last_record = time.monotonic()
                    idle_ms = (time.monotonic() - last_record) * 1000
                    if idle_timeout_ms is not None and idle_ms >= idle_timeout_ms:
                        break
                    continue
                last_record = time.monotonic()
                for r in records:
                    if max_messages is not None and count >= max_messages:
                        consumer.acknowledge(r, AcknowledgeType.RELEASE)  # not printed
                        continue
                    _write(out, r, output)
                    consumer.acknowledge(r, kind)
                    count += 1
                out.flush()
                results = consumer.commit_sync()
                refused += sum(
                    r.last_offset - r.first_offset + 1
                    for r in results
                    if not r.ok and r.type is kind
                )
        except ClientError as exc:
            _err(f"error: {exc}")
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            pass
    verb = "rejected" if reject else "read"
    _err(f"{count:,} records {verb} from {topic} as share group {group}")
    if refused:
        _err(
            f"warning: {refused:,} acknowledgements were refused (their locks had expired: "
            "those records go to another member, and may be printed again)"
        )


def _commit_positions(consumer: Consumer, committed_at: dict[tuple[str, int], int]) -> None:
    """With a tag filter, commit the consumer's positions, which move past the records the
    filter dropped (docs/tags.md), so a member that prints 1% of a topic still commits
    near the log end. Called only once every record polled was printed."""
    moved = {}
    for tp in consumer.assignment():
        position = consumer.position(tp)
        if position is not None and position > committed_at.get(tp, -1):
            moved[tp] = position
    if not moved:
        return
    try:
        consumer.commit(moved)
    except CommitFailedError as exc:
        _err(f"warning: {exc}; another member may print those records again")
        return
    committed_at.update(moved)


__all__ = ["consume", "produce", "start_notes"]
