from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AclResourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_RESOURCE_TYPE_UNSPECIFIED: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_TOPIC: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_GROUP: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_CLUSTER: _ClassVar[AclResourceType]
    ACL_RESOURCE_TYPE_TRANSACTIONAL_ID: _ClassVar[AclResourceType]

class AclPatternType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_PATTERN_TYPE_UNSPECIFIED: _ClassVar[AclPatternType]
    ACL_PATTERN_TYPE_LITERAL: _ClassVar[AclPatternType]
    ACL_PATTERN_TYPE_PREFIXED: _ClassVar[AclPatternType]

class AclOperation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_OPERATION_UNSPECIFIED: _ClassVar[AclOperation]
    ACL_OPERATION_READ: _ClassVar[AclOperation]
    ACL_OPERATION_WRITE: _ClassVar[AclOperation]
    ACL_OPERATION_CREATE: _ClassVar[AclOperation]
    ACL_OPERATION_DELETE: _ClassVar[AclOperation]
    ACL_OPERATION_ALTER: _ClassVar[AclOperation]
    ACL_OPERATION_DESCRIBE: _ClassVar[AclOperation]
    ACL_OPERATION_ALTER_CONFIGS: _ClassVar[AclOperation]
    ACL_OPERATION_DESCRIBE_CONFIGS: _ClassVar[AclOperation]
    ACL_OPERATION_CLUSTER_ACTION: _ClassVar[AclOperation]
    ACL_OPERATION_IDEMPOTENT_WRITE: _ClassVar[AclOperation]
    ACL_OPERATION_ALL: _ClassVar[AclOperation]

class AclPermission(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACL_PERMISSION_UNSPECIFIED: _ClassVar[AclPermission]
    ACL_PERMISSION_ALLOW: _ClassVar[AclPermission]
    ACL_PERMISSION_DENY: _ClassVar[AclPermission]

class BrokerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BROKER_STATE_UNSPECIFIED: _ClassVar[BrokerState]
    BROKER_STATE_ALIVE: _ClassVar[BrokerState]
    BROKER_STATE_FENCED: _ClassVar[BrokerState]
    BROKER_STATE_DRAINING: _ClassVar[BrokerState]

class PartitionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITION_STATE_UNSPECIFIED: _ClassVar[PartitionState]
    PARTITION_STATE_ACTIVE: _ClassVar[PartitionState]
    PARTITION_STATE_DECOMMISSIONED: _ClassVar[PartitionState]
ACL_RESOURCE_TYPE_UNSPECIFIED: AclResourceType
ACL_RESOURCE_TYPE_TOPIC: AclResourceType
ACL_RESOURCE_TYPE_GROUP: AclResourceType
ACL_RESOURCE_TYPE_CLUSTER: AclResourceType
ACL_RESOURCE_TYPE_TRANSACTIONAL_ID: AclResourceType
ACL_PATTERN_TYPE_UNSPECIFIED: AclPatternType
ACL_PATTERN_TYPE_LITERAL: AclPatternType
ACL_PATTERN_TYPE_PREFIXED: AclPatternType
ACL_OPERATION_UNSPECIFIED: AclOperation
ACL_OPERATION_READ: AclOperation
ACL_OPERATION_WRITE: AclOperation
ACL_OPERATION_CREATE: AclOperation
ACL_OPERATION_DELETE: AclOperation
ACL_OPERATION_ALTER: AclOperation
ACL_OPERATION_DESCRIBE: AclOperation
ACL_OPERATION_ALTER_CONFIGS: AclOperation
ACL_OPERATION_DESCRIBE_CONFIGS: AclOperation
ACL_OPERATION_CLUSTER_ACTION: AclOperation
ACL_OPERATION_IDEMPOTENT_WRITE: AclOperation
ACL_OPERATION_ALL: AclOperation
ACL_PERMISSION_UNSPECIFIED: AclPermission
ACL_PERMISSION_ALLOW: AclPermission
ACL_PERMISSION_DENY: AclPermission
BROKER_STATE_UNSPECIFIED: BrokerState
BROKER_STATE_ALIVE: BrokerState
BROKER_STATE_FENCED: BrokerState
BROKER_STATE_DRAINING: BrokerState
PARTITION_STATE_UNSPECIFIED: PartitionState
PARTITION_STATE_ACTIVE: PartitionState
PARTITION_STATE_DECOMMISSIONED: PartitionState

class ScramCredentialUpsertion(_message.Message):
    __slots__ = ("name", "mechanism", "iterations", "salt", "stored_key", "server_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    STORED_KEY_FIELD_NUMBER: _ClassVar[int]
    SERVER_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    mechanism: str
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes
    def __init__(self, name: _Optional[str] = ..., mechanism: _Optional[str] = ..., iterations: _Optional[int] = ..., salt: _Optional[bytes] = ..., stored_key: _Optional[bytes] = ..., server_key: _Optional[bytes] = ...) -> None: ...

class ScramCredentialDeletion(_message.Message):
    __slots__ = ("name", "mechanism")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    name: str
    mechanism: str
    def __init__(self, name: _Optional[str] = ..., mechanism: _Optional[str] = ...) -> None: ...

class AlterUserScramCredentialsRequest(_message.Message):
    __slots__ = ("upsertions", "deletions")
    UPSERTIONS_FIELD_NUMBER: _ClassVar[int]
    DELETIONS_FIELD_NUMBER: _ClassVar[int]
    upsertions: _containers.RepeatedCompositeFieldContainer[ScramCredentialUpsertion]
    deletions: _containers.RepeatedCompositeFieldContainer[ScramCredentialDeletion]
    def __init__(self, upsertions: _Optional[_Iterable[_Union[ScramCredentialUpsertion, _Mapping]]] = ..., deletions: _Optional[_Iterable[_Union[ScramCredentialDeletion, _Mapping]]] = ...) -> None: ...

class DescribeUserScramCredentialsRequest(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, users: _Optional[_Iterable[str]] = ...) -> None: ...

class ScramCredentialInfo(_message.Message):
    __slots__ = ("mechanism", "iterations")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    iterations: int
    def __init__(self, mechanism: _Optional[str] = ..., iterations: _Optional[int] = ...) -> None: ...

class UserScramCredentials(_message.Message):
    __slots__ = ("name", "credentials")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    name: str
    credentials: _containers.RepeatedCompositeFieldContainer[ScramCredentialInfo]
    def __init__(self, name: _Optional[str] = ..., credentials: _Optional[_Iterable[_Union[ScramCredentialInfo, _Mapping]]] = ...) -> None: ...

class DescribeUserScramCredentialsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[UserScramCredentials]
    def __init__(self, results: _Optional[_Iterable[_Union[UserScramCredentials, _Mapping]]] = ...) -> None: ...

class AclBinding(_message.Message):
    __slots__ = ("principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    principal: str
    host: str
    resource_type: AclResourceType
    resource_name: str
    pattern_type: AclPatternType
    operation: AclOperation
    permission: AclPermission
    def __init__(self, principal: _Optional[str] = ..., host: _Optional[str] = ..., resource_type: _Optional[_Union[AclResourceType, str]] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[_Union[AclPatternType, str]] = ..., operation: _Optional[_Union[AclOperation, str]] = ..., permission: _Optional[_Union[AclPermission, str]] = ...) -> None: ...

class AclFilter(_message.Message):
    __slots__ = ("principal", "host", "resource_type", "resource_name", "pattern_type", "operation", "permission")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    principal: str
    host: str
    resource_type: AclResourceType
    resource_name: str
    pattern_type: AclPatternType
    operation: AclOperation
    permission: AclPermission
    def __init__(self, principal: _Optional[str] = ..., host: _Optional[str] = ..., resource_type: _Optional[_Union[AclResourceType, str]] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[_Union[AclPatternType, str]] = ..., operation: _Optional[_Union[AclOperation, str]] = ..., permission: _Optional[_Union[AclPermission, str]] = ...) -> None: ...

class CreateAclsRequest(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DescribeAclsRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: AclFilter
    def __init__(self, filter: _Optional[_Union[AclFilter, _Mapping]] = ...) -> None: ...

class DescribeAclsResponse(_message.Message):
    __slots__ = ("acls", "metadata_version")
    ACLS_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    metadata_version: int
    def __init__(self, acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class DeleteAclsRequest(_message.Message):
    __slots__ = ("filters",)
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[AclFilter]
    def __init__(self, filters: _Optional[_Iterable[_Union[AclFilter, _Mapping]]] = ...) -> None: ...

class DeleteAclsResponse(_message.Message):
    __slots__ = ("deleted", "metadata_version")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedCompositeFieldContainer[AclBinding]
    metadata_version: int
    def __init__(self, deleted: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class MoveReplicaRequest(_message.Message):
    __slots__ = ("topic", "partition", "from_broker", "to_broker")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FROM_BROKER_FIELD_NUMBER: _ClassVar[int]
    TO_BROKER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    from_broker: int
    to_broker: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., from_broker: _Optional[int] = ..., to_broker: _Optional[int] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "partitions", "replication_factor", "config", "assignment")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    replication_factor: int
    config: _containers.ScalarMap[str, str]
    assignment: _containers.RepeatedCompositeFieldContainer[ReplicaList]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., config: _Optional[_Mapping[str, str]] = ..., assignment: _Optional[_Iterable[_Union[ReplicaList, _Mapping]]] = ...) -> None: ...

class ReplicaList(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, brokers: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("topic", "metadata_version")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    topic: TopicDescription
    metadata_version: int
    def __init__(self, topic: _Optional[_Union[TopicDescription, _Mapping]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ChangeResponse(_message.Message):
    __slots__ = ("metadata_version",)
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    metadata_version: int
    def __init__(self, metadata_version: _Optional[int] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics", "metadata_version")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicDescription]
    metadata_version: int
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicDescription, _Mapping]]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class AlterTopicConfigRequest(_message.Message):
    __slots__ = ("name", "set", "reset")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    name: str
    set: _containers.ScalarMap[str, str]
    reset: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., reset: _Optional[_Iterable[str]] = ...) -> None: ...

class AddPartitionsRequest(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class AddPartitionsResponse(_message.Message):
    __slots__ = ("topic", "metadata_version")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    topic: TopicDescription
    metadata_version: int
    def __init__(self, topic: _Optional[_Union[TopicDescription, _Mapping]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class DecommissionPartitionsRequest(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("cluster", "brokers", "controller_voters", "controller_leader_id", "controller_id", "metadata_version")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_VOTERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerDescription]
    controller_voters: _containers.RepeatedScalarFieldContainer[int]
    controller_leader_id: int
    controller_id: int
    metadata_version: int
    def __init__(self, cluster: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerDescription, _Mapping]]] = ..., controller_voters: _Optional[_Iterable[int]] = ..., controller_leader_id: _Optional[int] = ..., controller_id: _Optional[int] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class BrokerDescription(_message.Message):
    __slots__ = ("id", "host", "port", "raft_host", "raft_port", "rack", "state", "incarnation", "epoch")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAFT_HOST_FIELD_NUMBER: _ClassVar[int]
    RAFT_PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    id: int
    host: str
    port: int
    raft_host: str
    raft_port: int
    rack: str
    state: BrokerState
    incarnation: int
    epoch: int
    def __init__(self, id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., raft_host: _Optional[str] = ..., raft_port: _Optional[int] = ..., rack: _Optional[str] = ..., state: _Optional[_Union[BrokerState, str]] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class PartitionDescription(_message.Message):
    __slots__ = ("partition", "replicas", "learners", "leader_id", "leader_term", "state", "delete_after_ms", "live", "live_unknown_reason", "high_watermark", "log_start_offset", "replica_states")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_TERM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DELETE_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    LIVE_UNKNOWN_REASON_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICA_STATES_FIELD_NUMBER: _ClassVar[int]
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    learners: _containers.RepeatedScalarFieldContainer[int]
    leader_id: int
    leader_term: int
    state: PartitionState
    delete_after_ms: int
    live: bool
    live_unknown_reason: str
    high_watermark: int
    log_start_offset: int
    replica_states: _containers.RepeatedCompositeFieldContainer[ReplicaLiveState]
    def __init__(self, partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., learners: _Optional[_Iterable[int]] = ..., leader_id: _Optional[int] = ..., leader_term: _Optional[int] = ..., state: _Optional[_Union[PartitionState, str]] = ..., delete_after_ms: _Optional[int] = ..., live: _Optional[bool] = ..., live_unknown_reason: _Optional[str] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., replica_states: _Optional[_Iterable[_Union[ReplicaLiveState, _Mapping]]] = ...) -> None: ...

class ReplicaLiveState(_message.Message):
    __slots__ = ("broker_id", "state", "reason")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    state: str
    reason: str
    def __init__(self, broker_id: _Optional[int] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TopicDescription(_message.Message):
    __slots__ = ("name", "topic_id", "replication_factor", "partitions", "config", "effective_config")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EffectiveConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: int
    replication_factor: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionDescription]
    config: _containers.ScalarMap[str, str]
    effective_config: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[int] = ..., replication_factor: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionDescription, _Mapping]]] = ..., config: _Optional[_Mapping[str, str]] = ..., effective_config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PartitionRef(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class MoveDescription(_message.Message):
    __slots__ = ("topic", "partition", "learner", "replacing")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    REPLACING_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    learner: int
    replacing: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., learner: _Optional[int] = ..., replacing: _Optional[int] = ...) -> None: ...

class BrokerLoad(_message.Message):
    __slots__ = ("broker_id", "replicas", "preferred_leaders")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_LEADERS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    replicas: int
    preferred_leaders: int
    def __init__(self, broker_id: _Optional[int] = ..., replicas: _Optional[int] = ..., preferred_leaders: _Optional[int] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("cluster", "under_replicated", "leaderless", "moves", "loads", "rebalance_requested", "stuck")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    LEADERLESS_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    cluster: DescribeClusterResponse
    under_replicated: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    leaderless: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    moves: _containers.RepeatedCompositeFieldContainer[MoveDescription]
    loads: _containers.RepeatedCompositeFieldContainer[BrokerLoad]
    rebalance_requested: bool
    stuck: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[_Union[DescribeClusterResponse, _Mapping]] = ..., under_replicated: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ..., leaderless: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ..., moves: _Optional[_Iterable[_Union[MoveDescription, _Mapping]]] = ..., loads: _Optional[_Iterable[_Union[BrokerLoad, _Mapping]]] = ..., rebalance_requested: _Optional[bool] = ..., stuck: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainBrokerRequest(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    def __init__(self, broker_id: _Optional[int] = ...) -> None: ...

class RebalanceClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PlannedMove(_message.Message):
    __slots__ = ("topic", "partition", "learner", "replacing", "reason")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    REPLACING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    learner: int
    replacing: int
    reason: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., learner: _Optional[int] = ..., replacing: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PreferredLeaderChange(_message.Message):
    __slots__ = ("topic", "partition", "replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class RebalanceClusterResponse(_message.Message):
    __slots__ = ("moves", "leader_changes", "metadata_version")
    MOVES_FIELD_NUMBER: _ClassVar[int]
    LEADER_CHANGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    moves: _containers.RepeatedCompositeFieldContainer[PlannedMove]
    leader_changes: _containers.RepeatedCompositeFieldContainer[PreferredLeaderChange]
    metadata_version: int
    def __init__(self, moves: _Optional[_Iterable[_Union[PlannedMove, _Mapping]]] = ..., leader_changes: _Optional[_Iterable[_Union[PreferredLeaderChange, _Mapping]]] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class ClientQuotaEntity(_message.Message):
    __slots__ = ("user", "client_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    user: str
    client_id: str
    def __init__(self, user: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class ClientQuotaAlteration(_message.Message):
    __slots__ = ("entity", "set", "remove")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    entity: ClientQuotaEntity
    set: _containers.ScalarMap[str, int]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entity: _Optional[_Union[ClientQuotaEntity, _Mapping]] = ..., set: _Optional[_Mapping[str, int]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class AlterClientQuotasRequest(_message.Message):
    __slots__ = ("alterations",)
    ALTERATIONS_FIELD_NUMBER: _ClassVar[int]
    alterations: _containers.RepeatedCompositeFieldContainer[ClientQuotaAlteration]
    def __init__(self, alterations: _Optional[_Iterable[_Union[ClientQuotaAlteration, _Mapping]]] = ...) -> None: ...

class DescribeClientQuotasRequest(_message.Message):
    __slots__ = ("user", "client_id")
    USER_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    user: str
    client_id: str
    def __init__(self, user: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class ClientQuota(_message.Message):
    __slots__ = ("entity", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    entity: ClientQuotaEntity
    values: _containers.ScalarMap[str, int]
    def __init__(self, entity: _Optional[_Union[ClientQuotaEntity, _Mapping]] = ..., values: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DescribeClientQuotasResponse(_message.Message):
    __slots__ = ("quotas", "metadata_version")
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[ClientQuota]
    metadata_version: int
    def __init__(self, quotas: _Optional[_Iterable[_Union[ClientQuota, _Mapping]]] = ..., metadata_version: _Optional[int] = ...) -> None: ...
