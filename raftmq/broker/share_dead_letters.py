"""The share groups' dead-letter writer (docs/share-groups.md, "Dead letters"): a record
archived (its delivery limit reached, or REJECTed) in a group with
``share.dead.letter.topic`` waits in the share-partition state until the partition's
leader has written it to that topic, with the dead-letter headers of
raftmq.format.retry_headers (so ``raftmq dlq list|replay`` reads it as any other dead
letter), and then records it written (a DEAD_LETTERED entry). At least once: a leader that
fails between the two writes it again.

The original key, value, timestamp and headers go as stored (the record is decoded here,
off the fetch path, one batch at a time). It goes to the dead-letter topic's partition of
the same number, modulo its partition count.
"""

from __future__ import annotations

import logging
import time

from raftmq.broker.delay_mover import Sender
from raftmq.controller.model import MetadataState
from raftmq.format import entry
from raftmq.format import retry_headers as rh
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.partition.replica import PartitionReplica
from raftmq.partition.share_partition import ShareGroupView

log = logging.getLogger(__name__)

MAX_RECORDS_PER_BATCH = 500
WARN_EVERY_S = 30.0
RETRY_S = 1.0
"""How long a group's dead letters wait after the topic refused them before the next try."""
READ_BYTES = 64 * 1024


class DeadLetterWriter:
    def __init__(self, sender: Sender) -> None:
        self._sender = sender
        self._warned: dict[tuple[str, str], float] = {}
        self._retry_at: dict[tuple[str, int, str], float] = {}
        """(topic, partition, group) -> when its dead letters are tried again after a
        refusal (bounded by the share-partitions this broker leads)."""

    async def __call__(self, replica: PartitionReplica, state: MetadataState) -> None:
        """Write what waits in each group's state on ``replica`` (its leader's)."""
        now_s = time.monotonic()
        self._retry_at = {k: at for k, at in self._retry_at.items() if at > now_s}
        for gid, st in list(replica.shares.states.groups.items()):
            waiting = st.waiting_dead_letter()[:MAX_RECORDS_PER_BATCH]
            group = state.share_groups.get(gid)
            if not waiting or group is None or group.created_version != st.created_version:
                continue
            key = (replica.topic, replica.partition, gid)
            if time.monotonic() < self._retry_at.get(key, 0.0):
                continue
            view = ShareGroupView(gid, group.created_version, group.settings, state.version)
            topic = group.settings.dead_letter_topic
            if not topic:
                # The setting was cleared since they were archived: nothing to write.
                await replica.share.dead_lettered(view, waiting)
                continue
            counts = {o: st.records[o].delivery_count for o in waiting if o in st.records}
            records = self._records(replica, gid, counts)
            if records:
                found = state.topics.get(topic)
                partition = replica.partition % len(found.partitions) if found else 0
                code = await self._sender.produce(topic, partition, build_batch(records))
                if code:
                    self._warn(gid, topic, code)
                    self._retry_at[key] = time.monotonic() + RETRY_S
                    continue
            await replica.share.dead_lettered(view, waiting)

    def _records(self, replica: PartitionReplica, gid: str, counts: dict[int, int]) -> list[Record]:
        """The archived records, with their history in the headers; offsets retention
        removed are left out (nothing is left to write of them)."""
        out: list[Record] = []
        now_ms = int(time.time() * 1000)
        covered = replica.log_start_offset  # entries below it were read (or are gone)
        for wanted in sorted(counts):
            if wanted < covered:
                continue
            data = bytes(replica.read(wanted, READ_BYTES).data)
            for h in entry.iter_headers(data):
                covered = max(covered, h.next_offset)
                if h.type != entry.EntryType.DATA:
                    continue
                for r in decode_records(data, h):
                    n = counts.get(r.offset)
                    if n is None:
                        continue
                    info = rh.RetryInfo(
                        replica.topic,
                        replica.partition,
                        r.offset,
                        max(1, n),
                        now_ms,
                        f"share group {gid}: archived after {n} deliveries (the delivery "
                        "limit, or a REJECT)",
                    )
                    headers = tuple(rh.strip(r.headers)) + tuple(rh.encode(info))
                    out.append(Record(r.key, r.value, r.timestamp, headers))
            covered = max(covered, wanted + 1)
        return out

    def _warn(self, gid: str, topic: str, code: str) -> None:
        now_s = time.monotonic()
        if now_s - self._warned.get((gid, topic), -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned[(gid, topic)] = now_s
            log.warning(
                "share group %s: archived records wait for the dead-letter topic %s, which "
                "refuses them (%s); they are written once it takes them",
                gid,
                topic,
                code,
            )
