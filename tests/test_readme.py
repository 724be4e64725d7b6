"""The README's tour works when pasted: every fenced block of README.md runs, in the order
a reader meets it, against a real local cluster like the one ``make dev`` starts (three
brokers, topic ``demo`` with 3 partitions, data in ``./raftmq-data``).

- A ```python block runs on its own in a fresh interpreter (each block carries its own
  imports, as a reader copying one expects).
- Each line of a ```sh, ```bash or ```console block (continuation lines joined; a console
  block's ``$ `` prompt dropped) runs in bash with pipefail, in a folder that holds
  ``raftmq-data`` (the cluster's data and cluster file, where the CLI looks by default)
  and ``.venv/bin/raftmq``, a wrapper that runs this checkout's CLI with this interpreter.
- A block meant for reading only is marked by the line right before its fence:
  ``<!-- not run: why -->``. It is skipped, with that reason; every other block must
  succeed.

Two rewrites keep the run off shared state, and nothing else is changed: the README's
broker addresses ``127.0.0.1:9091``-``9093`` (``make dev``'s ports) become the ports the
test cluster bound (fixed ports could clash with a ``raftmq dev`` or another test run on
this machine), and ``/tmp/`` becomes the test's own temporary folder.

The tour runs twice: against a plaintext cluster, and against one started as ``raftmq dev
--secure`` starts it (TLS, authentication, ACLs; ``raftmq-data/client.toml`` written as it
writes it). The shell commands run unchanged there (a command that finds the cluster in
``raftmq-data`` uses that folder's client configuration); a Python block's clients get
the file's settings as keyword arguments (``Producer(address, **settings, ...)``, the one
more rewrite), as the README says Python clients take them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftmq.cli import connection
from raftmq.cli.cluster_cmd import CLIENT_CONFIG, TLS_FOLDER, write_client_config
from raftmq.devtools.dev_credentials import secure_cluster, store_admin
from raftmq.devtools.local_cluster import LocalCluster, local_spec
from tests.broker.conftest import SHARED_BROKER_ARGS, module_cluster

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PYTHON = {"python"}
SHELL = {"sh", "bash", "console"}
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")
ADDRESS = re.compile(r"127\.0\.0\.1:909([1-9])")
BLOCK_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    line: int
    """The line of its opening fence in README.md (1-based)."""
    language: str
    text: str
    not_run: str | None
    """Why it is not run, from its marker; None when it must run."""

    @property
    def name(self) -> str:
        return f"{self.language}-line-{self.line}"


def fenced_blocks(markdown: str) -> list[Block]:
    """Every fenced code block, with the not-run marker on the line before its fence."""
    lines = markdown.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        marker = NOT_RUN.search(lines[i - 1]) if i > 0 else None
        text = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(i + 1, opening.group(1), text, marker.group(1) if marker else None))
        i = end + 1
    return blocks


def shell_lines(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined, blank lines and comment
    lines dropped; in a console block only the ``$ `` lines (the rest is output)."""
    commands: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw
        if block.language == "console":
            if not line.startswith("$ ") and not pending:
                continue
            line = line.removeprefix("$ ")
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


BLOCKS = [b for b in fenced_blocks(README.read_text()) if b.language in PYTHON | SHELL]


CLIENT = re.compile(
    r"\b(Producer|Consumer|RetryingConsumer|ShareConsumer|LowLevelClient|AdminClient)\(([^,)]*)"
)
"""A client constructed with its addresses first (the README's way)."""


@dataclass
class Tour:
    cluster: LocalCluster
    home: Path
    """The reader's working folder: raftmq-data/ and .venv/bin/raftmq are here."""
    settings: dict[str, str] | None = None
    """A secure cluster's client settings (client.toml's), given to every Python client."""

    def rewrite(self, text: str, python: bool = False) -> str:
        addresses = self.cluster.addresses
        text = ADDRESS.sub(lambda m: addresses[int(m.group(1)) - 1], text)
        text = text.replace("/tmp/", f"{self.home}/tmp/")
        if python and self.settings is not None:
            text = f"_SECURE = {self.settings!r}\n" + CLIENT.sub(r"\1(\2, **_SECURE", text)
        return text

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module", params=["plaintext", "secure"])
def tour(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Tour]:
    home = tmp_path_factory.mktemp("reader")
    (home / "tmp").mkdir()
    bin_dir = home / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    wrapper = bin_dir / "raftmq"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m raftmq.cli.main "$@"\n')
    wrapper.chmod(0o755)
    spec = local_spec(3, {"demo": 3})  # what `raftmq dev` creates
    data = home / "raftmq-data"
    if request.param == "plaintext":
        with module_cluster(data, spec, SHARED_BROKER_ARGS, request) as cluster:
            yield Tour(cluster, home)
        return
    secure = secure_cluster(data / TLS_FOLDER)  # as `raftmq dev --secure`
    args = [*SHARED_BROKER_ARGS, *secure.broker_args]
    with module_cluster(data, spec, args, request, **secure.cluster_settings()) as cluster:
        store_admin(cluster, secure.credentials)
        config = write_client_config(
            data / CLIENT_CONFIG, cluster.addresses, secure.pki, secure.credentials.scram
        )
        settings = connection.load(config).tls
        yield Tour(cluster, home, {k: str(v) for k, v in settings.items()})


def test_the_readme_has_a_tour_to_run() -> None:
    """The parser finds the blocks (else every test below would pass by finding none)."""
    runnable = [b for b in BLOCKS if b.not_run is None]
    assert {b.language for b in runnable} >= {"python", "sh"}, BLOCKS
    assert all(b.not_run for b in BLOCKS if b.not_run is not None), "say why a block is not run"
    assert any("LowLevelClient" in b.text for b in runnable)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs_as_pasted(block: Block, tour: Tour) -> None:
    if block.not_run is not None:
        pytest.skip(f"README marks it not run: {block.not_run}")
    if block.language in PYTHON:
        runs = [[sys.executable, "-c", tour.rewrite(block.text, python=True)]]
    else:
        runs = [["bash", "-o", "pipefail", "-c", tour.rewrite(c)] for c in shell_lines(block)]
        assert runs, f"README.md:{block.line}: a shell block with no command"
    for argv in runs:
        done = subprocess.run(
            argv,
            cwd=tour.home,
            env=tour.env(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, (
            f"README.md:{block.line} failed (exit {done.returncode}): {argv[-1]}\n"
            f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-3000:]}"
        )
