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
import socket
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


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the usual bind-to-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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

    ``use_binary`` None means "the Go binary if installed", True requires it
    and False forces this package's implementation, which is what tests of
    the implementation itself need.
    """
    binary = shutil.which("toxiproxy-server")
    if use_binary and binary is None:
        raise LaunchError("toxiproxy-server is not on PATH")
    use_go = binary is not None and use_binary is not False
    attempts = 1 if port is not None else 3
    last_error: LaunchError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port(host)
        if use_go:
            assert binary is not None
            argv = [binary]
        else:
            argv = [sys.executable, "-m", "chaos.toxiproxy"]
        argv += ["-host", host, "-port", str(chosen)]
        if config is not None:
            argv += ["-config", str(config)]
        try:
            return _spawn(
                argv, host, chosen, "go" if use_go else "python", log_level, startup_timeout
            )
        except LaunchError as exc:
            last_error = exc  # most likely lost the race for the free port
    assert last_error is not None
    raise last_error


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
        if _api_answers(running.api_url):
            return running
        time.sleep(0.05)
    tail = running.log_tail()
    running.stop()
    raise LaunchError(
        f"{implementation} toxiproxy on {host}:{port} did not start "
        f"(exit code {process.returncode}):\n{tail}"
    )
