"""``raftmq produce`` and ``raftmq consume`` as a person runs them: real processes, lines
in, lines (or JSON) out, keys by separator, and errors as sentences."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from raftmq.client.partitioner import partition_for_key
from raftmq.devtools.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(120)


def raftmq(
    cluster: LocalCluster, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "raftmq.cli.main",
            *args,
            "--bootstrap",
            ",".join(cluster.addresses),
        ],
        input=stdin,
        capture_output=True,
        timeout=90,
        check=False,
    )


def test_lines_go_in_and_come_back_out(cluster: LocalCluster) -> None:
    lines = [f"user-{i % 5}:event {i}" for i in range(200)]
    done = raftmq(
        cluster, "produce", "cli", "--key-separator", ":", stdin="\n".join(lines).encode() + b"\n"
    )
    assert done.returncode == 0, done.stderr
    assert b"200 records written to cli" in done.stderr
    out = raftmq(
        cluster, "consume", "cli", "--from-beginning", "--max-messages", "200", "--format", "json"
    )
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == 200
    for r in records:
        assert r["partition"] == partition_for_key(r["key"].encode(), 2)
        assert r["value"].startswith("event ")
    for p in (0, 1):
        mine = [r for r in records if r["partition"] == p]
        assert [r["offset"] for r in mine] == sorted(r["offset"] for r in mine)
        events = [int(r["value"].split()[1]) for r in mine]
        assert events == sorted(events)  # a partition keeps send order
    one = raftmq(
        cluster, "consume", "cli", "--partition", "1", "--offset", "0", "--max-messages", "1"
    )
    assert one.returncode == 0 and one.stdout.startswith(b"event ")


def test_mistakes_are_sentences(cluster: LocalCluster) -> None:
    missing = raftmq(cluster, "consume", "nope", "--idle-timeout-ms", "100")
    assert missing.returncode == 1
    assert b"topic 'nope' does not exist" in missing.stderr
    needs = raftmq(cluster, "consume", "cli", "--offset", "3")
    assert needs.returncode == 2 and b"--offset needs --partition" in needs.stderr
    bad = raftmq(cluster, "produce", "cli", "--compression", "snappy", stdin=b"x\n")
    assert bad.returncode == 2 and b"'snappy' is not supported" in bad.stderr
    unknown = raftmq(cluster, "produce", "nope", stdin=b"x\n")
    assert unknown.returncode == 1 and b"topic 'nope' does not exist" in unknown.stderr
    assert b"Traceback" not in unknown.stderr + missing.stderr + bad.stderr


def test_consume_with_a_group_resumes_where_the_last_run_stopped(cluster: LocalCluster) -> None:
    lines = [f"line {i}" for i in range(10)]
    assert raftmq(cluster, "produce", "clig", stdin="\n".join(lines).encode()).returncode == 0
    first = raftmq(
        cluster, "consume", "clig", "--group", "readers", "--from-beginning", "--max-messages", "6"
    )
    assert first.returncode == 0, first.stderr
    assert b"starting at the log start (auto_offset_reset=earliest)" in first.stderr
    rest = raftmq(
        cluster,
        "consume",
        "clig",
        "--group",
        "readers",
        "--max-messages",
        "4",
        "--idle-timeout-ms",
        "8000",
    )
    assert rest.returncode == 0, rest.stderr
    assert b"group readers resumes clig/" in rest.stderr, rest.stderr
    printed = first.stdout.decode().splitlines() + rest.stdout.decode().splitlines()
    assert sorted(printed) == sorted(lines)  # what was printed was committed: none twice
    mixed = raftmq(cluster, "consume", "clig", "--group", "readers", "--partition", "0")
    assert mixed.returncode == 2 and b"leave out --partition" in mixed.stderr


def test_consume_says_where_it_starts_when_nothing_is_committed(cluster: LocalCluster) -> None:
    """A new group starts at the log end: without a word it would seem to hang."""
    new = raftmq(cluster, "consume", "clig", "--group", "newcomers", "--idle-timeout-ms", "1000")
    assert new.returncode == 0 and new.stdout == b"", new.stderr
    said = new.stderr.decode()
    for p in (0, 1):
        assert re.search(
            rf"no committed offset for [^:]*clig/{p}\b[^:]*: starting at the log end "
            r"\(auto_offset_reset=latest\); use --from-beginning to read from the start",
            said,
        ), said
    plain = raftmq(cluster, "consume", "clig", "--idle-timeout-ms", "500")
    assert plain.returncode == 0, plain.stderr
    assert b"reading clig from the log end: new records only; use --from-beginning" in (
        plain.stderr
    )
