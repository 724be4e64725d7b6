"""``raftmq log``: look inside a partition folder without changing it, and a demo that writes
one. Inspection never opens the folder as a Log (that would repair it); it reads the files."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from raftmq.format import entry
from raftmq.format.entry import EntryType
from raftmq.format.errors import InvalidEntryError
from raftmq.format.records import Record, build_batch, decode_records, iter_records
from raftmq.format.tags import entry_tags
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.inspect import describe, iter_entries, segment_files, verify_folder
from raftmq.log.log import Log

app = typer.Typer(
    help="Inspect, verify and demonstrate partition log folders.", no_args_is_help=True
)
# Pipes and CI logs get a wide console so segment names are not cut.
console = Console(width=None if sys.stdout.isatty() else 160)

Folder = Annotated[
    Path,
    typer.Argument(help="A partition folder: the directory holding its .log segment files."),
]


def _require_folder(folder: Path) -> None:
    if not folder.is_dir():
        console.print(
            f"[red]There is no folder at {folder}.[/] Give the path of a partition folder."
        )
        raise typer.Exit(2)
    if not any(folder.glob("*.log")):
        console.print(
            f"[red]{folder} holds no segment files (*.log).[/] Is it a partition folder? "
            "Partition folders hold files like 00000000000000000000-00000000000000000001.log."
        )
        raise typer.Exit(2)


@app.command()
def segments(folder: Folder) -> None:
    """List the segments of a partition folder: first index, base offset, size, index files."""
    _require_folder(folder)
    table = Table(title=f"segments in {folder}")
    for col in ("segment", "first index", "base offset", "bytes", "index files"):
        table.add_column(col, justify="right" if col != "segment" else "left")
    for seg in segment_files(folder):
        has_index = seg.index_path.exists() and seg.time_index_path.exists()
        table.add_row(
            seg.name,
            str(seg.first_index),
            str(seg.base_offset),
            f"{seg.size:,}",
            "yes" if has_index else "no (active)",
        )
    console.print(table)


@app.command()
def dump(
    folder: Folder,
    from_index: Annotated[int, typer.Option(help="First Raft index to show.")] = 0,
    limit: Annotated[int, typer.Option(min=1, help="How many entries to show at most.")] = 50,
    records: Annotated[bool, typer.Option(help="Also decode and print each record.")] = False,
) -> None:
    """Print entry headers (index, term, type, offsets, size, CRC), optionally their records."""
    _require_folder(folder)
    table = Table(title=f"entries in {folder}")
    columns = ("segment", "position", "index", "term", "type", "offset", "records", "bytes", "crc")
    for col in columns:
        table.add_column(col)
    shown = 0
    lines: list[str] = []
    try:
        for name, position, h in iter_entries(folder, verify=False):
            if h.index < from_index:
                continue
            d = describe(h)
            table.add_row(name[-8:], str(position), *(str(d[k]) for k in columns[2:]))
            if records and h.type == EntryType.DATA:
                lines += _record_lines(_entry_bytes(folder, name, position, h.size), name, position)
            shown += 1
            if shown >= limit:
                break
    finally:
        console.print(table)
        for line in lines:
            console.print(line, highlight=False)


def _record_lines(data: bytes, segment: str, position: int) -> list[str]:
    """One line per record of a DATA entry, or one problem line when they cannot be decoded
    (a dump shows what is there; ``raftmq log verify`` reports it as a problem)."""
    try:
        header = entry.parse_header(data)
        decoded = decode_records(data, header)
        block = entry_tags(data, header)
    except InvalidEntryError as exc:
        return [
            f"  [red]problem:[/] the records of the entry at byte {position} of {segment} "
            f"cannot be decoded: {escape(str(exc))}"
        ]
    shown = [f"  tag block {escape(str(block))}"] if block else []
    return shown + [
        f"  offset {rec.offset} ts {rec.timestamp} key {rec.key!r} "
        f"value {_short(rec.value)} headers {list(rec.headers)}"
        for rec in decoded
    ]


def _entry_bytes(folder: Path, segment: str, position: int, size: int) -> bytes:
    with open(folder / f"{segment}.log", "rb") as f:
        f.seek(position)
        return f.read(size)


def _short(value: bytes | None) -> str:
    if value is None:
        return "null"
    return repr(value if len(value) <= 40 else value[:40] + b"...")


@app.command()
def verify(folder: Folder) -> None:
    """Check every entry's CRC, the continuity of indexes, offsets and terms, every index file,
    and that every DATA entry's records decode. Exits 1 and names each problem with its segment
    and byte position if anything is off."""
    _require_folder(folder)
    report = verify_folder(folder)
    table = Table(title=f"verify {folder}")
    for col in ("segment", "entries", "records", "indexes", "terms", "result"):
        table.add_column(col)
    for seg in report.segments:
        table.add_row(
            seg.name,
            f"{seg.entries:,}",
            f"{seg.records:,}",
            f"{seg.first_index}..{seg.last_index}",
            f"{seg.first_term}..{seg.last_term}" if seg.entries else "-",
            "[green]ok[/]" if not seg.problems else "[red]" + "; ".join(seg.problems) + "[/]",
        )
    console.print(table)
    console.print(
        f"log start: index {report.start_index}, offset {report.start_offset}, "
        f"term before start {report.prev_term}"
    )
    for problem in report.problems:
        console.print(f"[red]problem:[/] {problem}")
    if not report.ok:
        console.print("[red]The folder has problems (listed above).[/]")
        raise typer.Exit(1)
    console.print("[green]Every CRC, index file, sequence and record checks out.[/]")


@app.command()
def demo(
    data: Annotated[Path, typer.Option(help="Where to create the demo partition folder.")] = Path(
        "./raftmq-data/demo"
    ),
    records: Annotated[int, typer.Option(min=1, max=10_000_000, help="How many records.")] = 5000,
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Records per batch.")] = 100,
) -> None:
    """Write records to a fresh partition folder, reopen it, read everything back, and show it.

    Exits 1 if what is read back differs from what was written."""
    folder = data / "demo-topic-0"
    if folder.exists():
        shutil.rmtree(folder)
    config = LogConfig(segment_bytes=128 * 1024, flush_policy=FlushPolicy.EVERY_BATCH)
    written: list[bytes] = []
    started = time.perf_counter()
    with Log.open(folder, config) as log, Progress(console=console, transient=True) as progress:
        task = progress.add_task("appending batches (fsync each)", total=records)
        term = 1
        log.append(entry.encode(b"", type=EntryType.NOOP, index=1, term=term))
        for first in range(0, records, batch):
            now = time.time_ns() // 1_000_000
            recs = [
                Record(f"key-{i % 16}".encode(), f"value-{i}".encode(), now, (("tag", b"demo"),))
                for i in range(first, min(first + batch, records))
            ]
            written += [r.value or b"" for r in recs]
            raw = build_batch(recs)
            log.append(
                entry.stamp(raw, index=log.next_index, term=term, base_offset=log.next_offset)
            )
            progress.advance(task, len(recs))
    write_s = time.perf_counter() - started
    console.print(f"wrote {records:,} records in {write_s:.2f} s (every batch fsynced)")

    with Log.open(folder, config) as log:
        console.print(
            f"reopened: {'clean' if log.recovery.clean else log.recovery}; "
            f"offsets {log.start_offset}..{log.next_offset - 1}, indexes {log.start_index}.."
            f"{log.last_index}, last term {log.last_term}"
        )
        read_back: list[bytes] = []
        offset = 0
        while offset < log.next_offset:
            result = log.read(offset, 256 * 1024)
            read_back += [r.value or b"" for r in iter_records(result.data)]
            offset = result.next_offset
    segments(folder)
    dump(folder, from_index=0, limit=5, records=False)
    verify(folder)
    if read_back != written:
        console.print(
            f"[red]Read back {len(read_back)} records that differ from the "
            f"{len(written)} written.[/]"
        )
        raise typer.Exit(1)
    console.print(
        f"[green]Read back all {len(read_back):,} records, in order, identical.[/] "
        f"Inspect it yourself: raftmq log dump {folder} --records --limit 3"
    )
