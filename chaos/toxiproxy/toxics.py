"""Toxic types: their attributes and what each one does to one direction of a link.

A *toxic* is configuration owned by a proxy (:class:`Toxic`).  Every open
connection keeps, per direction, one :class:`ToxicState` per toxic: the
toxicity roll and any counters live there, so that attribute updates apply to
live connections without resetting, say, the ``limit_data`` byte count.

The behaviour of a type lives in a :class:`ToxicKind`.  Chunks are *pushed*
through the chain: a kind receives an item and calls ``emit`` zero or more times
to hand data to the next toxic.  Waiting is always done through
:meth:`PipeHost.wait_until`, which returns early whenever the chain changes, so
that removing or updating a toxic takes effect on data it is already holding.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from chaos.toxiproxy.errors import ApiError

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
STREAMS = (UPSTREAM, DOWNSTREAM)


@dataclass
class Chunk:
    """Bytes read in one go, stamped with when they arrived.

    Delays are computed from the stamp rather than from when a toxic sees the
    chunk, so consecutive chunks are delayed in parallel (pipelined), not one
    after another.
    """

    data: bytes
    stamp: float


# ``None`` marks end of stream: it travels through the chain like data so that
# toxics such as ``slow_close`` and ``reset_peer`` can react to it in order.
Item = Chunk | None
Emit = Callable[[Item], Awaitable[None]]


class PipeHost(Protocol):
    """What a toxic may ask of the direction of a connection it acts on."""

    rng: random.Random
    peer_done: bool

    def now(self) -> float:
        """Event-loop time, the clock chunk stamps use."""
        ...

    async def wait_until(self, deadline: float | None) -> None:
        """Sleep until ``deadline`` (forever if None) or until the chain changes."""
        ...

    def close_connection(self) -> None:
        """Close both sockets of the connection with a normal FIN."""
        ...

    def reset_connection(self) -> None:
        """Close both sockets abortively so the peers see RST."""
        ...


class ToxicState:
    """One toxic's per-connection, per-direction runtime state."""

    def __init__(self, toxic: Toxic, seq: int) -> None:
        self.toxic = toxic
        # Position in the chain; toxics are only ever appended, so "the next
        # toxic after seq" stays well defined while toxics come and go.
        self.seq = seq
        self.active = False
        self.removed = False
        self.count = 0  # limit_data: bytes passed so far
        self.credit = 0.0  # bandwidth: oversleep (negative) to give back
        self.timer: asyncio.TimerHandle | None = None  # timeout: close timer

    @property
    def live(self) -> bool:
        """Whether the toxic still acts on this pipe right now."""
        return self.active and not self.removed

    def cancel_timer(self) -> None:
        """Stop a pending close timer, if any."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class ToxicKind:
    """Behaviour shared by every toxic of one type; the default passes data on."""

    type_name = "noop"
    attribute_names: tuple[str, ...] = ()

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        """Process one item; the default hands it on unchanged."""
        await emit(item)

    def on_activate(self, host: PipeHost, state: ToxicState) -> None:
        """Called when the toxic starts acting on a pipe (attach or re-roll)."""

    def on_deactivate(self, host: PipeHost, state: ToxicState, removed: bool) -> None:
        """Called when an active toxic stops acting on a pipe."""


class NoopKind(ToxicKind):
    """Passes data unchanged; useful to test the API and chain bookkeeping."""

    type_name = "noop"


class LatencyKind(ToxicKind):
    """Delays each chunk to ``arrival + latency ± jitter`` milliseconds."""

    type_name = "latency"
    attribute_names = ("latency", "jitter")

    def _draw(self, host: PipeHost, attrs: dict[str, int]) -> float:
        jitter = attrs["jitter"]
        extra = host.rng.randrange(-jitter, jitter) if jitter > 0 else 0
        return max(0, attrs["latency"] + extra) / 1000.0

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        if item is None:
            await emit(None)
            return
        version = state.toxic.version
        delay = self._draw(host, state.toxic.attributes)
        deadline = item.stamp + delay
        while state.live and host.now() < deadline:
            await host.wait_until(deadline)
            if state.toxic.version != version:
                # Updated while holding: honour the new latency for this chunk too.
                version = state.toxic.version
                delay = self._draw(host, state.toxic.attributes)
                deadline = item.stamp + delay
        # Later toxics measure from when this one released the chunk, which is
        # what makes several latency toxics in one direction add up.
        item.stamp = min(host.now(), deadline)
        await emit(item)


class BandwidthKind(ToxicKind):
    """Caps throughput at ``rate`` KB/s (KB = 1000 bytes); rate <= 0 stalls."""

    type_name = "bandwidth"
    attribute_names = ("rate",)

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        if item is None:
            await emit(None)
            return
        remaining = item.data
        while remaining:
            if not state.live:
                break
            rate = state.toxic.attributes["rate"]
            if rate <= 0:
                # The Go server never delivers with rate 0; people use it as a
                # stall, released by removing or updating the toxic.
                if host.peer_done:
                    return
                await host.wait_until(None)
                continue
            piece = remaining[: rate * 100]
            deadline = host.now() + len(piece) / (rate * 1000.0) + state.credit
            version = state.toxic.version
            # Wake-ups from unrelated chain changes must not release data early.
            while state.live and state.toxic.version == version and host.now() < deadline:
                await host.wait_until(deadline)
            if state.toxic.version != version or not state.live:
                continue  # recompute with the new rate, or flush below
            # Sleeping too long is credited back on the next piece, so timer
            # granularity does not lower the effective rate.
            state.credit = max(-1.0, min(0.0, deadline - host.now()))
            remaining = remaining[len(piece) :]
            await emit(Chunk(piece, item.stamp))
        if remaining:
            await emit(Chunk(remaining, item.stamp))


class SlowCloseKind(ToxicKind):
    """Holds back the end-of-stream close by ``delay`` milliseconds."""

    type_name = "slow_close"
    attribute_names = ("delay",)

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        if item is None:
            start = host.now()
            while state.live:
                deadline = start + state.toxic.attributes["delay"] / 1000.0
                if host.now() >= deadline:
                    break
                await host.wait_until(deadline)
        await emit(item)


class TimeoutKind(ToxicKind):
    """Drops all data; closes the connection ``timeout`` ms after the last drop.

    ``timeout`` 0 means hold the connection open forever.  Removing the toxic
    closes every connection it was active on, because the stream has lost data
    and cannot be trusted any more.
    """

    type_name = "timeout"
    attribute_names = ("timeout",)

    def _arm(self, host: PipeHost, state: ToxicState) -> None:
        state.cancel_timer()
        timeout = state.toxic.attributes["timeout"]
        if timeout > 0:
            loop = asyncio.get_running_loop()
            state.timer = loop.call_later(timeout / 1000.0, host.close_connection)

    def on_activate(self, host: PipeHost, state: ToxicState) -> None:
        self._arm(host, state)

    def on_deactivate(self, host: PipeHost, state: ToxicState, removed: bool) -> None:
        state.cancel_timer()
        if removed:
            host.close_connection()

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        if item is None:
            state.cancel_timer()
            await emit(None)
            return
        self._arm(host, state)  # data is dropped; the timer restarts


class ResetPeerKind(ToxicKind):
    """On the first chunk (or EOF) waits ``timeout`` ms, then resets both sockets."""

    type_name = "reset_peer"
    attribute_names = ("timeout",)

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        # The triggering data is dropped and, once triggered, the reset happens
        # even if the toxic is removed meanwhile (the data is already gone).
        timeout = state.toxic.attributes["timeout"]
        if timeout > 0:
            await asyncio.sleep(timeout / 1000.0)
        host.reset_connection()


class SlicerKind(ToxicKind):
    """Splits chunks into smaller pieces, ``delay`` microseconds apart."""

    type_name = "slicer"
    attribute_names = ("average_size", "size_variation", "delay")

    @staticmethod
    def split_points(size: int, average: int, variation: int, rng: random.Random) -> list[int]:
        """End offsets of the pieces a chunk of ``size`` bytes is cut into.

        Bisects around the midpoint (moved by up to ``variation``) until a
        piece is no larger than ``average + variation``.
        """
        if average <= 0:
            return [size]
        variation = max(0, min(variation, average - 1))
        limit = average + variation
        ends: list[int] = []
        stack = [(0, size)]
        while stack:
            start, end = stack.pop()
            if end - start <= limit:
                ends.append(end)
                continue
            mid = start + (end - start) // 2
            if variation > 0:
                mid += rng.randrange(-variation, variation)
            mid = max(start + 1, min(end - 1, mid))
            stack.append((mid, end))
            stack.append((start, mid))
        return ends

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        if item is None:
            await emit(None)
            return
        attrs = state.toxic.attributes
        ends = self.split_points(
            len(item.data), attrs["average_size"], attrs["size_variation"], host.rng
        )
        start = 0
        for end in ends:
            if not state.live:
                await emit(Chunk(item.data[start:], item.stamp))
                return
            await emit(Chunk(item.data[start:end], item.stamp))
            start = end
            delay = state.toxic.attributes["delay"]
            if delay > 0:
                deadline = host.now() + delay / 1_000_000.0
                while state.live and host.now() < deadline:
                    await host.wait_until(deadline)


class LimitDataKind(ToxicKind):
    """Passes at most ``bytes`` bytes in this direction, then closes the connection."""

    type_name = "limit_data"
    attribute_names = ("bytes",)

    async def handle(self, host: PipeHost, state: ToxicState, item: Item, emit: Emit) -> None:
        if item is None:
            await emit(None)
            return
        allowed = max(0, state.toxic.attributes["bytes"] - state.count)
        piece = item.data[:allowed]
        state.count += len(piece)
        if piece:
            await emit(Chunk(piece, item.stamp))
        if state.count >= state.toxic.attributes["bytes"]:
            # A full close, as in the Go server: the other direction ends too.
            await emit(None)


KINDS: dict[str, ToxicKind] = {
    kind.type_name: kind
    for kind in (
        LatencyKind(),
        BandwidthKind(),
        SlowCloseKind(),
        TimeoutKind(),
        ResetPeerKind(),
        SlicerKind(),
        LimitDataKind(),
        NoopKind(),
    )
}


def _coerce_int(name: str, value: Any) -> int:
    """Turn a JSON attribute into an int, accepting integral floats.

    The Go server rejects 100.5 for integer fields; accepting 100.0 is a
    harmless superset, and reading back integers keeps clients' equality
    checks working.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"bad request body: attribute {name} must be a number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ApiError(400, f"bad request body: attribute {name} must be an integer")
        value = int(value)
    return value


def parse_attributes(kind: ToxicKind, raw: Any) -> dict[str, int]:
    """Validate a (possibly partial) attributes object; unknown keys are ignored."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ApiError(400, "bad request body: attributes must be an object")
    wanted = {name.lower(): name for name in kind.attribute_names}
    parsed: dict[str, int] = {}
    for key, value in raw.items():
        name = wanted.get(str(key).lower())
        if name is not None:
            parsed[name] = _coerce_int(name, value)
    return parsed


class Toxic:
    """A toxic as configured through the API; shared by all connections of a proxy."""

    def __init__(
        self,
        kind: ToxicKind,
        name: str,
        stream: str,
        toxicity: float,
        attributes: dict[str, int],
    ) -> None:
        self.kind = kind
        self.name = name
        self.stream = stream
        self.toxicity = toxicity
        self.attributes = {attr: 0 for attr in kind.attribute_names}
        self.attributes.update(attributes)
        # Bumped on every update so toxics holding a chunk can notice.
        self.version = 0

    def update(self, attributes: dict[str, int], toxicity: float | None) -> None:
        """Merge a partial update; name, type and stream never change."""
        self.attributes.update(attributes)
        if toxicity is not None:
            self.toxicity = toxicity
        self.version += 1

    def to_json(self) -> dict[str, Any]:
        """The API representation of the toxic."""
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.kind.type_name,
            "stream": self.stream,
            "toxicity": self.toxicity,
        }
