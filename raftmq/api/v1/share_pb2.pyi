from raftmq.api.v1 import broker_pb2 as _broker_pb2
from raftmq.api.v1 import groups_pb2 as _groups_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AcknowledgeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACKNOWLEDGE_TYPE_UNSPECIFIED: _ClassVar[AcknowledgeType]
    ACKNOWLEDGE_TYPE_ACCEPT: _ClassVar[AcknowledgeType]
    ACKNOWLEDGE_TYPE_RELEASE: _ClassVar[AcknowledgeType]
    ACKNOWLEDGE_TYPE_REJECT: _ClassVar[AcknowledgeType]
    ACKNOWLEDGE_TYPE_RENEW: _ClassVar[AcknowledgeType]
ACKNOWLEDGE_TYPE_UNSPECIFIED: AcknowledgeType
ACKNOWLEDGE_TYPE_ACCEPT: AcknowledgeType
ACKNOWLEDGE_TYPE_RELEASE: AcknowledgeType
ACKNOWLEDGE_TYPE_REJECT: AcknowledgeType
ACKNOWLEDGE_TYPE_RENEW: AcknowledgeType

class ShareGroupHeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "subscriptions", "session_timeout_ms")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    session_timeout_ms: int
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., subscriptions: _Optional[_Iterable[str]] = ..., session_timeout_ms: _Optional[int] = ...) -> None: ...

class ShareGroupHeartbeatResponse(_message.Message):
    __slots__ = ("member_id", "member_epoch", "group_epoch", "assigned", "heartbeat_interval_ms", "metadata_version")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    member_epoch: int
    group_epoch: int
    assigned: _containers.RepeatedCompositeFieldContainer[_groups_pb2.GroupTopicPartitions]
    heartbeat_interval_ms: int
    metadata_version: int
    def __init__(self, member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., group_epoch: _Optional[int] = ..., assigned: _Optional[_Iterable[_Union[_groups_pb2.GroupTopicPartitions, _Mapping]]] = ..., heartbeat_interval_ms: _Optional[int] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class ListShareGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShareGroupSummary(_message.Message):
    __slots__ = ("group_id", "member_count", "group_epoch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_count: int
    group_epoch: int
    def __init__(self, group_id: _Optional[str] = ..., member_count: _Optional[int] = ..., group_epoch: _Optional[int] = ...) -> None: ...

class ListShareGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ShareGroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[ShareGroupSummary, _Mapping]]] = ...) -> None: ...

class DescribeShareGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class ShareMemberDescription(_message.Message):
    __slots__ = ("member_id", "member_epoch", "subscriptions", "assigned", "joined_ms", "last_heartbeat_age_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    JOINED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    member_epoch: int
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    assigned: _containers.RepeatedCompositeFieldContainer[_groups_pb2.GroupTopicPartitions]
    joined_ms: int
    last_heartbeat_age_ms: int
    def __init__(self, member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., subscriptions: _Optional[_Iterable[str]] = ..., assigned: _Optional[_Iterable[_Union[_groups_pb2.GroupTopicPartitions, _Mapping]]] = ..., joined_ms: _Optional[int] = ..., last_heartbeat_age_ms: _Optional[int] = ...) -> None: ...

class ShareGroupSetting(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ShareGroupDescription(_message.Message):
    __slots__ = ("group_id", "group_epoch", "members", "settings", "topics", "created_version")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    CREATED_VERSION_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    group_epoch: int
    members: _containers.RepeatedCompositeFieldContainer[ShareMemberDescription]
    settings: _containers.RepeatedCompositeFieldContainer[ShareGroupSetting]
    topics: _containers.RepeatedScalarFieldContainer[str]
    created_version: int
    def __init__(self, group_id: _Optional[str] = ..., group_epoch: _Optional[int] = ..., members: _Optional[_Iterable[_Union[ShareMemberDescription, _Mapping]]] = ..., settings: _Optional[_Iterable[_Union[ShareGroupSetting, _Mapping]]] = ..., topics: _Optional[_Iterable[str]] = ..., created_version: _Optional[int] = ...) -> None: ...

class AlterShareGroupConfigRequest(_message.Message):
    __slots__ = ("group_id", "settings")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    settings: _containers.RepeatedCompositeFieldContainer[ShareGroupSetting]
    def __init__(self, group_id: _Optional[str] = ..., settings: _Optional[_Iterable[_Union[ShareGroupSetting, _Mapping]]] = ...) -> None: ...

class AcknowledgementBatch(_message.Message):
    __slots__ = ("first_offset", "last_offset", "type", "delivery_count")
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    first_offset: int
    last_offset: int
    type: AcknowledgeType
    delivery_count: int
    def __init__(self, first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., type: _Optional[_Union[AcknowledgeType, str]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class AcknowledgeResult(_message.Message):
    __slots__ = ("first_offset", "last_offset", "error", "lock_deadline_ms")
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOCK_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    first_offset: int
    last_offset: int
    error: _broker_pb2.ProduceError
    lock_deadline_ms: int
    def __init__(self, first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., error: _Optional[_Union[_broker_pb2.ProduceError, _Mapping]] = ..., lock_deadline_ms: _Optional[int] = ...) -> None: ...

class ShareFetchRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "metadata_version", "topic", "partition", "max_records", "max_bytes", "max_wait_ms", "acknowledgements")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGEMENTS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    metadata_version: int
    topic: str
    partition: int
    max_records: int
    max_bytes: int
    max_wait_ms: int
    acknowledgements: _containers.RepeatedCompositeFieldContainer[AcknowledgementBatch]
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., metadata_version: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., max_records: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., acknowledgements: _Optional[_Iterable[_Union[AcknowledgementBatch, _Mapping]]] = ...) -> None: ...

class AcquiredRecords(_message.Message):
    __slots__ = ("first_offset", "last_offset", "delivery_count")
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    first_offset: int
    last_offset: int
    delivery_count: int
    def __init__(self, first_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class ShareFetchResponse(_message.Message):
    __slots__ = ("entries", "acquired", "lock_deadline_ms", "acknowledge_results", "high_watermark")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    LOCK_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGE_RESULTS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    entries: bytes
    acquired: _containers.RepeatedCompositeFieldContainer[AcquiredRecords]
    lock_deadline_ms: int
    acknowledge_results: _containers.RepeatedCompositeFieldContainer[AcknowledgeResult]
    high_watermark: int
    def __init__(self, entries: _Optional[bytes] = ..., acquired: _Optional[_Iterable[_Union[AcquiredRecords, _Mapping]]] = ..., lock_deadline_ms: _Optional[int] = ..., acknowledge_results: _Optional[_Iterable[_Union[AcknowledgeResult, _Mapping]]] = ..., high_watermark: _Optional[int] = ...) -> None: ...

class ShareAcknowledgeRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "metadata_version", "topic", "partition", "acknowledgements")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGEMENTS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    metadata_version: int
    topic: str
    partition: int
    acknowledgements: _containers.RepeatedCompositeFieldContainer[AcknowledgementBatch]
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., metadata_version: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., acknowledgements: _Optional[_Iterable[_Union[AcknowledgementBatch, _Mapping]]] = ...) -> None: ...

class ShareAcknowledgeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AcknowledgeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AcknowledgeResult, _Mapping]]] = ...) -> None: ...

class DescribeSharePartitionRequest(_message.Message):
    __slots__ = ("group_id", "topic", "partition")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    partition: int
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class SharePartitionDescription(_message.Message):
    __slots__ = ("exists", "start_offset", "end_offset", "in_flight", "acquired", "available", "archived_total", "dead_lettered_total", "oldest_acquired_age_ms", "high_watermark")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OLDEST_ACQUIRED_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    start_offset: int
    end_offset: int
    in_flight: int
    acquired: int
    available: int
    archived_total: int
    dead_lettered_total: int
    oldest_acquired_age_ms: int
    high_watermark: int
    def __init__(self, exists: _Optional[bool] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., in_flight: _Optional[int] = ..., acquired: _Optional[int] = ..., available: _Optional[int] = ..., archived_total: _Optional[int] = ..., dead_lettered_total: _Optional[int] = ..., oldest_acquired_age_ms: _Optional[int] = ..., high_watermark: _Optional[int] = ...) -> None: ...

class ResetSharePartitionRequest(_message.Message):
    __slots__ = ("group_id", "topic", "partition", "offset", "force")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    partition: int
    offset: int
    force: bool
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class ResetSharePartitionResponse(_message.Message):
    __slots__ = ("start_offset",)
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    start_offset: int
    def __init__(self, start_offset: _Optional[int] = ...) -> None: ...
