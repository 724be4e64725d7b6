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
