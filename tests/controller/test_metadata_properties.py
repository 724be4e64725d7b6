"""Properties of the metadata state machine over random command sequences: replicas that
apply the same entries hold the same state (byte-equal snapshots, equal results), a
snapshot taken anywhere and restored changes nothing that follows, and the replica-set
invariants hold after every entry, whatever was refused on the way."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.controller import commands as c
from raftmq.controller.model import MetadataState, TopicPartition
from raftmq.controller.state_machine import MetadataStateMachine
from tests.controller.machine import Driver

ROOT = Path(__file__).resolve().parents[2]
brokers = st.integers(1, 6)
topics = st.sampled_from(["a", "a", "a", "b", "c", "bad name"])
partitions = st.integers(0, 4)
times = st.integers(0, 10**6)
configs = st.dictionaries(
    st.sampled_from(["retention.ms", "segment.ms", "min.insync.replicas", "flush.policy", "x"]),
    st.sampled_from(["1", "2", "3600000", "-1", "interval", "0"]),
    max_size=2,
)
command = st.one_of(
    st.builds(
        c.RegisterBroker,
        brokers,
        st.just("127.0.0.1"),
        st.integers(1, 3),
        st.just("127.0.0.1"),
        st.integers(1, 3),
        st.sampled_from([None, "r1", "r2", "r3"]),
        st.integers(0, 1),
        times,
    ),
    st.builds(c.BrokerHeartbeat, brokers, st.integers(0, 1), times),
    st.builds(c.FenceBroker, brokers),
    st.builds(c.UnfenceBroker, brokers, st.integers(0, 1)),
    st.builds(c.DrainBroker, brokers),
    st.builds(c.CreateTopic, topics, st.integers(0, 6), st.integers(0, 4), configs),
    st.builds(c.AlterTopicConfig, topics, configs, st.tuples() | st.tuples(st.just("segment.ms"))),
    st.builds(c.AddPartitions, topics, st.integers(0, 8)),
    st.builds(c.DecommissionPartitions, topics, st.lists(partitions, max_size=2).map(tuple), times),
    st.builds(c.DeleteTopic, topics),
    st.builds(c.ReportLeader, topics, partitions, brokers, st.integers(0, 5)),
    st.builds(c.AddReplica, topics, partitions, brokers),
    st.builds(c.PromoteReplica, topics, partitions, brokers),
    st.builds(c.RemoveReplica, topics, partitions, brokers),
    st.builds(c.ReorderReplicas, topics, partitions, st.permutations([1, 2, 3]).map(tuple)),
    st.builds(c.AllocateProducerIds, brokers, st.integers(0, 2000)),
)


@st.composite
def commands(draw: st.DrawFn) -> list[c.Command]:
    """A command sequence drawn against the state it builds, so that most commands name
    brokers, topics and partitions that exist and get applied rather than refused; a few
    random ones (``command``) keep the refusals coming too."""
    d = Driver()
    out: list[c.Command] = []
    for b in range(1, draw(st.integers(3, 6)) + 1):
        out.append(c.RegisterBroker(b, "127.0.0.1", 1, "127.0.0.1", 2, f"r{b % 3}", 0, 0))
    out.append(c.CreateTopic("a", 3, 3))
    for cmd in out:
        d(cmd)
    for _ in range(draw(st.integers(0, 40))):
        cmd = _next_command(draw, d.machine.state)
        d(cmd)
        out.append(cmd)
    return out


def _next_command(draw: st.DrawFn, state: MetadataState) -> c.Command:
    """One command against ``state``; only the chosen command's arguments are drawn."""
    names = sorted(state.topics) or ["a"]
    t = draw(st.sampled_from(names))
    topic = state.topics.get(t)
    p = draw(st.integers(0, len(topic.partitions) - 1)) if topic else 0
    moving = [i for i, q in enumerate(topic.partitions) if q.learners] if topic else []
    finish: bool = draw(st.booleans())
    if moving and finish:  # a move under way: finish it more often
        p = draw(st.sampled_from(moving))
    part = topic.partitions[p] if topic else None
    members = sorted(part.replicas + part.learners) if part else [1]
    others = sorted(set(state.brokers) - set(members)) or [1]
    learners = list(part.learners) if part and part.learners else members
    voters = list(part.replicas) if part else [1]
    b = draw(st.sampled_from(sorted(state.brokers)))
    incarnation = state.brokers[b].incarnation
    choices: list[Callable[[], c.Command]] = [
        lambda: c.AddReplica(t, p, draw(st.sampled_from(others))),
        lambda: c.PromoteReplica(t, p, draw(st.sampled_from(learners))),
        lambda: c.RemoveReplica(t, p, draw(st.sampled_from(members))),
        lambda: c.ReportLeader(t, p, draw(st.sampled_from(members)), draw(st.integers(0, 9))),
        lambda: c.ReorderReplicas(t, p, tuple(draw(st.permutations(voters)))),
        lambda: c.AddPartitions(
            t, (len(topic.partitions) if topic else 0) + draw(st.integers(0, 3))
        ),
        lambda: c.CreateTopic(
            draw(st.sampled_from("bcde")),
            draw(st.integers(1, 5)),
            draw(st.integers(1, 4)),
            draw(configs),
        ),
        lambda: c.DecommissionPartitions(t, (p,), draw(times)),
        lambda: c.AlterTopicConfig(t, draw(configs)),
        lambda: c.DeleteTopic(t),
        lambda: c.FenceBroker(b),
        lambda: c.UnfenceBroker(b, incarnation),
        lambda: c.BrokerHeartbeat(b, incarnation, draw(times)),
        lambda: c.DrainBroker(b),
        lambda: c.AllocateProducerIds(b, draw(st.integers(1, 100))),
        lambda: c.RegisterBroker(
            b, "127.0.0.1", 1, "127.0.0.1", 2, f"r{b % 3}", incarnation + 1, 0
        ),
        lambda: draw(command),
        *_transaction_commands(draw, state, t, p),
    ]
    return draw(st.sampled_from(choices))()


def _transaction_commands(
    draw: st.DrawFn, state: MetadataState, t: str, p: int
) -> list[Callable[[], c.Command]]:
    """Transaction calls by the current producer of an id (or a stale one), the
    coordinator's aborts and markers written, so that transactions run through their
    states (and the topic deletes above drop their markers)."""
    tid = draw(st.sampled_from(["x", "y"]))
    txn = state.transactions.get(tid)
    pid, epoch = (txn.producer_id, txn.producer_epoch) if txn else (0, 0)
    epoch -= draw(st.sampled_from([0, 0, 0, 1]))
    now = draw(times)

    def calls(**kind: object) -> c.Command:
        return c.TransactionCalls((c.TxnCall(**kind),), now)  # type: ignore[arg-type]

    def written() -> c.Command:
        if txn is None:
            return c.RecordTxnMarkers(())
        marker = (txn.last_producer_id, txn.last_epoch + 1)
        return c.RecordTxnMarkers((c.WrittenMarkers(tid, *marker, txn.pending_markers[:1]),))

    tp = TopicPartition(t, p)
    return [
        lambda: calls(init=c.InitTransactions(tid, draw(st.sampled_from([1000, 999])))),
        lambda: calls(add_partitions=c.AddPartitionsToTxn(tid, pid, epoch, (tp,))),
        lambda: calls(end=c.EndTxn(tid, pid, epoch, draw(st.booleans()))),
        lambda: calls(abort=c.AbortTxn(tid, -1, -1)),
        written,
    ]


junk = st.binary(max_size=12)
entries = st.tuples(commands(), st.lists(junk, max_size=5), st.randoms()).map(
    lambda t: _interleave([c.encode(x) for x in t[0]], t[1], t[2])
)


def _interleave(data: list[bytes], noise: list[bytes], rnd: random.Random) -> list[bytes]:
    out = list(data)
    for item in noise:
        out.insert(rnd.randint(0, len(out)), item)
    return out


def run(data: list[bytes], machine: MetadataStateMachine | None = None) -> list[bytes]:
    machine = machine or MetadataStateMachine("prop")
    start = machine.version
    return [machine.apply(start + i + 1, d) for i, d in enumerate(data)]


def check_invariants(state: MetadataState) -> None:
    for topic in state.topics.values():
        assert topic.partitions
        for part in topic.partitions:
            members = part.replicas + part.learners
            assert len(set(members)) == len(members), part
            assert topic.replication_factor <= len(part.replicas), part
            assert len(members) <= topic.replication_factor + 1, part
            assert part.leader is None or part.leader in part.replicas, part
            assert set(members) <= set(state.brokers), part
        topic.settings  # the stored config still resolves  # noqa: B018


@settings(max_examples=150, deadline=None)
@given(entries)
def test_two_replicas_applying_the_same_entries_agree(data: list[bytes]) -> None:
    one, two = MetadataStateMachine("prop"), MetadataStateMachine("prop")
    assert run(data, one) == run(data, two)
    assert one.snapshot() == two.snapshot()
    assert one.state == two.state


@settings(max_examples=150, deadline=None)
@given(entries, st.data())
def test_a_snapshot_anywhere_changes_nothing_that_follows(
    data: list[bytes], pick: st.DataObject
) -> None:
    cut = pick.draw(st.integers(0, len(data)))
    straight = MetadataStateMachine("prop")
    results = run(data, straight)
    first = MetadataStateMachine("prop")
    run(data[:cut], first)
    snap = first.snapshot()
    restored = MetadataStateMachine("other")
    restored.restore(snap)
    assert restored.state == first.state
    assert restored.snapshot() == snap
    assert run(data[cut:], restored) == results[cut:]
    assert restored.snapshot() == straight.snapshot()


@settings(max_examples=150, deadline=None)
@given(commands())
def test_replica_set_invariants_hold_after_every_entry(cmds: list[c.Command]) -> None:
    d = Driver()
    for cmd in cmds:
        result = d(cmd)
        assert result.ok or isinstance(result, c.Refused)
        check_invariants(d.machine.state)


SCRIPT = """
import hashlib, sys
from raftmq.controller import commands as c
from raftmq.controller.state_machine import MetadataStateMachine
m = MetadataStateMachine("seeded")
cmds = [c.RegisterBroker(b, "h", 1, "h", 2, f"r{b % 3}", 1, 0) for b in range(1, 10)]
cmds += [c.CreateTopic(f"t{i}", 7, 3, {"retention.ms": "1000"}) for i in range(20)]
cmds += [c.AddPartitions(f"t{i}", 9) for i in range(0, 20, 3)]
for i, cmd in enumerate(cmds, 1):
    m.apply(i, c.encode(cmd))
sys.stdout.write(hashlib.sha256(m.snapshot()).hexdigest())
"""


def test_the_state_does_not_depend_on_the_processs_hash_seed() -> None:
    digests = set()
    for seed in ("1", "2"):
        env = os.environ | {"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, check=True, text=True
        )
        digests.add(out.stdout)
    assert len(digests) == 1


def test_restore_refuses_damaged_snapshots_and_keeps_the_state() -> None:
    import pytest

    from raftmq.controller.state_machine import SnapshotError

    m = MetadataStateMachine("x")
    run([c.encode(c.RegisterBroker(1, "h", 1, "h", 2, None, 1, 0))], m)
    good = m.snapshot()
    before = m.state
    for bad in (
        b"",
        good[:-1],
        good.replace(b'"format":1', b'"format":2'),
        good.replace(b'"brokers":{"1"', b'"brokers":{"2"'),
        good.replace(b'"port":1', b'"port":true'),
        good.replace(b'"port":1', b'"port":1,"extra":0'),
    ):
        with pytest.raises(SnapshotError):
            m.restore(bad)
        assert m.state is before
    assert hashlib.sha256(good).digest() == hashlib.sha256(m.snapshot()).digest()
