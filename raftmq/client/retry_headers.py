"""The retry and dead-letter headers, where clients have always imported them from: they
live in raftmq.format.retry_headers, since partition leaders write dead letters too (a
share group's archived records) and the broker may not import the client."""

from raftmq.format.retry_headers import *  # noqa: F403
