"""``raftmq dev --secure``: a local CA and certificates, TLS on every listener (mutual), a
client configuration file, and commands that connect working with ``--config FILE``, while
one without it is refused in a sentence."""

from __future__ import annotations

import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

RAFTMQ = [sys.executable, "-m", "raftmq.cli.main"]
SMALL = ["--partitions", "1", "--demo-records", "20", "--base-port", "0"]


@pytest.mark.timeout(240)
def test_dev_secure_writes_a_client_config_that_commands_use(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    proc = subprocess.Popen(
        [*RAFTMQ, "dev", "--secure", "--data", str(data), "--brokers", "2", *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C" in line:  # the last words of the notice (it may wrap)
                break
        out = " ".join(" ".join(lines).split())
        assert "Cluster is up, with TLS on (mutual)" in out and "--config" in out, out
        config = data / "client.toml"
        settings = tomllib.loads(config.read_text())
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            assert (config.parent / settings[key]).exists()

        def raftmq(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*RAFTMQ, *args], capture_output=True, text=True, timeout=120, check=False
            )

        demo = raftmq("demo", "--config", str(config), "--records", "30")
        assert demo.returncode == 0, demo.stdout + demo.stderr
        listed = raftmq("topic", "list", "--config", str(config))
        assert listed.returncode == 0 and "demo" in listed.stdout, listed.stdout + listed.stderr
        plain = raftmq("status", "--data", str(data))
        assert plain.returncode != 0
        assert "if its listener uses TLS" in plain.stdout + plain.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
