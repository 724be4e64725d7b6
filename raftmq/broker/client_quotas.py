"""Client quotas enforced on one broker (docs/quotas.md): a token bucket per caller and
quota type, filled at the quota's rate, drawn by what each call produced, fetched or kept
the event loop busy.

What a caller over quota gets is Kafka's (KIP-219): its call is served in full (nothing
is dropped or refused) and answered at once with ``throttle_time_ms``, the time until its
bucket is back in credit; the client sends nothing more to this broker until then. A
client that ignores it gains nothing: a call of a caller in debt is held here until the
debt is paid before it is served (Kafka mutes the connection the same way). So a client
that honours the throttle never waits twice, and one that does not is held to the rate
all the same.

Who the caller is: the user of its principal (``User:NAME`` gives NAME) and the client
id its calls carry (raftmq.log_records.CallContext, read only when a quota exists). Which
quota applies, and whose bucket it draws, is Kafka's order of precedence
(raftmq.controller.quotas.resolve).

Cost: with no quota in the metadata a call pays one attribute read and a truth test.
Bounded: at most ``max_buckets`` buckets whatever the number of callers; a bucket that
has filled up again is dropped (a new one would be the same), and past the bound the
least recently used goes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

from raftmq.controller.model import ClientQuota, MetadataState
from raftmq.controller.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    Index,
    index,
    resolve,
)
from raftmq.log_records import ANONYMOUS, current_call

T = TypeVar("T")

PRODUCE, FETCH, REQUEST = "produce", "fetch", "request"
KINDS = (PRODUCE, FETCH, REQUEST)
_KEY = {PRODUCE: PRODUCER_BYTE_RATE, FETCH: CONSUMER_BYTE_RATE, REQUEST: REQUEST_PERCENTAGE}
WINDOW_S = 1.0
"""A bucket holds one second of its rate: the burst a caller in credit may send at once,
and what one fetch may return (as Kafka bounds a fetch by the quota's window)."""
MAX_THROTTLE_S = 10.0
"""The longest throttle given or hold made, however deep the debt (a client's requests
must not outwait their deadlines); a deeper debt is paid over the next calls."""
MAX_BUCKETS = 10_000
PRINCIPAL_PREFIX = "User:"


class Bucket:
    """Tokens (bytes, or seconds of the loop's time) at ``rate`` a second, up to a window's
    worth; a call takes what it used even into debt."""

    __slots__ = ("at_s", "rate", "tokens")

    def __init__(self, rate: float, now_s: float) -> None:
        self.rate = rate
        self.tokens = rate * WINDOW_S
        self.at_s = now_s

    def refill(self, now_s: float) -> None:
        self.tokens = min(self.rate * WINDOW_S, self.tokens + (now_s - self.at_s) * self.rate)
        self.at_s = now_s

    def debt_s(self, now_s: float) -> float:
        """How long until the bucket is out of debt (0: in credit)."""
        self.refill(now_s)
        return -self.tokens / self.rate if self.tokens < 0 else 0.0

    def full(self, now_s: float) -> bool:
        self.refill(now_s)
        return self.tokens >= self.rate * WINDOW_S


class ClientQuotas:
    """One broker's enforcement; ``metadata`` gives the newest metadata it applied."""

    def __init__(
        self,
        metadata: Callable[[], MetadataState],
        *,
        clock: Callable[[], float] = time.monotonic,
        max_buckets: int = MAX_BUCKETS,
    ) -> None:
        self._metadata = metadata
        self._clock = clock
        self.max_buckets = max_buckets
        self._seen: tuple[ClientQuota, ...] = ()
        self._index: Index = {}
        self.buckets: OrderedDict[tuple[str, str, str], Bucket] = OrderedDict()
        """(kind, user, client id) -> bucket, least recently used first."""
        self.throttle_s = dict.fromkeys(KINDS, 0.0)
        """Per kind, the throttle time given in answers (a metric)."""
        self.held_s = dict.fromkeys(KINDS, 0.0)
        """Per kind of call, the time calls of callers in debt were held (a metric: a
        client that ignores throttle_time_ms shows here)."""

    def _quotas(self) -> Index | None:
        quotas = self._metadata().client_quotas
        if quotas is not self._seen:
            self._seen, self._index = quotas, index(quotas)
            if not quotas:
                self.buckets.clear()
        return self._index if quotas else None

    def _bucket(self, quotas: Index, kind: str, user: str, client_id: str) -> Bucket | None:
        found = resolve(quotas, _KEY[kind], user, client_id)
        if found is None:
            return None
        value, (share_user, share_client) = found
        rate = value / 100 if kind == REQUEST else float(value)
        key = (kind, share_user, share_client)
        now_s = self._clock()
        bucket = self.buckets.get(key)
        if bucket is None:
            self._make_room(now_s)
            bucket = self.buckets[key] = Bucket(rate, now_s)
        else:
            self.buckets.move_to_end(key)
            if bucket.rate != rate:  # the quota changed: the debt stays, the cap follows
                bucket.refill(now_s)
                bucket.rate = rate
                bucket.tokens = min(bucket.tokens, rate * WINDOW_S)
        return bucket

    def _make_room(self, now_s: float) -> None:
        """Drop the least recently used buckets that filled up again, and past the bound
        the least recently used one whatever its state."""
        while self.buckets:
            key, oldest = next(iter(self.buckets.items()))
            if not oldest.full(now_s) and len(self.buckets) < self.max_buckets:
                return
            del self.buckets[key]

    def fetch_limit_bytes(self, max_bytes: int) -> int:
        """``max_bytes`` of a fetch, lowered to one window of the caller's fetch quota."""
        quotas = self._quotas()
        if quotas is None:
            return max_bytes
        user, client_id = _caller()
        bucket = self._bucket(quotas, FETCH, user, client_id)
        if bucket is None:
            return max_bytes
        return max(1, min(max_bytes, int(bucket.rate * WINDOW_S)))

    async def call(
        self,
        kind: str,
        work: Coroutine[Any, Any, T],
        size: int | Callable[[T], int] = 0,
    ) -> tuple[T, int]:
        """Serve one call of the caller: held first while it is in debt, then ``work``,
        charged with the bytes it moved (PRODUCE and FETCH) and the time it kept the event
        loop busy (a request quota). ``size``: the bytes, known before the work (a
        produce's, charged at once, so that calls arriving meanwhile are held), or computed
        from its result (a fetch's). Returns the result and its throttle_time_ms."""
        quotas = self._quotas()
        if quotas is None:
            return await work, 0
        user, client_id = _caller()
        data = self._bucket(quotas, kind, user, client_id) if kind != REQUEST else None
        busy = self._bucket(quotas, REQUEST, user, client_id)
        if data is None and busy is None:
            return await work, 0
        charged = [(k, b) for k, b in ((kind, data), (REQUEST, busy)) if b is not None]
        now_s = self._clock()
        hold_s = max(b.debt_s(now_s) for _, b in charged)
        if hold_s > 0:
            hold_s = min(hold_s, MAX_THROTTLE_S)
            self.held_s[kind] += hold_s
            try:
                await asyncio.sleep(hold_s)
            except BaseException:  # the client went away while held: the work never ran
                work.close()
                raise
        if data is not None and isinstance(size, int):
            data.tokens -= size
        if busy is None:
            result = await work
        else:
            timed = Timed(work)
            try:
                result = await timed
            finally:
                busy.tokens -= timed.busy_s
        if data is not None and not isinstance(size, int):
            data.tokens -= size(result)
        now_s = self._clock()
        throttle_s = 0.0
        for k, bucket in charged:
            debt_s = min(bucket.debt_s(now_s), MAX_THROTTLE_S)
            self.throttle_s[k] += debt_s
            throttle_s = max(throttle_s, debt_s)
        return result, math.ceil(throttle_s * 1000)


def _caller() -> tuple[str, str]:
    """(user, client id) of the call being served."""
    call = current_call()
    principal = call.principal if call is not None else ANONYMOUS
    return principal.removeprefix(PRINCIPAL_PREFIX), call.client_id if call is not None else ""


class Timed(Generic[T]):
    """Awaits a coroutine and adds up the time its own steps run (``busy_s``), not the
    time it waits: a request quota counts what a call costs the event loop, as Kafka's
    counts a request thread's time, so a long poll or a wait for replication is free."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.busy_s = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self.coro
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = time.perf_counter()
            try:
                yielded = coro.send(sent) if thrown is None else coro.throw(thrown)
            except StopIteration as done:
                self.busy_s += time.perf_counter() - started
                result: T = done.value
                return result
            except BaseException:
                self.busy_s += time.perf_counter() - started
                raise
            self.busy_s += time.perf_counter() - started
            sent, thrown = None, None
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation: the coroutine handles it
                thrown = exc
