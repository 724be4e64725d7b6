"""``raftmq dev`` and its ports: the system's picks reserved for the cluster's lifetime and
reused on restart, and an explicit port that is taken refused in a sentence, never moved."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from raftmq.controller import cluster_file
from tests.cli.dev_runs import RAFTMQ, SMALL, run_dev_until_up


@pytest.mark.timeout(180)
def test_dev_on_system_ports_comes_back_on_the_same_ones(tmp_path: Path) -> None:
    run_dev_until_up(tmp_path, "--base-port", "0")
    first = cluster_file.load(tmp_path / "cluster.toml").brokers[1]
    assert first.port and first.raft_port
    ready = (tmp_path / "broker-1" / "ready.json").read_text()
    assert f"127.0.0.1:{first.port}" in ready and f"127.0.0.1:{first.raft_port}" in ready
    run_dev_until_up(tmp_path)
    assert cluster_file.load(tmp_path / "cluster.toml").brokers[1] == first


def test_dev_refuses_an_explicit_port_in_use_with_a_sentence(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        if port > 65001:
            pytest.skip(f"port {port} is above what --base-port allows")
        out = subprocess.run(
            [*RAFTMQ, "dev", "--data", str(tmp_path), *SMALL, "--base-port", str(port - 1)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out
    text = " ".join((out.stdout + out.stderr).split())
    assert f"port {port} on 127.0.0.1 (broker 1's client address) is in use" in text, text
    assert "--base-port" in text and "Traceback" not in text, text
    assert not (tmp_path / "broker-1.log").exists()  # no broker was started


@pytest.mark.timeout(180)
def test_dev_runs_dedicated_controllers_and_restarts_in_that_layout(tmp_path: Path) -> None:
    """Three controller-only nodes beside the broker; the demo goes through the broker.
    A restart without the flag is refused in a sentence, with it the cluster comes back."""
    args = ["--base-port", "0", "--dedicated-controllers"]
    out = run_dev_until_up(tmp_path, *args, "--demo-records", "20")
    assert "Every record came back" in out, out
    spec = cluster_file.load(tmp_path / "cluster.toml")
    assert spec.controller_voters == (1, 2, 3) and sorted(spec.brokers) == [1, 2, 3, 4]
    assert not list((tmp_path / "broker-1").glob("demo-*"))
    assert (tmp_path / "broker-4" / "demo-0").is_dir()
    # Four nodes, as the file, but combined: the layout differs, so it is refused.
    refused = subprocess.run(
        [*RAFTMQ, "dev", "--data", str(tmp_path), *SMALL, "--brokers", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--dedicated-controllers" in refused.stdout, refused
    run_dev_until_up(tmp_path, "--dedicated-controllers")
