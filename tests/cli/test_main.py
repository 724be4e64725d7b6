"""``python -m raftmq`` is the ``raftmq`` command, for a checkout without the script."""

import subprocess
import sys


def test_python_dash_m_raftmq_lists_the_commands():
    result = subprocess.run(
        [sys.executable, "-m", "raftmq", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for name in ("dev", "demo", "broker", "status", "log", "chaos"):
        assert f"│ {name} " in result.stdout


def test_chaos_without_its_extra_says_what_to_install(monkeypatch):
    """A missing optional dependency is a sentence and exit status 2, before any broker
    starts, not a ModuleNotFoundError (or one at the end of a run, for matplotlib)."""
    from typer.testing import CliRunner

    from raftmq.cli.main import app

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    result = CliRunner().invoke(app, ["chaos", "run", "--duration", "10"])
    assert result.exit_code == 2, result.output
    assert "pip install 'raftmq[chaos]'" in result.output
    assert "matplotlib" in result.output and "Traceback" not in result.output
