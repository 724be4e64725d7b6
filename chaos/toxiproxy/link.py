"""One proxied connection: two one-way pipes that run chunks through toxics.

Each direction has a reader task (socket -> bounded queue, stamping chunks on
arrival) and a processor task (queue -> toxic chain -> socket).  Splitting the
two lets a latency toxic delay chunks in parallel: the reader keeps stamping
new chunks while the processor waits for the oldest one's deadline.

Memory is bounded by the queue (chunk count and bytes) plus the asyncio write
buffer, which the processor drains before taking the next chunk; when the
queue is full the reader stops reading and TCP pushes back on the sender.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterable

from chaos.toxiproxy.addresses import split_host_port
from chaos.toxiproxy.toxics import DOWNSTREAM, UPSTREAM, Chunk, Item, Toxic, ToxicState

log = logging.getLogger("chaos.toxiproxy.link")

READ_SIZE = 32 * 1024  # what Go reads per call
QUEUE_MAX_CHUNKS = 1024  # the Go server buffers up to 1024 chunks per latency toxic
QUEUE_MAX_BYTES = 4 * 1024 * 1024
WRITE_HIGH_WATER = 256 * 1024
DIAL_TIMEOUT = 10.0
# A gracefully closed socket whose peer never reads would keep its write
# buffer forever; give it this long to flush, then drop it.
CLOSE_FLUSH_GRACE = 30.0


class ChunkQueue:
    """A single-producer, single-consumer queue bounded in chunks and bytes.

    ``finish`` appends end-of-stream without waiting for room, so a reader can
    always report EOF; ``discard`` turns later puts into no-ops once nobody
    will consume them, so a reader can never block forever.
    """

    def __init__(
        self, max_chunks: int = QUEUE_MAX_CHUNKS, max_bytes: int = QUEUE_MAX_BYTES
    ) -> None:
        self._items: deque[Chunk] = deque()
        self._bytes = 0
        self._max_chunks = max_chunks
        self._max_bytes = max_bytes
        self._finished = False
        self._discarding = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def _full(self) -> bool:
        if not self._items:
            return False
        return len(self._items) >= self._max_chunks or self._bytes >= self._max_bytes

    async def put(self, chunk: Chunk) -> None:
        """Append a chunk, waiting while the queue is full."""
        while self._full() and not self._discarding:
            self._writable.clear()
            await self._writable.wait()
        if self._discarding or self._finished:
            return
        self._items.append(chunk)
        self._bytes += len(chunk.data)
        self._readable.set()

    def finish(self) -> None:
        """Mark end of stream; ``get`` returns None once the queue is drained."""
        self._finished = True
        self._readable.set()

    def discard(self) -> None:
        """Drop everything queued and make future puts no-ops."""
        self._discarding = True
        self._items.clear()
        self._bytes = 0
        self._writable.set()

    async def get(self) -> Item:
        """Take the oldest chunk, or None at end of stream."""
        while not self._items:
            if self._finished:
                return None
            self._readable.clear()
            await self._readable.wait()
        chunk = self._items.popleft()
        self._bytes -= len(chunk.data)
        if not self._full():
            self._writable.set()
        return chunk


def _force_close(writer: asyncio.StreamWriter, reset: bool) -> None:
    """Close a socket now; with ``reset`` the kernel sends RST instead of FIN."""
    transport = writer.transport
    if reset:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class Pipe:
    """One direction of a connection, with its own state for every toxic."""

    def __init__(
        self,
        conn: Connection,
        direction: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rng: random.Random,
    ) -> None:
        self.conn = conn
        self.direction = direction
        self.reader = reader
        self.writer = writer
        self.rng = rng
        self.queue = ChunkQueue()
        self.chain: list[ToxicState] = []
        self.peer_done = False
        self.finished = False
        self._next_seq = 0
        self._waiters: set[asyncio.Future[None]] = set()

    # -- PipeHost interface used by toxics ---------------------------------

    def now(self) -> float:
        """Event-loop time, the clock chunk stamps use."""
        return asyncio.get_running_loop().time()

    async def wait_until(self, deadline: float | None) -> None:
        """Sleep until ``deadline`` or until :meth:`notify` wakes every waiter."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        handle = None
        if deadline is not None:
            handle = loop.call_at(deadline, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiters.discard(waiter)
            if handle is not None:
                handle.cancel()

    def close_connection(self) -> None:
        """Close both sockets with FIN (timeout toxic)."""
        self.conn.close()

    def reset_connection(self) -> None:
        """Close both sockets with RST (reset_peer toxic)."""
        self.conn.reset()

    # -- chain management --------------------------------------------------

    def notify(self) -> None:
        """Wake toxics that are waiting so they re-read their configuration."""
        for waiter in list(self._waiters):
            _wake(waiter)

    def _roll(self, state: ToxicState) -> None:
        state.active = self.rng.random() < state.toxic.toxicity
        # A pipe that already closed its destination must not start timers
        # (a timeout toxic would otherwise close the still-open other half).
        if state.active and not self.finished:
            state.toxic.kind.on_activate(self, state)

    def attach(self, toxic: Toxic) -> None:
        """Add a toxic at the end of this direction's chain."""
        state = ToxicState(toxic, self._next_seq)
        self._next_seq += 1
        self.chain.append(state)
        self._roll(state)
        self.notify()

    def _find(self, toxic: Toxic) -> ToxicState | None:
        for state in self.chain:
            if state.toxic is toxic:
                return state
        return None

    def update(self, toxic: Toxic) -> None:
        """Apply new attributes/toxicity: deactivate, roll again, reactivate."""
        state = self._find(toxic)
        if state is None:
            return
        if state.active:
            state.active = False
            toxic.kind.on_deactivate(self, state, removed=False)
        self._roll(state)
        self.notify()

    def detach(self, toxic: Toxic) -> None:
        """Remove a toxic; whatever it holds is released by the woken waiter."""
        state = self._find(toxic)
        if state is None:
            return
        self.chain.remove(state)
        was_active = state.active
        state.removed = True
        if was_active:
            toxic.kind.on_deactivate(self, state, removed=True)
        self.notify()

    def shutdown(self) -> None:
        """Forget toxic timers; used when the connection is torn down."""
        for state in self.chain:
            state.cancel_timer()
        self.queue.discard()
        self.notify()

    # -- data path ---------------------------------------------------------

    async def read_loop(self) -> None:
        """Socket -> queue.  Errors count as end of stream, as in Go."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(READ_SIZE)
                if not data:
                    break
                await self.queue.put(Chunk(data, loop.time()))
        except (ConnectionError, OSError):
            pass
        finally:
            self.queue.finish()

    async def process_loop(self) -> None:
        """Queue -> toxics -> socket until end of stream has been delivered."""
        while not self.finished:
            item = await self.queue.get()
            await self._push(-1, item)
            if item is None:
                break
        if not self.finished:
            self._finish()

    def _next_state(self, after_seq: int) -> ToxicState | None:
        for state in self.chain:
            if state.seq > after_seq:
                return state
        return None

    async def _push(self, after_seq: int, item: Item) -> None:
        """Hand ``item`` to the first toxic after ``after_seq``, or to the socket."""
        if self.finished:
            return
        state = self._next_state(after_seq)
        if state is None:
            await self._deliver(item)
        elif not state.active:
            await self._push(state.seq, item)
        else:

            async def emit(next_item: Item, seq: int = state.seq) -> None:
                await self._push(seq, next_item)

            await state.toxic.kind.handle(self, state, item, emit)

    async def _deliver(self, item: Item) -> None:
        if item is None:
            self._finish()
            return
        transport = self.writer.transport
        if transport.is_closing():
            return
        try:
            self.writer.write(item.data)
            await self.writer.drain()
        except (ConnectionError, OSError):
            self._finish()

    def _finish(self) -> None:
        """Close the destination fully (after flushing); the peer pipe then ends."""
        if self.finished:
            return
        self.finished = True
        self.queue.discard()
        for state in self.chain:
            state.cancel_timer()
        transport = self.writer.transport
        if not transport.is_closing():
            transport.close()
            if transport.get_write_buffer_size() > 0:
                asyncio.get_running_loop().call_later(CLOSE_FLUSH_GRACE, transport.abort)
        self.conn.pipe_finished(self)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Connection:
    """A client connection accepted by a proxy and the upstream socket it dialled."""

    def __init__(
        self,
        upstream: str,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        toxics: Callable[[], Iterable[Toxic]],
        rng: random.Random,
        on_done: Callable[[Connection], None],
    ) -> None:
        self.upstream = upstream
        self.client_reader = client_reader
        self.client_writer = client_writer
        self._toxics = toxics
        self._rng = rng
        self._on_done = on_done
        self.server_writer: asyncio.StreamWriter | None = None
        self.pipes: dict[str, Pipe] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the connection in its own task so that it can be cancelled."""
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            host, port = split_host_port(self.upstream)
            host = host.strip("[]") or "127.0.0.1"
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=READ_SIZE * 2), DIAL_TIMEOUT
            )
        except (OSError, ValueError, TimeoutError) as exc:
            log.info("dial upstream %s failed: %s", self.upstream, exc)
            return None

    async def _run(self) -> None:
        try:
            dialled = await self._dial()
            if dialled is None or self._closed:
                if dialled is not None:
                    dialled[1].transport.abort()
                return
            server_reader, server_writer = dialled
            self.server_writer = server_writer
            server_writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
            self.client_writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
            up = Pipe(self, UPSTREAM, self.client_reader, server_writer, self._rng)
            down = Pipe(self, DOWNSTREAM, server_reader, self.client_writer, self._rng)
            self.pipes = {UPSTREAM: up, DOWNSTREAM: down}
            for toxic in self._toxics():
                self.pipes[toxic.stream].attach(toxic)
            loop = asyncio.get_running_loop()
            self._tasks = [
                loop.create_task(up.read_loop()),
                loop.create_task(up.process_loop()),
                loop.create_task(down.read_loop()),
                loop.create_task(down.process_loop()),
            ]
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self._teardown("done")
            self._on_done(self)

    def pipe_finished(self, pipe: Pipe) -> None:
        """One direction closed its destination; let the other one stop holding."""
        for other in self.pipes.values():
            if other is not pipe:
                other.peer_done = True
                other.notify()

    def _teardown(self, mode: str) -> None:
        """Stop every task and close the sockets.

        ``mode`` is "done" after both pipes ended on their own (sockets that are
        still flushing a graceful close are left to finish), "abort" to drop
        everything with FIN, or "reset" to drop everything with RST.
        """
        self._closed = True
        for pipe in self.pipes.values():
            pipe.shutdown()
        # Cancelling includes the calling task when a toxic (reset_peer) tears
        # the connection down from inside a pipe: it stops at its next await.
        for task in self._tasks:
            task.cancel()
        for writer in (self.client_writer, self.server_writer):
            if writer is None:
                continue
            if mode != "done" or not writer.transport.is_closing():
                _force_close(writer, reset=mode == "reset")

    def attach(self, toxic: Toxic) -> None:
        """Start applying a newly added toxic to this live connection."""
        pipe = self.pipes.get(toxic.stream)
        if pipe is not None and not self._closed:
            pipe.attach(toxic)

    def update(self, toxic: Toxic) -> None:
        """Apply an updated toxic to this live connection."""
        pipe = self.pipes.get(toxic.stream)
        if pipe is not None and not self._closed:
            pipe.update(toxic)

    def detach(self, toxic: Toxic) -> None:
        """Stop applying a removed toxic to this live connection."""
        pipe = self.pipes.get(toxic.stream)
        if pipe is not None and not self._closed:
            pipe.detach(toxic)

    def abort(self) -> None:
        """Drop the connection at once (proxy disabled, deleted or server stopping)."""
        self._teardown("abort")
        if self.task is not None:
            self.task.cancel()

    def close(self) -> None:
        """Close both sockets with FIN, discarding whatever toxics hold."""
        if not self._closed:
            self._teardown("abort")

    def reset(self) -> None:
        """Close both sockets with RST so the peers see ECONNRESET."""
        self._teardown("reset")
