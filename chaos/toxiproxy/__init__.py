"""A toxiproxy 2.x compatible chaos proxy written in asyncio.

The Go ``toxiproxy-server`` is not always installable where raftmq's chaos tests
run, so this package speaks the same HTTP API (enough for ``toxiproxy-python``
and for hand-written ``curl`` calls) and injects the same network faults.  See
``docs/toxiproxy.md`` for what is implemented and where it differs.
"""

from chaos.toxiproxy.version import SERVER_VERSION

__all__ = ["SERVER_VERSION"]
