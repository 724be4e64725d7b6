"""What a partition refuses, with the symbolic code the API layer puts in ``raftmq-error``.

Each carries a sentence for a person; the API maps ``code`` to a gRPC status."""

from __future__ import annotations


class PartitionError(Exception):
    code = "INVALID_ARGUMENT"


class InvalidBatchError(PartitionError):
    code = "INVALID_BATCH"


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

    def __init__(self, topic: str, partition: int, leader: int, detail: str = "") -> None:
        who = f"broker {leader}" if leader else "not known yet (an election is under way)"
        super().__init__(
            f"this broker is not the leader of {topic}/{partition}; the leader is {who}"
            + (f" ({detail})" if detail else "")
        )
        self.leader = leader


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


class ReplicaFailedError(PartitionError):
    """This broker's replica of the partition is failed (quarantined) after an error in its
    own log or storage; the other partitions on the broker are unaffected. The client
    retries on another replica or later."""

    code = "REPLICA_FAILED"

    def __init__(self, topic: str, partition: int, reason: str) -> None:
        super().__init__(
            f"this broker's replica of {topic}/{partition} has failed ({reason}); "
            "use another replica or retry later"
        )
        self.topic = topic
        self.partition = partition
        self.reason = reason
