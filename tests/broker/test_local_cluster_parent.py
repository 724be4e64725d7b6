"""A local cluster's brokers never outlive the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import sys, time
from pathlib import Path
from raftmq.devtools.local_cluster import LocalCluster, local_spec
cluster = LocalCluster(Path(sys.argv[1]), local_spec(3, {"t": 1}))
cluster.start()
cluster.wait_for_leaders(timeout=60)
print(" ".join(str(p.pid) for p in cluster.procs.values()), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_brokers_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the parent (as when a terminal running 'raftmq dev' is closed) reaches
    no broker, since they run in their own session; each notices and stops cleanly."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    pids: list[int] = []
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "brokers outlived their parent"
        for bid in (1, 2, 3):
            log = (tmp_path / f"broker-{bid}.log").read_text()
            assert "exited; stopping" in log
    finally:
        parent.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
