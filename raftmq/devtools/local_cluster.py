"""A cluster of real broker processes on this machine, for ``raftmq dev``, integration tests
and the chaos harness: start, SIGKILL, SIGSTOP, restart on the same data, wait for leaders.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from raftmq.client.lowlevel import LowLevelClient
from raftmq.controller import cluster_file
from raftmq.controller.cluster_file import ClusterSpec
from raftmq.controller.metadata import BrokerSpec, TopicSpec
from raftmq.controller.placement import round_robin

CLUSTER_FILE = "cluster.toml"


def free_port(preferred: int = 0) -> int:
    """``preferred`` if it is free on 127.0.0.1, else any free port."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port on 127.0.0.1")


def local_spec(
    brokers: int,
    topics: dict[str, int],
    *,
    replication: int = 3,
    base_port: int = 0,
    name: str = "raftmq-dev",
) -> ClusterSpec:
    """Brokers on 127.0.0.1 (ports near ``base_port`` when free) and topics with replicas
    placed round-robin."""
    specs = {
        i: BrokerSpec(
            i,
            "127.0.0.1",
            free_port(base_port + i if base_port else 0),
            free_port(base_port + 100 + i if base_port else 0),
        )
        for i in range(1, brokers + 1)
    }
    ids = sorted(specs)
    factor = min(replication, brokers)
    out = {}
    for topic, partitions in topics.items():
        replicas = round_robin(ids, partitions, factor)
        out[topic] = TopicSpec(topic, replicas)
    return ClusterSpec(name, specs, out)


class LocalCluster:
    def __init__(
        self,
        data: Path,
        spec: ClusterSpec,
        *,
        broker_args: list[str] | None = None,
        per_broker_args: dict[int, list[str]] | None = None,
        nofile: int | None = None,
    ) -> None:
        """``per_broker_args`` adds arguments to one broker's command line (chaos passes
        ``--peers`` and ``--listen`` to route traffic through proxies). ``nofile`` starts
        the brokers with that open-file limit, soft and hard (so they cannot raise it), as
        on a host whose default is low."""
        self.data = data
        self.spec = spec
        self.broker_args = broker_args or []
        self.per_broker_args = per_broker_args or {}
        self.nofile = nofile
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        data.mkdir(parents=True, exist_ok=True)
        self.cluster_path = data / CLUSTER_FILE
        self.cluster_path.write_text(cluster_file.dump(spec))

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.spec.brokers.values()]

    def log_path(self, broker_id: int) -> Path:
        return self.data / f"broker-{broker_id}.log"

    def start(self, broker_id: int | None = None, *, open_files_limit: int | None = None) -> None:
        """Start one broker (or every one not running). ``open_files_limit`` (default: the
        cluster's ``nofile``) starts it with that RLIMIT_NOFILE, soft and hard, as a host
        with a low limit would (the chaos harness's ``fd-pressure`` fault)."""
        if open_files_limit is None:
            open_files_limit = self.nofile
        for bid in [broker_id] if broker_id else list(self.spec.brokers):
            if bid in self.procs and self.procs[bid].poll() is None:
                continue
            cmd = [
                sys.executable,
                "-m",
                "raftmq.cli.main",
                "broker",
                "--id",
                str(bid),
                "--cluster",
                str(self.cluster_path),
                "--data",
                str(self.data),
                # Brokers run in their own session, so a Ctrl-C reaches only this process,
                # which stops them in order; they stop by themselves if it dies.
                "--parent-pid",
                str(os.getpid()),
                *self.broker_args,
            ]
            cmd += self.per_broker_args.get(bid, [])
            if open_files_limit is not None:
                # prlimit(1) (util-linux) rather than a preexec_fn: forking a process that
                # runs gRPC threads to call setrlimit in the child is not safe.
                cmd = ["prlimit", f"--nofile={open_files_limit}:{open_files_limit}", "--", *cmd]
            with open(self.log_path(bid), "ab") as logfile:
                self.procs[bid] = subprocess.Popen(
                    cmd,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

    def signal(self, broker_id: int, sig: signal.Signals) -> None:
        proc = self.procs.get(broker_id)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def kill(self, broker_id: int) -> None:
        """SIGKILL: no hand-over, no flush. Resumes a paused process first."""
        proc = self.procs.pop(broker_id, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)

    def stop(self, broker_id: int | None = None, timeout: float = 15.0) -> None:
        """SIGTERM (graceful hand-over and flush), then SIGKILL after ``timeout``."""
        ids = [broker_id] if broker_id else list(self.procs)
        for bid in ids:
            self.signal(bid, signal.SIGCONT)
            self.signal(bid, signal.SIGTERM)
        for bid in ids:
            proc = self.procs.pop(bid, None)
            if proc is None:
                continue
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def alive(self, broker_id: int) -> bool:
        proc = self.procs.get(broker_id)
        return proc is not None and proc.poll() is None

    def client(self) -> LowLevelClient:
        return LowLevelClient(self.addresses)

    def wait_for_leaders(
        self, timeout: float = 30.0, among: set[int] | None = None, *, preferred: bool = False
    ) -> dict:
        """Block until every partition reports a leader (optionally one of ``among``; with
        ``preferred``, its first-listed replica, where leader rebalancing puts it once that
        replica is in sync: then no hand-back will move it later)."""
        wanted = {(t.name, p) for t in self.spec.topics.values() for p in range(t.partitions)}
        first = {
            (t.name, p): replicas[0]
            for t in self.spec.topics.values()
            for p, replicas in enumerate(t.replicas)
        }
        deadline = time.monotonic() + timeout
        with LowLevelClient(self.addresses, retries=1) as client:
            while True:
                leaders = client.refresh_leaders(timeout=1.0)
                good = {
                    k
                    for k, v in leaders.items()
                    if (among is None or v.broker_id in among)
                    and (not preferred or v.broker_id == first[k])
                }
                if wanted <= good:
                    return leaders
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"partitions without {'their preferred' if preferred else 'a'} leader"
                        f" after {timeout:.0f} s: "
                        f"{sorted(wanted - good)}; see {self.data}/broker-*.log"
                    )
                time.sleep(0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=10)
        for bid in list(self.procs):
            self.kill(bid)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
