"""Tag expressions: what a consumer subscribes to (docs/tags.md has the user's guide).

Grammar (whitespace between tokens is ignored)::

    expression := or
    or         := and ( "||" and )*
    and        := not ( "&&" not )*
    not        := "!" not | "(" or ")" | "*" | TAG
    TAG        := 1 to 64 characters of [A-Za-z0-9_.:/-]

so ``!`` binds tighter than ``&&``, which binds tighter than ``||``. A TAG is true for a
record that carries that tag; ``*`` is true for a record that carries any tag. An
expression is at most :data:`MAX_EXPRESSION_CHARS` characters and nests ``!`` and
parentheses at most :data:`MAX_DEPTH` deep; anything else is a :class:`TagFilterError`
naming the position (0-based) of the mistake.

Two evaluations, one per side of the wire:

- exact, on one record's tags (:meth:`TagFilter.matches`): the client keeps a record of a
  fetched batch only if it matches;
- conservative, on what the broker knows of a batch (:meth:`TagFilter.may_match`): the
  union of its records' tags (its tag block), or a bloom of that union (the segment's tag
  index). Kleene's three-valued logic: a tag absent from the union is false for every
  record; a present one is unknown (some records may lack it); ``!unknown`` is unknown.
  The batch may match unless the expression is definitely false, so a batch holding a
  matching record is never skipped. An untagged batch is exactly the empty tag set.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from raftmq.format.errors import InvalidEntryError
from raftmq.format.tags import (
    MAX_TAG_BYTES,
    TAG_ALPHABET,
    TAG_CHARACTERS,
    read_block,
    tag_problem,
)

MAX_EXPRESSION_CHARS = 1024
MAX_DEPTH = 32

# Three values: False (0), unknown (1), True (2).
_F, _U, _T = 0, 1, 2

_Node = tuple[Any, ...]
"""("tag", name) | ("any",) | ("not", node) | ("and" | "or", (node, ...))"""


class TagFilterError(ValueError):
    """An expression that does not parse or breaks a limit: ``position`` is where (0-based)."""

    def __init__(self, expression: str, position: int, why: str) -> None:
        super().__init__(f"tag filter {expression!r}: {why} at position {position}")
        self.expression = expression
        self.position = position
        self.why = why


def bloom_bits(tag: bytes) -> int:
    """The bits ``tag`` sets in a 64-bit bloom (three of them, from its CRC32C): the
    segment tag index keeps the OR of an entry's tags' bits."""
    h = crc32c(tag)
    return (1 << (h & 63)) | (1 << ((h >> 6) & 63)) | (1 << ((h >> 12) & 63))


ALL_BITS = (1 << 64) - 1
"""The bloom that rules nothing out (for a block that cannot be read)."""


def bloom_of_block(buf: bytes | bytearray | memoryview, start: int, end: int) -> int | None:
    """The bloom of the tag block at ``buf[start:]``; None when it runs past ``end`` (read
    more), :data:`ALL_BITS` when it is malformed (rule nothing out: a reader never hides a
    record because of a block it cannot read)."""
    if start >= end:
        return None
    count = buf[start]
    if not count:
        return ALL_BITS
    pos = start + 1
    bits = 0
    for _ in range(count):
        if pos >= end or pos + 1 + buf[pos] > end:
            return None
        size = buf[pos]
        bits |= bloom_bits(bytes(buf[pos + 1 : pos + 1 + size]))
        pos += 1 + size
    return bits


def block_union(buf: bytes | bytearray | memoryview, start: int, end: int) -> frozenset[str] | None:
    """The tags of the block at ``buf[start:end]`` as a union, or None when it cannot be
    read (which :meth:`TagFilter.may_match_block` takes as "may match")."""
    try:
        found, _ = read_block(buf, start, end)
    except InvalidEntryError:
        return None
    return frozenset(t.decode() for t in found)


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed expression (:func:`parse`)."""

    expression: str
    root: _Node
    masks: dict[str, int]
    """Each tag's bloom bits."""
    matches_untagged: bool
    """True on the empty tag set (e.g. ``!debug``): untagged records match it."""

    def matches(self, record_tags: Collection[str]) -> bool:
        """Exact: does a record with ``record_tags`` match?"""
        return (
            _eval(self.root, lambda t: _T if t in record_tags else _F, _T if record_tags else _F)
            == _T
        )

    def may_match(self, union: Collection[str]) -> bool:
        """Conservative: may a batch whose records' tags have the union ``union`` hold a
        matching record? (False only when none can.)"""
        return _eval(self.root, lambda t: _U if t in union else _F, _U if union else _F) != _F

    def may_match_block(self, buf: bytes | bytearray | memoryview, start: int, end: int) -> bool:
        """:meth:`may_match` on the tag block at ``buf[start:end]``; True for a block that
        cannot be read (never hide a record for it)."""
        union = block_union(buf, start, end)
        return union is None or self.may_match(union)

    def may_match_bloom(self, bloom: int) -> bool:
        """:meth:`may_match` for a tagged batch known only by the bloom of its union: a tag
        whose bits are all set may be present (unknown), else it is absent."""
        masks = self.masks
        return _eval(self.root, lambda t: _U if bloom & masks[t] == masks[t] else _F, _U) != _F


def _eval(node: _Node, tag: Callable[[str], int], any_tag: int) -> int:
    """Three-valued evaluation: ``tag`` gives a tag's value, ``any_tag`` the value of
    ``*``. For an exact set both answer only True or False, so the result is exact too."""
    kind = node[0]
    if kind == "tag":
        return tag(node[1])
    if kind == "any":
        return any_tag
    if kind == "not":
        return _T - _eval(node[1], tag, any_tag)
    values = [_eval(n, tag, any_tag) for n in node[1]]
    return min(values) if kind == "and" else max(values)


def parse(expression: str) -> TagFilter:
    """Parse ``expression``; raise TagFilterError naming the position of the mistake."""
    if not isinstance(expression, str):
        raise TagFilterError(repr(expression), 0, "an expression is a str")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise TagFilterError(
            expression[:40] + "...",
            MAX_EXPRESSION_CHARS,
            f"an expression is at most {MAX_EXPRESSION_CHARS} characters, this one is "
            f"{len(expression)}",
        )
    parser = _Parser(expression)
    root = parser.parse_or(0)
    parser.skip_spaces()
    if parser.pos < len(expression):
        raise parser.error("expected '&&', '||' or the end")
    masks = {t: bloom_bits(t.encode()) for t in parser.tags}
    return TagFilter(expression, root, masks, _eval(root, lambda t: _F, _F) == _T)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tags: set[str] = set()

    def error(self, why: str) -> TagFilterError:
        return TagFilterError(self.text, self.pos, why)

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def take(self, token: str) -> bool:
        self.skip_spaces()
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def parse_or(self, depth: int) -> _Node:
        nodes = [self.parse_and(depth)]
        while self.take("||"):
            nodes.append(self.parse_and(depth))
        return nodes[0] if len(nodes) == 1 else ("or", tuple(nodes))

    def parse_and(self, depth: int) -> _Node:
        nodes = [self.parse_not(depth)]
        while self.take("&&"):
            nodes.append(self.parse_not(depth))
        return nodes[0] if len(nodes) == 1 else ("and", tuple(nodes))

    def parse_not(self, depth: int) -> _Node:
        self.skip_spaces()
        if depth >= MAX_DEPTH:
            raise self.error(f"'!' and parentheses nest at most {MAX_DEPTH} deep")
        if self.take("!"):
            return ("not", self.parse_not(depth + 1))
        if self.take("("):
            node = self.parse_or(depth + 1)
            if not self.take(")"):
                raise self.error("expected ')'")
            return node
        if self.take("*"):
            return ("any",)
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in TAG_ALPHABET:
            self.pos += 1
        if self.pos == start:
            if self.pos >= len(self.text):
                raise self.error("expected a tag, '!', '(' or '*' but the expression ends")
            found = self.text[self.pos]
            if found == "&" or found == "|":
                raise self.error(
                    f"expected a tag, '!', '(' or '*', found {found!r} (the operators are "
                    "'&&' and '||')"
                )
            raise self.error(
                f"expected a tag, '!', '(' or '*', found {found!r}; tags use {TAG_CHARACTERS}"
            )
        name = self.text[start : self.pos]
        if len(name) > MAX_TAG_BYTES:
            self.pos = start
            raise self.error(
                f"tag {name[:20]!r}... is {len(name)} characters; at most {MAX_TAG_BYTES}"
            )
        assert tag_problem(name.encode()) is None
        self.tags.add(name)
        return ("tag", name)
