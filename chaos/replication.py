"""After a broker was killed for good: wait until the controller has healed every partition
back to its replication factor on live brokers, and record what it saw (``replication``
ops, one per partition, which the checker bounds in time).

A partition counts as healed when the admin API says so from both sides: ClusterStatus
lists it neither under-replicated nor moving (the controller's view: no voter on a fenced
broker, no learner being added), and DescribeTopic's live answer (the partition leader's
view) names exactly ``replication_factor`` voters, none of them a dead broker, every one
in sync."""

from __future__ import annotations

import time

from chaos.cluster import TOPIC, ChaosCluster
from chaos.history import Op
from chaos.workload import Recorder
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.client import AdminClient, ClientError

POLL_S = 0.5
IN_SYNC = "in_sync"


def partition_problems(
    status: apb.ClusterStatusResponse, topic: apb.TopicDescription, gone: set[int]
) -> dict[int, str]:
    """Why each partition of ``topic`` is not yet healed (empty when all are): a sentence
    per partition, from the controller's status and the leader's live description."""
    problems: dict[int, str] = {}
    for ref in status.under_replicated:
        if ref.topic == TOPIC:
            problems[ref.partition] = "the controller lists it under-replicated"
    for move in status.moves:
        if move.topic == TOPIC:
            problems.setdefault(
                move.partition,
                f"a move is under way: learner {move.learner} replacing {move.replacing}",
            )
    factor = topic.replication_factor
    for part in topic.partitions:
        p = part.partition
        voters = list(part.replicas)
        dead = sorted(set(voters) & gone)
        in_sync = {s.broker_id for s in part.replica_states if s.state == IN_SYNC}
        if dead:
            problems.setdefault(p, f"replicas {voters} still include dead broker(s) {dead}")
        elif len(voters) != factor:
            problems.setdefault(p, f"{len(voters)} voters {voters}, not the factor {factor}")
        elif part.learners:
            problems.setdefault(p, f"learners {list(part.learners)} not yet promoted")
        elif not part.live:
            problems.setdefault(p, f"no leader answered: {part.live_unknown_reason}")
        elif not set(voters) <= in_sync:
            lagging = sorted(set(voters) - in_sync)
            problems.setdefault(p, f"replicas {lagging} of {voters} are not in sync")
    return problems


def wait_healed(
    chaos: ChaosCluster, gone: set[int], recorder: Recorder, healed_at: float, limit_s: float
) -> dict[int, tuple[int, ...]]:
    """Poll until every partition is healed or 1.5 x ``limit_s`` passed since ``healed_at``
    (the end of the fault window, on the recorder's clock), record one ``replication`` op
    per partition (``start`` the fault window's end, ``end`` when all were healed or the
    wait gave up; ``value`` its voters; ``error`` why not, if not), and return the voters
    the metadata lists at the end: the final reads read those."""
    addresses = [chaos.direct_address(v) for v in chaos.voters if v not in gone]
    problems: dict[int, str] = {
        p: "no answer from the admin API yet" for p in range(chaos.partitions)
    }
    voters: dict[int, tuple[int, ...]] = {p: chaos.replicas(p) for p in range(chaos.partitions)}
    with AdminClient(
        addresses,
        attempts=5,
        backoff_s=0.1,
        timeout_s=3.0,
        **chaos.client_settings,
    ) as admin:
        while True:
            try:
                status = admin.cluster_status()
                topic = admin.describe_topic(TOPIC)
            except ClientError as exc:
                problems = {p: f"admin API: {exc}" for p in range(chaos.partitions)}
            else:
                voters = {part.partition: tuple(part.replicas) for part in topic.partitions}
                problems = partition_problems(status, topic, gone)
            if not problems or recorder.now() - healed_at > 1.5 * limit_s:
                break
            time.sleep(POLL_S)
    now = recorder.now()
    for p in range(chaos.partitions):
        recorder.add(
            Op(
                "replication",
                "controller",
                p,
                ",".join(map(str, voters.get(p, ()))),
                status="fail" if p in problems else "ok",
                start=healed_at,
                end=now,
                error=problems.get(p),
            )
        )
    return voters
