"""Whether a metadata version changed what a broker's replicas are, or only who leads.

Why: most metadata versions in a busy cluster only move leaderships (leader reports).
After a broker's death at 10,000 partitions the survivors applied thousands of them in a
burst, and each cost a full pass over every partition (which replicas to open or delete,
their settings, their moves): 48% of a survivor's CPU for 40 s. A version whose layout is
the last fully applied one's needs none of that; :func:`same_layout` tells it cheaply
(identity first: a voter's own copy shares every unchanged object with the last).
"""

from __future__ import annotations

from raftmq.controller.model import MetadataState, Partition, Topic


def same_layout(before: MetadataState, after: MetadataState) -> bool:
    """True when ``after`` differs from ``before`` at most in partitions' leaders (and in
    what a broker's replicas do not follow: groups, offsets, transactions, heartbeats):
    the same brokers at the same Raft addresses, the same topics with the same ids,
    settings and partitions, each with the same replicas, learners, move and state."""
    if before.brokers is not after.brokers:
        if before.brokers.keys() != after.brokers.keys():
            return False
        for b, old in before.brokers.items():
            new = after.brokers[b]
            if (old.raft_host, old.raft_port) != (new.raft_host, new.raft_port):
                return False
    if before.topics is after.topics:
        return True
    if before.topics.keys() != after.topics.keys():
        return False
    return all(_same_topic(t, after.topics[name]) for name, t in before.topics.items())


def _same_topic(a: Topic, b: Topic) -> bool:
    if a is b:
        return True
    if (
        a.topic_id != b.topic_id
        or a.replication_factor != b.replication_factor
        or a.config != b.config
        or len(a.partitions) != len(b.partitions)
    ):
        return False
    pairs = zip(a.partitions, b.partitions, strict=True)
    return all(same_partition(x, y) for x, y in pairs)


def same_partition(x: Partition | None, y: Partition | None) -> bool:
    """The same replicas, learners, move and state (the leader may differ); None for a
    partition that does not exist. Identity first: most partitions are shared."""
    if x is y:
        return True
    if x is None or y is None:
        return False
    return (
        x.replicas == y.replicas
        and x.learners == y.learners
        and x.replacing == y.replacing
        and x.state == y.state
        and x.delete_after_ms == y.delete_after_ms
    )
