"""Does a broker that starts with no data directory join a group with a past?

A replica that lost its data cannot tell, from its own disk, whether it is new or was
replaced: the record that it once voted and acknowledged (in the data directory's Raft
state store, see docs/raft.md, "Rejoining after disk loss") is gone with the directory. A
new replica may vote at once; a replaced one must not vote until it holds the leader's log again,
or it could help elect a leader that lacks entries it acknowledged. So when the broker's
whole data directory is missing, it asks its peers, before opening any group, whether the
partitions it hosts already have a history (a leader term or data). Those that do are
marked as having promised, and their replicas start rejoining.

Why ask peers rather than wait: at a cluster's first start every broker is new and none
answers yet (each opens its groups before it serves), so a probe that fails fast costs
nothing there; a broker restarted with a replaced disk finds its peers serving. What it
cannot tell: a replaced disk on a broker that starts while none of its peers serves (the
whole cluster cold-started at once). The controller, which will know every broker's
storage, closes that gap.

The controller quorum's own group is probed the same way (:func:`metadata_with_history`),
by a controller voter that starts with no data folder, before it opens the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

import grpc

from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.api.v1 import controller_pb2 as cpb
from raftmq.api.v1 import controller_pb2_grpc as cpb_grpc
from raftmq.controller.quorum import GROUP
from raftmq.raft.host.group_storage import record_promised

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0
"""How long one peer may take to answer; a peer that is not up refuses at once."""


async def _peer_history(
    address: str, topics: list[str], security: net.Security
) -> set[tuple[str, int]] | None:
    """The partitions of ``topics`` for which the broker at ``address`` knows a leader term
    or holds data; None when it does not answer."""
    async with net.aio_channel(address, security=security) as channel:
        try:
            answer = await pb_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(topics=topics), timeout=PROBE_TIMEOUT_S
            )
        except grpc.RpcError:
            return None
    return {
        (t.name, p.partition)
        for t in answer.topics
        for p in t.partitions
        if p.leader_term > 0 or p.high_watermark > 0
    }


async def partitions_with_history(
    addresses: Mapping[int, str],
    me: int,
    hosted: set[tuple[str, int]],
    security: net.Security = net.PLAINTEXT,
) -> tuple[set[tuple[str, int]], list[int]]:
    """Of the partitions this broker ``hosted``, those some peer reports a past for, and
    the ids of the peers that answered. The peers are the nodes of ``addresses`` (client
    addresses by id): those of the bootstrap file and of the metadata (a broker's file may
    name only the controller voters, which host no partition in the dedicated layout)."""
    topics = sorted({topic for topic, _ in hosted})
    peers = sorted((b, a) for b, a in addresses.items() if b != me)
    answers = await asyncio.gather(*(_peer_history(a, topics, security) for _, a in peers))
    seen: set[tuple[str, int]] = set()
    answered = []
    for (peer, _), known in zip(peers, answers, strict=True):
        if known is not None:
            answered.append(peer)
            seen |= known & hosted
    return seen, answered


async def _voter_has_past(address: str, security: net.Security) -> bool | None:
    """Whether the voter at ``address`` knows a past of the metadata group: an entry in
    its log, or only a term above 0 (it saw an election, so a leader may have committed
    entries it has not received yet: it was cut off, or stopped, right after); None when
    it does not answer."""
    async with net.aio_channel(address, security=security) as channel:
        try:
            answer = await cpb_grpc.ControllerStub(channel).DescribeVoter(
                cpb.DescribeVoterRequest(), timeout=PROBE_TIMEOUT_S
            )
        except grpc.RpcError:
            return None
    return answer.last_index > 0 or answer.term > 0


async def metadata_with_history(
    voters: Mapping[int, str], me: int, security: net.Security = net.PLAINTEXT
) -> tuple[bool, list[int]]:
    """Does the controller quorum have a past this voter may have been part of (a voter
    holds an entry of its log, or saw a term: an election happened)? With the ids of the
    voters that answered.

    The metadata group's own promise record lives in the data folder too, so a
    controller voter whose folder was wiped asks the other voters, as a broker does for its
    partitions: if the quorum committed anything, the wiped voter must rejoin (no vote
    until it holds the leader's log), or it could help a lagging voter win an election and
    vote committed metadata away."""
    peers = [(v, a) for v, a in sorted(voters.items()) if v != me]
    pasts = await asyncio.gather(*(_voter_has_past(a, security) for _, a in peers))
    answered = [v for (v, _), past in zip(peers, pasts, strict=True) if past is not None]
    return any(pasts), answered


async def mark_wiped_voter(
    voters: Mapping[int, str], me: int, data_dir: Path, security: net.Security = net.PLAINTEXT
) -> None:
    """No data folder on controller voter ``me``: if the quorum has a past, this voter's
    metadata group rejoins (no vote until it holds the leader's log), as a replaced
    partition replica does (:func:`metadata_with_history`)."""
    past, answered = await metadata_with_history(voters, me, security)
    if not answered:
        # Nobody could say, so assume the past (as for partitions): a voter that passed
        # for new would vote at once, and with one voter that missed committed metadata
        # it could elect that one and vote acknowledged metadata (offset commits, topics)
        # away. A new cluster's voters start with --new (raftmq dev does), so they never
        # wait here for each other.
        log.warning(
            "broker %d: no data folder, no --new, and no other voter answering whether the "
            "metadata has a past: its metadata group rejoins (no vote until it holds the "
            "leader's log); if this is a new cluster, restart every voter with --new",
            me,
        )
        record_promised(data_dir / GROUP)
        return
    if not past:
        log.info(
            "broker %d: no data folder, and no other voter (answered: %s) holds metadata: "
            "a new controller voter",
            me,
            ", ".join(map(str, answered)) or "none",
        )
        return
    log.warning(
        "broker %d: no data folder, but voters %s hold metadata (a replaced or wiped "
        "disk): its metadata group rejoins, and votes again only once it holds the "
        "leader's log",
        me,
        ", ".join(map(str, answered)),
    )
    record_promised(data_dir / GROUP)
