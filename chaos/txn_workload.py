"""The transactional workload (``raftmq chaos run --transactions``): exactly-once
consume-transform-produce under faults, as a service built on raftmq runs it, and the
readers that hold it to its promises (chaos/txn_checker.py checks what they record; the
ops are described in chaos/history.py).

- **Pipeline workers**: each a read_committed Consumer in one group (no auto-commit) on
  the run's main topic and a transactional Producer (``chaos-txn-K``) writing to an
  output topic. Per poll, one transaction: an output per input record (its value names
  the transaction and the input's partition and offset), the consumed positions sent
  with it (send_offsets_to_transaction), commit. A transaction that cannot commit is
  aborted and the worker seeks back to the group's committed offsets; one whose commit
  got no answer is tried again, and if that fails too, the producer is replaced by a new
  one with the same id (its init_transactions fences the old one and aborts what it left
  open) and the worker seeks back as well: the group's offsets say whether it committed.
- **Direct transactional producers** (``chaos-txn-direct-K``) write small transactions
  to the output topic and abort a share of them on purpose, so aborted writes exist
  without faults.
- **Readers** of the output topic, read_committed and read_uncommitted, each assigned
  every partition from the beginning, record every record they poll.

After the run (:meth:`TxnWorkload.finish`) every transactional id is fenced once more (so
nothing stays open), the group's committed offsets are read, and a fresh read_committed
reader reads the whole output topic.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaos.client_workload import record_group_offsets
from chaos.history import Op, txn_value
from chaos.workload import Recorder
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import (
    Consumer,
    ConsumerGroupMetadata,
    ConsumerRecord,
    LowLevelClient,
    Producer,
    ProducerFencedError,
    TransactionAbortableError,
)
from raftmq.client.producer import RecordFuture

OUT_TOPIC = "txn-out"
"""The output topic: not named ``chaos-...``, so the nemesis's file faults, which look for
the main topic's directories, leave it alone."""
GROUP = "chaos-txn-group"
TXN_TIMEOUT_MS = 10_000
"""Short, so a transaction left open by a fault is aborted by the coordinator soon."""
COMMIT_ATTEMPTS = 3
"""Commits tried before an unanswered one is given up as unknown (the client retries
each for max_block_ms itself)."""
REQUEST_TIMEOUT_MS = 3_000
DELIVERY_TIMEOUT_MS = 15_000
MAX_BLOCK_MS = 10_000
SESSION_TIMEOUT_MS = 12_000
"""As the client workload's: long enough for a group to ride out a paused controller."""
FINAL_READ_S = 60.0
"""How long the final read_committed read waits for every partition's last stable
offset to reach its high watermark."""


@dataclass(frozen=True, slots=True)
class TxnWorkloadOptions:
    workers: int = 2
    """Pipeline workers (consumer group members with a transactional producer each)."""
    producers: int = 2
    """Direct transactional producers, aborting ``abort_share`` of their transactions."""
    committed_readers: int = 2
    uncommitted_readers: int = 1
    abort_share: float = 0.3
    seed: int = 0


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


@dataclass
class _Send:
    value: str
    partition: int
    start: float
    future: RecordFuture | None
    error: str | None = None
    """Why ``send`` itself raised (then ``future`` is None: nothing was sent)."""


@dataclass
class _Open:
    """The transaction a body fills: its id and its sends, recorded when it ends."""

    txn: str
    sends: list[_Send] = field(default_factory=list)


class _Transactor:
    """One transactional id's producer: runs and records transactions, and replaces
    the producer after a fencing or an outcome it could not learn."""

    def __init__(self, workload: TxnWorkload, process: str, transactional_id: str) -> None:
        self.w = workload
        self.process = process
        self.transactional_id = transactional_id
        self.producer: Producer | None = None
        self.count = 0

    def ready(self) -> bool:
        """A producer with its transactions initialised (made now if there is none);
        False when the run stopped before one was."""
        while self.producer is None and not self.w.stop.is_set():
            producer = self.w.producer(self.transactional_id)
            try:
                producer.init_transactions()
                self.producer = producer
            except Exception as exc:
                self.w.error(self.process, f"init_transactions: {_error(exc)}")
                _close(producer)
                self.w.stop.wait(0.5)
        return self.producer is not None

    def renew(self) -> None:
        """Close the producer; the next :meth:`ready` makes a new one, whose
        init_transactions fences this one and aborts its open transaction."""
        if self.producer is not None:
            _close(self.producer)
            self.producer = None

    def run(self, body: Callable[[Producer, _Open], None], *, abort: bool = False) -> str:
        """Begin a transaction, let ``body`` send in it, then commit it (or, with
        ``abort``, abort it); record it. Returns its status: ok, fail or info."""
        producer = self.producer
        assert producer is not None
        self.count += 1
        txn = _Open(f"{self.process}#{self.count}")
        asked = self.w.recorder.now()
        error: str | None
        try:
            producer.begin_transaction()
            body(producer, txn)
            asked = self.w.recorder.now()
            if abort:
                status, error = self._abort(producer, "aborted on purpose")
            else:
                status, error = self._commit(producer)
        except Exception as exc:
            # The commit was never asked for: nothing of it can become visible.
            asked = self.w.recorder.now()
            status, error = self._abort(producer, _error(exc))
            if isinstance(exc, ProducerFencedError):
                self.renew()
        self._record(txn, status, asked, error)
        return status

    def _commit(self, producer: Producer) -> tuple[str, str | None]:
        unanswered: list[str] = []
        for _ in range(COMMIT_ATTEMPTS):
            try:
                producer.commit_transaction()
                return "ok", "; ".join(unanswered) or None
            except TransactionAbortableError as exc:
                # Refused for good (the client's contract): it aborts, nothing visible.
                return self._abort(producer, "; ".join([*unanswered, _error(exc)]))
            except ProducerFencedError as exc:
                unanswered.append(_error(exc))
                break
            except Exception as exc:  # no answer: the same commit again
                unanswered.append(_error(exc))
                time.sleep(0.2)
        self.renew()
        return "info", "; ".join(unanswered)

    def _abort(self, producer: Producer, why: str) -> tuple[str, str]:
        try:
            producer.abort_transaction()
        except Exception as exc:
            # Not committed (never asked to, or refused for good), so it stays invisible
            # whatever became of the abort; a new producer's init_transactions ends it.
            why = f"{why}; abort failed: {_error(exc)}"
            self.renew()
        return "fail", why

    def _record(self, txn: _Open, status: str, asked: float, error: str | None) -> None:
        rec = self.w.recorder
        for s in txn.sends:
            offset, why = None, s.error
            if s.future is not None and s.future.done():
                exc = s.future.exception(timeout=0)
                if exc is None:
                    offset = s.future.result(timeout=0).offset
                else:
                    why = _error(exc)
            elif s.future is not None:
                why = "not settled when the transaction ended"
            rec.add(
                Op(
                    "txn-write",
                    self.process,
                    s.partition,
                    s.value,
                    offset,
                    "ok" if offset is not None else "info",
                    s.start,
                    rec.now(),
                    error=why,
                )
            )
        rec.add(
            Op(
                "txn",
                self.process,
                value=txn.txn,
                status=status,
                start=asked,
                end=rec.now(),
                error=error,
            )
        )

    def send(
        self,
        producer: Producer,
        txn: _Open,
        partition: int,
        source: tuple[int, int] | None = None,
    ) -> None:
        value = txn_value(txn.txn, len(txn.sends), source)
        start = self.w.recorder.now()
        try:
            future = producer.send(self.w.out_topic, value.encode(), partition=partition)
        except Exception as exc:
            txn.sends.append(_Send(value, partition, start, None, _error(exc)))
            raise
        txn.sends.append(_Send(value, partition, start, future))

    def send_offsets(
        self,
        producer: Producer,
        txn: _Open,
        positions: dict[tuple[str, int], int],
        group: ConsumerGroupMetadata,
    ) -> None:
        rec = self.w.recorder
        start = rec.now()
        status, error = "ok", None
        try:
            producer.send_offsets_to_transaction(positions, group)
        except Exception as exc:
            status, error = "info", _error(exc)
            raise
        finally:
            for (_, p), o in sorted(positions.items()):
                rec.add(
                    Op(
                        "txn-offsets",
                        self.process,
                        p,
                        txn.txn,
                        o,
                        status,
                        start,
                        rec.now(),
                        error=error,
                    )
                )


def _close(producer: Producer) -> None:
    # It is being replaced or the run is over: nothing more to learn from it.
    with contextlib.suppress(Exception):
        producer.close(timeout=5)


class TxnWorkload:
    def __init__(
        self,
        addresses: list[str],
        in_topic: str,
        partitions: int,
        recorder: Recorder,
        options: TxnWorkloadOptions,
        out_topic: str = OUT_TOPIC,
        client_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.addresses = addresses
        self.client_settings: dict[str, Any] = dict(client_settings or {})
        self.in_topic = in_topic
        self.out_topic = out_topic
        self.partitions = partitions
        self.recorder = recorder
        self.options = options
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.transactional_ids: list[str] = []

    def start(self) -> None:
        o = self.options
        for k in range(o.workers):
            self._spawn(f"txn-worker-{k}", self._work, k)
        for k in range(o.producers):
            self._spawn(f"txn-producer-{k}", self._produce, k)
        for k in range(o.committed_readers):
            self._spawn(f"read_committed-{k}", self._read, k)
        for k in range(o.uncommitted_readers):
            self._spawn(f"read_uncommitted-{k}", self._read, k)

    def _spawn(self, name: str, target: Callable[[str, int], None], k: int) -> None:
        t = threading.Thread(target=target, args=(name, k), name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def producer(self, transactional_id: str) -> Producer:
        return Producer(
            self.addresses,
            acks="all",
            linger_ms=2,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
            max_block_ms=MAX_BLOCK_MS,
            transactional_id=transactional_id,
            transaction_timeout_ms=TXN_TIMEOUT_MS,
            **self.client_settings,
        )

    def error(self, process: str, error: str) -> None:
        now = self.recorder.now()
        self.recorder.add(Op("txn-error", process, status="info", start=now, end=now, error=error))

    def _transactor(self, process: str, transactional_id: str) -> _Transactor:
        self.transactional_ids.append(transactional_id)
        return _Transactor(self, process, transactional_id)

    # --- the pipeline -----------------------------------------------------------------

    def _work(self, process: str, k: int) -> None:
        transactor = self._transactor(process, f"chaos-txn-{k}")
        try:
            while not self.stop.is_set():
                try:
                    with self._member(process) as consumer:
                        self._pipeline(process, consumer, transactor)
                except Exception as exc:  # the consumer broke: a new one joins the group
                    self.error(process, _error(exc))
                    self.stop.wait(0.5)
        finally:
            transactor.renew()

    def _member(self, process: str) -> Consumer:
        consumer = Consumer(
            self.addresses,
            **self.client_settings,
            group_id=GROUP,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            fetch_max_wait_ms=200,
            max_poll_records=100,
        )

        def tenure(event: str) -> Callable[[set[tuple[str, int]]], None]:
            def note(partitions: set[tuple[str, int]]) -> None:
                now = self.recorder.now()
                for _, p in sorted(partitions):
                    self.recorder.add(Op("txn-assign", process, p, event, start=now, end=now))

            return note

        consumer.subscribe(
            [self.in_topic],
            on_assign=tenure("assign"),
            on_revoke=tenure("revoke"),
            on_lost=tenure("lost"),
        )
        return consumer

    def _pipeline(self, process: str, consumer: Consumer, transactor: _Transactor) -> None:
        while not self.stop.is_set():
            if not transactor.ready():
                return
            records = consumer.poll(0.5)
            if not records:
                continue
            now = self.recorder.now()
            for r in records:
                self.recorder.add(
                    Op(
                        "txn-consume",
                        process,
                        r.partition,
                        (r.value or b"").decode(),
                        r.offset,
                        "ok",
                        now,
                        now,
                    )
                )

            def body(
                producer: Producer, txn: _Open, records: list[ConsumerRecord] = records
            ) -> None:
                positions: dict[tuple[str, int], int] = {}
                for r in records:
                    transactor.send(
                        producer, txn, r.partition % self.partitions, (r.partition, r.offset)
                    )
                    positions[(r.topic, r.partition)] = r.offset + 1
                transactor.send_offsets(producer, txn, positions, consumer.group_metadata())

            if transactor.run(body) != "ok":
                self._rewind(process, consumer)

    def _rewind(self, process: str, consumer: Consumer) -> None:
        """Seek every held partition back to the group's committed offset (raises when
        the group does not answer: the worker then starts over with a new consumer)."""
        held = sorted(consumer.assignment())
        asked = self.recorder.now()
        committed = consumer.committed(held)
        for tp in held:
            offset = committed.get(tp)
            if offset is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
            self.recorder.add(
                Op(
                    "txn-seek",
                    process,
                    tp[1],
                    "committed",
                    -1 if offset is None else offset,
                    "ok",
                    asked,
                    self.recorder.now(),
                )
            )

    # --- direct transactional producers -----------------------------------------------

    def _produce(self, process: str, k: int) -> None:
        rng = random.Random(f"{self.options.seed}-{process}")
        transactor = self._transactor(process, f"chaos-txn-direct-{k}")

        def body(producer: Producer, txn: _Open) -> None:
            for _ in range(rng.randint(1, 3)):
                transactor.send(producer, txn, rng.randrange(self.partitions))

        try:
            while not self.stop.is_set() and transactor.ready():
                transactor.run(body, abort=rng.random() < self.options.abort_share)
                self.stop.wait(rng.uniform(0.02, 0.1))
        finally:
            transactor.renew()

    # --- readers of the output ----------------------------------------------------------

    def _reader(self, isolation: str) -> Consumer:
        consumer = Consumer(
            self.addresses,
            **self.client_settings,
            isolation_level=isolation,  # type: ignore[arg-type]
            auto_offset_reset="earliest",
            fetch_max_wait_ms=200,
            max_poll_records=500,
        )
        consumer.assign([(self.out_topic, p) for p in range(self.partitions)])
        return consumer

    def _read(self, process: str, k: int) -> None:
        isolation = process.rsplit("-", 1)[0]
        last: dict[int, int] = {}
        while not self.stop.is_set():
            try:
                with self._reader(isolation) as consumer:
                    for p, o in sorted(last.items()):  # a restart goes on where it was
                        consumer.seek((self.out_topic, p), o + 1)
                        now = self.recorder.now()
                        self.recorder.add(
                            Op("txn-seek", process, p, "restart", o + 1, "ok", now, now)
                        )
                    while not self.stop.is_set():
                        records = consumer.poll(0.5)
                        now = self.recorder.now()
                        for r in records:
                            self.recorder.add(_read_op("txn-read", process, r, now))
                            last[r.partition] = r.offset
            except Exception as exc:
                self.error(process, _error(exc))
                self.stop.wait(0.5)

    # --- the end --------------------------------------------------------------------------

    def finish(self, direct: list[str], timeout: float = 60.0) -> None:
        """Stop every thread, fence every transactional id (what is still open is
        aborted), read the group's committed offsets, then read the output topic whole
        with a fresh read_committed reader. ``direct``: the brokers' own addresses, asked
        for each output partition's log start (retention) and high watermark."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for tid in self.transactional_ids:
            self._fence(tid)
        self._read_committed()
        self._final_read(direct)

    def _fence(self, transactional_id: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            producer = self.producer(transactional_id)
            try:
                producer.init_transactions()
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    self.error("final-fence", f"{transactional_id}: {_error(exc)}")
                    return
                time.sleep(0.5)
            finally:
                _close(producer)

    def _read_committed(self) -> None:
        record_group_offsets(
            self.recorder,
            lambda: Consumer(
                self.addresses, group_id=GROUP, enable_auto_commit=False, **self.client_settings
            ),
            [(self.in_topic, p) for p in range(self.partitions)],
            "txn-committed",
        )

    def _final_read(self, direct: list[str]) -> None:
        starts, hws = self._log_bounds(direct)
        process = "final-read_committed"
        reached: dict[int, int] = {}
        with self._reader("read_committed") as consumer:
            deadline = time.monotonic() + FINAL_READ_S
            while time.monotonic() < deadline:
                records = consumer.poll(0.5)
                now = self.recorder.now()
                for r in records:
                    self.recorder.add(_read_op("txn-final", process, r, now))
                for p in range(self.partitions):
                    reached[p] = consumer.position((self.out_topic, p)) or 0
                if not records and all(reached[p] >= hws.get(p, 0) for p in reached):
                    break
        now = self.recorder.now()
        for p in range(self.partitions):
            end, hw = reached.get(p, 0), hws.get(p, 0)
            error = None
            if end < hw:
                error = (
                    f"the read_committed read stopped at {end}, below the high watermark "
                    f"{hw}, after {FINAL_READ_S:.0f} s (the last stable offset stayed behind)"
                )
            self.recorder.add(
                Op(
                    "txn-range",
                    process,
                    p,
                    str(end),
                    starts.get(p, 0),
                    "ok",
                    now,
                    now,
                    hw=hw,
                    error=error,
                )
            )

    def _log_bounds(self, direct: list[str]) -> tuple[dict[int, int], dict[int, int]]:
        """Per output partition, the largest log start and high watermark any broker
        hosting it reports."""
        starts: dict[int, int] = {}
        hws: dict[int, int] = {}
        with LowLevelClient(direct, retries=2, **self.client_settings) as client:
            for address in direct:
                for p in range(self.partitions):
                    try:
                        resp = client.stub(address).ListOffsets(
                            pb.ListOffsetsRequest(
                                topic=self.out_topic, partition=p, position=pb.EARLIEST
                            ),
                            timeout=5,
                        )
                    except Exception:
                        continue  # not a replica of it, or not answering
                    starts[p] = max(resp.log_start_offset, starts.get(p, 0))
                    hws[p] = max(resp.high_watermark, hws.get(p, 0))
        return starts, hws


def _read_op(kind: str, process: str, r: ConsumerRecord, now: float) -> Op:
    return Op(kind, process, r.partition, (r.value or b"").decode(), r.offset, "ok", now, now)
