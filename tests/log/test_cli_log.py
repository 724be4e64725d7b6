"""The `raftmq log` commands a person uses, run as a real subprocess."""

import os
import subprocess
import sys
from pathlib import Path

from raftmq.format import entry
from raftmq.format.records import Record, build_batch
from raftmq.log.config import LogConfig
from raftmq.log.inspect import verify_folder
from raftmq.log.log import Log

RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RAFTMQ, *args], capture_output=True, text=True, timeout=120)


def test_demo_writes_reopens_and_verifies(tmp_path: Path):
    result = run("log", "demo", "--data", str(tmp_path), "--records", "3000")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Read back all 3,000 records, in order, identical" in result.stdout
    folder = tmp_path / "demo-topic-0"
    assert run("log", "verify", str(folder)).returncode == 0
    dump = run("log", "dump", str(folder), "--records", "--limit", "2")
    assert "value b'value-0'" in dump.stdout


def test_verify_names_a_corrupt_byte_and_fails(tmp_path: Path):
    assert run("log", "demo", "--data", str(tmp_path), "--records", "3000").returncode == 0
    folder = tmp_path / "demo-topic-0"
    first = sorted(folder.glob("*.log"))[0]
    with open(first, "r+b") as f:
        f.seek(500)
        byte = f.read(1)
        f.seek(500)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    result = run("log", "verify", str(folder))
    assert result.returncode == 1
    assert "CRC mismatch" in result.stdout and first.stem in result.stdout


def test_a_folder_that_is_not_a_partition_gets_a_sentence(tmp_path: Path):
    result = run("log", "verify", str(tmp_path))
    assert result.returncode == 2
    assert "holds no segment files" in result.stdout


def test_verify_and_dump_name_an_entry_whose_records_cannot_be_decoded(tmp_path: Path):
    """Its CRC is right (it was written so), but its header claims 3 records and its payload
    holds 2: verify fails naming segment and byte, dump --records says so instead of
    crashing."""
    from raftmq.format import entry
    from raftmq.format.records import Record, build_batch, encode_records
    from raftmq.log.config import LogConfig
    from raftmq.log.log import Log

    folder = tmp_path / "p0"
    with Log.open(folder, LogConfig()) as log:
        good = build_batch([Record(b"k", b"fine", 5)])
        log.append(entry.stamp(good, index=1, term=1, base_offset=0))
        payload = encode_records([Record(None, b"a", 5), Record(None, b"b", 5)], base_timestamp=5)
        bad_at = log.segments()[0][3]
        log.append(
            entry.encode(
                payload,
                index=2,
                term=1,
                base_offset=1,
                record_count=3,
                first_timestamp=5,
                max_timestamp=5,
            )
        )
    segment = sorted(folder.glob("*.log"))[0].stem
    result = run("log", "verify", str(folder))
    assert result.returncode == 1, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # the table may wrap the sentence
    assert f"entry at byte {bad_at} (index 2) has records that cannot be decoded" in out
    assert "record_count is 3" in out and segment in out
    assert "checks out" not in out
    dump = run("log", "dump", str(folder), "--records")
    assert dump.returncode == 0, dump.stdout + dump.stderr
    assert "value b'fine'" in dump.stdout
    assert f"problem: the records of the entry at byte {bad_at} of {segment}" in dump.stdout
    assert "Traceback" not in dump.stdout + dump.stderr


def small_segment_log(folder: Path, entries: int = 200) -> list[Path]:
    """A closed log of several sealed segments (with index files); its segment files."""
    config = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=512)
    with Log.open(folder, config) as log:
        for i in range(entries):
            batch = build_batch([Record(None, f"value-{i}".encode() * 10, 1_000 + i)])
            log.append(entry.stamp(batch, index=log.next_index, term=1, base_offset=i))
        log.flush()
    return sorted(folder.glob("*.log"))


def test_verify_reports_one_flipped_bit_as_one_problem(tmp_path: Path):
    """Not also an index slot "not an entry boundary" past it, nor the next segment
    "ending before" it: what follows a bad entry is unknown, not wrong."""
    segments = small_segment_log(tmp_path)
    assert len(segments) >= 3 and segments[0].with_suffix(".index").exists()
    with open(segments[0], "r+b") as f:
        f.seek(500)
        byte = f.read(1)
        f.seek(500)
        f.write(bytes([byte[0] ^ 0x01]))
    report = verify_folder(tmp_path)
    problems = report.problems + [p for s in report.segments for p in s.problems]
    assert len(problems) == 1, problems
    assert "CRC mismatch" in problems[0] and segments[0].stem in problems[0]


def test_dump_shows_a_tagged_entry_s_block_and_verify_passes(tmp_path: Path):
    folder = tmp_path / "p0"
    with Log.open(folder, LogConfig()) as log:
        tagged = build_batch([Record(None, b"v", 5, (("tag", b"paid"), ("tag", b"eu")))])
        log.append(entry.stamp(tagged, index=1, term=1, base_offset=0))
    assert run("log", "verify", str(folder)).returncode == 0
    dump = run("log", "dump", str(folder), "--records")
    assert "tag block ['eu', 'paid']" in dump.stdout, dump.stdout
