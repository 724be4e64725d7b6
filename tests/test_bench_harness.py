"""benchmarks/harness.py: the rules every benchmark shares (real disk, percentiles, and that
nothing a bench started outlives it, on exit, SIGTERM or Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.harness import (
    MEMORY_FILE_SYSTEMS,
    disk_tempdir,
    filesystem_of,
    idle_cpu,
    kill_all,
    latency_summary,
    percentile,
    track,
)

REPO = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 1001)]
    assert percentile(values, 0.5) == 500
    assert percentile(values, 0.99) == 990
    assert percentile(values, 0.999) == 999
    assert percentile([7.0], 0.999) == 7
    summary = latency_summary([0.001, 0.003, 0.002])
    assert summary["count"] == 3 and summary["p50_ms"] == 2 and summary["max_ms"] == 3


def test_idle_cpu_tells_a_busy_process_from_a_sleeping_one():
    busy = track(
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    )
    asleep = track(subprocess.Popen(["sleep", "30"], start_new_session=True))
    try:
        shares = idle_cpu({1: busy.pid, 2: asleep.pid}, 1.0)
    finally:
        kill_all()
    (busy_share, busy_ticks), (asleep_share, _) = shares[1], shares[2]
    # 2 cores shared with other work: a spinning process still gets a good part of one
    assert busy_share > 0.2 and busy_ticks > 0.1, shares
    assert asleep_share < 0.01, shares


def test_temp_dir_is_not_in_memory():
    path = disk_tempdir("harness-test-")
    try:
        assert filesystem_of(path)[1] not in MEMORY_FILE_SYSTEMS
    finally:
        path.rmdir()


def test_kill_all_kills_the_whole_group():
    proc = track(subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True))
    time.sleep(0.2)
    children = [
        int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    ]
    kill_all()
    assert proc.poll() is not None
    deadline = time.monotonic() + 5
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(c) for c in children), "a grandchild outlived kill_all"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_kill_what_the_bench_started(sig):
    bench = textwrap.dedent(
        """
        import subprocess, time
        from benchmarks.harness import kill_on_exit, track
        kill_on_exit()
        child = track(subprocess.Popen(["sleep", "60"], start_new_session=True))
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", bench], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.send_signal(sig)
        proc.wait(timeout=10)
        assert not _alive(child)
    finally:
        proc.kill()
