"""Why the metadata state machine refused a command: one symbolic code per kind of
mistake, in one place. A refusal is a result, not an exception: it travels back to the
proposer through the Raft log's apply result, and the api floor maps each code to its own
``ErrorCode`` (and gRPC status) when the admin service lands. Every refusal carries a
sentence a person can act on besides the code."""

from __future__ import annotations

from enum import StrEnum


class RefusalCode(StrEnum):
    # The command itself
    MALFORMED_COMMAND = "MALFORMED_COMMAND"  # not a command this version can read
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"  # a format version from a newer controller
    # Topics
    INVALID_TOPIC_NAME = "INVALID_TOPIC_NAME"
    TOPIC_ALREADY_EXISTS = "TOPIC_ALREADY_EXISTS"
    UNKNOWN_TOPIC = "UNKNOWN_TOPIC"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"  # a count out of bounds, or one that shrinks
    UNKNOWN_PARTITION = "UNKNOWN_PARTITION"
    PARTITION_DECOMMISSIONED = "PARTITION_DECOMMISSIONED"
    INVALID_REPLICATION_FACTOR = "INVALID_REPLICATION_FACTOR"
    NOT_ENOUGH_BROKERS = "NOT_ENOUGH_BROKERS"  # too few live, unfenced, non-draining brokers
    INVALID_CONFIG = "INVALID_CONFIG"
    # Brokers
    INVALID_BROKER = "INVALID_BROKER"  # a registration with bad fields
    UNKNOWN_BROKER = "UNKNOWN_BROKER"
    STALE_BROKER_INCARNATION = "STALE_BROKER_INCARNATION"  # from a process since replaced
    BROKER_NOT_AVAILABLE = "BROKER_NOT_AVAILABLE"  # fenced or draining: not a target
    # Replicas and leaders
    STALE_LEADER_TERM = "STALE_LEADER_TERM"
    NOT_A_REPLICA = "NOT_A_REPLICA"
    INVALID_REPLICA_CHANGE = "INVALID_REPLICA_CHANGE"  # would break a replica-set invariant
    # Consumer groups
    INVALID_GROUP = "INVALID_GROUP"  # a bad group or member id, assignor, or too many members
    UNKNOWN_GROUP = "UNKNOWN_GROUP"
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"  # removed (session timeout, left): join again
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"  # stale epoch: heartbeat (or rejoin) first
    GROUP_NOT_EMPTY = "GROUP_NOT_EMPTY"  # an admin change while members are active
    PARTITION_NOT_ASSIGNED = "PARTITION_NOT_ASSIGNED"  # a commit for someone else's partition
    # Share groups (raftmq.controller.share_groups)
    INCONSISTENT_GROUP_TYPE = "INCONSISTENT_GROUP_TYPE"  # the id names a group of the other kind
    INVALID_SHARE_SETTING = "INVALID_SHARE_SETTING"  # unknown or out of range
    # Producer ids
    INVALID_PRODUCER_ID_BLOCK = "INVALID_PRODUCER_ID_BLOCK"
    PRODUCER_IDS_EXHAUSTED = "PRODUCER_IDS_EXHAUSTED"
    # Transactions (raftmq.controller.transactions)
    INVALID_TRANSACTIONAL_ID = "INVALID_TRANSACTIONAL_ID"
    INVALID_TXN_TIMEOUT = "INVALID_TXN_TIMEOUT"
    INVALID_TXN_STATE = "INVALID_TXN_STATE"  # the call does not fit the transaction's state
    CONCURRENT_TRANSACTIONS = "CONCURRENT_TRANSACTIONS"  # the last one is still ending: retry
    TOO_MANY_TXN_PARTITIONS = "TOO_MANY_TXN_PARTITIONS"
    TRANSACTION_ABORTED = "TRANSACTION_ABORTED"  # the coordinator aborted it (timeout, operator)
    PRODUCER_FENCED = "PRODUCER_FENCED"  # an older epoch: another instance took the id
    UNKNOWN_TRANSACTIONAL_ID = "UNKNOWN_TRANSACTIONAL_ID"
    # SCRAM users (raftmq.controller.scram_users)
    UNACCEPTABLE_CREDENTIAL = "UNACCEPTABLE_CREDENTIAL"
    RESOURCE_NOT_FOUND = "RESOURCE_NOT_FOUND"  # no credentials for that user
    # ACLs (raftmq.controller.acls)
    INVALID_ACL = "INVALID_ACL"  # a bad principal, host, name, pattern or operation
    TOO_MANY_ACLS = "TOO_MANY_ACLS"  # the cluster holds its limit of bindings
    # Client quotas (raftmq.controller.quotas)
    INVALID_CLIENT_QUOTA = "INVALID_CLIENT_QUOTA"  # a bad entity, key or value
    TOO_MANY_CLIENT_QUOTAS = "TOO_MANY_CLIENT_QUOTAS"


class CommandRefused(Exception):
    """Raised inside a transition handler (transitions.py, groups.py) to refuse a command;
    ``apply_command`` turns it into a ``Refused`` result, the state left as it was."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
