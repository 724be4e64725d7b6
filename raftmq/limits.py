"""Bounds of the raftmq.v1 protocol that both ends check: a client before it sends (so a
mistake fails at once, with the client's own words), the server when it receives (so no
other client gets past them).

Why a top-level helper: the client may import only api, format and these helpers, and the
partition and controller floors sit below api (tests/test_layers.py), while a bound written
twice drifts. Beside raftmq.tasks and raftmq.net every floor may import it, so there is one
definition of each. Plain values only: it imports no raftmq package and no gRPC.
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

CLIENT_ID_HEADER = "raftmq-client-id"
"""The gRPC metadata key that carries a client's id (Kafka's ``client.id``) on every call:
quotas may be set per client id (docs/quotas.md)."""
CLIENT_ID = re.compile(r"\A[\x20-\x7e]{1,255}\Z")
"""A client id: 1-255 printable ASCII characters (what gRPC metadata may carry)."""

TOPIC_NAME_CHARS = 200
"""The longest topic name (raftmq.controller.metadata.TOPIC_NAME): also what the client
checks the names it derives against (the retry and dead-letter topics)."""
