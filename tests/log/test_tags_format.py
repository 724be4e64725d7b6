"""Tags in the format (docs/format.md "Tags", docs/tags.md): the expression grammar and its
two evaluations, the tag block, and the produce check's refusals with their sentences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.format import entry, tags
from raftmq.format.compression import Codec
from raftmq.format.errors import InvalidEntryError
from raftmq.format.records import Record, build_batch, check_payload, encode_records
from raftmq.format.tag_filter import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    TagFilterError,
    bloom_of_block,
    parse,
)
from raftmq.partition import errors
from raftmq.partition.batch_check import check_produce

NAMES = ["a", "b", "c", "paid", "eu"]
NOW = 1_700_000_000_000


def expressions(depth: int = 3) -> st.SearchStrategy[str]:
    leaf = st.sampled_from([*NAMES, "*"])
    if depth == 0:
        return leaf
    sub = expressions(depth - 1)
    return st.one_of(
        leaf,
        sub.map(lambda e: f"!{e}"),
        sub.map(lambda e: f"({e})"),
        st.tuples(sub, sub).map(lambda p: f"{p[0]} && {p[1]}"),
        st.tuples(sub, sub).map(lambda p: f"{p[0]} || {p[1]}"),
    )


TAG_SETS = st.frozensets(st.sampled_from(NAMES), max_size=4)


@settings(max_examples=500, deadline=None)
@given(expressions(), st.lists(TAG_SETS, min_size=1, max_size=6))
def test_a_batch_with_a_matching_record_is_never_ruled_out(
    expression: str, batch: list[frozenset[str]]
) -> None:
    flt = parse(expression)
    union = frozenset().union(*batch)
    if any(flt.matches(record) for record in batch):
        assert flt.may_match(union)
        if union:  # what the tag index knows of a tagged batch: a bloom of its union
            block = tags.encode_block(t.encode() for t in union)
            bloom = bloom_of_block(block, 0, len(block))
            assert bloom is not None and flt.may_match_bloom(bloom)
            assert flt.may_match_block(block, 0, len(block))


@settings(max_examples=300, deadline=None)
@given(expressions(), TAG_SETS)
def test_the_conservative_answer_is_exact_for_an_untagged_batch(
    expression: str, record: frozenset[str]
) -> None:
    flt = parse(expression)
    assert flt.may_match(frozenset()) == flt.matches(frozenset()) == flt.matches_untagged
    # A uniform batch of one record: "no" is always right, and "yes" is right for a match.
    if not flt.may_match(record):
        assert not flt.matches(record)


@pytest.mark.parametrize(
    ("expression", "record", "matches"),
    [
        ("paid", {"paid", "eu"}, True),
        ("paid && (eu || us)", {"paid", "us"}, True),
        ("paid && (eu || us)", {"paid"}, False),
        ("!a && b || c", {"c", "a"}, True),  # ((!a) && b) || c
        ("!a && b || c", {"a", "b"}, False),
        ("!(a || b)", set(), True),
        ("*", set(), False),
        ("*", {"x"}, True),
        ("!*", set(), True),
        ("  paid&&eu ", {"paid", "eu"}, True),
        ("a.b:c/d-e_f", {"a.b:c/d-e_f"}, True),
    ],
)
def test_precedence_and_the_words(expression: str, record: set[str], matches: bool) -> None:
    assert parse(expression).matches(record) is matches


@pytest.mark.parametrize(
    ("expression", "sentence"),
    [
        ("", "expected a tag, '!', '(' or '*' but the expression ends at position 0"),
        ("paid &&", "expected a tag, '!', '(' or '*' but the expression ends at position 7"),
        ("(paid || eu", "expected ')' at position 11"),
        ("paid eu", "expected '&&', '||' or the end at position 5"),
        ("paid & eu", "expected '&&', '||' or the end at position 5"),
        ("a || | b", "found '|' (the operators are '&&' and '||') at position 5"),
        ("a && é", "found 'é'; tags use A-Z a-z 0-9 _ . : / - at position 5"),
        ("x" * 65, "is 65 characters; at most 64 at position 0"),
        ("!" * (MAX_DEPTH + 1) + "a", f"nest at most {MAX_DEPTH} deep at position {MAX_DEPTH}"),
        ("a" * (MAX_EXPRESSION_CHARS + 1), f"at most {MAX_EXPRESSION_CHARS} characters"),
    ],
)
def test_a_bad_expression_names_the_position(expression: str, sentence: str) -> None:
    with pytest.raises(TagFilterError) as caught:
        parse(expression)
    assert sentence in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_the_block_is_sorted_distinct_and_checked() -> None:
    block = tags.encode_block([b"paid", b"eu", b"paid"])
    assert block == b"\x02\x02eu\x04paid"
    assert tags.read_block(block, 0, len(block)) == ([b"eu", b"paid"], len(block))
    bad = {
        b"\x00": "declares 0 tags",
        b"\x02\x04paid\x02eu": "lists 'eu' after 'paid'; tags are distinct and in ascending",
        b"\x02\x02eu\x02eu": "lists 'eu' after 'eu'",
        b"\x01\x05pa": "ends inside tag 0 of 1",
        b"\x01\x03a b": "has a character outside",
    }
    for raw, sentence in bad.items():
        with pytest.raises(tags.InvalidTagsError, match=sentence):
            tags.read_block(raw, 0, len(raw))


def test_build_batch_keeps_the_records_region_after_the_block_with_any_codec() -> None:
    records = [Record(None, b"v%d" % i, NOW, (("tag", b"t%d" % (i % 3)),)) for i in range(50)]
    for codec in (Codec.NONE, Codec.GZIP, Codec.ZSTD, Codec.LZ4):
        raw = build_batch(records, compression_codec=codec)
        h = entry.parse_header(raw)
        assert h.attributes == entry.TAGGED | int(codec)
        assert tags.entry_tags(raw, h) == ["t0", "t1", "t2"]
        check_payload(h.attributes, raw, entry.HEADER_SIZE, h.size, 50, NOW, NOW)


def produced(payload: bytes, *, attributes: int = 0, count: int = 1) -> bytes:
    return entry.encode(
        payload, record_count=count, first_timestamp=NOW, max_timestamp=NOW, attributes=attributes
    )


def region(*headers: tuple[str, bytes | None]) -> bytes:
    return encode_records([Record(None, b"v", NOW, tuple(headers))], base_timestamp=NOW)


REFUSED = {
    "tag headers, no bit": (
        produced(region(("tag", b"paid"))),
        "entry 0 (byte 0 of the request): the records carry tags ['paid'] but the tagged bit "
        "(0x20) is unset",
    ),
    "a block that misses a tag": (
        produced(
            tags.encode_block([b"paid"]) + region(("tag", b"paid"), ("tag", b"eu")),
            attributes=entry.TAGGED,
        ),
        "the tag block lists ['paid'] but the records carry the tags ['eu', 'paid']; the block "
        "is exactly the union of the records' tags",
    ),
    "the bit and no tags": (
        produced(b"\x00" + region(), attributes=entry.TAGGED),
        "the tag block declares 0 tags",
    ),
    "a null tag": (
        produced(region(("tag", None))),
        "record 0 has a tag header with a null value; a tag is 1 to 64 bytes",
    ),
    "a tag of 65 bytes": (
        produced(region(("tag", b"x" * 65))),
        "record 0: tag 'xxxxxxxx",
    ),
    "17 tags on a record": (
        produced(
            tags.encode_block([b"t%02d" % i for i in range(17)])
            + region(*(("tag", b"t%02d" % i) for i in range(17))),
            attributes=entry.TAGGED,
        ),
        "record 0 carries more than 16 tags; a record carries at most 16",
    ),
    "a bad character": (
        produced(region(("tag", b"caf\xc3\xa9"))),
        "has a character outside A-Z a-z 0-9 _ . : / -",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_broker_refuses_bad_tags_with_invalid_tags(case: str) -> None:
    raw, sentence = REFUSED[case]
    with pytest.raises(errors.InvalidTagsError) as caught:
        check_produce(raw, max_entry_bytes=1 << 20, max_future_ms=3_600_000, now_ms=NOW)
    assert sentence in str(caught.value)
    assert caught.value.code == "INVALID_TAGS"


def test_a_batch_of_256_distinct_tags_cannot_be_built() -> None:
    records = [Record(None, b"v", NOW, (("tag", b"t%03d" % i),)) for i in range(256)]
    with pytest.raises(
        ValueError, match="carries 256 distinct tags; a tagged batch carries 1 to 255"
    ):
        build_batch(records)


def test_readers_ignore_the_tag_rules_that_only_the_produce_check_enforces() -> None:
    """Data written before tags existed (a header named tag, no block) stays readable."""
    from raftmq.format.records import decode_records

    old = produced(region(("tag", b"has space")))
    h = entry.parse_header(old)
    assert [r.headers for r in decode_records(old, h)] == [(("tag", b"has space"),)]
    with pytest.raises(InvalidEntryError):
        check_payload(0, old, entry.HEADER_SIZE, len(old), 1, NOW, NOW)
