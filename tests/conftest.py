"""Suite-wide collection rules for running the tests side by side (pytest-xdist,
``--dist loadgroup``, set in pyproject's addopts).

Most tests wait on broker processes, not on the CPU, so several workers finish the suite
sooner. Tests of one file that share a module- or session-scoped fixture of ours (a shared
3-broker cluster, the Spark session, the toxiproxy server) are kept on one worker, so that
fixture starts once, as it does in a serial run. Every other test is its own unit of work,
so a file of long CPU-bound tests (the Raft simulations, the property tests) spreads over
all workers. A test or file marked ``xdist_group`` keeps its own group (``timing``: tests
whose verdict depends on how promptly they are scheduled run one after another)."""

from __future__ import annotations

import pytest

SHARED_SCOPES = ("module", "package", "session")


def _shares_a_fixture_of_ours(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            ours = getattr(fixturedef.func, "__module__", "").startswith("tests.")
            if ours and fixturedef.scope in SHARED_SCOPES:
                return True
    return False


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as each test is collected: pytest-xdist reads the groups in its
    pytest_collection_modifyitems, which may run before a conftest's."""
    if item.get_closest_marker("xdist_group") is None and _shares_a_fixture_of_ours(item):
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
