"""Each package of raftmq imports only the packages its rule (MAY_IMPORT) lists, none of
another package's private parts, and nothing outside raftmq/raft/ reaches into a Raft
group's core, a follower's progress or a group's log (read it through
``RaftGroup.log_reader``, which only reads).

The rules, in words (docs/architecture.md):
- the contracts: ``format`` (the bytes of entries and records) imports nothing; ``api``
  (the RPCs, their error codes and bounds) only ``format``;
- the server, each floor on the ones below it: format < log < raft < partition,
  controller < broker; partition and controller do not import each other; the bounds
  client and server share live in a top-level helper (raftmq/limits.py), one definition;
- ``client`` imports only the contracts, never the server: an application that imports
  it loads no log, Raft, partition, controller or broker code (checked in a subprocess);
- the applications: ``spark`` is a client application (contracts and client only);
  ``devtools`` launches clusters (anything but cli and spark); ``cli`` may use anything
  but spark, and is the only one that may import the chaos harness (lazily, for
  ``raftmq chaos``).
- The top-level modules (raftmq/tasks.py and the like) are helpers every package may
  import; they import no package of raftmq themselves. raft/host counts as raft.

This test implements the rules itself from the code's own imports, so they keep holding
without any outside tool."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raftmq"
SERVER = frozenset({"log", "raft", "partition", "controller", "broker"})
CONTRACTS = frozenset({"format", "api"})
MAY_IMPORT: dict[str, frozenset[str]] = {
    "format": frozenset(),
    "api": frozenset({"format"}),
    "log": frozenset({"format"}),
    "raft": frozenset({"format", "log"}),
    "partition": frozenset({"format", "log", "raft"}),
    "controller": frozenset({"format", "log", "raft"}),
    "broker": CONTRACTS | SERVER,
    "client": CONTRACTS,
    "spark": CONTRACTS | {"client"},
    "devtools": CONTRACTS | SERVER | {"client"},
    "cli": CONTRACTS | SERVER | {"client", "devtools"},
    "__main__": frozenset({"cli"}),  # `python -m raftmq`
    "__init__": frozenset(),
}
"""Per package under raftmq/ (or top-level module that is no helper), the other packages it
may import. Every top-level helper module may be imported by all of them."""
PEEKED = frozenset({"core", "progress", "log"})
"""Attributes only raftmq/raft may read: a group's core, a core's progress, a group's log
(whose writes must follow the core). Everyone else asks the host (RaftHost.status,
RaftGroup.term/commit_index/next_offset/log_reader, the offsets RaftHost.propose returns).
``log.log(level, ...)``, a module's logger, is no peek."""


def _peek(node: ast.AST) -> str | None:
    """The attribute ``node`` peeks at, if it is one of PEEKED."""
    if not isinstance(node, ast.Attribute) or node.attr not in PEEKED:
        return None
    if node.attr == "log" and isinstance(node.value, ast.Name) and node.value.id == "log":
        return None  # the logger's log(level, msg)
    return node.attr


def _sources(package: Path) -> list[tuple[Path, str]]:
    """Every source file of ``package`` with its floor: the package under raftmq/ it is
    in, or for a top-level module its own name."""
    out = []
    for path in sorted(package.rglob("*.py")):
        if "_pb2" in path.name:
            continue  # generated gRPC code
        parts = path.relative_to(package).parts
        out.append((path, parts[0] if len(parts) > 1 else path.stem))
    return out


def _helpers(package: Path) -> frozenset[str]:
    """The top-level helper modules (raftmq/tasks.py, ...)."""
    return frozenset(p.stem for p in package.glob("*.py")) - MAY_IMPORT.keys()


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import, lazy ones included; ``from a.b import
    c`` names ``a.b.c``, the module or the name it takes from a.b."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _why_not(floor: str, name: str, helpers: frozenset[str]) -> str | None:
    """Why a module of ``floor`` may not import ``name``; None when it may."""
    bits = name.split(".")
    if bits[0] == "chaos":
        return None if floor == "cli" else "the chaos harness: only the CLI may"
    if bits[0] != "raftmq" or len(bits) == 1 or bits[1] == floor:
        return None
    target = bits[1]
    if any(bit.startswith("_") for bit in bits[2:]):
        return f"a private part of {target}"
    if target in helpers:
        return None
    allowed = frozenset() if floor in helpers else MAY_IMPORT[floor]
    if target not in allowed:
        return f"{floor} may import only {', '.join(sorted(allowed | {'helpers'}))}"
    return None


def layer_violations(package: Path = PACKAGE) -> list[str]:
    helpers = _helpers(package)
    bad = []
    for path, floor in _sources(package):
        assert floor in MAY_IMPORT or floor in helpers, (
            f"{path}: package raftmq/{floor} has no rule; add it to MAY_IMPORT"
        )
        for line, name in _imported(ast.parse(path.read_text(), str(path))):
            why = _why_not(floor, name, helpers)
            if why is not None:
                bad.append(f"{path.relative_to(package.parent)}:{line} imports {name} ({why})")
    return bad


def peeks_into_raft() -> list[str]:
    """Peeks in raftmq outside raft/, and in the chaos harness and the benchmarks, which
    drive the same faces from outside the package."""
    outside = [path for path, floor in _sources(PACKAGE) if floor != "raft"]
    outside += sorted((ROOT / "chaos").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    bad = []
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            peeked = _peek(node)
            if peeked is not None:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} reads .{peeked}")
    return bad


def test_every_package_imports_only_what_its_rule_allows() -> None:
    assert layer_violations() == []


def test_nothing_outside_raft_reads_a_core_its_progress_or_a_group_log() -> None:
    assert peeks_into_raft() == []


def test_importing_the_client_loads_no_server_code() -> None:
    """What an application pays for ``import raftmq.client``: the contracts, the helpers
    and the client, nothing of the server (the static rule sees direct imports only)."""
    code = "import sys, raftmq.client; print(*sorted(sys.modules))"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    loaded = {m.split(".")[1] for m in run.stdout.split() if m.startswith("raftmq.")}
    assert "client" in loaded
    assert sorted(loaded & SERVER) == []
    assert sorted(loaded - MAY_IMPORT["client"] - _helpers(PACKAGE) - {"client"}) == []


def test_the_import_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    """Injected bad imports are found (a test that cannot fail proves nothing), and what
    the rules allow is not."""
    package = tmp_path / "raftmq"
    sources = {
        "tasks.py": "import asyncio\n",
        "net.py": "from raftmq.client import lowlevel\n",
        "client/fine.py": (
            "from raftmq.api.limits import RACK\nfrom raftmq import format\n"
            "from raftmq.tasks import stop_task\nfrom raftmq.client.errors import _own\n"
        ),
        "client/bad.py": "from raftmq.controller.groups import X\n",
        "format/bad.py": "def lazy():\n    import raftmq.log.log\n",
        "spark/bad.py": "from raftmq import broker\nfrom raftmq.client.lowlevel import _retry\n",
        "devtools/bad.py": "import chaos.run\n",
        "cli/fine.py": "from chaos.run import run\nfrom raftmq.broker.server import Broker\n",
    }
    for name, text in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert [v.split(" (")[0] for v in layer_violations(package)] == [
        "raftmq/client/bad.py:1 imports raftmq.controller.groups.X",
        "raftmq/devtools/bad.py:1 imports chaos.run",
        "raftmq/format/bad.py:2 imports raftmq.log.log",
        "raftmq/net.py:1 imports raftmq.client.lowlevel",
        "raftmq/spark/bad.py:1 imports raftmq.broker",
        "raftmq/spark/bad.py:2 imports raftmq.client.lowlevel._retry",
    ]


def test_the_peek_rule_catches_what_it_forbids() -> None:
    tree = ast.parse("y = g.core.term\nr.group.log.on_durable = f\nlog.log(20, 'not a peek')\n")
    peeks = [_peek(n) for n in ast.walk(tree)]
    assert sorted(p for p in peeks if p is not None) == ["core", "log"]
