"""The live half of admin DescribeTopic: high watermark, log start and each replica's
sync state, which only a partition's leader knows (the controller holds the metadata
only). The admin service asks the leaders when it is asked, rather than every leader
reporting all the time: describing is rare, and reports of 1,000 partitions' watermarks
would be metadata entries for nothing.

Bounded for 1,000 partitions: one Metadata call per broker (the leader answers for every
partition of the topic it leads, in one message), all at once, each within
``TIMEOUT_S``; a second round only for partitions whose leader turned out to be another
broker than the metadata said (an election since the last report), to that broker. A
broker that does not answer leaves its partitions shown as unknown, with why: describing
never fails for want of a leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc

from raftmq import net
from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc
from raftmq.controller.model import MetadataState

TIMEOUT_S = 2.0
"""How long DescribeTopic waits for a leader's answer."""
_STATE = {
    pb.REPLICA_OK: "in_sync",
    pb.REPLICA_CATCHING_UP: "catching_up",
    pb.REPLICA_FAILED: "failed",
    pb.REPLICA_OPENING: "opening",
}


class LiveState:
    """Asks leader brokers (their client Broker service) for their partitions' state."""

    def __init__(self, *, security: net.Security = net.PLAINTEXT) -> None:
        self._channels = net.AioChannels(security=security)

    def _stub(self, address: str) -> pb_grpc.BrokerStub:
        return pb_grpc.BrokerStub(self._channels.of(address))

    async def close(self) -> None:
        await self._channels.close()

    async def _ask(self, address: str, topic: str) -> pb.TopicInfo | str:
        """The topic as the broker at ``address`` sees it, or why there is no answer."""
        try:
            answer = await self._stub(address).Metadata(
                pb.MetadataRequest(topics=[topic]), timeout=TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            return f"broker at {address} did not answer ({exc.code().name}: {exc.details()})"
        for info in answer.topics:
            if info.name == topic:
                return info
        return f"broker at {address} does not know the topic yet"

    async def fill(self, desc: apb.TopicDescription, state: MetadataState) -> None:
        """Set the live fields of each partition of ``desc`` (as the metadata ``state``
        describes it) from its leader's answer."""
        addresses = {b.id: f"{b.host}:{b.port}" for b in state.brokers.values()}
        parts = {p.partition: p for p in desc.partitions}
        for p in parts.values():
            p.live = False
            p.high_watermark = p.log_start_offset = -1
            p.live_unknown_reason = "no leader is known for it"
        # the broker each partition is asked at: its reported leader, else its preferred
        pending = {n: p.leader_id or (p.replicas[0] if p.replicas else 0) for n, p in parts.items()}
        heard: dict[int, pb.TopicInfo | str] = {}
        for _ in range(2):  # a second round for leaders that moved since the last report
            targets = sorted({b for b in pending.values() if b in addresses and b not in heard})
            answers = await asyncio.gather(*(self._ask(addresses[b], desc.name) for b in targets))
            heard.update(zip(targets, answers, strict=True))
            for _ in range(3):  # follow a redirect to a broker already heard
                for n, broker_id in list(pending.items()):
                    answer = heard.get(broker_id)
                    if answer is None:
                        continue
                    if isinstance(answer, str):
                        parts[n].live_unknown_reason = answer
                        del pending[n]
                    else:
                        _take(parts[n], answer, broker_id, pending, n)
        # what is still pending: its leader moved twice, or is not a registered broker


def _take(
    part: apb.PartitionDescription,
    answer: pb.TopicInfo,
    broker_id: int,
    pending: dict[int, int],
    n: int,
) -> None:
    """Fill ``part`` from broker ``broker_id``'s view if it leads the partition; else
    point ``pending`` at the leader it names, for the next round."""
    info: Mapping[int, pb.PartitionInfo] = {i.partition: i for i in answer.partitions}
    mine = info.get(n)
    if mine is None:
        part.live_unknown_reason = f"broker {broker_id} does not know partition {n} yet"
        del pending[n]
        return
    if mine.leader_id != broker_id:
        part.live_unknown_reason = (
            f"broker {broker_id} does not lead it; it names broker {mine.leader_id or 'none'}"
        )
        if mine.leader_id:
            pending[n] = mine.leader_id
        else:
            del pending[n]
        return
    del pending[n]
    part.live = True
    part.live_unknown_reason = ""
    part.leader_id = broker_id
    part.leader_term = max(part.leader_term, mine.leader_term)
    part.high_watermark = mine.high_watermark
    part.log_start_offset = mine.log_start_offset
    seen = {s.broker_id: s for s in mine.replica_status}
    for b in [*part.replicas, *part.learners]:
        s = seen.get(b)
        part.replica_states.append(
            apb.ReplicaLiveState(
                broker_id=b,
                state=_STATE.get(s.state, "unknown") if s else "unknown",
                reason=s.reason if s else "the leader has no progress for it",
            )
        )
