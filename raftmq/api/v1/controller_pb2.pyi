from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReportLeaderRequest(_message.Message):
    __slots__ = ("topic", "partition", "leader_id", "term")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    leader_id: int
    term: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_id: _Optional[int] = ..., term: _Optional[int] = ...) -> None: ...

class PromoteReplicaRequest(_message.Message):
    __slots__ = ("topic", "partition", "broker_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    broker_id: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., broker_id: _Optional[int] = ...) -> None: ...

class ChangeDone(_message.Message):
    __slots__ = ("metadata_version",)
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    metadata_version: int
    def __init__(self, metadata_version: _Optional[int] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "host", "port", "raft_host", "raft_port", "rack", "incarnation")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RAFT_HOST_FIELD_NUMBER: _ClassVar[int]
    RAFT_PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    host: str
    port: int
    raft_host: str
    raft_port: int
    rack: str
    incarnation: int
    def __init__(self, broker_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., raft_host: _Optional[str] = ..., raft_port: _Optional[int] = ..., rack: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("broker_id", "incarnation", "metadata_version")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    incarnation: int
    metadata_version: int
    def __init__(self, broker_id: _Optional[int] = ..., incarnation: _Optional[int] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("fenced", "metadata_version")
    FENCED_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    fenced: bool
    metadata_version: int
    def __init__(self, fenced: _Optional[bool] = ..., metadata_version: _Optional[int] = ...) -> None: ...

class WatchMetadataRequest(_message.Message):
    __slots__ = ("from_version",)
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    def __init__(self, from_version: _Optional[int] = ...) -> None: ...

class MetadataUpdate(_message.Message):
    __slots__ = ("version", "state")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: bytes
    def __init__(self, version: _Optional[int] = ..., state: _Optional[bytes] = ...) -> None: ...

class DescribeVoterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeVoterResponse(_message.Message):
    __slots__ = ("voter_id", "term", "last_index", "leader_id", "rejoining")
    VOTER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    REJOINING_FIELD_NUMBER: _ClassVar[int]
    voter_id: int
    term: int
    last_index: int
    leader_id: int
    rejoining: bool
    def __init__(self, voter_id: _Optional[int] = ..., term: _Optional[int] = ..., last_index: _Optional[int] = ..., leader_id: _Optional[int] = ..., rejoining: _Optional[bool] = ...) -> None: ...

class AllocateProducerIdsRequest(_message.Message):
    __slots__ = ("broker_id", "count")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    count: int
    def __init__(self, broker_id: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class AllocateProducerIdsResponse(_message.Message):
    __slots__ = ("first_id", "count")
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    first_id: int
    count: int
    def __init__(self, first_id: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...
