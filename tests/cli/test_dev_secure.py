"""``raftmq dev --secure``: a local CA and certificates, TLS on every listener (mutual),
authentication (an admin SCRAM user), a client configuration file, and commands that
connect working with ``--config FILE`` (users added and listed too) or finding it in the
data folder, while one without it, or with certificates but no credentials, is refused in
a sentence."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.cli.dev_runs import RAFTMQ, run_dev_until_up

TLS_FLAGS = (("ca", "cafile"), ("cert", "certfile"), ("key", "keyfile"))


def _raftmq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAFTMQ, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.timeout(240)
def test_dev_secure_writes_a_client_config_that_commands_use(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    config = data / "client.toml"

    def use_it() -> None:
        settings = tomllib.loads(config.read_text())
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            assert (config.parent / settings[key]).exists()
        assert settings["sasl_mechanism"] == "SCRAM-SHA-256" and settings["sasl_username"]
        demo = _raftmq("demo", "--config", str(config), "--records", "30")
        assert demo.returncode == 0, demo.stdout + demo.stderr
        listed = _raftmq("topic", "list", "--config", str(config))
        assert listed.returncode == 0 and "demo" in listed.stdout, listed.stdout + listed.stderr
        produced = _raftmq("produce", "demo", "--config", str(config), stdin="tour-1\ntour-2\n")
        assert produced.returncode == 0, produced.stdout + produced.stderr
        consumed = _raftmq(
            *("consume", "demo", "--from-beginning", "--max-messages", "2"),
            *("--group", "tour", "--config", str(config)),
        )
        assert consumed.returncode == 0, consumed.stdout + consumed.stderr
        added = _raftmq("user", "add", "bob", "--password", "bob-pw", "--config", str(config))
        assert added.returncode == 0, added.stdout + added.stderr
        users = _raftmq("user", "list", "--json", "--config", str(config))
        names = {u["name"] for u in json.loads(users.stdout)}
        assert names == {"admin", "bob"}, users.stdout + users.stderr
        tls = [f"--tls-{k}={config.parent / settings[f'ssl_{v}']}" for k, v in TLS_FLAGS]
        anonymous = _raftmq("topic", "list", "--bootstrap", settings["bootstrap"], *tls)
        assert anonymous.returncode != 0
        assert "this listener expects SCRAM-SHA-256" in " ".join(anonymous.stdout.split())
        # The data folder's client.toml serves a command that finds the cluster there...
        found = _raftmq("topic", "list", "--data", str(data))
        assert found.returncode == 0 and "demo" in found.stdout, found.stdout + found.stderr
        # ...but not one told where the brokers are: plaintext then, refused.
        plain = _raftmq("status", "--bootstrap", settings["bootstrap"])
        assert plain.returncode != 0
        assert "if its listener uses TLS" in plain.stdout + plain.stderr

    out = run_dev_until_up(
        data, "--secure", "--demo-records", "20", "--base-port", "0", while_up=use_it
    )
    out = " ".join(out.split())  # the notice wraps
    assert (
        "Cluster is up, with TLS on (mutual) and authentication" in out
        and f"--config {config}" in out
    ), out
