from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_TOPIC: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_PARTITION: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_HOSTED: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_LEADER: _ClassVar[ErrorCode]
    ERROR_CODE_LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_SHUTTING_DOWN: _ClassVar[ErrorCode]
    ERROR_CODE_REPLICA_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_OUTCOME_UNKNOWN: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_BATCH: _ClassVar[ErrorCode]
    ERROR_CODE_CORRUPT_BATCH: _ClassVar[ErrorCode]
    ERROR_CODE_BATCH_TOO_LARGE: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_MALFORMED_REQUEST: _ClassVar[ErrorCode]
    ERROR_CODE_DUPLICATE_REQUEST_ID: _ClassVar[ErrorCode]
    ERROR_CODE_OFFSET_OUT_OF_RANGE: _ClassVar[ErrorCode]
    ERROR_CODE_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_CORRUPT_DATA: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_CONTROLLER: _ClassVar[ErrorCode]
    ERROR_CODE_CONTROLLER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TOPIC_NAME: _ClassVar[ErrorCode]
    ERROR_CODE_TOPIC_ALREADY_EXISTS: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_PARTITIONS: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_REPLICATION_FACTOR: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_CONFIG: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_ENOUGH_BROKERS: _ClassVar[ErrorCode]
    ERROR_CODE_PARTITION_DECOMMISSIONED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_BROKER: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_BROKER: _ClassVar[ErrorCode]
    ERROR_CODE_STALE_BROKER_INCARNATION: _ClassVar[ErrorCode]
    ERROR_CODE_BROKER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ERROR_CODE_STALE_LEADER_TERM: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_A_REPLICA: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_REPLICA_CHANGE: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_PRODUCER_ID_BLOCK: _ClassVar[ErrorCode]
    ERROR_CODE_PRODUCER_IDS_EXHAUSTED: _ClassVar[ErrorCode]
    ERROR_CODE_UNSUPPORTED_VERSION: _ClassVar[ErrorCode]
    ERROR_CODE_NOT_ENOUGH_REPLICAS: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_GROUP: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_GROUP: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_MEMBER: _ClassVar[ErrorCode]
    ERROR_CODE_FENCED_MEMBER_EPOCH: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_NOT_EMPTY: _ClassVar[ErrorCode]
    ERROR_CODE_PARTITION_NOT_ASSIGNED: _ClassVar[ErrorCode]
    ERROR_CODE_OUT_OF_ORDER_SEQUENCE: _ClassVar[ErrorCode]
    ERROR_CODE_PRODUCER_FENCED: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_PRODUCER_ID: _ClassVar[ErrorCode]
    ERROR_CODE_UNSAFE_REBUILD: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TRANSACTIONAL_ID: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TXN_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TXN_STATE: _ClassVar[ErrorCode]
    ERROR_CODE_CONCURRENT_TRANSACTIONS: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_TXN_PARTITIONS: _ClassVar[ErrorCode]
    ERROR_CODE_TRANSACTION_ABORTED: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_TRANSACTIONAL_ID: _ClassVar[ErrorCode]
    ERROR_CODE_SASL_AUTHENTICATION_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_UNSUPPORTED_SASL_MECHANISM: _ClassVar[ErrorCode]
    ERROR_CODE_ILLEGAL_SASL_STATE: _ClassVar[ErrorCode]
    ERROR_CODE_SESSION_EXPIRED: _ClassVar[ErrorCode]
    ERROR_CODE_UNACCEPTABLE_CREDENTIAL: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_NOT_FOUND: _ClassVar[ErrorCode]
    ERROR_CODE_TOPIC_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_GROUP_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_CLUSTER_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_TRANSACTIONAL_ID_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ACL: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_ACLS: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_CLIENT_QUOTA: _ClassVar[ErrorCode]
    ERROR_CODE_TOO_MANY_CLIENT_QUOTAS: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TAGS: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_TAG_FILTER: _ClassVar[ErrorCode]
    ERROR_CODE_DELAY_TOO_LONG: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_DELAY: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_RECORD_STATE: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ACKNOWLEDGE_TYPE: _ClassVar[ErrorCode]
    ERROR_CODE_LOCK_RENEWAL_LIMIT: _ClassVar[ErrorCode]
    ERROR_CODE_INCONSISTENT_GROUP_TYPE: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_SHARE_SETTING: _ClassVar[ErrorCode]

class Acks(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACKS_ALL: _ClassVar[Acks]
    ACKS_LEADER: _ClassVar[Acks]
    ACKS_NONE: _ClassVar[Acks]

class IsolationLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_UNCOMMITTED: _ClassVar[IsolationLevel]
    READ_COMMITTED: _ClassVar[IsolationLevel]

class OffsetPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EARLIEST: _ClassVar[OffsetPosition]
    LATEST: _ClassVar[OffsetPosition]

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_OK: _ClassVar[ReplicaState]
    REPLICA_CATCHING_UP: _ClassVar[ReplicaState]
    REPLICA_FAILED: _ClassVar[ReplicaState]
    REPLICA_OPENING: _ClassVar[ReplicaState]
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_UNKNOWN_TOPIC: ErrorCode
ERROR_CODE_UNKNOWN_PARTITION: ErrorCode
ERROR_CODE_NOT_HOSTED: ErrorCode
ERROR_CODE_NOT_LEADER: ErrorCode
ERROR_CODE_LEADER_NOT_AVAILABLE: ErrorCode
ERROR_CODE_SHUTTING_DOWN: ErrorCode
ERROR_CODE_REPLICA_FAILED: ErrorCode
ERROR_CODE_OUTCOME_UNKNOWN: ErrorCode
ERROR_CODE_INVALID_BATCH: ErrorCode
ERROR_CODE_CORRUPT_BATCH: ErrorCode
ERROR_CODE_BATCH_TOO_LARGE: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_MALFORMED_REQUEST: ErrorCode
ERROR_CODE_DUPLICATE_REQUEST_ID: ErrorCode
ERROR_CODE_OFFSET_OUT_OF_RANGE: ErrorCode
ERROR_CODE_TIMEOUT: ErrorCode
ERROR_CODE_CORRUPT_DATA: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_NOT_CONTROLLER: ErrorCode
ERROR_CODE_CONTROLLER_NOT_AVAILABLE: ErrorCode
ERROR_CODE_INVALID_TOPIC_NAME: ErrorCode
ERROR_CODE_TOPIC_ALREADY_EXISTS: ErrorCode
ERROR_CODE_INVALID_PARTITIONS: ErrorCode
ERROR_CODE_INVALID_REPLICATION_FACTOR: ErrorCode
ERROR_CODE_INVALID_CONFIG: ErrorCode
ERROR_CODE_NOT_ENOUGH_BROKERS: ErrorCode
ERROR_CODE_PARTITION_DECOMMISSIONED: ErrorCode
ERROR_CODE_INVALID_BROKER: ErrorCode
ERROR_CODE_UNKNOWN_BROKER: ErrorCode
ERROR_CODE_STALE_BROKER_INCARNATION: ErrorCode
ERROR_CODE_BROKER_NOT_AVAILABLE: ErrorCode
ERROR_CODE_STALE_LEADER_TERM: ErrorCode
ERROR_CODE_NOT_A_REPLICA: ErrorCode
ERROR_CODE_INVALID_REPLICA_CHANGE: ErrorCode
ERROR_CODE_INVALID_PRODUCER_ID_BLOCK: ErrorCode
ERROR_CODE_PRODUCER_IDS_EXHAUSTED: ErrorCode
ERROR_CODE_UNSUPPORTED_VERSION: ErrorCode
ERROR_CODE_NOT_ENOUGH_REPLICAS: ErrorCode
ERROR_CODE_INVALID_GROUP: ErrorCode
ERROR_CODE_UNKNOWN_GROUP: ErrorCode
ERROR_CODE_UNKNOWN_MEMBER: ErrorCode
ERROR_CODE_FENCED_MEMBER_EPOCH: ErrorCode
ERROR_CODE_GROUP_NOT_EMPTY: ErrorCode
ERROR_CODE_PARTITION_NOT_ASSIGNED: ErrorCode
ERROR_CODE_OUT_OF_ORDER_SEQUENCE: ErrorCode
ERROR_CODE_PRODUCER_FENCED: ErrorCode
ERROR_CODE_UNKNOWN_PRODUCER_ID: ErrorCode
ERROR_CODE_UNSAFE_REBUILD: ErrorCode
ERROR_CODE_INVALID_TRANSACTIONAL_ID: ErrorCode
ERROR_CODE_INVALID_TXN_TIMEOUT: ErrorCode
ERROR_CODE_INVALID_TXN_STATE: ErrorCode
ERROR_CODE_CONCURRENT_TRANSACTIONS: ErrorCode
ERROR_CODE_TOO_MANY_TXN_PARTITIONS: ErrorCode
ERROR_CODE_TRANSACTION_ABORTED: ErrorCode
ERROR_CODE_UNKNOWN_TRANSACTIONAL_ID: ErrorCode
ERROR_CODE_SASL_AUTHENTICATION_FAILED: ErrorCode
ERROR_CODE_UNSUPPORTED_SASL_MECHANISM: ErrorCode
ERROR_CODE_ILLEGAL_SASL_STATE: ErrorCode
ERROR_CODE_SESSION_EXPIRED: ErrorCode
ERROR_CODE_UNACCEPTABLE_CREDENTIAL: ErrorCode
ERROR_CODE_RESOURCE_NOT_FOUND: ErrorCode
ERROR_CODE_TOPIC_AUTHORIZATION_FAILED: ErrorCode
ERROR_CODE_GROUP_AUTHORIZATION_FAILED: ErrorCode
ERROR_CODE_CLUSTER_AUTHORIZATION_FAILED: ErrorCode
ERROR_CODE_TRANSACTIONAL_ID_AUTHORIZATION_FAILED: ErrorCode
ERROR_CODE_INVALID_ACL: ErrorCode
ERROR_CODE_TOO_MANY_ACLS: ErrorCode
ERROR_CODE_INVALID_CLIENT_QUOTA: ErrorCode
ERROR_CODE_TOO_MANY_CLIENT_QUOTAS: ErrorCode
ERROR_CODE_INVALID_TAGS: ErrorCode
ERROR_CODE_INVALID_TAG_FILTER: ErrorCode
ERROR_CODE_DELAY_TOO_LONG: ErrorCode
ERROR_CODE_INVALID_DELAY: ErrorCode
ERROR_CODE_INVALID_RECORD_STATE: ErrorCode
ERROR_CODE_INVALID_ACKNOWLEDGE_TYPE: ErrorCode
ERROR_CODE_LOCK_RENEWAL_LIMIT: ErrorCode
ERROR_CODE_INCONSISTENT_GROUP_TYPE: ErrorCode
ERROR_CODE_INVALID_SHARE_SETTING: ErrorCode
ACKS_ALL: Acks
ACKS_LEADER: Acks
ACKS_NONE: Acks
READ_UNCOMMITTED: IsolationLevel
READ_COMMITTED: IsolationLevel
EARLIEST: OffsetPosition
LATEST: OffsetPosition
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_OK: ReplicaState
REPLICA_CATCHING_UP: ReplicaState
REPLICA_FAILED: ReplicaState
REPLICA_OPENING: ReplicaState

class DescribeDelayedRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DelayedLevel(_message.Message):
    __slots__ = ("level", "pending", "next_due_ms", "complete")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    NEXT_DUE_MS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    level: int
    pending: int
    next_due_ms: int
    complete: bool
    def __init__(self, level: _Optional[int] = ..., pending: _Optional[int] = ..., next_due_ms: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...

class DescribeDelayedResponse(_message.Message):
    __slots__ = ("levels",)
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    levels: _containers.RepeatedCompositeFieldContainer[DelayedLevel]
    def __init__(self, levels: _Optional[_Iterable[_Union[DelayedLevel, _Mapping]]] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("topic", "partition", "entries", "acks", "timeout_ms", "request_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    entries: bytes
    acks: Acks
    timeout_ms: int
    request_id: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., entries: _Optional[bytes] = ..., acks: _Optional[_Union[Acks, str]] = ..., timeout_ms: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class ProduceStreamRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ProduceRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ProduceRequest, _Mapping]]] = ...) -> None: ...

class ProduceStreamResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[ProduceResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[ProduceResponse, _Mapping]]] = ...) -> None: ...

class ProduceError(_message.Message):
    __slots__ = ("code", "message", "leader_id", "leader_address")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    leader_id: int
    leader_address: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., leader_id: _Optional[int] = ..., leader_address: _Optional[str] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("base_offset", "last_offset", "high_watermark", "log_start_offset", "request_id", "error", "throttle_time_ms")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    last_offset: int
    high_watermark: int
    log_start_offset: int
    request_id: int
    error: ProduceError
    throttle_time_ms: int
    def __init__(self, base_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., request_id: _Optional[int] = ..., error: _Optional[_Union[ProduceError, _Mapping]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("topic", "partition", "offset", "max_bytes", "max_wait_ms", "min_bytes", "replica_read", "isolation_level", "tag_filter")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_READ_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TAG_FILTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int
    min_bytes: int
    replica_read: bool
    isolation_level: IsolationLevel
    tag_filter: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., replica_read: _Optional[bool] = ..., isolation_level: _Optional[_Union[IsolationLevel, str]] = ..., tag_filter: _Optional[str] = ...) -> None: ...

class AbortedTransaction(_message.Message):
    __slots__ = ("producer_id", "first_offset", "last_offset")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    first_offset: int
    last_offset: int
    def __init__(self, producer_id: _Optional[int] = ..., first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("entries", "next_offset", "high_watermark", "log_start_offset", "broker_id", "last_stable_offset", "aborted_transactions", "throttle_time_ms")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    entries: bytes
    next_offset: int
    high_watermark: int
    log_start_offset: int
    broker_id: int
    last_stable_offset: int
    aborted_transactions: _containers.RepeatedCompositeFieldContainer[AbortedTransaction]
    throttle_time_ms: int
    def __init__(self, entries: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., broker_id: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., aborted_transactions: _Optional[_Iterable[_Union[AbortedTransaction, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("topic", "partition", "position", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    position: OffsetPosition
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., position: _Optional[_Union[OffsetPosition, str]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("offset", "log_start_offset", "high_watermark", "last_stable_offset", "throttle_time_ms")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    throttle_time_ms: int
    def __init__(self, offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("topics", "allow_auto_create", "routing_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_AUTO_CREATE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    allow_auto_create: bool
    routing_only: bool
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., allow_auto_create: _Optional[bool] = ..., routing_only: _Optional[bool] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("id", "host", "port", "rack")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    id: int
    host: str
    port: int
    rack: str
    def __init__(self, id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("partition", "leader_id", "replicas", "leader_term", "high_watermark", "replica_status", "log_start_offset", "in_sync_replicas")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEADER_TERM_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    REPLICA_STATUS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    leader_id: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    leader_term: int
    high_watermark: int
    replica_status: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    log_start_offset: int
    in_sync_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., leader_id: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., leader_term: _Optional[int] = ..., high_watermark: _Optional[int] = ..., replica_status: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., log_start_offset: _Optional[int] = ..., in_sync_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("broker_id", "state", "reason")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    state: ReplicaState
    reason: str
    def __init__(self, broker_id: _Optional[int] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("cluster", "brokers", "topics", "broker_id", "metadata_version", "throttle_time_ms")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    broker_id: int
    metadata_version: int
    throttle_time_ms: int
    def __init__(self, cluster: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ..., broker_id: _Optional[int] = ..., metadata_version: _Optional[int] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class InitProducerIdRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RebuildReplicaRequest(_message.Message):
    __slots__ = ("topic", "partition", "force")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    force: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class RebuildReplicaResponse(_message.Message):
    __slots__ = ("status", "deleted_bytes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DELETED_BYTES_FIELD_NUMBER: _ClassVar[int]
    status: ReplicaStatus
    deleted_bytes: int
    def __init__(self, status: _Optional[_Union[ReplicaStatus, _Mapping]] = ..., deleted_bytes: _Optional[int] = ...) -> None: ...

class InitProducerIdResponse(_message.Message):
    __slots__ = ("producer_id", "producer_epoch", "throttle_time_ms")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    producer_id: int
    producer_epoch: int
    throttle_time_ms: int
    def __init__(self, producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class TxnMarker(_message.Message):
    __slots__ = ("topic", "partition", "producer_id", "producer_epoch", "commit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ..., commit: _Optional[bool] = ...) -> None: ...

class WriteTxnMarkersRequest(_message.Message):
    __slots__ = ("markers", "timeout_ms")
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    markers: _containers.RepeatedCompositeFieldContainer[TxnMarker]
    timeout_ms: int
    def __init__(self, markers: _Optional[_Iterable[_Union[TxnMarker, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class TxnMarkerResult(_message.Message):
    __slots__ = ("index", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    error: ProduceError
    def __init__(self, index: _Optional[int] = ..., error: _Optional[_Union[ProduceError, _Mapping]] = ...) -> None: ...

class WriteTxnMarkersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TxnMarkerResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TxnMarkerResult, _Mapping]]] = ...) -> None: ...
