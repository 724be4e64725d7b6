"""The network transport: one TCP connection per pair of processes, carrying every group
they share in both directions.

The lower node id dials (through whatever address it was given, e.g. a toxiproxy listener),
the higher one accepts. Each side speaks HELLO first, so a connection routed to the wrong
process is refused. Outgoing messages wait in two bounded queues per peer (urgent first);
a full queue drops bulk messages and tells the driver, because Raft retransmits and an
unbounded queue would only turn a slow peer into an out-of-memory broker. A per-pair ping
detects a dead or partitioned peer within ``dead_after_s`` seconds, which is what lets the
driver stop ticking idle groups without risking a stuck follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from raftmq import net
from raftmq.raft.host import wire
from raftmq.raft.host.transport import Handler, Outgoing
from raftmq.tasks import stop_task

log = logging.getLogger(__name__)

FRAME_TARGET_BYTES = 256 * 1024
"""Bulk messages packed per frame: small enough that an urgent message waits at most one."""
CONNECT_TIMEOUT_S = 2.0
DIAL_BACKOFF_FIRST_S = 0.05
"""After a failed dial the next waits this long (jittered), then twice as long..."""
DIAL_BACKOFF_MAX_S = 1.0
"""...up to this: a peer that comes back is reached within about a second."""
CONNECTED_POLL_S = 0.05
"""How often a dialler with a live connection looks whether it was lost."""

HELLO_TIMEOUT_S = 5.0
"""How long a new connection may take to say HELLO before it is closed. Only a greeted
connection is pinged (and closed when silent), so without this a connection through a
hung link (a proxy that accepted and passes nothing) held its descriptor for good on both
sides, and the dialler never dialled again."""

UNREACHABLE_EVERY_S = 0.25
"""How often at most a peer's dropped messages are reported to the host (:meth:`_drop`)."""


@dataclass
class _Peer:
    node_id: int
    address: tuple[str, int] | None
    urgent: deque[tuple[str, Outgoing]] = field(default_factory=deque)
    bulk: deque[tuple[str, Outgoing, int]] = field(default_factory=deque)
    bulk_bytes: int = 0
    writer: asyncio.StreamWriter | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_heard_s: float = 0.0
    told_unreachable_s: float = -1e9
    alive: bool = False
    ping_seq: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class TcpTransport:
    def __init__(
        self,
        node_id: int,
        listen: tuple[str, int],
        peers: Mapping[int, tuple[str, int] | None],
        *,
        cluster: str = "raftmq",
        max_queue_bytes: int = 32 * 1024 * 1024,
        ping_interval_s: float = 0.2,
        dead_after_s: float = 1.5,
        security: net.Security = net.PLAINTEXT,
    ) -> None:
        """``security``: TLS for the listener and the dials (raftmq.net); with
        ``require_client_cert`` the nodes authenticate each other by their certificates."""
        assert node_id not in peers, "a node is not its own peer"
        self.node_id = node_id
        self.listen = listen
        self.cluster = cluster
        self.max_queue_bytes = max_queue_bytes
        self.ping_interval_s = ping_interval_s
        self.dead_after_s = dead_after_s
        self.security = security
        self._handler: Handler | None = None
        self._peers = {p: _Peer(p, addr) for p, addr in peers.items()}
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.dropped = 0

    def set_handler(self, handler: Handler) -> None:
        self._handler = handler

    # --- sending ------------------------------------------------------------------------

    def send(self, peer: int, group: str, message: Outgoing, *, urgent: bool) -> None:
        p = self._peers.get(peer)
        if p is None:
            raise KeyError(f"node {peer} is not a peer of node {self.node_id}")
        if urgent:
            # Urgent messages are small and few (one per group per heartbeat at most); the
            # bound protects against a peer that never reads.
            if len(p.urgent) >= 100_000:
                self._drop(p)
                return
            p.urgent.append((group, message))
        else:
            # Appends, snapshots and repair replies carry bytes; a quiesce notice none.
            size = len(getattr(message, "entries", b"")) + len(getattr(message, "data", b""))
            if p.bulk_bytes + size > self.max_queue_bytes:
                self._drop(p)
                return
            p.bulk.append((group, message, size))
            p.bulk_bytes += size
        p.wake.set()

    def _drop(self, p: _Peer) -> None:
        """Count a dropped message and tell the host, at most every
        :data:`UNREACHABLE_EVERY_S` per peer: the host looks at every group it leads with
        that peer (their streaming falls back to probing), and a dead peer of 10,000
        groups made each wake of its writer loop such a pass (18% of a survivor's CPU
        after a broker's death). A message dropped in between is sent again by Raft; a
        group that started streaming to the peer since the last report is told with the
        next drop once the interval has passed."""
        self.dropped += 1
        now_s = time.monotonic()
        if self._handler is not None and now_s - p.told_unreachable_s >= UNREACHABLE_EVERY_S:
            p.told_unreachable_s = now_s
            self._handler.on_unreachable(p.node_id)

    def peer_alive(self, peer: int) -> bool:
        p = self._peers.get(peer)
        return p is not None and p.alive

    async def _writer_loop(self, p: _Peer) -> None:
        while not self._closing:
            await p.wake.wait()
            p.wake.clear()
            writer = p.writer
            if writer is None:
                # No connection: what is queued is stale by the time one exists.
                if p.urgent or p.bulk:
                    p.urgent.clear()
                    p.bulk.clear()
                    p.bulk_bytes = 0
                    self._drop(p)
                continue
            try:
                while p.urgent or p.bulk:
                    self._write_frame(p, writer)
                    await writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                self._disconnect(p, writer)

    def flush(self) -> None:
        """Write what is queued now rather than on the writer tasks' next turn.

        The driver calls it before it blocks on an fsync, so a round's appends are on the
        wire while the disk works; waiting for the writer task would put a whole fsync (and
        a task switch) between a leader's append and its followers. Frames beyond what the
        socket buffer takes stay queued for the writer task, which waits for the socket.
        """
        for p in self._peers.values():
            writer = p.writer
            if writer is None or not (p.urgent or p.bulk):
                continue
            try:
                while (p.urgent or p.bulk) and (
                    writer.transport.get_write_buffer_size() < FRAME_TARGET_BYTES
                ):
                    self._write_frame(p, writer)
            except (ConnectionError, OSError, RuntimeError):
                self._disconnect(p, writer)

    @staticmethod
    def _write_frame(p: _Peer, writer: asyncio.StreamWriter) -> None:
        """One frame: every urgent message, then bulk ones up to the frame target."""
        batch: list[tuple[str, Outgoing]] = list(p.urgent)
        p.urgent.clear()
        budget = FRAME_TARGET_BYTES
        while p.bulk and (budget > 0 or not batch):
            group, m, size = p.bulk.popleft()
            p.bulk_bytes -= size
            budget -= size
            batch.append((group, m))
        writer.write(wire.encode_messages(batch))

    # --- connections --------------------------------------------------------------------

    async def start(self) -> None:
        # reuse_port: a local cluster's launcher holds this port reserved for the broker's
        # lifetime (raftmq.devtools.ports); port 0 binds any, see :attr:`port`.
        self._server = await net.serve_tcp(
            self._accept, self.listen[0], self.listen[1], reuse_port=True, security=self.security
        )
        for p in self._peers.values():
            self._start_peer(p)
        self._tasks.append(asyncio.get_running_loop().create_task(self._ping_loop()))

    @property
    def port(self) -> int:
        """The port the listener got (the one asked for, or the kernel's pick for 0)."""
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def set_peer_address(self, peer: int, address: tuple[str, int]) -> None:
        """Where to dial ``peer``, for peers given no address (None) at construction:
        nodes in one process each bind port 0, start, and only then learn the others'."""
        self._peers[peer].address = address

    def add_peer(self, peer: int, address: tuple[str, int]) -> bool:
        """Learn a peer at runtime (a broker that registered with the controller after this
        one started); True if it was new. A known peer keeps its address: one given at
        construction may be a proxy the operator chose (the chaos harness's)."""
        if peer == self.node_id or peer in self._peers:
            return False
        p = self._peers[peer] = _Peer(peer, address)
        if self._server is not None and not self._closing:
            self._start_peer(p)
        return True

    def _start_peer(self, p: _Peer) -> None:
        loop = asyncio.get_running_loop()
        p.last_heard_s = time.monotonic()
        self._tasks.append(loop.create_task(self._writer_loop(p)))
        if self.node_id < p.node_id:
            self._tasks.append(loop.create_task(self._dial_loop(p)))

    async def _dial_loop(self, p: _Peer) -> None:
        backoff_s = DIAL_BACKOFF_FIRST_S
        while not self._closing:
            if p.writer is not None or p.address is None:
                await asyncio.sleep(CONNECTED_POLL_S)
                continue
            try:
                reader, writer = await asyncio.wait_for(
                    net.connect_tcp(p.address[0], p.address[1], security=self.security),
                    timeout=CONNECT_TIMEOUT_S,
                )
            except (OSError, TimeoutError):
                await asyncio.sleep(backoff_s * (0.5 + random.random()))
                backoff_s = min(backoff_s * 2, DIAL_BACKOFF_MAX_S)
                continue
            backoff_s = DIAL_BACKOFF_FIRST_S
            writer.write(wire.hello(self.node_id, self.cluster))
            await self._serve(p.node_id, reader, writer)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(wire.hello(self.node_id, self.cluster))
            await self._serve(None, reader, writer)
        except asyncio.CancelledError:
            # The process is stopping (asyncio.run cancels what is left). Ending quietly
            # matters: asyncio's own callback reads a cancelled handler's exception and
            # logged a traceback per inbound connection at every broker stop.
            writer.close()
        except Exception:  # pragma: no cover - logged, the connection is simply gone
            log.exception("node %d: inbound connection failed", self.node_id)

    async def _serve(
        self, expected: int | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read frames until the connection ends; the first must be the peer's HELLO."""
        buf = bytearray()
        peer: _Peer | None = None
        try:
            while not self._closing:
                if peer is None:
                    chunk = await asyncio.wait_for(reader.read(1 << 20), HELLO_TIMEOUT_S)
                else:
                    chunk = await reader.read(1 << 20)
                if not chunk:
                    break
                if buf:
                    buf += chunk
                    bodies: list[bytes] | list[memoryview] = wire.split_frames(buf)
                else:  # the usual case: decoded where they arrived, the rest kept
                    bodies, used = wire.frames_in(chunk)
                    buf += memoryview(chunk)[used:]
                for body in bodies:
                    kind, payload = wire.decode_body(body)
                    if peer is None:
                        peer = self._greet(expected, kind, payload, writer)
                        if peer is None:
                            return
                        continue
                    self._heard(peer)
                    if kind == wire.KIND_MESSAGES and self._handler is not None:
                        self._handler.on_messages(peer.node_id, payload)  # type: ignore[arg-type]
                    elif kind == wire.KIND_PING:
                        writer.write(wire.ping(wire.KIND_PONG, payload))  # type: ignore[arg-type]
        except (
            ConnectionError,
            OSError,
            TimeoutError,
            wire.FrameError,
            asyncio.IncompleteReadError,
        ) as exc:
            log.debug("node %d: connection to %s ended: %r", self.node_id, expected, exc)
        finally:
            if peer is not None:
                self._disconnect(peer, writer)
            else:
                writer.close()

    def _greet(
        self, expected: int | None, kind: int, payload: object, writer: asyncio.StreamWriter
    ) -> _Peer | None:
        if kind != wire.KIND_HELLO:
            log.warning("node %d: connection did not start with HELLO", self.node_id)
            return None
        assert isinstance(payload, tuple), "wire.decode gives HELLO as (node, cluster)"
        node, cluster = payload
        if cluster != self.cluster or node not in self._peers:
            log.warning("node %d: refused node %s of cluster %r", self.node_id, node, cluster)
            return None
        if expected is not None and node != expected:
            log.warning("node %d: dialed %d but node %d answered", self.node_id, expected, node)
            return None
        p = self._peers[node]
        if p.writer is not None and p.writer is not writer:
            p.writer.close()  # a newer connection replaces a half-dead one
        p.writer = writer
        was_alive = p.alive
        self._heard(p)
        if was_alive and self._handler is not None:
            # A new connection may be a new process of the peer, restarted sooner than
            # dead_after_s: tell the driver as for a peer that came back, so the groups
            # it shares wake. A quiesced leader otherwise never learns that a follower
            # restarted, and one that lost its state (rejoining: it never campaigns,
            # so it sends nothing) waited for a heartbeat that never came.
            self._handler.on_peer_state(node, True)
        p.wake.set()
        return p

    def _heard(self, p: _Peer) -> None:
        p.last_heard_s = time.monotonic()
        if not p.alive:
            p.alive = True
            if self._handler is not None:
                self._handler.on_peer_state(p.node_id, True)

    def _disconnect(self, p: _Peer, writer: asyncio.StreamWriter) -> None:
        if p.writer is writer:
            p.writer = None
            p.wake.set()  # the writer loop drops what is queued
        writer.close()

    async def _ping_loop(self) -> None:
        """Ping every connected peer each ``ping_interval_s``; call a peer dead when
        nothing came from it for ``dead_after_s`` of this loop's own time.

        A wake-up later than the interval means this process's loop was held up: what
        the peers sent meanwhile waits unread in the socket, so the lateness is credited
        to every peer's silence instead of counted against it. Without that, a broker
        busy for 1.5 s (opening thousands of replicas) called its live peers dead, woke
        every quiesced group it shared with them and reconnected, and the heartbeats
        of the woken groups made it busier still."""
        while not self._closing:
            woke_s = time.monotonic() + self.ping_interval_s
            await asyncio.sleep(self.ping_interval_s)
            now_s = time.monotonic()
            late_s = now_s - woke_s
            if late_s > self.ping_interval_s:
                for p in self._peers.values():
                    p.last_heard_s = min(now_s, p.last_heard_s + late_s)
            for p in self._peers.values():
                if p.writer is not None:
                    p.ping_seq += 1
                    try:
                        p.writer.write(wire.ping(wire.KIND_PING, p.ping_seq))
                    except (ConnectionError, RuntimeError):
                        self._disconnect(p, p.writer)
                if p.alive and now_s - p.last_heard_s > self.dead_after_s:
                    p.alive = False
                    if p.writer is not None:
                        self._disconnect(p, p.writer)  # silent: force a fresh connection
                    if self._handler is not None:
                        self._handler.on_peer_state(p.node_id, False)

    async def close(self) -> None:
        self._closing = True
        for p in self._peers.values():
            p.wake.set()
            if p.writer is not None:
                p.writer.close()
                p.writer = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await stop_task(task)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
