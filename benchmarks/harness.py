"""What every benchmark here shares, with one set of rules:

- where data goes: :func:`disk_tempdir`, a temporary folder on a real disk (fsync on tmpfs
  costs nothing and would flatter whichever side fsyncs more);
- figures: :func:`percentile` (nearest rank), :func:`latency_summary`, :func:`cpu_seconds_of`,
  :func:`idle_cpu` (share of a core per process over a window, from schedstat),
  :func:`fsync_probe` (what the data disk's fsync costs now: the floor under acks=all);
- the command line: :func:`add_run_options` (``--quick``: under a minute; ``--json``: every
  figure as one JSON object on the last line, printed by :func:`print_json_last`), then a
  readable table for people;
- killing what they started: :func:`track` each child started in its own session
  (``start_new_session=True``), :func:`add_cleanup` for other things to undo, and
  :func:`kill_on_exit` once in ``main``: at exit, on SIGTERM and on Ctrl-C every tracked
  process group is SIGKILLed, so no broker or load process outlives its bench.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MEMORY_FILE_SYSTEMS = ("tmpfs", "ramfs")


# --- where data goes ----------------------------------------------------------------------


def filesystem_of(path: Path | str) -> tuple[str, str, str]:
    """(mount point, file system type, device) holding ``path``, from /proc/mounts."""
    real = os.path.realpath(path)
    best = ("/", "unknown", "unknown")
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype, *_ = line.split()
            mnt = mnt.replace("\\040", " ")
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best[0]):
                best = (mnt, fstype, dev)
    return best


def disk_tempdir(prefix: str, first_choice: Path | str | None = None) -> Path:
    """A fresh temporary folder on a real disk: in ``first_choice`` if given (created if
    missing, used even on tmpfs since the user asked, with a note), else in the first of
    $TMPDIR, /var/tmp, /tmp, the current directory and REPO/.bench-tmp that is not in memory."""
    if first_choice:
        base = Path(first_choice)
        base.mkdir(parents=True, exist_ok=True)
        if filesystem_of(base)[1] in MEMORY_FILE_SYSTEMS:
            print(f"note: {base} is in memory; fsync figures will not reflect a disk", flush=True)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    candidates = [os.environ.get("TMPDIR"), "/var/tmp", "/tmp", os.getcwd(), REPO / ".bench-tmp"]
    for cand in candidates:
        if not cand:
            continue
        Path(cand).mkdir(parents=True, exist_ok=True)
        if filesystem_of(cand)[1] not in MEMORY_FILE_SYSTEMS:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=cand))
    raise RuntimeError("no folder on a real disk for the benchmark's data (all are tmpfs)")


def cpu_seconds_of(pid: int) -> float:
    """utime + stime of a process (all threads) from /proc, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ns_of(pid: int) -> int:
    """CPU time of every thread of a process, in ns, from /proc/PID/task/*/schedstat.

    Why not only utime + stime from /proc/PID/stat: those count 10 ms clock ticks, and an
    idle broker uses a few of them per second, so a 4 s window would read in steps of a
    quarter of a percent. The stat figure is printed beside it as a check."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def idle_cpu(pids: dict[int, int], seconds: float) -> dict[int, tuple[float, float]]:
    """Share of one core each process used over ``seconds``: (by schedstat, by stat)."""
    before = {b: (cpu_ns_of(pid), cpu_seconds_of(pid)) for b, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    return {
        b: (
            (cpu_ns_of(pid) - before[b][0]) / 1e9 / elapsed,
            (cpu_seconds_of(pid) - before[b][1]) / elapsed,
        )
        for b, pid in pids.items()
    }


# --- figures ------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: p999 of 1000 samples is the maximum)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(samples_s: list[float]) -> dict[str, Any]:
    """Count, p50/p99/p999 and max in milliseconds of latencies given in seconds."""
    s = sorted(samples_s)
    return {
        "count": len(s),
        "p50_ms": percentile(s, 0.50) * 1000,
        "p99_ms": percentile(s, 0.99) * 1000,
        "p999_ms": percentile(s, 0.999) * 1000,
        "max_ms": (s[-1] * 1000) if s else float("nan"),
    }


def fsync_probe(directory: Path, count: int = 1000, size: int = 1024) -> dict[str, Any]:
    """Latency of append + fsync of ``size`` bytes on the data disk: the floor under an
    acks=all commit (leader and a follower each fsync), so a latency target can be read
    against what the disk allows at the moment. 1000 samples (about a second) so the rare
    stalls of a shared virtual disk show in p999 and max: they are the sequential tail."""
    path = directory / "fsync-probe"
    lats: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        block = os.urandom(size)
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            lats.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return latency_summary(lats)


# --- the command line ---------------------------------------------------------------------


def add_run_options(parser: argparse.ArgumentParser, quick_help: str) -> None:
    """``--quick`` (what it trims: ``quick_help``) and ``--json``, the same in every bench."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--json", action="store_true", help="print every figure as one JSON object, last line"
    )


def say(msg: str) -> None:
    """A progress line on stderr, stamped with the time (stdout keeps the figures)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def print_json_last(figures: object, **dumps_kwargs: Any) -> None:
    """The ``--json`` line: one object, the last line of the output, for scripts to parse."""
    print(json.dumps(figures, **dumps_kwargs), flush=True)


# --- killing what we started --------------------------------------------------------------

_LIVE: set[subprocess.Popen[Any]] = set()
_CLEANUPS: list[Callable[[], None]] = []


def track(proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    """Kill ``proc``'s process group at exit unless :func:`untrack`-ed first. The child must
    lead its own session (``start_new_session=True``) so that killing the group cannot hit
    the bench itself and does reach the child's own children."""
    _LIVE.add(proc)
    return proc


def untrack(proc: subprocess.Popen[Any]) -> None:
    _LIVE.discard(proc)


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    """Signal the whole process group ``proc`` leads; gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def add_cleanup(fn: Callable[[], None]) -> None:
    """Run ``fn`` in :func:`kill_all` (newest first), unless :func:`remove_cleanup`-ed."""
    _CLEANUPS.append(fn)


def remove_cleanup(fn: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        _CLEANUPS.remove(fn)


def kill_all() -> None:
    """Last line of defence: run the cleanups, then SIGKILL every tracked process group."""
    for fn in reversed(_CLEANUPS):
        with contextlib.suppress(Exception):
            fn()
    _CLEANUPS.clear()
    for proc in list(_LIVE):
        kill_group(proc)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
        _LIVE.discard(proc)


def kill_on_exit() -> None:
    """Call once in ``main``: kill what was started at exit, on SIGTERM (exit 128 + 15) and on
    Ctrl-C, even when started from a shell that ignores SIGINT for background jobs."""
    atexit.register(kill_all)

    def on_term(signum: int, _frame: object) -> None:
        kill_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
