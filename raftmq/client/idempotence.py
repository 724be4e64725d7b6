"""The idempotent producer's bookkeeping (docs/clients.md, "Idempotence"): its session
(the producer id and epoch a broker handed out through InitProducerId), the next
sequence number per partition, and the batches sent under a sequence and not yet settled.

Why a session is replaced: a batch that fails for good after it got a sequence leaves a
hole the partition will never see filled, so every later sequence of that partition
would be refused as out of order. The producer then takes a new producer id (sequences
start again at 0 everywhere) once the old session's batches of a partition are settled,
so the new session's batches of that partition are stored after them, never between.
The same happens before a partition's sequence would pass 2^31 - 1.
"""

from __future__ import annotations

from raftmq.client.accumulator import Batch
from raftmq.format import entry

RENEW_BEFORE_SEQUENCE = entry.MAX_SEQUENCE - (1 << 22)
"""Past it a partition's next batch waits for a new session: a batch holds far fewer
than 2^22 records (batch_size / record overhead), so no sequence passes 2^31 - 1."""

Key = tuple[str, int]


class Sequencer:
    def __init__(self) -> None:
        self.producer_id = -1
        self.producer_epoch = -1
        self.renew = True
        """A new session is needed before the next fresh batch gets a sequence."""
        self._next: dict[Key, int] = {}
        self._unsettled: dict[Key, list[Batch]] = {}
        """Per partition, its batches that have a sequence and no final outcome, in
        sequence order."""

    def start(self, producer_id: int, producer_epoch: int) -> None:
        """A new session: every partition's sequences start at 0 again."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._next.clear()
        self.renew = False

    def may_send_fresh(self, key: Key) -> bool:
        """May a partition's next batch without a sequence go now? Only in a live session,
        and never while a batch of this partition from an older session is unsettled."""
        if self.renew or self.producer_id < 0:
            return False
        unsettled = self._unsettled.get(key)
        return not unsettled or unsettled[0].producer_id == self.producer_id

    def assign(self, batch: Batch) -> None:
        """Give a fresh batch the session and the partition's next sequence."""
        assert batch.sequence < 0 and not self.renew, "a batch gets its sequence once"
        key = (batch.topic, batch.partition)
        first = self._next.get(key, 0)
        batch.producer_id, batch.producer_epoch, batch.sequence = (
            self.producer_id,
            self.producer_epoch,
            first,
        )
        self._next[key] = first + len(batch.records)
        if self._next[key] > RENEW_BEFORE_SEQUENCE:
            self.renew = True
        self._unsettled.setdefault(key, []).append(batch)

    def settled(self, batch: Batch, *, failed: bool) -> None:
        """A batch's outcome is final. A failure of a batch with a sequence leaves a hole
        in its partition: the session is replaced (see the module's docstring)."""
        if batch.sequence < 0:
            return
        key = (batch.topic, batch.partition)
        unsettled = self._unsettled.get(key)
        if unsettled and batch in unsettled:
            unsettled.remove(batch)
            if not unsettled:
                del self._unsettled[key]
        if failed and batch.producer_id == self.producer_id:
            self.renew = True

    def earlier_unsettled(self, batch: Batch) -> bool:
        """Is a batch sent before this one (same session and partition) still without an
        outcome? Then an OUT_OF_ORDER_SEQUENCE answer means only that this one arrived
        first, and it is retried after that one."""
        for other in self._unsettled.get((batch.topic, batch.partition), ()):
            if other is batch:
                return False
            if other.producer_id == batch.producer_id:
                return True
        return False
