"""The share of a broker's open-file limit it gives to client connections: bounded under
a low limit (so connections cannot take the descriptors persists need), never below a
floor, and no cap at all where the limit is unlimited or huge."""

from __future__ import annotations

import resource

from raftmq.broker.open_files import MIN_CONNECTIONS, connection_cap
from raftmq.log.handles import cap_for_limit


def test_connections_get_half_of_what_segment_files_leave() -> None:
    assert connection_cap(128) == (128 - cap_for_limit(128)) // 2 == 48
    assert connection_cap(1024) == (1024 - cap_for_limit(1024)) // 2
    assert connection_cap(1024) + cap_for_limit(1024) < 1024


def test_a_tiny_limit_still_admits_the_floor() -> None:
    assert connection_cap(20) == MIN_CONNECTIONS


def test_an_unlimited_limit_sets_no_cap() -> None:
    assert connection_cap(resource.RLIM_INFINITY) is None
    assert connection_cap(1 << 40) is None
