"""Failure isolation in the Raft driver, with real logs on disk: an error in one group's
storage quarantines that group alone, the others keep committing on the same node, and the
group is reopened from disk once the fault is gone. An error outside any group fails the
host, and its owner hears of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from raftmq.log.config import LogConfig
from raftmq.log.segment import LOG_SUFFIX, segment_name
from raftmq.raft.errors import (
    GroupFailedError,
    NotLeaderError,
    OutcomeUnknownError,
    ProposalDroppedError,
)
from raftmq.raft.host import host as driver_mod
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.transport import MemoryNetwork
from raftmq.raft.membership import Membership
from raftmq.raft.ready import Role
from tests.raft.test_driver import FAST, MEMBERS, batch, wait_for

TINY = LogConfig(segment_bytes=4096)  # rolls every few dozen entries


def leader_of(hosts: dict[int, RaftHost], group: str) -> RaftHost | None:
    leaders = [h for h in hosts.values() if group in h.groups and h.groups[group].is_leader]
    return leaders[0] if len(leaders) == 1 else None


def committed_entries(host: RaftHost, group: str) -> bytes:
    g = host.groups[group]
    return g.log.read_entries(g.log.start_index, 1 << 30, g.core.log.committed + 1)


async def propose_some(hosts: dict[int, RaftHost], group: str, count: int, first: int) -> None:
    """Commit ``count`` entries through whoever leads ``group``, retrying leader changes."""
    for _ in range(100):
        leader = leader_of(hosts, group)
        if leader is not None:
            try:
                for i in range(first, first + count):
                    await leader.propose(group, batch(i)).done
                return
            except (NotLeaderError, ProposalDroppedError, OutcomeUnknownError, GroupFailedError):
                pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"no leader of {group} took the proposals")


def block_next_segments(host: RaftHost, group: str, ahead: int = 400) -> list[Path]:
    """Put a directory where each of the group's next segment files would be created (one
    record per entry: offset and index advance together). The next roll then fails with
    EEXIST, as real as a full or broken disk for root, whom permissions do not stop; and a
    reopen fails too until they are removed."""
    g = host.groups[group]
    offset, index = g.log.next_offset, g.log.next_index
    paths = []
    for k in range(ahead):
        path = g.directory / (segment_name(offset + k, index + k) + LOG_SUFFIX)
        path.mkdir()
        paths.append(path)
    return paths


@pytest.fixture
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_mod, "RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(driver_mod, "RETRY_MAX_S", 0.4)


async def test_a_storage_error_quarantines_one_group_and_it_comes_back(
    tmp_path: Path, quick_retry: None, caplog: pytest.LogCaptureFixture
) -> None:
    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, **FAST)
        for g in ("a", "b"):
            host.open_group(g, tmp_path / f"n{node}" / g, MEMBERS, log_config=TINY, replay=False)
        hosts[node] = host
    for host in hosts.values():
        await host.start()
    try:
        for g in ("a", "b"):
            await wait_for(lambda g=g: leader_of(hosts, g) is not None, what=f"a leader of {g}")
        bad = leader_of(hosts, "a")
        assert bad is not None
        blocked = block_next_segments(bad, "a")

        # Commit into "a" until its leader's log must roll into a blocked path.
        first_term = bad.status("a").term
        with pytest.raises((OutcomeUnknownError, GroupFailedError, NotLeaderError)):
            for i in range(1000):
                await bad.propose("a", batch(i)).done
        st = bad.status("a")
        assert st.failed is not None and "FileExistsError" in st.failed, st
        assert st.leader == 0 and st.role == Role.FOLLOWER and not st.followers
        assert "a" not in bad.groups and "a" in bad.quarantined
        errors = [r for r in caplog.records if r.levelname == "ERROR" and "group a" in r.message]
        assert len(errors) == 1 and errors[0].exc_info is not None, errors
        with pytest.raises(GroupFailedError, match="FileExistsError"):
            bad.propose("a", batch(0))

        # The other members of "a" elect a leader at once (TimeoutNow) and go on.
        others = {n: h for n, h in hosts.items() if h is not bad}
        await wait_for(lambda: leader_of(others, "a") is not None, 5.0, "a new leader of a")
        new = leader_of(others, "a")
        assert new is not None and new.status("a").term > first_term
        await propose_some(others, "a", 20, 2000)
        # Group "b" keeps committing everywhere, on the failed group's node too.
        await propose_some(hosts, "b", 30, 0)
        want_b = committed_entries(leader_of(hosts, "b"), "b")  # type: ignore[arg-type]
        await wait_for(
            lambda: all(committed_entries(h, "b") == want_b for h in hosts.values()),
            what="every node to commit b",
        )
        # While the fault lasts, reopening fails and the group stays quarantined.
        await asyncio.sleep(1.0)
        assert "a" in bad.quarantined
        assert "reopening from disk failed" in (bad.status("a").failed or "")

        for path in blocked:
            shutil.rmtree(path)
        await wait_for(lambda: "a" in bad.groups, 5.0, "the group to be reopened")
        assert bad.status("a").failed is None
        await propose_some(hosts, "a", 10, 3000)
        leader = leader_of(hosts, "a")
        assert leader is not None
        want_a = committed_entries(leader, "a")
        await wait_for(
            lambda: all(committed_entries(h, "a") == want_a for h in hosts.values()),
            what="the reopened member to hold every committed entry of a",
        )
    finally:
        for host in hosts.values():
            await host.stop()


async def test_a_failure_outside_any_group_fails_the_host_and_tells_its_owner(
    tmp_path: Path,
) -> None:
    """The fsync pool is the host's, not a group's: once it cannot run, the host fails,
    its waiting proposals learn that their outcome is unknown, and wait_failed returns."""
    net = MemoryNetwork()
    host = RaftHost(1, net.transport(1), seed=1, **FAST)
    alone = Membership(frozenset({1}))
    for g in ("x", "y"):
        host.open_group(g, tmp_path / g, alone, log_config=TINY)
    await host.start()
    try:
        await wait_for(lambda: all(host.groups[g].is_leader for g in ("x", "y")), what="leaders")
        failed = asyncio.get_running_loop().create_task(host.wait_failed())
        await asyncio.sleep(0.05)
        assert not failed.done()
        host._pool.shutdown()  # as if the host could start no fsync thread
        futures = [host.propose(g, batch(1)).done for g in ("x", "y")]
        exc = await asyncio.wait_for(failed, 5.0)
        assert isinstance(exc, RuntimeError)
        for fut in futures:
            with pytest.raises(OutcomeUnknownError):
                await fut
        with pytest.raises(ProposalDroppedError):
            host.propose("x", batch(2))
    finally:
        await host.stop()


async def _emfile_scenario(tmp: Path) -> dict[str, object]:
    """Run in a child process (the limit is process-wide): three nodes, groups "a" (small
    segments: it must open files to roll) and "b" (never rolls). With RLIMIT_NOFILE at the
    files already open, "a" fails with EMFILE while "b" commits on; with the limit back, "a"
    is reopened and commits again."""
    import resource

    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, **FAST)
        host.open_group("a", tmp / f"n{node}" / "a", MEMBERS, log_config=TINY, replay=False)
        host.open_group("b", tmp / f"n{node}" / "b", MEMBERS, replay=False)
        hosts[node] = host
    for host in hosts.values():
        await host.start()
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    out: dict[str, object] = {}
    try:
        for g in ("a", "b"):
            await wait_for(lambda g=g: leader_of(hosts, g) is not None, what=f"a leader of {g}")
        await propose_some(hosts, "a", 5, 0)
        await propose_some(hosts, "b", 5, 0)
        await asyncio.sleep(1.5)  # every commit hint file is open by now
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), limits[1]))
        leader = leader_of(hosts, "a")
        assert leader is not None
        with contextlib.suppress(Exception):
            for i in range(1000):
                await leader.propose("a", batch(i)).done
        out["reasons"] = [h.status("a").failed for h in hosts.values()]
        await propose_some(hosts, "b", 20, 100)
        out["b_commit_while_a_failed"] = [h.status("b").commit for h in hosts.values()]
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        await wait_for(lambda: all("a" in h.groups for h in hosts.values()), 10.0, "reopen")
        await propose_some(hosts, "a", 10, 5000)
        want = committed_entries(leader_of(hosts, "a"), "a")  # type: ignore[arg-type]
        await wait_for(
            lambda: all(committed_entries(h, "a") == want for h in hosts.values()),
            what="every node to hold a's committed entries",
        )
        out["a_recovered"] = True
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        for host in hosts.values():
            await host.stop()
    return out


def test_emfile_quarantines_the_group_that_needed_a_file_and_it_recovers(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    code = (
        "import asyncio, json, sys; from pathlib import Path; "
        "import tests.raft.test_driver_isolation as t; "
        "t.driver_mod.RETRY_FIRST_S = 0.2; t.driver_mod.RETRY_MAX_S = 0.4; "
        # No idle segment descriptor to give up (raftmq.log.handles.open_fd): a process
        # whose descriptors are all taken by what it cannot close.
        "import raftmq.log.handles as handles; handles.EMFILE_ROOM = 0; "
        "print(json.dumps(asyncio.run(t._emfile_scenario(Path(sys.argv[1])))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = [r for r in out["reasons"] if r]
    assert failed and all("Too many open files" in r for r in failed), out
    assert all(c >= 25 for c in out["b_commit_while_a_failed"]), out
    assert out["a_recovered"]


async def test_a_follower_never_acknowledges_entries_its_fsync_did_not_make_durable(
    tmp_path: Path,
) -> None:
    """Persist before send, enforced: a follower whose fsync returns without making its
    entries durable (a lying disk, or a host bug that skips it) must not acknowledge them.
    Its group is quarantined instead, the leader never counts it, and the group commits
    on with the other follower."""
    net = MemoryNetwork()
    hosts: dict[int, RaftHost] = {}
    for node in (1, 2, 3):
        host = RaftHost(node, net.transport(node), seed=node, **FAST)
        host.open_group("a", tmp_path / f"n{node}" / "a", MEMBERS, replay=False)
        hosts[node] = host
    for host in hosts.values():
        await host.start()
    try:
        await wait_for(lambda: leader_of(hosts, "a") is not None, what="a leader")
        leader = leader_of(hosts, "a")
        assert leader is not None
        first = await leader.propose("a", batch(0)).done
        liar = next(h for h in hosts.values() if h is not leader)
        # Batch 0 committed on the other follower's ack; the liar may still be fsyncing it
        # in its pool. That fsync is real and lets it acknowledge batch 0 honestly after
        # the swap below, so read what it holds only once nothing is in flight.
        await wait_for(
            lambda: liar.groups["a"].log.durable_index >= first,
            what="the follower's fsync of the first entry",
        )
        held = liar.groups["a"].log.durable_index
        liar.groups["a"].log.flush = lambda: None  # type: ignore[method-assign]
        index = await asyncio.wait_for(leader.propose("a", batch(1)).done, 5.0)
        await wait_for(lambda: "a" in liar.quarantined, what="the follower's quarantine")
        failure = liar.status("a").failed
        assert failure is not None and "AssertionError" in failure and "durable" in failure
        assert leader.status("a").followers[liar.node_id].match <= held < index
    finally:
        for host in hosts.values():
            await host.stop()
