from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ScramClientFirstRequest(_message.Message):
    __slots__ = ("mechanism", "message")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    message: str
    def __init__(self, mechanism: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ScramClientFirstResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ScramClientFinalRequest(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class ScramClientFinalResponse(_message.Message):
    __slots__ = ("message", "session_token", "session_lifetime_ms", "principal")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_LIFETIME_MS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    message: str
    session_token: str
    session_lifetime_ms: int
    principal: str
    def __init__(self, message: _Optional[str] = ..., session_token: _Optional[str] = ..., session_lifetime_ms: _Optional[int] = ..., principal: _Optional[str] = ...) -> None: ...
