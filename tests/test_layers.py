"""The layer order holds: a module imports only its own floor or lower ones, and nothing
outside raftmq/raft/ reaches into a Raft group's core, a follower's progress or a
group's log (read it through ``RaftGroup.log_reader``, which only reads).

The order (docs/architecture.md), lowest first:
format < log < raft < partition, controller < api, broker < client, cli, devtools, spark.
raft/host counts as raft. Only the CLI may import the chaos harness (lazily, for
``raftmq chaos``). This test implements the rule itself from the code's own imports, so
it keeps holding without any outside tool."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "raftmq"
ORDER = [
    ["format"],
    ["log"],
    ["raft"],
    ["partition", "controller"],
    ["api", "broker"],
    ["client", "cli", "devtools", "spark"],
]
RANK = {name: rank for rank, floor in enumerate(ORDER) for name in floor}
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


def _modules() -> list[tuple[Path, str]]:
    """Every raftmq source file with its floor (the package under raftmq/)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_pb2" in path.name:
            continue  # generated gRPC code
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1:
            out.append((path, parts[0]))
    return out


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from raftmq import broker`` names the floor in the alias
            if node.module == "raftmq":
                found += [(node.lineno, f"raftmq.{a.name}") for a in node.names]
    return found


def upward_imports() -> list[str]:
    bad = []
    for path, floor in _modules():
        here = RANK.get(floor)
        assert here is not None, f"{path}: package raftmq/{floor} has no floor; add it to ORDER"
        for line, name in _imported(ast.parse(path.read_text(), str(path))):
            bits = name.split(".")
            where = f"{path.relative_to(ROOT)}:{line} imports {name}"
            if bits[0] == "chaos" and floor != "cli":
                bad.append(f"{where} (the chaos harness: only the CLI may)")
            if bits[0] == "raftmq" and len(bits) > 1 and RANK.get(bits[1], -1) > here:
                bad.append(f"{where} (upward: {bits[1]} is above {floor})")
    return bad


def peeks_into_raft() -> list[str]:
    """Peeks in raftmq outside raft/, and in the chaos harness and the benchmarks, which
    drive the same faces from outside the package."""
    outside = [path for path, floor in _modules() if floor != "raft"]
    outside += sorted((ROOT / "chaos").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    bad = []
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            peeked = _peek(node)
            if peeked is not None:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} reads .{peeked}")
    return bad


def test_no_module_imports_upward() -> None:
    assert upward_imports() == []


def test_nothing_outside_raft_reads_a_core_its_progress_or_a_group_log() -> None:
    assert peeks_into_raft() == []


def test_the_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    """The walks do find what they look for (a test that cannot fail proves nothing)."""
    tree = ast.parse(
        "from raftmq.client.lowlevel import X\nimport chaos.run\ny = g.core.term\n"
        "r.group.log.on_durable = f\nlog.log(20, 'not a peek')\n"
    )
    assert [n for _, n in _imported(tree)] == ["raftmq.client.lowlevel", "chaos.run"]
    peeks = [_peek(n) for n in ast.walk(tree)]
    assert sorted(p for p in peeks if p is not None) == ["core", "log"]
