"""What the harness asks of the cluster while faults run, recorded op by op.

Producers send one record per produce, sequentially, acks=all, each value unique and
self-describing; readers long-poll every partition in order. Every outcome is classified
the way the checker needs it: a write is ``fail`` only when the broker proved nothing was
written, and ``info`` (indeterminate) whenever it might have been.

New generators (idempotent producers, consumer groups, membership changes) are added as
more threads writing to the same :class:`Recorder`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Op, send_value
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import ClientError, ErrorCode, LowLevelClient, Producer
from raftmq.client.producer import RecordFuture
from raftmq.format.records import Record, build_batch, iter_records

DEFINITE_REFUSALS = {
    ErrorCode.ERROR_CODE_NOT_LEADER,
    ErrorCode.ERROR_CODE_LEADER_NOT_AVAILABLE,
    ErrorCode.ERROR_CODE_SHUTTING_DOWN,
    ErrorCode.ERROR_CODE_NOT_HOSTED,
    ErrorCode.ERROR_CODE_INVALID_BATCH,
    ErrorCode.ERROR_CODE_CORRUPT_BATCH,
    ErrorCode.ERROR_CODE_BATCH_TOO_LARGE,
    ErrorCode.ERROR_CODE_INVALID_ARGUMENT,
    ErrorCode.ERROR_CODE_UNKNOWN_TOPIC,
    ErrorCode.ERROR_CODE_UNKNOWN_PARTITION,
}
"""Broker answers that prove the write was not (and will never be) committed."""

DELIVERY_TIMEOUT_MS = 15_000
"""How long the real clients' producers try a record (their delivery.timeout.ms)."""
REQUEST_TIMEOUT_MS = 3_000


class Recorder:
    """A thread-safe, append-only history with a clock starting at the run's start."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self._ops: list[Op] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)


def classify(exc: ClientError) -> str:
    return "fail" if exc.code in DEFINITE_REFUSALS else "info"


def send_one(
    client: LowLevelClient,
    recorder: Recorder,
    process: str,
    topic: str,
    partition: int,
    value: str,
    timeout_ms: int,
) -> Op:
    start = recorder.now()
    record = Record(None, value.encode(), int(time.time() * 1000))
    try:
        resp = client.produce(
            topic, partition, build_batch([record]), acks=pb.ACKS_ALL, timeout_ms=timeout_ms
        )
        op = Op("send", process, partition, value, resp.base_offset, "ok", start, recorder.now())
    except ClientError as exc:
        op = Op(
            "send",
            process,
            partition,
            value,
            None,
            classify(exc),
            start,
            recorder.now(),
            error=f"{exc.label}: {exc}"[:300],
        )
    except Exception as exc:  # anything unexpected: the write may have happened
        op = Op(
            "send",
            process,
            partition,
            value,
            None,
            "info",
            start,
            recorder.now(),
            error=repr(exc)[:300],
        )
    recorder.add(op)
    return op


class Workload:
    def __init__(
        self,
        addresses: list[str],
        topic: str,
        partitions: int,
        recorder: Recorder,
        *,
        producers: int = 4,
        timeout_ms: int = 3000,
        client_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.addresses = addresses
        self.client_settings = dict(client_settings or {})
        self.topic = topic
        self.partitions = partitions
        self.recorder = recorder
        self.producers = producers
        self.timeout_ms = timeout_ms
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.positions: dict[int, int] = {}

    def _client(self) -> LowLevelClient:
        # Retry only refusals that prove nothing was written; a connection lost mid-call is
        # recorded as indeterminate instead of retried into a possible duplicate.
        return LowLevelClient(
            self.addresses,
            retries=8,
            backoff=0.05,
            retry_unavailable=False,
            **self.client_settings,
        )

    def start(self) -> None:
        for k in range(self.producers):
            self._spawn(f"producer-{k}", self._produce, k)
        for p in range(self.partitions):
            self._spawn(f"reader-{p}", self._read, p)

    def _spawn(self, name: str, target: Callable[..., None], arg: int) -> None:
        t = threading.Thread(target=target, args=(arg,), name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def _produce(self, k: int) -> None:
        process = f"producer-{k}"
        seq = 0
        with self._client() as client:
            while not self.stop.is_set():
                partition = (k + seq) % self.partitions
                value = send_value(process, partition, seq)
                op = send_one(
                    client, self.recorder, process, self.topic, partition, value, self.timeout_ms
                )
                seq += 1
                if op.status != "ok":
                    self.stop.wait(0.05)  # do not spin while the cluster recovers

    def _read(self, partition: int) -> None:
        process = f"reader-{partition}"
        offset = 0
        with self._client() as client:
            while not self.stop.is_set():
                try:
                    resp = client.fetch(self.topic, partition, offset, max_wait_ms=500)
                except ClientError as exc:
                    offset = self._reset(process, partition, offset, exc)
                    self.stop.wait(0.1)
                    continue
                except Exception:
                    self.stop.wait(0.1)
                    continue
                now = self.recorder.now()
                for r in iter_records(resp.entries):
                    if r.offset < offset:
                        continue
                    self.recorder.add(
                        Op(
                            "read",
                            process,
                            partition,
                            (r.value or b"").decode(),
                            r.offset,
                            "ok",
                            now,
                            now,
                            hw=resp.high_watermark,
                        )
                    )
                    offset = r.offset + 1
        self.positions[partition] = offset

    def _reset(self, process: str, partition: int, offset: int, exc: ClientError) -> int:
        """Where to read next after a refused fetch at ``offset``.

        OFFSET_OUT_OF_RANGE below the log start means retention deleted the records the
        reader has not read yet: it jumps to the log start, as a Kafka consumer with
        ``auto.offset.reset=earliest`` would, and records a ``reset`` op so the checker
        allows exactly that skip. Out of range above the high watermark (a new leader
        not yet caught up on its commit index) is only waited out: the reader keeps its
        place."""
        if exc.code != ErrorCode.ERROR_CODE_OFFSET_OUT_OF_RANGE:
            return offset
        try:
            start = int(exc.meta.get("raftmq-log-start-offset", ""))
        except ValueError:
            return offset
        if start <= offset:
            return offset
        now = self.recorder.now()
        self.recorder.add(Op("reset", process, partition, str(start), offset, "ok", now, now))
        return start

    def finish(self, timeout: float = 30.0) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)


def chaos_producer(
    addresses: list[str], client_settings: Mapping[str, str], *, idempotent: bool
) -> Producer:
    """A producer as every chaos workload sends with: acks=all, its own retries within
    DELIVERY_TIMEOUT_MS, idempotent when asked."""
    settings: dict[str, object] = {
        **client_settings,
        "acks": "all",
        "linger_ms": 2,
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "delivery_timeout_ms": DELIVERY_TIMEOUT_MS,
        "max_block_ms": DELIVERY_TIMEOUT_MS,
    }
    if idempotent:
        settings["enable_idempotence"] = True
    return Producer(addresses, **settings)  # type: ignore[arg-type]


SEND_IN_FLIGHT = 32
"""Records a numbered sender has sent and not yet seen settled, at most."""


@dataclass(frozen=True, slots=True)
class NumberedSend:
    """One record of :func:`send_numbered`: where it goes and what the producer is told."""

    topic: str
    partition: int
    value: str
    options: Mapping[str, Any] = field(default_factory=dict)
    """More keyword arguments of ``Producer.send`` (``deliver_at``, ``tags``)."""
    wall_ms: int | None = None
    """Kept in the op (a delayed record's send time)."""


def send_numbered(
    producer: Producer,
    stop: threading.Event,
    recorder: Recorder,
    kind: str,
    process: str,
    make: Callable[[int], NumberedSend],
    *,
    interval_s: float,
    keep_offset: bool = True,
    on_acked: Callable[[NumberedSend], None] | None = None,
) -> None:
    """Send ``make(0)``, ``make(1)``, ... until ``stop``, one every ``interval_s``, at most
    SEND_IN_FLIGHT unsettled, and record one ``kind`` op per record once it settles: ``ok``
    (with its offset when ``keep_offset``), ``fail`` when the producer refused it at the
    call (nothing was sent), ``info`` when it failed after the producer's retries (an
    attempt may have been stored). ``on_acked`` hears of each acknowledged record."""
    pending: list[RecordFuture] = []
    seq = 0

    def record(
        send: NumberedSend, start: float, exc: BaseException | None, offset: int | None, failed: str
    ) -> None:
        if exc is None and on_acked is not None:
            on_acked(send)
        recorder.add(
            Op(
                kind,
                process,
                send.partition,
                send.value,
                offset if keep_offset else None,
                "ok" if exc is None else failed,
                start,
                recorder.now(),
                error=None if exc is None else f"{type(exc).__name__}: {exc}"[:300],
                wall_ms=send.wall_ms,
            )
        )

    def settled(send: NumberedSend, start: float, future: RecordFuture) -> None:
        exc = future.exception(timeout=0)
        offset = None if exc is not None else future.result(timeout=0).offset
        # A failure after the producer's retries is never proof that nothing was stored.
        record(send, start, exc, offset, "info")

    while not stop.is_set():
        pending = [f for f in pending if not f.done()]
        if len(pending) >= SEND_IN_FLIGHT:
            pending[0].exception(timeout=DELIVERY_TIMEOUT_MS / 1000 + 30)
            continue
        send = make(seq)
        seq += 1
        start = recorder.now()
        try:
            future = producer.send(
                send.topic, send.value.encode(), partition=send.partition, **send.options
            )
        except Exception as exc:  # refused at the call: nothing was sent
            record(send, start, exc, None, "fail")
            stop.wait(0.1)
            continue
        future.add_done_callback(functools.partial(settled, send, start))
        pending.append(future)
        stop.wait(interval_s)
