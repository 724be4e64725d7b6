"""What a partition refuses, with the symbolic code the API layer puts in ``raftmq-error``.

Each carries a sentence for a person. ``code`` is the name of an ``ErrorCode`` of
broker.proto without its ``ERROR_CODE_`` prefix, as a string: this floor is below the API
and cannot import the generated enum, so the broker turns the name into the code
(``raftmq.broker.refusals.Refusal.of``), and tests/broker/test_error_contract.py fails on a
name that is not an ErrorCode."""

from __future__ import annotations


class PartitionError(Exception):
    code = "INVALID_ARGUMENT"


class InvalidBatchError(PartitionError):
    code = "INVALID_BATCH"


class InvalidTagsError(InvalidBatchError):
    """A produced entry's tags break a rule of docs/format.md, "Tags"."""

    code = "INVALID_TAGS"


class CorruptBatchError(PartitionError):
    code = "CORRUPT_BATCH"


class BatchTooLargeError(PartitionError):
    code = "BATCH_TOO_LARGE"


class ProduceTimeoutError(PartitionError):
    code = "TIMEOUT"


class OutcomeUnknownError(PartitionError):
    """The broker stopped before it knew whether the write committed: it may have."""

    code = "OUTCOME_UNKNOWN"


class NotLeaderError(PartitionError):
    code = "NOT_LEADER"

    def __init__(
        self, topic: str, partition: int, leader: int, detail: str = "", *, failed: str = ""
    ) -> None:
        """``failed``: why this broker's replica is quarantined, if it is (then it does not
        know the leader, and saying an election is under way would not be the truth)."""
        if failed:
            who = f"broker {leader}" if leader else "not known here"
            text = (
                f"this broker's replica of {topic}/{partition} failed: {failed}; "
                f"the leader is {who}"
            )
        else:
            who = f"broker {leader}" if leader else "not known yet (an election is under way)"
            text = f"this broker is not the leader of {topic}/{partition}; the leader is {who}"
        super().__init__(text + (f" ({detail})" if detail else ""))
        self.leader = leader


class ReplicaFailedError(PartitionError):
    """This broker's replica is quarantined after an error in its log, storage or apply; it
    is reopened from disk with backoff. Nothing of the request was done: retry on another
    replica (a fetch) or at the partition's leader (a produce), or later."""

    code = "REPLICA_FAILED"

    def __init__(self, topic: str, partition: int, reason: str) -> None:
        super().__init__(
            f"this broker's replica of {topic}/{partition} failed: {reason}; it is being "
            "reopened from disk. Use another replica or the partition's leader, or retry later."
        )
        self.reason = reason


class OffsetOutOfRangeError(PartitionError):
    code = "OFFSET_OUT_OF_RANGE"

    def __init__(self, message: str, start: int, high_watermark: int) -> None:
        super().__init__(message)
        self.start = start
        self.high_watermark = high_watermark


class CorruptDataError(PartitionError):
    """This replica's stored copy of a range failed its checksum (a disk problem, not the
    client's): the client reads the range from another replica (``leader``, when known and
    not this broker) or retries later, once the replica has restored it."""

    code = "CORRUPT_DATA"

    def __init__(self, message: str, leader: int = 0) -> None:
        super().__init__(message)
        self.leader = leader


class NotEnoughReplicasError(PartitionError):
    """An acks=all write to a partition with fewer in-sync voters than its
    min.insync.replicas: refused before anything was appended, so a retry cannot
    duplicate it."""

    code = "NOT_ENOUGH_REPLICAS"


class PartitionDecommissionedError(PartitionError):
    """A write to a decommissioned partition: it takes no new records (reads go on
    until its data is deleted)."""

    code = "PARTITION_DECOMMISSIONED"


class LeaderNotReadyError(PartitionError):
    """A new leader has not yet applied an entry of its own term: its producer state may
    still lack batches of earlier terms, so it takes no idempotent batch yet (retriable)."""

    code = "LEADER_NOT_AVAILABLE"


class OutOfOrderSequenceError(PartitionError):
    code = "OUT_OF_ORDER_SEQUENCE"


class ProducerFencedError(PartitionError):
    code = "PRODUCER_FENCED"


class UnknownProducerIdError(PartitionError):
    code = "UNKNOWN_PRODUCER_ID"


class InvalidTxnStateError(PartitionError):
    """A batch that does not fit its producer's transaction here (an idempotent batch
    while a transaction is open)."""

    code = "INVALID_TXN_STATE"


class ConcurrentTransactionsError(PartitionError):
    """A transactional batch of a newer epoch while the older transaction's marker has
    not reached this partition yet: retriable."""

    code = "CONCURRENT_TRANSACTIONS"
