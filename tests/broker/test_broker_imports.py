"""The broker package's modules import each other without a cycle, and its request layer
(routing.py) imports no wire protocol.

Why: a cycle is how the package grew into a knot (errors.py imported server.py to read two
fields of the Broker, which imported everything); without one, each module can be read,
tested and replaced from the bottom up, and a second listener (Kafka, HTTP) can sit on
routing.py beside the gRPC service. Imports are read from the source (ast), every one of
them, including those under ``if TYPE_CHECKING:`` and inside functions: a cycle hidden
there still ties the modules together.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import raftmq.broker

PACKAGE = "raftmq.broker"
BROKER_DIR = Path(raftmq.broker.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``, so a
    submodule imported by name is seen)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def broker_graph() -> dict[str, set[str]]:
    """Each module of raftmq/broker/: the modules of the same package it imports."""
    modules = {f"{PACKAGE}.{p.stem}": p for p in BROKER_DIR.glob("*.py") if p.stem != "__init__"}
    return {name: imported_modules(path) & set(modules) for name, path in modules.items()}


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module: the modules it imports), as the modules along
    it with the first repeated at the end; None when there is none."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        if module in on_path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        on_path.add(module)
        for imported in sorted(graph.get(module, ())):
            cycle = visit(imported)
            if cycle is not None:
                return cycle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle is not None:
            return cycle
    return None


def test_the_broker_modules_import_each_other_without_a_cycle() -> None:
    graph = broker_graph()
    assert f"{PACKAGE}.server" in graph and f"{PACKAGE}.routing" in graph, sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_cycle_check_finds_an_injected_cycle() -> None:
    """The check can fail: a synthetic graph with a cycle three modules long (and one
    without) is told apart, and so is the real graph with one bad import added."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    graph = broker_graph()
    graph[f"{PACKAGE}.refusals"].add(f"{PACKAGE}.server")  # what errors.py once did
    cycle = find_cycle(graph)
    assert cycle is not None and f"{PACKAGE}.server" in cycle and f"{PACKAGE}.refusals" in cycle


def test_the_ast_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import grpc\n"
        "from raftmq.broker import server\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from raftmq.broker.refusals import Refusal\n"
        "def later():\n"
        "    import raftmq.api.v1.broker_pb2\n"
    )
    found = imported_modules(source)
    assert {"grpc", "raftmq.broker.server", "raftmq.broker.refusals"} <= found
    assert "raftmq.api.v1.broker_pb2" in found


def _wire_protocol(module: str) -> bool:
    generated = module.startswith("raftmq.api.v1") and module.rsplit(".", 1)[-1].endswith(
        ("_pb2", "_pb2_grpc")
    )
    return module == "grpc" or module.startswith(("grpc.", "grpc_", "google.protobuf")) or generated


def test_the_request_layer_imports_no_wire_protocol() -> None:
    """routing.py takes and returns plain values, so a listener of another protocol can
    call it unchanged: it imports neither grpc nor protobuf nor the generated messages."""
    imported = imported_modules(BROKER_DIR / "routing.py")
    assert not sorted(m for m in imported if _wire_protocol(m))
    assert _wire_protocol("raftmq.api.v1.broker_pb2") and _wire_protocol("grpc")
