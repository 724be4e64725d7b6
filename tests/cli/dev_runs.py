"""Running ``raftmq dev`` in a test: started as a user would, used while it is up, and
stopped with Ctrl-C, as tests/cli's dev tests do."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]
SMALL = ["--brokers", "1", "--partitions", "1", "--demo-records", "0"]


def run_dev_until_up(data: Path, *args: str, while_up: Callable[[], None] | None = None) -> str:
    """Start ``raftmq dev``, wait for "Cluster is up", run ``while_up`` (if given), stop it
    with Ctrl-C; its output. Later ``args`` override SMALL's."""
    proc = subprocess.Popen(
        [*RAFTMQ, "dev", "--data", str(data), *SMALL, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Cluster is up" in line:
                try:
                    if while_up is not None:
                        while_up()
                finally:
                    proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert "Cluster is up" in out, out
    return out
