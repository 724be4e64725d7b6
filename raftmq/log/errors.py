"""Exceptions of the storage layer. Each message names what was wrong and what is valid,
so the API layer can pass it to a user unchanged."""

from __future__ import annotations


class LogError(Exception):
    """Base class for every error the log raises on purpose."""


class InvalidEntryError(LogError):
    """Bytes that are not a well-formed entry: refused before anything is written."""


class CorruptEntryError(LogError):
    """Bytes whose CRC does not match: on append, a bad batch; on read, disk corruption."""

    def __init__(self, message: str, *, position: int = -1, segment: str = "") -> None:
        super().__init__(message)
        self.position = position
        self.segment = segment


class EntryTooLargeError(InvalidEntryError):
    """An entry over ``max.message.bytes``."""


class NotContiguousError(InvalidEntryError):
    """An append whose Raft index or message offset does not follow the log's end."""


class OutOfRangeError(LogError):
    """A read or truncation outside the log; the message carries the valid range."""

    def __init__(self, message: str, *, start: int, end: int) -> None:
        super().__init__(message)
        self.start = start
        self.end = end


class LogClosedError(LogError):
    """The log was closed; nothing more can be read or written through this handle."""
