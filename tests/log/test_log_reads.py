"""Reads that cross segment boundaries with entries larger than one read chunk."""

from raftmq.format import entry
from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.log import READ_SLACK_BYTES, Log


def test_read_by_index_continues_into_a_segment_whose_first_entry_is_large(tmp_path):
    config = LogConfig(segment_bytes=300_000, flush_policy=FlushPolicy.INTERVAL)
    big = READ_SLACK_BYTES * 3
    with Log.open(tmp_path, config) as log:
        for i in range(1, 8):
            log.append(entry.encode(b"x" * big, index=i, term=1, base_offset=i - 1, record_count=1))
        assert len(log.segments()) > 2
        got = []
        lo = 1
        while lo < log.next_index:
            result = log.read_by_index(lo, 10 * big)
            assert result.entries >= 1
            got += [h.index for h in entry.iter_headers(result.data)]
            lo = result.next_index
        assert got == list(range(1, 8))
        whole = log.read_by_index(1, 1 << 30)
        assert [h.index for h in entry.iter_headers(whole.data)] == list(range(1, 8))
        by_offset = log.read(0, 1 << 30)
        assert by_offset.data == whole.data


def test_a_read_whose_budget_ends_inside_an_indexed_entry_makes_one_pread(tmp_path, monkeypatch):
    """With a slot at each end of the entry that would overflow max_bytes, the read knows
    it cannot fit without reading the rest of its budget (a consumer's every fetch)."""
    from raftmq.log.segment import Segment

    payload = 64 * 1024
    with Log.open(tmp_path, LogConfig(flush_policy=FlushPolicy.INTERVAL)) as log:
        for i in range(1, 41):
            log.append(
                entry.encode(b"x" * payload, index=i, term=1, base_offset=i - 1, record_count=1)
            )
        size = len(log.read(0, 1).data)  # one whole entry, header included
        calls = []
        real = Segment.pread

        def counted(self, length, position):
            calls.append(length)
            return real(self, length, position)

        monkeypatch.setattr(Segment, "pread", counted)
        result = log.read(0, 1024 * 1024)
        assert result.entries == (1024 * 1024) // size
        assert len(result.data) == result.entries * size
        assert calls == [len(result.data)]
