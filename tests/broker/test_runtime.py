"""The broker's runtime settings take effect where they can."""

from __future__ import annotations

import gc
import platform

import pytest

from raftmq.broker.runtime import GC_THRESHOLDS, tune_gc, tune_malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_malloc_settings_are_accepted_by_glibc() -> None:
    assert tune_malloc() is True


def test_gc_settings_apply_and_freeze_startup_objects() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
