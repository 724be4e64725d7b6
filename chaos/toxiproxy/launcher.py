"""Start a toxiproxy server in its own process for tests and the chaos harness.

A separate process matters: the proxy must keep pumping bytes while the test
blocks in socket calls, and killing it is a realistic way to lose the proxy.
When a real ``toxiproxy-server`` binary is on PATH it is used instead (unless
the caller asks for the Python one), so the harness can run against both.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

_PROJECT_ROOT = Path(__file__).resolve().parents[2]


class LaunchError(RuntimeError):
    """The server did not come up; the message carries the tail of its log."""


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on, from /proc (Linux): how the launcher learns
    which port a server started with ``-port 0`` got, since the Go binary reports none."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
            next(f)  # the header
            for line in f:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass
class RunningToxiproxy:
    """A server process and how to reach its API."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    implementation: str  # "python" or "go"
    log_path: Path
    keep_log: bool = False  # the log file is deleted on stop unless set
    _log_file: IO[bytes] | None = field(repr=False, default=None)

    @property
    def api_url(self) -> str:
        """Base URL of the HTTP API, without a trailing slash."""
        return f"http://{self.host}:{self.port}"

    def log_tail(self, limit: int = 4000) -> str:
        """The end of the server's combined stdout/stderr, for failure messages."""
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
        if not self.keep_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()
        return self.process.returncode

    def __enter__(self) -> RunningToxiproxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _api_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/version", timeout=1.0) as response:
            json.loads(response.read())
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def start_toxiproxy(
    host: str = "127.0.0.1",
    port: int | None = None,
    *,
    use_binary: bool | None = None,
    config: str | os.PathLike[str] | None = None,
    log_level: str = "info",
    startup_timeout: float = 10.0,
) -> RunningToxiproxy:
    """Start a server and wait (at most ``startup_timeout`` s) until its API answers.
    Without ``port`` the server binds port 0 and :attr:`RunningToxiproxy.port` is the one
    it got: no port is picked first and bound later, a race another process can win.

    ``use_binary`` None means "the Go binary if installed", True requires it
    and False forces this package's implementation, which is what tests of
    the implementation itself need.
    """
    binary = shutil.which("toxiproxy-server")
    if use_binary and binary is None:
        raise LaunchError("toxiproxy-server is not on PATH")
    use_go = binary is not None and use_binary is not False
    if use_go:
        assert binary is not None
        argv = [binary]
    else:
        argv = [sys.executable, "-m", "chaos.toxiproxy"]
    argv += ["-host", host, "-port", str(port or 0)]
    if config is not None:
        argv += ["-config", str(config)]
    return _spawn(argv, host, port or 0, "go" if use_go else "python", log_level, startup_timeout)


def _spawn(
    argv: list[str], host: str, port: int, implementation: str, log_level: str, timeout: float
) -> RunningToxiproxy:
    env = dict(os.environ)
    env["LOG_LEVEL"] = log_level
    # The project is not necessarily pip-installed; make ``chaos`` importable.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    fd, log_name = tempfile.mkstemp(prefix="toxiproxy-", suffix=".log")
    log_file = os.fdopen(fd, "wb")
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env
    )
    running = RunningToxiproxy(
        host, port, process, implementation, Path(log_name), _log_file=log_file
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        # Port 0: the server bound one the kernel picked; proxies of a config file listen
        # too, so the API is the listener that answers GET /version.
        for candidate in [port] if port else sorted(listening_ports(process.pid)):
            running.port = candidate
            if _api_answers(running.api_url):
                return running
        time.sleep(0.05)
    tail = running.log_tail()
    running.stop()
    raise LaunchError(
        f"{implementation} toxiproxy on {host}:{port} did not start "
        f"(exit code {process.returncode}):\n{tail}"
    )
