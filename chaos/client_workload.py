"""The workload of the real clients: what a service built on raftmq does, under faults.

Producers are :class:`raftmq.client.Producer` objects (acks=all, with their own
retries; idempotent when asked), each sending numbered records, several in flight, to the
partitions in turn; every settled record becomes a ``send`` op. Consumers are
:class:`raftmq.client.Consumer` objects, each record they poll a ``consume``
op. Two modes, one switch each (:class:`ClientWorkloadOptions`):

- ``group``: the consumers are members of one consumer group (``subscribe``), commit
  what they processed after each poll and when partitions are revoked (``commit`` ops),
  and after the run a fresh member reads the group's committed offsets (``committed``
  ops): the checker holds commits to never going back, never past the log end, never
  lost, and never past a record nobody consumed.
- without it: each consumer is assigned a fixed share of the partitions and reads them
  from the beginning, in order, with nothing committed.

With ``racks`` the consumers read from the follower in their rack (client_rack), so
follower reads face the faults too: a follower that served an uncommitted record would
show as a dirty read.

``idempotent`` turns on the producers' idempotence, and the checker then counts a record
stored twice as a violation.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from chaos.feature_workload import tags_of
from chaos.history import Op, send_value
from chaos.workload import DELIVERY_TIMEOUT_MS, Recorder, chaos_producer
from raftmq.client import Consumer, ConsumerRecord, Producer
from raftmq.client.producer import RecordFuture

GROUP = "chaos-group"
IN_FLIGHT = 32
"""Records a producer has sent and not yet seen settled; past it, it waits for the oldest."""
SEND_INTERVAL_S = 0.004
"""Pause between sends, so a run makes thousands of ops, not millions."""
SESSION_TIMEOUT_MS = 12_000
"""A member's heartbeat call gives up after half of it (client/group_session.py) and poll
then raises; a fault holds a paused or cut-off controller leader for up to 5 s, which a
group must ride out: so well above 10 s."""


@dataclass(frozen=True, slots=True)
class ClientWorkloadOptions:
    producers: int = 2
    consumers: int = 3
    group: bool = False
    """Consumers as members of one group, committing (else fixed assignments, no commits)."""
    idempotent: bool = False
    """Producers with enable_idempotence (the checker then forbids duplicates)."""
    tags: bool = False
    """Producers tag each record (chaos.feature_workload.tags_of its sequence number)."""
    racks: tuple[str, ...] = ()
    """The brokers' racks: consumer k reads from the in-sync replica in rack k (mod
    their number) when there is one (client_rack); empty: from the leaders."""


class ClientWorkload:
    def __init__(
        self,
        addresses: list[str],
        topic: str,
        partitions: int,
        recorder: Recorder,
        options: ClientWorkloadOptions,
        client_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.addresses = addresses
        self.client_settings = dict(client_settings or {})
        self.topic = topic
        self.partitions = partitions
        self.recorder = recorder
        self.options = options
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for k in range(self.options.producers):
            self._spawn(f"producer-{k}", self._produce, k)
        for k in range(self.options.consumers):
            self._spawn(f"consumer-{k}", self._consume, k)

    def _spawn(self, name: str, target: Callable[[int], None], arg: int) -> None:
        t = threading.Thread(target=target, args=(arg,), name=name, daemon=True)
        t.start()
        self.threads.append(t)

    # --- producing ------------------------------------------------------------------------

    def _producer(self) -> Producer:
        return chaos_producer(
            self.addresses, self.client_settings, idempotent=self.options.idempotent
        )

    def _produce(self, k: int) -> None:
        process = f"producer-{k}"
        pending: collections.deque[RecordFuture] = collections.deque()
        seq = 0
        with self._producer() as producer:
            while not self.stop.is_set():
                while len(pending) >= IN_FLIGHT or (pending and pending[0].done()):
                    with_timeout(pending.popleft())
                partition = seq % self.partitions
                value = send_value(process, partition, seq)
                seq += 1
                start = self.recorder.now()
                try:
                    future = producer.send(
                        self.topic,
                        value.encode(),
                        partition=partition,
                        tags=tags_of(seq - 1) if self.options.tags else None,
                    )
                except Exception as exc:  # refused at the call: nothing was sent
                    self._record_send(process, partition, value, start, None, exc, "fail")
                    self.stop.wait(0.1)
                    continue
                future.add_done_callback(
                    functools.partial(self._settled, process, partition, value, start)
                )
                pending.append(future)
                self.stop.wait(SEND_INTERVAL_S)
        # close() flushed: every future is settled and recorded.

    def _settled(
        self, process: str, partition: int, value: str, start: float, future: RecordFuture
    ) -> None:
        exc = future.exception(timeout=0)
        offset = None if exc is not None else future.result(timeout=0).offset
        # A failure after the producer's retries is never proof that nothing was stored
        # (an earlier attempt may have been), so it is indeterminate.
        self._record_send(process, partition, value, start, offset, exc, "info")

    def _record_send(
        self,
        process: str,
        partition: int,
        value: str,
        start: float,
        offset: int | None,
        exc: BaseException | None,
        failed: str,
    ) -> None:
        status = "ok" if exc is None else failed
        error = None if exc is None else f"{type(exc).__name__}: {exc}"[:300]
        self.recorder.add(
            Op(
                "send",
                process,
                partition,
                value,
                offset,
                status,
                start,
                self.recorder.now(),
                error=error,
            )
        )

    # --- consuming ------------------------------------------------------------------------

    def _consumer(self, k: int = 0) -> Consumer:
        settings: dict[str, object] = {
            **self.client_settings,
            "auto_offset_reset": "earliest",
            "fetch_max_wait_ms": 200,
            "max_poll_records": 200,
        }
        racks = self.options.racks
        if racks:
            settings["client_rack"] = racks[k % len(racks)]
        if self.options.group:
            settings |= {
                "group_id": GROUP,
                "enable_auto_commit": False,
                "session_timeout_ms": SESSION_TIMEOUT_MS,
            }
        return Consumer(self.addresses, **settings)  # type: ignore[arg-type]

    def _consume(self, k: int) -> None:
        process = f"consumer-{k}"
        while not self.stop.is_set():
            try:
                with self._consumer(k) as consumer:
                    if self.options.group:
                        self._member(process, consumer)
                    else:
                        mine = range(k, self.partitions, self.options.consumers)
                        consumer.assign([(self.topic, p) for p in mine])
                        self._poll_loop(process, consumer, None)
                    return
            except Exception as exc:  # the consumer broke: note it, start a new one
                now = self.recorder.now()
                self.recorder.add(
                    Op(
                        "consumer-error",
                        process,
                        status="info",
                        start=now,
                        end=now,
                        error=f"{type(exc).__name__}: {exc}"[:300],
                    )
                )
                if not self.options.group:
                    return  # a new one would start over at offset 0: not this mode's model
                self.stop.wait(0.5)

    def _member(self, process: str, consumer: Consumer) -> None:
        processed: dict[tuple[str, int], int] = {}

        def on_revoke(partitions: set[tuple[str, int]]) -> None:
            self._commit(
                process, consumer, {tp: processed[tp] for tp in partitions if tp in processed}
            )
            for tp in partitions:
                processed.pop(tp, None)

        def on_lost(partitions: set[tuple[str, int]]) -> None:
            for tp in partitions:  # another member may hold them already: no commit
                processed.pop(tp, None)

        consumer.subscribe([self.topic], on_revoke=on_revoke, on_lost=on_lost)
        self._poll_loop(process, consumer, processed)
        on_revoke(set(processed))

    def _poll_loop(
        self,
        process: str,
        consumer: Consumer,
        processed: dict[tuple[str, int], int] | None,
    ) -> None:
        """Poll until the run stops; with ``processed`` (group mode) commit after each poll
        the offsets after what it returned, which the caller processed by recording it."""
        while not self.stop.is_set():
            records = consumer.poll(0.5)
            if not records:
                continue
            self._record_consumed(process, consumer, records)
            if processed is not None:
                done = {(r.topic, r.partition): r.offset + 1 for r in records}
                processed.update(done)
                self._commit(process, consumer, done)

    def _record_consumed(
        self, process: str, consumer: Consumer, records: list[ConsumerRecord]
    ) -> None:
        """One ``consume`` op per record; ``replica``: the broker whose fetch answer last
        filled the partition's buffer (the leader, or with racks maybe a follower; the
        fetcher's own note, read for the report, not for any check)."""
        now = self.recorder.now()
        states = consumer._fetcher.states
        for r in records:
            state = states.get((r.topic, r.partition))
            self.recorder.add(
                Op(
                    "consume",
                    process,
                    r.partition,
                    (r.value or b"").decode(),
                    r.offset,
                    "ok",
                    now,
                    now,
                    replica=state.served_by if state is not None else None,
                )
            )

    def _commit(
        self, process: str, consumer: Consumer, offsets: dict[tuple[str, int], int]
    ) -> None:
        if not offsets:
            return
        start = self.recorder.now()
        status, error = "ok", None
        try:
            consumer.commit(offsets)
        except Exception as exc:
            # Refused (fenced) or not known: either way the checker must not count on it.
            status, error = "info", f"{type(exc).__name__}: {exc}"[:300]
        end = self.recorder.now()
        for (_, partition), offset in sorted(offsets.items()):
            self.recorder.add(
                Op("commit", process, partition, None, offset, status, start, end, error=error)
            )

    # --- the end --------------------------------------------------------------------------

    def finish(self, timeout: float = 30.0) -> None:
        """Stop every thread (producers flush, members commit and leave); in group mode
        then read the group's committed offsets with a fresh consumer."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
        if self.options.group:
            self._read_committed()

    def _read_committed(self) -> None:
        tps = [(self.topic, p) for p in range(self.partitions)]
        record_group_offsets(self.recorder, self._consumer, tps, "committed")


def record_group_offsets(
    recorder: Recorder, make_consumer: Callable[[], Consumer], tps: list[tuple[str, int]], kind: str
) -> None:
    """After the run: a group's committed offsets of ``tps`` as a fresh consumer of the
    group reads them, one ``kind`` op per partition (-1: none), or one ``fail`` op when
    the group did not answer within 30 s."""
    deadline = time.monotonic() + 30
    while True:
        start = recorder.now()
        try:
            with make_consumer() as consumer:
                found = consumer.committed(tps)
            break
        except Exception as exc:
            if time.monotonic() > deadline:
                recorder.add(
                    Op(
                        kind,
                        "final-group",
                        status="fail",
                        start=start,
                        end=recorder.now(),
                        error=f"{type(exc).__name__}: {exc}"[:300],
                    )
                )
                return
            time.sleep(0.5)
    end = recorder.now()
    for (_, partition), offset in sorted(found.items()):
        recorder.add(
            Op(
                kind,
                "final-group",
                partition,
                None,
                -1 if offset is None else offset,
                "ok",
                start,
                end,
            )
        )


def with_timeout(future: RecordFuture) -> None:
    """Wait for a sent record to settle (its callback records it); a producer's delivery
    timeout bounds the wait, so this never hangs past it."""
    future.exception(timeout=DELIVERY_TIMEOUT_MS / 1000 + 30)
