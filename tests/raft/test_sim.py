"""Randomized, deterministic whole-cluster runs: every seed is a different history of
drops, duplicates, delays, partitions, pauses, crashes and restarts, checked for Raft's
safety properties after every event and for liveness once the network heals."""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable

import pytest

from raftmq.controller.state_machine import MetadataStateMachine, encode_snapshot
from raftmq.raft import RaftCore, Role, log_view
from tests.raft.sim import Params, SafetyViolation, Sim, run_seed

CI_SEEDS = int(os.environ.get("RAFT_SIM_SEEDS", "200"))
LONG_SEEDS = int(os.environ.get("RAFT_SIM_LONG_SEEDS", "3000"))
CHUNK = 20


@pytest.mark.parametrize("start", range(0, CI_SEEDS, CHUNK))
def test_random_seeds(start: int):
    for seed in range(start, min(start + CHUNK, CI_SEEDS)):
        run_seed(seed)  # raises with the seed and a replay command on any violation


@pytest.mark.long
@pytest.mark.parametrize("start", range(100_000, 100_000 + LONG_SEEDS, 100))
def test_many_random_seeds(start: int):
    for seed in range(start, start + 100):
        run_seed(seed)


def test_replay_is_exact():
    a, b = Sim(7).run(), Sim(7).run()
    assert (a.time, a.events, a.committed, a.leaders) == (b.time, b.events, b.committed, b.leaders)


@pytest.mark.parametrize("seed", range(5))
def test_repeated_cold_restarts_lose_no_committed_entry(seed: int):
    """Power loss on every node at once, five times, with writes in flight each time."""
    p = Params(
        nodes=3 + 2 * (seed % 2),
        ticks=300,
        drop=0.02,
        dup=0.02,
        max_delay=2,
        crash=0.0,
        partition=0.0,
        pause=0.0,
        propose=1.0,
        transfer=0.0,
        read=0.0,
        compact=0.02,
        fsync_delay=3,
        cold_restarts=5,
    )
    sim = Sim(1000 + seed, p)
    sim.run()
    # Every entry ever committed is still there, in order, on every member.
    top = max(sim.committed)
    for n in sim.members():
        assert n.app_index >= top
    assert sim.commit_hi >= 50


def run_seeds(
    seeds: range, params: Callable[[int], Params], count: Callable[[Sim], int] = lambda _: 0
) -> int:
    """Run each seed with ``params(seed)`` (raising with a replay command on any
    violation); returns the sum of ``count`` over the runs (how often a fault happened)."""
    return sum(count(run_seed(seed, params(seed))) for seed in seeds)


def disk_loss_params(seed: int) -> Params:
    """Frequent disk losses on top of the usual faults, in 3- and 5-node groups."""
    p = Params.random(random.Random(seed))
    p.nodes = 3 + 2 * (seed % 2)
    p.disk_loss = 0.03
    p.membership = False
    return p


DISK_LOSS_SEEDS = int(os.environ.get("RAFT_SIM_DISK_LOSS_SEEDS", "60"))


@pytest.mark.parametrize("start", range(0, DISK_LOSS_SEEDS, CHUNK))
def test_disk_loss_loses_no_committed_entry(start: int):
    """A node restarts with its log wiped or cut and its hard state gone, again and again:
    it must neither help elect a leader without a committed entry nor vote twice, and it
    must catch up (the liveness check at the end includes it)."""
    seeds = range(5000 + start, 5000 + min(start + CHUNK, DISK_LOSS_SEEDS))
    losses = run_seeds(seeds, disk_loss_params, lambda sim: sim.disk_losses)
    assert losses >= CHUNK  # the fault did happen


@pytest.mark.long
@pytest.mark.parametrize("start", range(200_000, 200_000 + LONG_SEEDS, 100))
def test_disk_loss_many_seeds(start: int):
    run_seeds(range(start, start + 100), disk_loss_params)


def test_checker_catches_a_core_without_the_election_restriction(monkeypatch):
    """The checks have teeth: a core that votes for any log must be caught quickly."""
    monkeypatch.setattr(log_view.RaftLog, "is_up_to_date", lambda self, i, t: True)
    for seed in range(60):
        try:
            run_seed(seed)
        except SafetyViolation as e:
            assert f"seed {seed}" in str(e) and "--seed" in str(e)
            return
    pytest.fail("60 seeds of a core without the election restriction went unnoticed")


def controller_disk_loss_params(seed: int) -> Params:
    """Disk losses as above, the application being the controller's metadata state
    machine (offset commits and topics, snapshotted and restored as the controller does)."""
    p = disk_loss_params(seed)
    p.metadata = True
    p.propose = max(p.propose, 0.3)
    return p


CONTROLLER_SEEDS = int(os.environ.get("RAFT_SIM_CONTROLLER_SEEDS", "10"))
"""A seed of the controller group costs about 2 s (the metadata machine applies real
commands): few in the default run, many under ``long``."""
CONTROLLER_LONG_SEEDS = int(os.environ.get("RAFT_SIM_CONTROLLER_LONG_SEEDS", "1000"))


@pytest.mark.parametrize("start", range(0, CONTROLLER_SEEDS, CHUNK))
def test_controller_disk_loss_keeps_every_acknowledged_command(start: int):
    """The controller group under disk loss (issue 20): no acknowledged offset commit or
    topic is lost, and no node's committed offset ever goes back."""
    seeds = range(7000 + start, 7000 + min(start + CHUNK, CONTROLLER_SEEDS))
    acks = run_seeds(seeds, controller_disk_loss_params, lambda sim: sim.acks)
    assert acks >= len(seeds)  # commands were acknowledged: the check had work to do


@pytest.mark.long
@pytest.mark.parametrize("start", range(300_000, 300_000 + CONTROLLER_LONG_SEEDS, 50))
def test_controller_disk_loss_many_seeds(start: int):
    run_seeds(range(start, start + 50), controller_disk_loss_params)


def test_checker_catches_a_controller_snapshot_that_forgets_offsets(monkeypatch):
    """The controller checks have teeth: a metadata snapshot without the groups' offsets
    (what a node restores after a disk loss or an install) must be caught."""

    def forgetful(self: MetadataStateMachine) -> bytes:
        return encode_snapshot(dataclasses.replace(self.state, consumer_groups={}))

    monkeypatch.setattr(MetadataStateMachine, "snapshot", forgetful)
    for seed in range(7000, 7030):
        try:
            run_seed(seed, controller_disk_loss_params(seed))
        except SafetyViolation as e:
            assert f"seed {seed}" in str(e)
            return
    pytest.fail("30 seeds of a controller snapshot without offsets went unnoticed")


def early_send_params(seed: int) -> Params:
    """Leaders crash between sending their appends and their own fsync (the appends go
    out before the leader's write: ``Ready.send_now``), often, losing every unsynced write
    or keeping a torn prefix of them, in 3- and 5-node groups, on top of the usual faults."""
    p = Params.random(random.Random(seed))
    p.nodes = 3 + 2 * (seed % 2)
    p.membership = False  # the quorum durability check needs a static group
    p.propose = max(p.propose, 0.6)
    p.fsync_delay = max(p.fsync_delay, 1)
    p.crash_after_send = 0.05
    return p


EARLY_SEND_SEEDS = int(os.environ.get("RAFT_SIM_EARLY_SEND_SEEDS", "40"))


@pytest.mark.parametrize("start", range(0, EARLY_SEND_SEEDS, CHUNK))
def test_leader_crash_between_send_and_fsync_loses_no_committed_entry(start: int):
    """A leader whose followers got entries it then lost commits nothing on them alone:
    commit needs a majority of fsyncs, the leader's own counting once it is durable."""
    seeds = range(9000 + start, 9000 + min(start + CHUNK, EARLY_SEND_SEEDS))
    crashes = run_seeds(seeds, early_send_params, lambda sim: sim.early_crashes)
    assert crashes >= CHUNK  # the fault did happen


@pytest.mark.long
@pytest.mark.parametrize("start", range(400_000, 400_000 + LONG_SEEDS, 100))
def test_early_send_many_seeds(start: int):
    run_seeds(range(start, start + 100), early_send_params)


def test_checker_catches_a_leader_counting_its_own_unsynced_copy(monkeypatch):
    """The checks have teeth: a leader that counts its own copy toward commit when it
    hands the entries out for writing, not once they are durable, must be caught."""
    ready = RaftCore.ready

    def eager(self: RaftCore):  # type: ignore[no-untyped-def]
        rd = ready(self)
        if self.role == Role.LEADER and rd.entries:
            self.progress[self.id].maybe_update(rd.last_index)
            self._maybe_commit()
        return rd

    monkeypatch.setattr(RaftCore, "ready", eager)
    monkeypatch.setattr(RaftCore, "_check_invariants", lambda self: None)
    for seed in range(9000, 9030):
        try:
            run_seed(seed, early_send_params(seed))
        except SafetyViolation as e:
            assert f"seed {seed}" in str(e)
            return
    pytest.fail("30 seeds of a leader counting its unsynced copy went unnoticed")
