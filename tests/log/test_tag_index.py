"""The segment tag index and the filtered read (docs/format.md "Index files", docs/tags.md):
slots written on append, rebuilt by recovery, cut by truncation, and a filtered read that
reads only candidate entries and says how far it looked."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftmq.format import entry
from raftmq.format.records import Record, build_batch, decode_records
from raftmq.format.tag_filter import bloom_bits, parse
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.log import Log
from raftmq.log.segment import Segment

CONFIG = LogConfig(segment_bytes=64 * 1024, flush_policy=FlushPolicy.INTERVAL)


def batch(tags: list[str], n: int = 4, value_bytes: int = 200) -> bytes:
    headers = tuple(("tag", t.encode()) for t in tags)
    return build_batch(
        [Record(None, b"v" * value_bytes, 1_700_000_000_000, headers) for _ in range(n)]
    )


def fill(log: Log, plan: list[list[str]]) -> list[list[str]]:
    """Append one batch per element of ``plan`` (its tags), stamped as a leader would."""
    for tags in plan:
        log.append(
            entry.stamp(batch(tags), index=log.next_index, term=1, base_offset=log.next_offset)
        )
    return plan


def tagged_offsets(log: Log, expression: str, *, max_bytes: int = 1 << 26) -> list[int]:
    """Base offsets of the entries a filtered read returns, reading on to the log's end."""
    flt = parse(expression)
    got: list[int] = []
    offset = 0
    while offset < log.next_offset:
        result = log.read_filtered(offset, max_bytes, flt)
        assert result.next_offset > offset, "a filtered read always moves on"
        got += [h.base_offset for h in entry.iter_headers(result.data)]
        offset = result.next_offset
    return got


def expected(plan: list[list[str]], expression: str) -> list[int]:
    flt = parse(expression)
    return [4 * k for k, tags in enumerate(plan) if flt.may_match(set(tags))]


PLAN = [["paid"] if k % 17 == 3 else (["debug"] if k % 5 == 0 else []) for k in range(300)]


def test_every_tagged_entry_has_a_slot_with_its_bloom(tmp_path: Path) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        fill(log, PLAN)
        slots = []
        for seg in log._segments:
            idx = log._index_of(seg)
            slots += [
                (seg.base_offset + o, b)
                for o, b in zip(idx.tag_offsets, idx.tag_blooms, strict=True)
            ]
        want = [(4 * k, bloom_bits(t[0].encode())) for k, t in enumerate(PLAN) if t]
        assert slots == want


@pytest.mark.parametrize("expression", ["paid", "debug", "!debug", "paid || debug", "*", "!*"])
def test_a_filtered_read_returns_exactly_the_entries_that_may_match(
    tmp_path: Path, expression: str
) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        fill(log, PLAN)
        assert len(log.segments()) > 3
        assert tagged_offsets(log, expression) == expected(PLAN, expression)
        # Small answers: the same entries, in several reads.
        assert tagged_offsets(log, expression, max_bytes=1) == expected(PLAN, expression)


def test_an_indexed_read_reads_only_candidate_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        fill(log, PLAN)
        log.flush()
        read: list[int] = []
        real = Segment.pread

        def counted(self: Segment, length: int, position: int) -> bytes:
            read.append(length)
            return real(self, length, position)

        monkeypatch.setattr(Segment, "pread", counted)
        result = log.read_filtered(0, 1 << 26, parse("paid"))
        matching = [k for k, t in enumerate(PLAN) if t == ["paid"]]
        assert result.entries == len(matching)
        assert result.next_offset == log.next_offset
        size = len(batch(["paid"]))
        # A header-and-block read, then the entry, per match; nothing else.
        assert sum(read) <= len(matching) * (size + entry.HEADER_SIZE + 256)
        assert result.read_bytes == sum(read)


def test_a_read_with_no_match_moves_past_everything_it_looked_at(tmp_path: Path) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        fill(log, PLAN)
        result = log.read_filtered(0, 1 << 20, parse("nothing-has-this"))
        assert (result.entries, result.next_offset, result.read_bytes) == (0, log.next_offset, 0)
        # Below an upper bound (the high watermark), it stops there.
        result = log.read_filtered(0, 1 << 20, parse("nothing-has-this"), upper_offset=400)
        assert (result.entries, result.next_offset) == (0, 400)


def test_recovery_rebuilds_the_tag_index_and_truncation_cuts_it(tmp_path: Path) -> None:
    with Log.open(tmp_path, CONFIG) as log:
        fill(log, PLAN)
        before = tagged_offsets(log, "paid || debug")
    for seg_file in tmp_path.glob("*.tagindex"):
        seg_file.unlink()  # as segments sealed before tag indexes existed
    with Log.open(tmp_path, CONFIG) as log:
        assert len(log.read(0, 1 << 30).data) > 0
        assert not list(tmp_path.glob("*.tagindex"))  # unfiltered reads do without them
        assert tagged_offsets(log, "paid || debug") == before  # a filtered one builds them
        assert all(p.with_suffix(".tagindex").exists() for p in tmp_path.glob("*.index"))
        cut_at = 150  # entries 150.. go (Raft index k + 1 holds entry k)
        log.truncate_suffix(cut_at + 1)
        assert tagged_offsets(log, "paid || debug") == expected(PLAN[:cut_at], "paid || debug")
        fill(log, [["paid"]] * 3)
        after = PLAN[:cut_at] + [["paid"]] * 3
        assert tagged_offsets(log, "paid") == expected(after, "paid")


def test_a_mixed_batch_comes_whole_and_the_client_side_drops_the_rest(tmp_path: Path) -> None:
    records = [
        Record(None, b"a", 1_700_000_000_000, (("tag", b"paid"),)),
        Record(None, b"b", 1_700_000_000_000, (("tag", b"eu"),)),
        Record(None, b"c", 1_700_000_000_000),
    ]
    with Log.open(tmp_path, CONFIG) as log:
        log.append(entry.stamp(build_batch(records), index=1, term=1, base_offset=0))
        flt = parse("paid")
        result = log.read_filtered(0, 1 << 20, flt)
        assert result.entries == 1
        h = entry.parse_header(result.data)
        kept = [
            r.value
            for r in decode_records(result.data, h)
            if flt.matches({v.decode() for n, v in r.headers if n == "tag" and v})
        ]
        assert kept == [b"a"]


def test_random_plans_agree_with_the_definition(tmp_path: Path) -> None:
    rng = random.Random(25)
    names = ["a", "b", "c", "d"]
    plan = [rng.sample(names, rng.randint(0, 2)) for _ in range(200)]
    with Log.open(tmp_path, CONFIG) as log:
        fill(log, plan)
        for expression in ["a", "a && b", "!a", "a || !b", "(a || b) && !c", "*", "d && !d"]:
            assert tagged_offsets(log, expression) == expected(plan, expression), expression


def test_log_verify_checks_the_tag_index_against_the_entries(tmp_path: Path) -> None:
    from raftmq.log.atomic_file import write_atomic
    from raftmq.log.inspect import verify_folder

    with Log.open(tmp_path, CONFIG) as log:
        fill(log, PLAN)
    report = verify_folder(tmp_path)
    assert not any(r.problems for r in report.segments) and not report.problems
    victim = sorted(tmp_path.glob("*.tagindex"))[0]
    write_atomic(victim, b"")  # a sound file that lists nothing
    problems = [p for r in verify_folder(tmp_path).segments for p in r.problems]
    assert len(problems) == 1 and "does not list the segment's" in problems[0]


def test_log_verify_reads_tag_headers_of_entries_from_before_tag_blocks(tmp_path: Path) -> None:
    """An untagged entry whose records carry headers named tag (what producers sent before
    tag blocks existed) is readable as it is: verify does not call it undecodable."""
    from raftmq.format.records import encode_records
    from raftmq.log.inspect import verify_folder

    legacy = entry.encode(
        encode_records([Record(None, b"v", 5, (("tag", b"not a tag!"),))], base_timestamp=5),
        index=1,
        term=1,
        record_count=1,
        first_timestamp=5,
        max_timestamp=5,
    )
    with Log.open(tmp_path, CONFIG) as log:
        log.append(legacy)
    assert verify_folder(tmp_path).ok
