"""Regenerates the Python code of the .proto files (``make proto``), and tells whether the
committed code is current (a test runs :func:`is_current`)."""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted((ROOT / "raftmq" / "api" / "v1").glob("*.proto"))


def generate(out: Path) -> None:
    from grpc_tools import protoc  # a build-time tool: imported only here

    for proto in PROTOS:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(proto.relative_to(ROOT)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")


def is_current() -> list[str]:
    """Names of generated files that differ from what the .proto files produce now."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for fresh in sorted(Path(tmp).rglob("*_pb2*.py*")):
            committed = ROOT / fresh.relative_to(tmp)
            if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
        return stale


if __name__ == "__main__":
    generate(ROOT)
    print("generated:", *(p.name for p in PROTOS), file=sys.stderr)
