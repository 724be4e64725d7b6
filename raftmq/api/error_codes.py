"""The raftmq.v1 error contract as data: each ``ErrorCode`` (broker.proto) with the gRPC status
a broker answers it with, whether a client may retry it, and the name the ``raftmq-error``
trailer and ``ProduceError.code`` carry.

Why here, at the api floor: the broker needs the status to answer and the client needs
"retriable" to decide what to retry, and the client may import only api and format. One
table both read means the broker's answer and the client's retry policy cannot disagree.
Adding an ErrorCode without a line in :data:`RULES` (or without a comment in broker.proto
naming the same status) fails tests/broker/test_error_contract.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from raftmq.api.v1 import broker_pb2 as pb

ErrorCode = pb.ErrorCode
"""The generated enum type; its values are ``pb.ERROR_CODE_*`` (plain ints at run time)."""
PREFIX = "ERROR_CODE_"
"""Every ErrorCode name starts with it (proto3 style); the wire name is the rest."""


@dataclass(frozen=True, slots=True)
class Rule:
    status: grpc.StatusCode
    retriable: bool
    """Nothing of the request was done: the same request, sent again (where the answer
    points, or after refreshing Metadata, with a backoff) may succeed and cannot duplicate a
    write. False also for codes whose retry could store a write twice."""


_NF, _FP, _UA, _IA = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INVALID_ARGUMENT,
)
_UN = grpc.StatusCode.UNAUTHENTICATED
_PD = grpc.StatusCode.PERMISSION_DENIED
RULES: dict[pb.ErrorCode, Rule] = {
    pb.ERROR_CODE_UNKNOWN_TOPIC: Rule(_NF, retriable=False),
    pb.ERROR_CODE_UNKNOWN_PARTITION: Rule(_NF, retriable=False),
    pb.ERROR_CODE_NOT_HOSTED: Rule(_NF, retriable=True),
    pb.ERROR_CODE_NOT_LEADER: Rule(_FP, retriable=True),
    pb.ERROR_CODE_LEADER_NOT_AVAILABLE: Rule(_UA, retriable=True),
    pb.ERROR_CODE_SHUTTING_DOWN: Rule(_UA, retriable=True),
    pb.ERROR_CODE_REPLICA_FAILED: Rule(_UA, retriable=True),
    pb.ERROR_CODE_OUTCOME_UNKNOWN: Rule(_UA, retriable=False),
    pb.ERROR_CODE_INVALID_BATCH: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_TAGS: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_TAG_FILTER: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_RECORD_STATE: Rule(_FP, retriable=False),
    pb.ERROR_CODE_INVALID_ACKNOWLEDGE_TYPE: Rule(_IA, retriable=False),
    pb.ERROR_CODE_LOCK_RENEWAL_LIMIT: Rule(_FP, retriable=False),
    pb.ERROR_CODE_INCONSISTENT_GROUP_TYPE: Rule(_FP, retriable=False),
    pb.ERROR_CODE_INVALID_SHARE_SETTING: Rule(_IA, retriable=False),
    pb.ERROR_CODE_CORRUPT_BATCH: Rule(_IA, retriable=False),
    pb.ERROR_CODE_BATCH_TOO_LARGE: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_ARGUMENT: Rule(_IA, retriable=False),
    pb.ERROR_CODE_MALFORMED_REQUEST: Rule(_IA, retriable=False),
    pb.ERROR_CODE_DUPLICATE_REQUEST_ID: Rule(_IA, retriable=False),
    pb.ERROR_CODE_OFFSET_OUT_OF_RANGE: Rule(grpc.StatusCode.OUT_OF_RANGE, retriable=False),
    pb.ERROR_CODE_TIMEOUT: Rule(grpc.StatusCode.DEADLINE_EXCEEDED, retriable=False),
    pb.ERROR_CODE_CORRUPT_DATA: Rule(grpc.StatusCode.DATA_LOSS, retriable=True),
    pb.ERROR_CODE_INTERNAL: Rule(grpc.StatusCode.INTERNAL, retriable=False),
    # controller and admin service
    pb.ERROR_CODE_NOT_CONTROLLER: Rule(_UA, retriable=True),
    pb.ERROR_CODE_CONTROLLER_NOT_AVAILABLE: Rule(_UA, retriable=True),
    pb.ERROR_CODE_INVALID_TOPIC_NAME: Rule(_IA, retriable=False),
    pb.ERROR_CODE_TOPIC_ALREADY_EXISTS: Rule(grpc.StatusCode.ALREADY_EXISTS, retriable=False),
    pb.ERROR_CODE_INVALID_PARTITIONS: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_REPLICATION_FACTOR: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_CONFIG: Rule(_IA, retriable=False),
    pb.ERROR_CODE_NOT_ENOUGH_BROKERS: Rule(_FP, retriable=False),
    pb.ERROR_CODE_PARTITION_DECOMMISSIONED: Rule(_FP, retriable=False),
    pb.ERROR_CODE_INVALID_BROKER: Rule(_IA, retriable=False),
    pb.ERROR_CODE_UNKNOWN_BROKER: Rule(_NF, retriable=False),
    pb.ERROR_CODE_STALE_BROKER_INCARNATION: Rule(_FP, retriable=False),
    pb.ERROR_CODE_BROKER_NOT_AVAILABLE: Rule(_FP, retriable=False),
    pb.ERROR_CODE_STALE_LEADER_TERM: Rule(_FP, retriable=False),
    pb.ERROR_CODE_NOT_A_REPLICA: Rule(_FP, retriable=False),
    pb.ERROR_CODE_INVALID_REPLICA_CHANGE: Rule(_FP, retriable=False),
    pb.ERROR_CODE_INVALID_PRODUCER_ID_BLOCK: Rule(_IA, retriable=False),
    pb.ERROR_CODE_PRODUCER_IDS_EXHAUSTED: Rule(grpc.StatusCode.RESOURCE_EXHAUSTED, retriable=False),
    pb.ERROR_CODE_UNSUPPORTED_VERSION: Rule(_FP, retriable=False),
    pb.ERROR_CODE_NOT_ENOUGH_REPLICAS: Rule(_UA, retriable=True),
    # consumer groups
    pb.ERROR_CODE_INVALID_GROUP: Rule(_IA, retriable=False),
    pb.ERROR_CODE_UNKNOWN_GROUP: Rule(_NF, retriable=False),
    pb.ERROR_CODE_UNKNOWN_MEMBER: Rule(_FP, retriable=False),
    pb.ERROR_CODE_FENCED_MEMBER_EPOCH: Rule(_FP, retriable=False),
    pb.ERROR_CODE_GROUP_NOT_EMPTY: Rule(_FP, retriable=False),
    pb.ERROR_CODE_PARTITION_NOT_ASSIGNED: Rule(_FP, retriable=False),
    # idempotent producers
    pb.ERROR_CODE_OUT_OF_ORDER_SEQUENCE: Rule(_FP, retriable=False),
    pb.ERROR_CODE_PRODUCER_FENCED: Rule(_FP, retriable=False),
    pb.ERROR_CODE_UNKNOWN_PRODUCER_ID: Rule(_FP, retriable=False),
    # operator repairs
    pb.ERROR_CODE_UNSAFE_REBUILD: Rule(_FP, retriable=False),
    # transactions
    pb.ERROR_CODE_INVALID_TRANSACTIONAL_ID: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_TXN_TIMEOUT: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_TXN_STATE: Rule(_FP, retriable=False),
    pb.ERROR_CODE_CONCURRENT_TRANSACTIONS: Rule(_UA, retriable=True),
    pb.ERROR_CODE_TOO_MANY_TXN_PARTITIONS: Rule(_IA, retriable=False),
    pb.ERROR_CODE_TRANSACTION_ABORTED: Rule(_FP, retriable=False),
    pb.ERROR_CODE_UNKNOWN_TRANSACTIONAL_ID: Rule(_NF, retriable=False),
    # authentication
    pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED: Rule(_UN, retriable=False),
    pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM: Rule(_UN, retriable=False),
    pb.ERROR_CODE_ILLEGAL_SASL_STATE: Rule(_UN, retriable=False),
    pb.ERROR_CODE_SESSION_EXPIRED: Rule(_UN, retriable=True),
    pb.ERROR_CODE_UNACCEPTABLE_CREDENTIAL: Rule(_IA, retriable=False),
    pb.ERROR_CODE_RESOURCE_NOT_FOUND: Rule(_NF, retriable=False),
    # authorization (ACLs)
    pb.ERROR_CODE_TOPIC_AUTHORIZATION_FAILED: Rule(_PD, retriable=False),
    pb.ERROR_CODE_GROUP_AUTHORIZATION_FAILED: Rule(_PD, retriable=False),
    pb.ERROR_CODE_CLUSTER_AUTHORIZATION_FAILED: Rule(_PD, retriable=False),
    pb.ERROR_CODE_TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Rule(_PD, retriable=False),
    pb.ERROR_CODE_INVALID_ACL: Rule(_IA, retriable=False),
    pb.ERROR_CODE_TOO_MANY_ACLS: Rule(grpc.StatusCode.RESOURCE_EXHAUSTED, retriable=False),
    # client quotas
    pb.ERROR_CODE_INVALID_CLIENT_QUOTA: Rule(_IA, retriable=False),
    pb.ERROR_CODE_TOO_MANY_CLIENT_QUOTAS: Rule(grpc.StatusCode.RESOURCE_EXHAUSTED, retriable=False),
    pb.ERROR_CODE_DELAY_TOO_LONG: Rule(_IA, retriable=False),
    pb.ERROR_CODE_INVALID_DELAY: Rule(_IA, retriable=False),
}
"""Every code a broker sends -> its rule. UNSPECIFIED is never sent, so it has none."""


def name_of(code: pb.ErrorCode) -> str:
    """The wire name of ``code``: ``NOT_LEADER`` for ``ERROR_CODE_NOT_LEADER``."""
    return ErrorCode.Name(code).removeprefix(PREFIX)


def code_of(name: str) -> pb.ErrorCode:
    """The code a wire name stands for; UNSPECIFIED for one this version does not know (a
    newer broker's), so a client never fails on reading an answer."""
    try:
        return ErrorCode.Value(PREFIX + name)
    except ValueError:
        return pb.ERROR_CODE_UNSPECIFIED
