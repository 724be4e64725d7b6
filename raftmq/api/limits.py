"""Bounds of the raftmq.v1 protocol that both ends check: a client before it sends (so a
mistake fails at once, with the client's own words), the server when it receives (so no
other client gets past them).

Why here, at the api floor: the client may import only api and format (tests/test_layers.py),
and a bound written twice drifts. The server's packages import these too, so there is one
definition of each. Plain values only: importing this loads no gRPC and no server code.
"""

from __future__ import annotations

import re

RACK = re.compile(r"\A[A-Za-z0-9._-]{1,64}\Z")
"""A rack name: a broker's (RegisterBroker) and a consumer's ``client_rack``, which picks
the in-rack replica to read from."""

MAX_OFFSET_METADATA_CHARS = 4096
"""The free text a consumer group keeps beside each committed offset, at most."""

KEPT_BATCHES = 5
"""The batches a partition remembers per idempotent producer (raftmq.partition.producer_state),
so a resent batch among them is recognised as a duplicate. A producer keeps at most this many
in flight per partition: any more and a resent one could be forgotten and stored twice."""
