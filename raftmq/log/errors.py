"""Exceptions of the storage layer. Each message names what was wrong and what is valid,
so the API layer can pass it to a user unchanged."""

from __future__ import annotations

from raftmq.format.errors import InvalidEntryError


class LogError(Exception):
    """Base class for every error the log raises on purpose about itself (a range, a
    closed handle). Errors about an entry's bytes are raftmq.format.errors.FormatError;
    a caller that handles both catches ``(LogError, FormatError)``."""


class EntryTooLargeError(InvalidEntryError, LogError):
    """An entry over ``max.message.bytes``."""


class NotContiguousError(InvalidEntryError, LogError):
    """An append whose Raft index or message offset does not follow the log's end."""


class OutOfRangeError(LogError):
    """A read or truncation outside the log; the message carries the valid range."""

    def __init__(self, message: str, *, start: int, end: int) -> None:
        super().__init__(message)
        self.start = start
        self.end = end


class LogClosedError(LogError):
    """The log was closed; nothing more can be read or written through this handle."""
