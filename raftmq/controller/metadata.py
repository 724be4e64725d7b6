"""Reading cluster metadata. The controller's :class:`~raftmq.controller.model.MetadataState`
is the one vocabulary: brokers, the CLI and the tools read one immutable state (a version
they were sent, or the voter's own copy) and ask it the questions below; nothing else
describes topics or brokers at run time. (The bootstrap file's node list,
:mod:`raftmq.controller.cluster_file`, only says where to find the controller.)"""

from __future__ import annotations

import re

from raftmq.controller.model import MetadataState
from raftmq.limits import TOPIC_NAME_CHARS

TOPIC_NAME = re.compile(rf"\A[A-Za-z0-9._-]{{1,{TOPIC_NAME_CHARS}}}\Z")
r"""Valid topic names. ``\Z``, not ``$``: ``$`` also matches before a final newline, which
let "demo\n" through; callers use ``fullmatch`` all the same."""


def broker_addresses(state: MetadataState) -> dict[int, str]:
    """Each registered broker's client address (``host:port``) by id, whatever its state:
    a fenced broker's replicas still need it, and a refusal still names it as a leader."""
    return {b.id: f"{b.host}:{b.port}" for _, b in sorted(state.brokers.items())}


def preferred_leader(state: MetadataState, topic: str, partition: int) -> int:
    """The broker that should lead the partition when it can (its first replica)."""
    return state.topics[topic].partitions[partition].preferred_leader
