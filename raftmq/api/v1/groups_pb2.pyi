from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GroupTopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumerGroupHeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "instance_id", "member_epoch", "subscriptions", "owned", "assignor", "session_timeout_ms")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    OWNED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    instance_id: str
    member_epoch: int
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    owned: _containers.RepeatedCompositeFieldContainer[GroupTopicPartitions]
    assignor: str
    session_timeout_ms: int
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., subscriptions: _Optional[_Iterable[str]] = ..., owned: _Optional[_Iterable[_Union[GroupTopicPartitions, _Mapping]]] = ..., assignor: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ...) -> None: ...

class ConsumerGroupHeartbeatResponse(_message.Message):
    __slots__ = ("member_id", "member_epoch", "group_epoch", "assigned", "revoke", "heartbeat_interval_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    member_epoch: int
    group_epoch: int
    assigned: _containers.RepeatedCompositeFieldContainer[GroupTopicPartitions]
    revoke: _containers.RepeatedCompositeFieldContainer[GroupTopicPartitions]
    heartbeat_interval_ms: int
    def __init__(self, member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., group_epoch: _Optional[int] = ..., assigned: _Optional[_Iterable[_Union[GroupTopicPartitions, _Mapping]]] = ..., revoke: _Optional[_Iterable[_Union[GroupTopicPartitions, _Mapping]]] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class OffsetToCommit(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "offsets")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    offsets: _containers.RepeatedCompositeFieldContainer[OffsetToCommit]
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[OffsetToCommit, _Mapping]]] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ("metadata_version",)
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    metadata_version: int
    def __init__(self, metadata_version: _Optional[int] = ...) -> None: ...

class FetchOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[GroupTopicPartitions]
    def __init__(self, group_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[GroupTopicPartitions, _Mapping]]] = ...) -> None: ...

class CommittedPosition(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata", "committed_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    committed_ms: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ..., committed_ms: _Optional[int] = ...) -> None: ...

class FetchOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[CommittedPosition]
    def __init__(self, offsets: _Optional[_Iterable[_Union[CommittedPosition, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group_id", "state", "member_count", "group_epoch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    state: str
    member_count: int
    group_epoch: int
    def __init__(self, group_id: _Optional[str] = ..., state: _Optional[str] = ..., member_count: _Optional[int] = ..., group_epoch: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class GroupMemberDescription(_message.Message):
    __slots__ = ("member_id", "instance_id", "member_epoch", "subscriptions", "assigned", "target", "joined_ms", "last_heartbeat_age_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    JOINED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    instance_id: str
    member_epoch: int
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    assigned: _containers.RepeatedCompositeFieldContainer[GroupTopicPartitions]
    target: _containers.RepeatedCompositeFieldContainer[GroupTopicPartitions]
    joined_ms: int
    last_heartbeat_age_ms: int
    def __init__(self, member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., subscriptions: _Optional[_Iterable[str]] = ..., assigned: _Optional[_Iterable[_Union[GroupTopicPartitions, _Mapping]]] = ..., target: _Optional[_Iterable[_Union[GroupTopicPartitions, _Mapping]]] = ..., joined_ms: _Optional[int] = ..., last_heartbeat_age_ms: _Optional[int] = ...) -> None: ...

class GroupDescription(_message.Message):
    __slots__ = ("group_id", "state", "group_epoch", "assignor", "members", "offsets")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    state: str
    group_epoch: int
    assignor: str
    members: _containers.RepeatedCompositeFieldContainer[GroupMemberDescription]
    offsets: _containers.RepeatedCompositeFieldContainer[CommittedPosition]
    def __init__(self, group_id: _Optional[str] = ..., state: _Optional[str] = ..., group_epoch: _Optional[int] = ..., assignor: _Optional[str] = ..., members: _Optional[_Iterable[_Union[GroupMemberDescription, _Mapping]]] = ..., offsets: _Optional[_Iterable[_Union[CommittedPosition, _Mapping]]] = ...) -> None: ...

class ResetOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "offsets", "force")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    offsets: _containers.RepeatedCompositeFieldContainer[OffsetToCommit]
    force: bool
    def __init__(self, group_id: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[OffsetToCommit, _Mapping]]] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class ChangeDoneResponse(_message.Message):
    __slots__ = ("metadata_version",)
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    metadata_version: int
    def __init__(self, metadata_version: _Optional[int] = ...) -> None: ...
