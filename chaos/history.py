"""The history of a chaos run: every operation the workload attempted and what it saw.

It is the only thing the checker reads, so a run can be re-checked later from its
``history.jsonl``, and the checker can be tested on handcrafted histories. New workloads
(idempotent producers, consumer groups, membership changes) add kinds; old kinds keep
their meaning.

Kinds:
- ``send``: a producer's write of one record. ``value`` is unique in the run and names its
  producer, partition and sequence number. ``status``: ``ok`` (acknowledged; ``offset`` is
  the acknowledged offset), ``fail`` (definitely not written: the broker refused it before
  or instead of committing it), ``info`` (indeterminate: timeout, connection lost).
- ``read``: a record a live reader saw while faults ran: ``offset``, ``value``, and
  ``hw``, the high watermark in the same fetch answer. Readers read each partition in
  order; ``process`` identifies the reader, whose assignment never changes within a run.
- ``reset``: a live reader's fetch at ``offset`` was answered OFFSET_OUT_OF_RANGE because
  retention had moved the log start past it, so the reader jumped to the log start (like a
  Kafka consumer with ``auto.offset.reset=earliest``); ``value`` = str(the new offset). The
  checker allows exactly that skip in the reader's order.
- ``consume``: a record a real Consumer polled (chaos/client_workload.py): ``process``
  the consumer, ``offset``, ``value``; ``replica`` the broker that answered the fetch (a
  follower in the consumer's rack, with follower reads). A group member may be handed a
  partition again and see records again (at-least-once), so only consumers that commit
  nothing are held to reading in order.
- ``commit``: a group member's commit (the client side: what the member asked for) of
  ``offset`` (the next to consume) on ``partition``: ``ok`` (acknowledged by the
  coordinator) or ``info`` (refused or not known: not counted on), ``error`` why.
- ``committed``: after the run, the group's committed offset of ``partition`` (-1: none)
  as a fresh consumer read it (the coordinator side: its FetchOffsets answer);
  ``status`` ``fail`` with ``error`` when it could not.
- ``consumer-error``: a Consumer raised out of ``poll`` (``error``); the workload starts
  a new one in group mode.
- ``final``: a record read after healing by a fresh reader of one replica (``replica`` =
  broker id), from that replica's log start to its high watermark (``hw``).
- ``range``: per partition and replica (``replica``), what its final reads covered:
  ``offset`` = its log start (ListOffsets EARLIEST; records below it were deleted by
  retention or skipped by a snapshot install), ``hw`` = its high watermark, ``end`` when
  the read ended (the run waits for a replica behind until healing plus the recovery
  limit). ``status`` ``fail`` (with ``error``): the replica never answered, so it has no
  log start (its 0 means nothing). Histories without ``range`` ops (older runs) mean
  every replica started at 0.
- ``digest``: per partition and replica, the SHA-256 (``value``) of the stored entry bytes
  of the range every replica holds: from the largest log start among the replicas (their
  ``range`` ops) to ``offset`` (the smallest high watermark among them). Replicas must agree
  byte for byte on it.
- ``recovery``: after healing, ``value`` = seconds until every partition had a leader and
  accepted a write; ``status`` ``ok`` or ``fail`` (not within the limit).
- ``fault``: the nemesis started (``status`` ``start``) or ended (``end``) a fault;
  ``value`` describes it (a power loss, ``unsynced``, says how many un-fsynced bytes it
  dropped: "... N un-fsynced bytes dropped ...").
- ``leader``: the monitor saw the set of brokers that claim to lead ``partition`` change;
  ``value`` lists their ids ("2", "1,3" while an old leader has not yet noticed, "" when
  none does).
- ``replication``: in runs that killed a broker for good, per partition, whether the
  controller healed it back to its replication factor of in-sync voters on live brokers:
  ``value`` its voters at the end ("1,3,4"), ``status`` ``ok`` or ``fail`` (``error`` says
  what was still missing), ``start`` the end of the fault window, ``end`` when every
  partition was seen healed (or the wait gave up).
- ``status``: after the final reads, what broker ``replica`` says of itself: with
  ``partition`` -1 its grpc.health.v1 answer (``SERVING``, ``NOT_SERVING``, or
  ``UNREACHABLE``; ``error`` set when its Metadata call then got no answer, so none of its
  replicas could be reported); otherwise the state it reports for its replica of that partition
  (``REPLICA_OK``, ``REPLICA_CATCHING_UP``, ``REPLICA_FAILED``, ``REPLICA_OPENING``)
  and, in ``error``, why.
- ``assignment``: with the status ops, what broker ``replica``'s metadata says of
  ``partition``: ``value`` the assigned replicas (PartitionInfo ``replicas``, comma-
  separated broker ids), ``offset`` the leader it knows (0: none). The checker takes the
  leader's own answer (else the most common one) as the assignment and requires a status
  op from every assigned replica's broker.

Transactions (``--transactions``, chaos/txn_workload.py; checked by chaos/txn_checker.py).
The workload writes to an output topic of its own, so none of these is a ``send``,
``consume`` or ``final`` of the main topic; ``partition`` is an output partition unless
said otherwise. Each write's value (:func:`txn_value`) names its transaction, its index
in it and, for the pipeline's, the input record (partition, offset) it was made from.
- ``txn``: one transaction's outcome. ``process`` the transactional worker or producer,
  ``value`` the transaction id (``process#n``), ``status`` ``ok`` (committed), ``fail``
  (aborted: aborted on purpose, refused, or never asked to commit) or ``info`` (unknown:
  the commit's answer never came); ``start`` when its commit (or abort) was asked for,
  ``end`` when the outcome was known; ``error`` why it did not commit.
- ``txn-write``: a record a transaction sent: ``offset`` from its future when it was
  stored (``status`` ``ok``), else None (``info``: not known to be stored, ``error`` why).
- ``txn-offsets``: a consumer position a pipeline transaction carried
  (send_offsets_to_transaction): ``partition`` the input partition, ``offset`` the next
  input offset to consume, ``value`` the transaction id; ``ok`` when the coordinator took it.
- ``txn-consume``: an input record (main topic: ``partition``, ``offset``, ``value``) a
  pipeline worker polled, in the worker's program order.
- ``txn-assign``: a worker's group handed it ``partition`` (input) (``value`` ``assign``),
  or took it back (``revoke``) or dropped the worker (``lost``): a tenure's bounds.
- ``txn-seek``: a worker or output reader moved its position on ``partition`` to
  ``offset`` (-1: the log start): a worker after an aborted or unknown transaction, to the
  group's committed offset (``value`` ``committed``, ``start`` when it asked the group), a
  reader when it started again after an error (``value`` ``restart``).
- ``txn-read``: a record an output reader polled; ``process`` names the reader and its
  isolation level (``read_committed-K``, ``read_uncommitted-K``).
- ``txn-committed``: after the run, the pipeline group's committed offset of input
  ``partition`` (-1: none), as a fresh consumer read it; ``fail`` when it could not.
- ``txn-final``: after the run, once every transactional id was fenced (what was open is
  aborted), a record a fresh read_committed reader read from the output's beginning.
- ``txn-range``: per output partition, that final read: ``offset`` the largest log start
  any replica reported (retention), ``hw`` the high watermark, ``value`` the position the
  reader reached (str), ``error`` why it stopped short of ``hw``.
- ``txn-error``: a worker, producer or reader raised out of its loop (``error``); it
  starts again with a new client.

Message features (``--delayed``, ``--tags``, chaos/feature_workload.py; checked by
chaos/feature_checker.py).
- ``delayed-send``: a record sent to the delayed topic with ``deliver_at``: ``value``
  names the producer, partition, sequence and due time (ms since the epoch, after
  ``@``); ``wall_ms`` when it was sent; ``status`` as for ``send`` (its offset is the
  internal topic's, so none is kept).
- ``delayed-consume``: a record of the delayed topic a consumer polled: ``offset``,
  ``value``, ``wall_ms`` when it arrived.
- ``tag-consume``: a record of the main topic the consumer with the tag filter polled.
- ``tag-position``: after the run, where that consumer stopped on ``partition``
  (``offset``: the next it would read); every matching record below it must be among
  its ``tag-consume`` ops.
- ``feature-error``: one of these consumers raised out of ``poll`` (``error``); it starts
  again where its last record left off.

Share groups (``--share-group``, chaos/share_workload.py; checked by
chaos/share_checker.py). Members are processes (chaos/share_member.py); ``process``
names one member process (a replacement gets a new name). Times in ``wall_ms`` and
``start_ms`` are the machine's wall clock, the one the leaders stamp lock deadlines with.
- ``share-send``: a record sent to the share topic: as ``send`` (``offset`` when ``ok``).
- ``share-receive``: a record ``poll`` gave a member: ``partition``, ``offset``,
  ``value``, ``count`` its delivery count, ``deadline_ms`` its lock deadline, ``wall_ms``
  when poll returned it (after the leader acquired it).
- ``share-ack``: one acknowledged range ``offset`` .. ``last_offset`` of ``partition``;
  ``value`` the type (ACCEPT, RELEASE, REJECT); ``status`` ``ok`` (committed), ``fail``
  (refused, ``error`` why) or ``info`` (OUTCOME_UNKNOWN: an attempt the member retried
  may have been applied before the leader failed, or the member was killed while
  committing it); ``start_ms`` when the commit was sent, ``wall_ms`` when its answer came
  (or the member was killed).
- ``share-crash``: the workload SIGKILLed member ``process`` at ``wall_ms``.
- ``share-dlq``: after the run, a record read from the group's dead-letter topic:
  ``value`` as sent, ``partition`` and ``offset`` the original ones (its headers),
  ``count`` its delivery attempts, ``error`` the reason the broker gave.
- ``share-error``: a member's consumer raised (``error``); the member started a new one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Op:
    kind: str
    process: str
    partition: int = -1
    value: str | None = None
    offset: int | None = None
    status: str = "ok"
    start: float = 0.0
    end: float = 0.0
    hw: int | None = None
    replica: int | None = None
    error: str | None = None
    wall_ms: int | None = None
    """Wall clock (ms since the epoch) when it happened, for ops held to due times."""
    count: int | None = None
    """A share group delivery's count (``share-receive``, ``share-dlq``)."""
    deadline_ms: int | None = None
    """A share group delivery's lock deadline (ms since the epoch, the leader's clock)."""
    start_ms: int | None = None
    """Wall clock when an operation was asked for (``share-ack``: its commit sent)."""
    last_offset: int | None = None
    """The last offset of a range that starts at ``offset`` (``share-ack``)."""

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @staticmethod
    def from_json(line: str) -> Op:
        return Op(**json.loads(line))


def write(path: Path, ops: Iterable[Op]) -> None:
    with open(path, "w") as f:
        for op in ops:
            f.write(op.to_json() + "\n")


def read(path: Path) -> Iterator[Op]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield Op.from_json(line)


def send_value(producer: str, partition: int, seq: int) -> str:
    return f"{producer}:{partition}:{seq}"


TXN_KINDS = frozenset(
    {
        "txn",
        "txn-write",
        "txn-offsets",
        "txn-consume",
        "txn-assign",
        "txn-seek",
        "txn-read",
        "txn-committed",
        "txn-final",
        "txn-range",
        "txn-error",
    }
)
"""The kinds of the transactional workload (chaos/txn_checker.py checks them)."""

FEATURE_KINDS = frozenset(
    {"delayed-send", "delayed-consume", "tag-consume", "tag-position", "feature-error"}
)
"""The kinds of the message-feature workload (chaos/feature_checker.py checks them)."""

SHARE_KINDS = frozenset(
    {"share-send", "share-receive", "share-ack", "share-crash", "share-dlq", "share-error"}
)
"""The kinds of the share group workload (chaos/share_checker.py checks them)."""


def txn_value(txn: str, index: int, source: tuple[int, int] | None = None) -> str:
    """The value of a transaction's ``index``-th write; ``source``: the input (partition,
    offset) a pipeline output was made from."""
    base = f"{txn}/{index}"
    return base if source is None else f"{base}/{source[0]}/{source[1]}"


def parse_txn_value(value: str) -> tuple[str, int, tuple[int, int] | None] | None:
    """(transaction id, index, input) of a :func:`txn_value`; None for anything else."""
    parts = value.split("/")
    try:
        if len(parts) == 2:
            return parts[0], int(parts[1]), None
        if len(parts) == 4:
            return parts[0], int(parts[1]), (int(parts[2]), int(parts[3]))
    except ValueError:
        return None
    return None
