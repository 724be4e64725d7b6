"""The addresses a running broker actually bound, in a small file in its data directory.

A launcher waits for this file rather than polling a port: a port that answers may belong
to another process, while the file says which process listens where (and a broker given
port 0 says which port it got): its gRPC and Raft listeners and, unless metrics are off,
its Prometheus endpoint. It is replaced atomically once the listeners are up, and removed
by the launcher before each start, so a file present is this run's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

READY_FILE = "ready.json"


@dataclass(frozen=True, slots=True)
class BoundAddresses:
    pid: int
    client: str  # host:port of the gRPC service
    raft: str  # host:port of the Raft listener
    metrics: str = ""  # host:port serving Prometheus /metrics ("": metrics are off)


def write(data_dir: Path, bound: BoundAddresses) -> Path:
    """Write ``data_dir/ready.json`` atomically (rename); no fsync: it describes this run
    only and means nothing after a crash."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / READY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "pid": bound.pid,
                "client": bound.client,
                "raft": bound.raft,
                "metrics": bound.metrics,
            }
        )
    )
    os.replace(tmp, path)
    return path


def read(data_dir: Path) -> BoundAddresses | None:
    """What ``data_dir/ready.json`` says, or None while there is none."""
    try:
        raw = json.loads((data_dir / READY_FILE).read_text())
    except FileNotFoundError:
        return None
    return BoundAddresses(
        int(raw["pid"]), str(raw["client"]), str(raw["raft"]), str(raw.get("metrics", ""))
    )
