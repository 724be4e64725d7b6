"""Log.abandon: how the Raft host lets go of a log whose write or fsync failed, before it
reopens it from disk (no second fsync on a descriptor whose fsync failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.log.config import FlushPolicy, LogConfig
from raftmq.log.errors import LogClosedError
from raftmq.log.log import Log
from tests.log.test_log import fill, open_fds


def test_abandon_closes_every_descriptor_without_writing_and_a_reopen_reads_the_disk(
    tmp_path: Path,
) -> None:
    before = open_fds()
    config = LogConfig(
        segment_bytes=4096, flush_policy=FlushPolicy.INTERVAL, write_behind_bytes=1 << 20
    )
    log = Log.open(tmp_path, config)
    written = fill(log, 60)  # several segments; the newest entries kept back in memory
    log.flush()
    kept_back = fill(log, 3)
    assert log._segments[-1].pending, "the test needs bytes kept back by write-behind"
    assert open_fds() > before
    log.abandon()
    log.abandon()  # idempotent
    assert open_fds() == before
    with pytest.raises(LogClosedError):
        fill(log, 1)
    again = Log.open(tmp_path, LogConfig(segment_bytes=4096))
    try:
        # What was written before survives; what was only kept back was never written.
        assert again.last_index == len(written)
        got = again.read_entries(1, 1 << 30)
        assert got == b"".join(written)
        assert kept_back
    finally:
        again.close()
