"""Errors about the bytes themselves: an entry that is not well formed, or one whose CRC
does not match. They live with the format because every layer that checks bytes (the
client edge, the peer edge, the disk read) raises them; the log's own errors
(raftmq.log.errors) subclass them where an error is also about an entry."""

from __future__ import annotations


class FormatError(Exception):
    """Base class for every error the format checks raise on purpose."""


class InvalidEntryError(FormatError):
    """Bytes that are not a well-formed entry: refused before anything is written."""


class CorruptEntryError(FormatError):
    """Bytes whose CRC does not match: on append, a bad batch; on read, disk corruption."""

    def __init__(self, message: str, *, position: int = -1, segment: str = "") -> None:
        super().__init__(message)
        self.position = position
        self.segment = segment
