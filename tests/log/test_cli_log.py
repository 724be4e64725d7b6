"""The `raftmq log` commands a person uses, run as a real subprocess."""

import os
import subprocess
import sys
from pathlib import Path

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
