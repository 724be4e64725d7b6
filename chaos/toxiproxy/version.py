"""The version string reported by ``GET /version`` and ``-version``.

It claims the Go server's API level (2.12.0) so that clients doing feature
detection treat us like that release, and carries ``+raftmq`` build metadata so
that a human can still tell the two servers apart.
"""

SERVER_VERSION = "2.12.0+raftmq"
