"""Every benchmark runs one way: ``python -m benchmarks.NAME`` from the repository root.

Benchmarks import one another (``benchmarks.harness``) and start each other as modules
(``-m benchmarks.raft_bench_node``), so they run as modules of the ``benchmarks`` package,
none as a script with its own ``sys.path`` fix. This test runs ``--help`` of each the
documented way (cheap: argument parsing only, nothing is measured) and checks that no
usage line, README or Makefile shows the script form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULES = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem != "__init__")
SCRIPT_FORM = "python benchmarks/"


@pytest.mark.parametrize("name", MODULES)
def test_each_benchmark_runs_as_a_module(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if 'if __name__ == "__main__"' in (REPO / "benchmarks" / f"{name}.py").read_text():
        assert "usage:" in done.stdout, done.stdout


def test_no_doc_shows_the_script_form() -> None:
    places = [REPO / "README.md", REPO / "Makefile", *(REPO / "benchmarks").glob("*.py")]
    bad = [str(p.relative_to(REPO)) for p in places if SCRIPT_FORM in p.read_text()]
    assert bad == [], f"say 'python -m benchmarks.NAME' instead of '{SCRIPT_FORM}NAME.py'"
