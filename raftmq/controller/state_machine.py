"""The metadata state machine: what the controller group's Raft runner drives.

The runner's contract (raftmq/raft/host/): ``apply(index, command) -> result`` for each
committed entry in order, ``snapshot() -> bytes`` and ``restore(bytes)``. Everything
here is pure: no I/O, no clock, no randomness, so every controller replica that applies
the same entries holds the same state, and the same snapshot bytes.
"""

from __future__ import annotations

import dataclasses

from raftmq.controller import acls, codec, quotas
from raftmq.controller.commands import (
    MalformedCommand,
    Refused,
    Result,
    decode_command,
    encode,
)
from raftmq.controller.metadata import TOPIC_NAME
from raftmq.controller.model import MetadataState, Transaction, TxnEndedBy, TxnState
from raftmq.controller.transactions import (
    MAX_PRODUCER_EPOCH,
    MAX_TXN_PARTITIONS,
    MAX_TXN_TIMEOUT_MS,
    MIN_TXN_TIMEOUT_MS,
    TRANSACTIONAL_ID,
)
from raftmq.controller.transitions import apply_command

SNAPSHOT_FORMAT = 1


class SnapshotError(ValueError):
    """Bytes that are not a snapshot this version can restore (corrupt, or newer)."""


class MetadataStateMachine:
    """Applies metadata commands in log order; holds the current :class:`MetadataState`."""

    def __init__(self, cluster_name: str) -> None:
        self._state = MetadataState(cluster_name)

    @property
    def state(self) -> MetadataState:
        """The state after the last applied entry: immutable, safe to keep."""
        return self._state

    @property
    def version(self) -> int:
        return self._state.version

    def apply(self, index: int, command: bytes) -> bytes:
        """Applies the entry at ``index``; returns the encoded result for the proposer.

        Never raises for a bad command: bytes that do not decode, or a command the state
        refuses, apply nothing but still advance ``version`` (the entry is in the log)."""
        assert index > self._state.version, (index, self._state.version)
        assert index <= codec.INT64_MAX, index
        result: Result
        try:
            decoded = decode_command(command)
        except MalformedCommand as exc:
            state, result = self._state, Refused(exc.code, str(exc))
        else:
            state, result = apply_command(self._state, index, decoded)
        self._state = dataclasses.replace(state, version=index)
        return encode(result)

    def snapshot(self) -> bytes:
        """The whole state in canonical JSON: equal states give equal bytes."""
        return encode_snapshot(self._state)

    def restore(self, data: bytes) -> None:
        """Replaces the state with the snapshot's; raises :class:`SnapshotError` (and
        keeps the current state) if ``data`` is not a snapshot this version reads."""
        self._state = decode_snapshot(data)


def encode_snapshot(state: MetadataState) -> bytes:
    """``state`` as a snapshot: what :func:`decode_snapshot` reads (also the watch
    stream's encoding of a whole state, controller.proto)."""
    return codec.dumps({"format": SNAPSHOT_FORMAT, "state": codec.to_json(state)})


def decode_snapshot(data: bytes) -> MetadataState:
    try:
        raw = codec.loads(data)
    except codec.CodecError as exc:
        raise SnapshotError(f"the metadata snapshot is damaged: {exc}") from None
    if not isinstance(raw, dict) or set(raw) != {"format", "state"}:
        raise SnapshotError("the metadata snapshot has no format and state")
    if raw["format"] != SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"the metadata snapshot has format {raw['format']!r}; this controller reads "
            f"{SNAPSHOT_FORMAT}: upgrade it"
        )
    try:
        state: MetadataState = codec.from_json(MetadataState, raw["state"], "state")
    except TypeError as exc:
        raise SnapshotError(f"the metadata snapshot is damaged: {exc}") from None
    _check(state)
    return state


def _check(state: MetadataState) -> None:
    """The invariants every applied state keeps; a snapshot breaking one is damaged."""
    problems = []
    problems += [
        f"broker key {k} holds broker {b.id}" for k, b in state.brokers.items() if k != b.id
    ]
    for name, topic in state.topics.items():
        if name != topic.name or not TOPIC_NAME.fullmatch(name):
            problems.append(f"topic key {name!r} holds topic {topic.name!r}")
        for p, part in enumerate(topic.partitions):
            members = part.replicas + part.learners
            if not part.replicas or len(set(members)) != len(members):
                problems.append(f"{name}/{p} has replicas {members}")
            if part.replacing is not None and (
                part.replacing not in part.replicas or not part.learners
            ):
                problems.append(f"{name}/{p} replaces {part.replacing} with no move under way")
    problems += [
        f"group key {k!r} holds group {g.group_id!r}"
        for k, g in state.consumer_groups.items()
        if k != g.group_id
    ]
    for key, share in state.share_groups.items():
        if key != share.group_id or key in state.consumer_groups:
            problems.append(
                f"share group key {key!r} holds {share.group_id!r}, or a consumer group"
            )
        problems += [
            f"share group {key!r}: member key {m!r} holds {v.member_id!r}"
            for m, v in share.members.items()
            if m != v.member_id
        ]
        if list(share.topics) != sorted(set(share.topics)):
            problems.append(f"share group {key!r}: topics not distinct and sorted")
    for key, txn in state.transactions.items():
        problems += [f"transaction {key!r}: {p}" for p in _transaction_problems(state, key, txn)]
    problems += acls.problems(state)
    problems += quotas.problems(state)
    if problems:
        raise SnapshotError("the metadata snapshot is inconsistent: " + "; ".join(problems))


def _transaction_problems(state: MetadataState, key: str, txn: Transaction) -> list[str]:
    """What a transaction's record breaks of the rules its transitions keep."""
    checks = [
        (key == txn.transactional_id and TRANSACTIONAL_ID.fullmatch(key), "a bad id"),
        (0 <= txn.producer_id < state.next_producer_id, "a producer id never handed out"),
        (0 <= txn.producer_epoch < MAX_PRODUCER_EPOCH, f"epoch {txn.producer_epoch}"),
        (MIN_TXN_TIMEOUT_MS <= txn.timeout_ms <= MAX_TXN_TIMEOUT_MS, "a bad timeout"),
        (
            txn.state.ending <= bool(txn.pending_markers)
            and bool(txn.pending_markers) <= (txn.state.ending or txn.state == TxnState.ONGOING),
            "pending markers out of step",
        ),
        (
            not txn.state.ending or set(txn.pending_markers) <= set(txn.partitions),
            "markers for other partitions",
        ),
        (
            not txn.last_committed or (txn.state == TxnState.ONGOING and txn.pending_markers),
            "a last decision with no markers pending",
        ),
        (len(txn.partitions) <= MAX_TXN_PARTITIONS, "too many partitions"),
        (
            txn.started_ms == 0 or txn.state == TxnState.ONGOING or txn.state.ending,
            "a start time with no transaction",
        ),
        (not txn.offsets or txn.state == TxnState.ONGOING, "offsets outside a transaction"),
        (not txn.offsets or txn.group_id, "offsets of no group"),
        (
            (txn.last_epoch >= 0)
            == (txn.state.ended or bool(txn.pending_markers))
            == (txn.ended_by != TxnEndedBy.NONE),
            "the last transaction out of step",
        ),
    ]
    return [what for ok, what in checks if not ok]
