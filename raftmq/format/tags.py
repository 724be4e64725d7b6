"""Record tags and the tag block of a DATA entry (docs/format.md, "Tags").

A record's tags are headers named ``tag``. So that a broker can filter batches by tag
without decoding a key or a value (nor inflating a compressed payload), a DATA entry whose
records carry tags sets attribute bit 5 (:data:`raftmq.format.entry.TAGGED`) and starts its
payload with an uncompressed *tag block*: the exact union of its records' tags,

    u8 count (1..255), then count x (u8 length, the tag's bytes), strictly ascending

followed by the records region (plain records or the codec's frame). The block sits at a
fixed place (right after the 74-byte header), so the log indexes it on append from the
entry's first bytes, and a filtered fetch decides on an entry from its header and block.

Limits (checked by the producer at ``send`` and by the broker on produce, each with a
sentence that names the limit): at most :data:`MAX_TAGS_PER_RECORD` tags per record, each
1..:data:`MAX_TAG_BYTES` bytes of ``[A-Za-z0-9_.:/-]``, and at most
:data:`MAX_TAGS_PER_BATCH` distinct tags per entry (the count is a u8).
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from raftmq.format import entry
from raftmq.format.entry import EntryHeader
from raftmq.format.errors import InvalidEntryError

if TYPE_CHECKING:
    from raftmq.format.records import Record

TAG_HEADER = "tag"
"""The header name that makes a header's value a tag."""
TAG_HEADER_BYTES = TAG_HEADER.encode()
MAX_TAGS_PER_RECORD = 16
MAX_TAG_BYTES = 64
MAX_TAGS_PER_BATCH = 255
TAG_CHARACTERS = "A-Z a-z 0-9 _ . : / -"
"""The characters a tag may use, as the error sentences name them."""
TAG_ALPHABET = frozenset(string.ascii_letters + string.digits + "_.:/-")
"""Those characters, for a parser that reads a tag one character at a time."""
_TAG = re.compile(rb"[A-Za-z0-9_.:/-]{1,%d}\Z" % MAX_TAG_BYTES)
assert {chr(c) for c in range(128) if _TAG.match(bytes((c,)))} == TAG_ALPHABET
MAX_BLOCK_BYTES = 1 + MAX_TAGS_PER_BATCH * (1 + MAX_TAG_BYTES)
"""The largest tag block: what a reader fetches to be sure it holds a whole one."""


class InvalidTagsError(InvalidEntryError):
    """An entry's tags break a rule of docs/format.md, "Tags" (a tag too long, too many,
    bad characters, a block that is not the union of its records' tags). The broker answers
    it with its own error code (INVALID_TAGS), so a producer knows which rule it broke."""


def tag_problem(tag: bytes) -> str | None:
    """Why ``tag`` (a header value) is not a valid tag, or None when it is."""
    if _TAG.match(tag):
        return None
    if not tag:
        return "a tag is empty; tags are 1 to 64 bytes"
    if len(tag) > MAX_TAG_BYTES:
        return f"tag {_show(tag)} is {len(tag)} bytes; a tag is at most {MAX_TAG_BYTES} bytes"
    return f"tag {_show(tag)} has a character outside {TAG_CHARACTERS}"


def check_record_tags(tags: Collection[str]) -> None:
    """The producer's check of one record's tags at ``send``: raise ValueError with the
    sentence the broker would refuse the batch with."""
    if len(tags) > MAX_TAGS_PER_RECORD:
        raise ValueError(
            f"a record carries {len(tags)} tags; at most {MAX_TAGS_PER_RECORD} are allowed"
        )
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags {list(tags)!r} repeat a tag; give each tag once")
    for tag in tags:
        if not isinstance(tag, str):
            raise ValueError(f"tag {tag!r} is not a str")
        problem = tag_problem(tag.encode())
        if problem is not None:
            raise ValueError(problem)


def encode_block(tags: Iterable[bytes]) -> bytes:
    """The tag block for the union ``tags`` (at least one; valid tags)."""
    ordered = sorted(set(tags))
    if not 1 <= len(ordered) <= MAX_TAGS_PER_BATCH:
        raise InvalidTagsError(
            f"a batch carries {len(ordered)} distinct tags; a tagged batch carries 1 to "
            f"{MAX_TAGS_PER_BATCH}: build smaller batches"
        )
    out = bytearray((len(ordered),))
    for tag in ordered:
        assert tag_problem(tag) is None, tag
        out.append(len(tag))
        out += tag
    return bytes(out)


def read_block(
    buf: bytes | bytearray | memoryview, start: int, end: int
) -> tuple[list[bytes], int]:
    """(tags, position after the block) of the tag block at ``buf[start:end]``; raise
    InvalidTagsError when it is cut short, empty, unordered or holds an invalid tag.

    Every check is needed by the broker on produce, and cheap enough (a few dozen bytes)
    that readers run the same one rather than trust the block."""
    if start >= end:
        raise InvalidTagsError("the tagged bit (0x20) is set but the payload is empty")
    count = buf[start]
    if not count:
        raise InvalidTagsError(
            "the tag block declares 0 tags; an entry without tags leaves the tagged bit "
            "(0x20) unset"
        )
    pos = start + 1
    tags: list[bytes] = []
    for n in range(count):
        if pos >= end or pos + 1 + buf[pos] > end:
            raise InvalidTagsError(f"the tag block ends inside tag {n} of {count}")
        size = buf[pos]
        tag = bytes(buf[pos + 1 : pos + 1 + size])
        problem = tag_problem(tag)
        if problem is not None:
            raise InvalidTagsError(f"the tag block holds an invalid tag: {problem}")
        if tags and tag <= tags[-1]:
            raise InvalidTagsError(
                f"the tag block lists {_show(tag)} after {_show(tags[-1])}; tags are distinct "
                "and in ascending byte order"
            )
        tags.append(tag)
        pos += 1 + size
    return tags, pos


def block_size(buf: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """Bytes of the tag block at ``buf[start:end]``, walking its lengths only (for readers
    of entries the broker checked; InvalidEntryError if it does not fit)."""
    if start >= end:
        raise InvalidEntryError("the tagged bit (0x20) is set but the payload is empty")
    pos = start + 1
    for _ in range(buf[start]):
        if pos >= end:
            raise InvalidEntryError("the tag block runs past the payload")
        pos += 1 + buf[pos]
    if pos > end:
        raise InvalidEntryError("the tag block runs past the payload")
    return pos - start


def records_region(buf: bytes | bytearray | memoryview, header: EntryHeader) -> memoryview:
    """The records region of the DATA entry ``header`` describes in ``buf``: its payload
    after the tag block, if it has one (plain records, or the codec's frame).

    The one place that knows where records start: every reader of a payload (consumers,
    the Spark source, ``raftmq log verify``, the broker's produce check) goes through it."""
    payload = entry.payload_of(buf, header)
    if header.attributes & entry.TAGGED:
        return payload[block_size(payload, 0, len(payload)) :]
    return payload


def entry_tags(buf: bytes | bytearray | memoryview, header: EntryHeader) -> list[str]:
    """The tags of the entry's block (the union of its records' tags); [] when untagged."""
    if not header.attributes & entry.TAGGED:
        return []
    payload = entry.payload_of(buf, header)
    return [t.decode() for t in read_block(payload, 0, len(payload))[0]]


def record_tags(record: Record) -> frozenset[str]:
    """A decoded record's tags (its headers named ``tag``), for a filter's exact match."""
    if not record.headers:
        return frozenset()
    return frozenset(v.decode() for n, v in record.headers if n == TAG_HEADER and v is not None)


def _show(tag: bytes) -> str:
    shown = tag[:MAX_TAG_BYTES].decode("utf-8", "replace")
    return repr(shown + ("..." if len(tag) > MAX_TAG_BYTES else ""))
