"""The connection settings of the commands that connect (raftmq.cli.connection): a client
configuration file with Kafka's ssl_ and sasl_ keys, and the flags that override it,
without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from raftmq.cli import connection
from raftmq.cli.main import app


def test_a_config_file_gives_tls_files_relative_to_it_and_credentials_as_they_are(
    tmp_path: Path,
) -> None:
    path = tmp_path / "client.toml"
    path.write_text(
        'bootstrap = "h:1,h:2"\nssl_cafile = "tls/ca.pem"\n'
        'sasl_mechanism = "SCRAM-SHA-256"\nsasl_username = "alice"\nsasl_password = "pw"\n'
    )
    loaded = connection.load(path)
    assert loaded.bootstrap == ["h:1", "h:2"]
    assert loaded.tls == {
        "ssl_cafile": str(tmp_path / "tls" / "ca.pem"),
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "alice",
        "sasl_password": "pw",
    }
    path.write_text('sasl_mechnism = "x"\n')
    with pytest.raises(ValueError, match="unknown setting"):
        connection.load(path)


def test_settings_that_do_not_go_together_are_refused_before_connecting(tmp_path: Path) -> None:
    path = tmp_path / "client.toml"
    path.write_text('sasl_mechanism = "OAUTHBEARER"\n')
    result = CliRunner().invoke(
        app, ["topic", "list", "--config", str(path), "--bootstrap", "127.0.0.1:1"]
    )
    assert result.exit_code == 2
    assert "OAUTHBEARER needs sasl_oauth_token" in result.output
    result = CliRunner().invoke(
        app,
        [
            *("topic", "list", "--config", str(path), "--bootstrap", "127.0.0.1:1"),
            *("--sasl-mechanism", "PLAIN"),
        ],
    )
    assert result.exit_code == 2 and "'PLAIN' is not supported" in result.output
