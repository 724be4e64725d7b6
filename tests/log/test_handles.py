"""Bounded resources of many logs in one process: the shared LRU of segment descriptors
(handles.py) and the disk reserved ahead of active segments (preallocate.py).

Why these tests exist: 1,000 partition replicas held ~2,000 open files per broker and died
of EMFILE under a soft limit of 1,024, and 3,000 active segments reserved ~47 GB for 13 MB.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.log import preallocate
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.handles import HANDLES, cap_for_limit
from raftmq.log.log import Log
from raftmq.log.segment import LOG_SUFFIX

ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4096
SLACK = 2 * BLOCK
"""Allocated beyond the size of a file we reserve nothing for: its last partial block and
an extent tree block."""


def data_entry(index: int, size: int = 100) -> bytes:
    return entry.encode(
        bytes([index % 251]) * size,
        index=index,
        term=1,
        base_offset=index - 1,
        record_count=1,
        first_timestamp=index,
        max_timestamp=index,
    )


def append_one(log: Log, size: int = 100) -> bytes:
    e = data_entry(log.next_index, size)
    log.append(e)
    return e


def run_child(code: str, directory: Path, *, timeout_s: float) -> list[int]:
    """The integers a child process running ``code`` on ``directory`` printed: the tests
    that lower the open-file limit do it in a process of their own."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [int(word) for word in proc.stdout.split()]


def exhaust_descriptors() -> list[int]:
    """In a child process: lower the open-file limit to two above what is open, and take
    every descriptor left (on /dev/null); returns them."""
    in_use = len(os.listdir("/proc/self/fd"))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 2, hard))
    taken = []
    try:
        while True:
            taken.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return taken


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def allocated_bytes(directory: Path) -> tuple[int, int]:
    """(allocated, written) bytes of every segment file under ``directory``."""
    allocated = written = 0
    for path in directory.rglob("*" + LOG_SUFFIX):
        st = path.stat()
        allocated += st.st_blocks * 512
        written += st.st_size
    return allocated, written


@pytest.fixture
def cap() -> Iterator[None]:
    """Tests here change the process-wide cap and budget: restore both afterwards."""
    old_cap, old_total = HANDLES.cap, preallocate.BUDGET.total_bytes
    yield
    HANDLES.set_cap(old_cap)
    preallocate.BUDGET.set_total(old_total)


def test_the_cap_follows_the_open_file_limit() -> None:
    assert cap_for_limit(256) < 256 - 32  # room is left for sockets and small files
    assert cap_for_limit(1024) < 1024 - 200
    assert cap_for_limit(1 << 20) > 500_000
    assert cap_for_limit(10) >= 16  # never so low a log cannot work


def test_many_logs_share_a_bounded_set_of_descriptors(tmp_path: Path, cap: None) -> None:
    """60 logs, each rolling segments, written and read in turns with room for only 8
    descriptors: never more are open, and every byte reads back."""
    HANDLES.set_cap(8)
    baseline = open_fds()
    config = LogConfig(segment_bytes=2048, flush_policy=FlushPolicy.INTERVAL, max_open_segments=4)
    logs = [Log.open(tmp_path / f"log-{i}", config) for i in range(60)]
    written: list[list[bytes]] = [[] for _ in logs]
    peak = 0
    try:
        for round_ in range(12):
            for i, log in enumerate(logs):
                written[i].append(append_one(log, 300))
                if round_ % 3 == 2:
                    log.flush()
                got = log.read_by_index(1, 1 << 20).data
                assert got == b"".join(written[i])
                peak = max(peak, open_fds() - baseline)
                assert HANDLES.open_count <= 8
        assert peak <= 8 + 1  # + one short-lived checkpoint or directory descriptor
        assert HANDLES.evictions > 0
    finally:
        for log in logs:
            log.close()
    for i in range(0, 60, 7):  # and a restart finds everything in place
        with Log.open(tmp_path / f"log-{i}", config) as log:
            assert log.read_by_index(1, 1 << 20).data == b"".join(written[i])


def test_flushes_in_threads_keep_their_descriptors_while_others_evict(
    tmp_path: Path, cap: None
) -> None:
    """The driver fsyncs logs in a thread pool while its loop appends to others: a pinned
    descriptor is never closed under a running fdatasync or write."""
    HANDLES.set_cap(4)
    config = LogConfig(segment_bytes=4096, flush_policy=FlushPolicy.INTERVAL)
    logs = [Log.open(tmp_path / f"log-{i}", config) for i in range(24)]
    errors: list[BaseException] = []

    def worker(mine: list[Log]) -> None:
        try:
            for _ in range(40):
                for log in mine:
                    append_one(log, 200)
                    log.flush()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(logs[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        for log in logs:
            assert log.durable_index == log.last_index == 40
            assert len(log.read_by_index(1, 1 << 20).data) == 40 * len(data_entry(1, 200))
        assert HANDLES.open_count <= 4
    finally:
        for log in logs:
            log.close()


def test_idle_logs_reserve_nothing_ahead_of_their_data(tmp_path: Path, cap: None) -> None:
    """200 logs with a few KiB each: allocated disk stays near what was written (a fixed
    16 MiB each used to be reserved: 3.2 GB here)."""
    logs = [Log.open(tmp_path / f"log-{i}") for i in range(200)]
    try:
        for log in logs:
            for _ in range(8):
                append_one(log, 500)
        allocated, written = allocated_bytes(tmp_path)
        # Each file rounds up to whole blocks; beyond that at most the process's budget.
        assert allocated <= 2 * written + preallocate.BUDGET.total_bytes
        assert allocated <= written + len(logs) * SLACK
    finally:
        for log in logs:
            log.close()


def test_busy_logs_reserve_within_the_process_budget(tmp_path: Path, cap: None) -> None:
    """Logs written fast get reservations ahead of their ends, sized by their writes, and
    all of them together never hold more than the budget."""
    budget = 1 << 20
    # Tickets of logs other tests abandoned (simulated crashes) stay taken: count from here.
    held = preallocate.BUDGET.used_bytes
    preallocate.BUDGET.set_total(held + budget)
    # Write-through, so the files' sizes are all that was appended.
    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, write_behind_bytes=0)
    logs = [Log.open(tmp_path / f"log-{i}", config) for i in range(6)]
    reserved_seen = 0
    try:
        for _ in range(200):
            for log in logs:
                append_one(log, 8000)
            allocated, written = allocated_bytes(tmp_path)
            reserved_seen = max(reserved_seen, allocated - written)
            assert preallocate.BUDGET.used_bytes - held <= budget
            assert allocated - written <= budget + len(logs) * SLACK
        assert reserved_seen >= 256 * 1024  # busy logs did reserve ahead
    finally:
        for log in logs:
            log.close()
    assert preallocate.BUDGET.used_bytes == held  # every ticket came back
    allocated, written = allocated_bytes(tmp_path)
    assert allocated <= written + len(logs) * SLACK  # closing gave the reservations back


def test_a_busy_log_reserves_up_to_its_step(tmp_path: Path, cap: None) -> None:
    """One log written as fast as it goes reaches the whole preallocate_bytes step: the
    benefit measured by benchmarks/log_bench.py stays."""
    config = LogConfig(flush_policy=FlushPolicy.INTERVAL, preallocate_bytes=4 << 20)
    with Log.open(tmp_path / "busy", config) as log:
        most = 0
        for _ in range(600):
            append_one(log, 16_000)
            seg = log._segments[-1]
            most = max(most, seg.allocated_bytes - seg.size)
        assert most > 2 << 20


CHILD = textwrap.dedent(
    """
    import asyncio, os, resource, sys
    from pathlib import Path

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    from raftmq.format import entry
    from raftmq.log.config import LogConfig
    from raftmq.log.handles import HANDLES
    from raftmq.raft.host.host import RaftHost
    from raftmq.raft.membership import Membership
    from raftmq.raft.host.transport import MemoryNetwork

    GROUPS = 1000
    root = Path(sys.argv[1])
    peak = [0]

    def sample():
        peak[0] = max(peak[0], len(os.listdir("/proc/self/fd")))

    async def main():
        host = RaftHost(1, MemoryNetwork().transport(1), tick_s=0.02, election_tick=3)
        config = LogConfig(segment_bytes=4096)
        for g in range(GROUPS):
            host.open_group(f"g{g}", root / f"g{g}", Membership(frozenset({1})),
                            log_config=config, replay=False, apply=lambda b, i: None)
            sample()
        await host.start()
        while not all(grp.is_leader for grp in host.groups.values()):
            sample()
            await asyncio.sleep(0.05)
        for round_ in range(3):
            futs = []
            for g in range(GROUPS):
                body = entry.encode(b"x" * 1500, record_count=1)
                futs.append(host.propose(f"g{g}", body).done)
                if g % 50 == 0:
                    sample()
            await asyncio.gather(*futs)
            sample()
            for g in range(0, GROUPS, 10):
                host.groups[f"g{g}"].log.read(0, 1 << 20)
            sample()
        await asyncio.sleep(1.2)  # commit hints get written
        sample()
        await host.stop()
        print(HANDLES.cap, peak[0], HANDLES.peak, HANDLES.evictions)

    asyncio.run(main())
    """
)


def test_a_thousand_groups_under_a_256_file_limit(tmp_path: Path) -> None:
    """1,000 Raft groups (logs rolling segments, hard state, commit hints) in one process
    whose soft open-file limit is 256: no EMFILE, and open files stay under the limit."""
    cap, peak, cache_peak, evictions = run_child(CHILD, tmp_path, timeout_s=300)
    assert cap == cap_for_limit(256)
    assert cache_peak <= cap
    assert peak < 256 - 32, (peak, cap)
    assert evictions > 0


SHED_CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from raftmq.log.config import LogConfig
    from raftmq.log.handles import HANDLES, open_fd
    from raftmq.log.log import Log
    from tests.log.test_handles import append_one, exhaust_descriptors

    root = Path(sys.argv[1])
    logs = [Log.open(root / f"l{i}", LogConfig()) for i in range(6)]
    for log in logs:
        append_one(log)
    held = HANDLES.open_count
    assert held >= 6, held
    exhaust_descriptors()  # as a burst of sockets would
    fd = open_fd(root / "persisted.tmp", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"kept")
    os.fsync(fd)
    os.close(fd)
    print(held, HANDLES.open_count)
    """
)


def test_a_persist_out_of_descriptors_takes_the_room_of_idle_segment_files(
    tmp_path: Path,
) -> None:
    """With every descriptor taken (sockets the segment cap cannot see), opening a file to
    persist closes idle segment descriptors and succeeds, instead of failing with EMFILE
    while the cache holds descriptors it can reopen later."""
    held, after = run_child(SHED_CHILD, tmp_path, timeout_s=60)
    assert after < held
    assert (tmp_path / "persisted.tmp").read_bytes() == b"kept"


RESERVE_CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from raftmq.log.handles import HANDLES, RESERVE, open_fd
    from tests.log.test_handles import exhaust_descriptors

    root = Path(sys.argv[1])
    RESERVE.fill()
    assert HANDLES.open_count == 0  # nothing idle to close: only the reserve can help
    hogs = exhaust_descriptors()
    fd = open_fd(root / "persisted.tmp", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"kept")
    os.close(fd)
    lent = RESERVE.released
    for h in hogs[:8]:  # room again: the next open takes the lent descriptor back
        os.close(h)
    os.close(open_fd(root / "persisted.tmp", os.O_RDONLY))
    print(lent, RESERVE.held)
    """
)


def test_a_persist_with_no_idle_segment_file_takes_a_reserved_descriptor(
    tmp_path: Path,
) -> None:
    """A broker holds a few descriptors back: with every other one taken and no idle
    segment descriptor to close (chaos seed 7453), a persist gets one of them, and the
    reserve fills again once there is room."""
    lent, held = run_child(RESERVE_CHILD, tmp_path, timeout_s=60)
    assert lent == 1
    assert held == 4
    assert (tmp_path / "persisted.tmp").read_bytes() == b"kept"
