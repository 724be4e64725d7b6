"""Auto-creation of topics on produce (``raftmq broker --auto-create-topics``, off by
default as in Kafka 4's advice: a typo in a producer's topic name should be an error, not
a new topic). When on, a produce to a topic the metadata does not name creates it through
the controller (admin.proto CreateTopic, the controller's placement) and then goes on as
any produce would.

Bounded: one creation in flight per topic name (concurrent producers to the same new
topic share it), at most ``MAX_CREATIONS`` names at once, each waited on for at most
``WAIT_S``; a creation that is not done by then is refused as retriable
(LEADER_NOT_AVAILABLE), so the producer comes back once the topic is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.controller_link import LinkRefusal
from raftmq.broker.refusals import Refusal, shorten
from raftmq.controller.model import BrokerState, MetadataState

log = logging.getLogger(__name__)

MAX_CREATIONS = 16
"""Topic names being auto-created at once by one broker, at most."""
WAIT_S = 10.0
"""How long a produce waits for its topic to be created and known to this broker."""
POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class AutoCreate:
    """The broker setting: the shape of a topic created on produce."""

    partitions: int = 1
    replication_factor: int = 0
    """0: three, or every alive broker when fewer are alive."""

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(
                f"auto-created topics need at least one partition, not {self.partitions}"
            )
        if self.replication_factor < 0:
            raise ValueError(
                f"the auto-created topics' replication factor must be 0 (automatic) or "
                f"more, not {self.replication_factor}"
            )

    def factor_for(self, state: MetadataState) -> int:
        if self.replication_factor:
            return self.replication_factor
        alive = sum(b.state == BrokerState.ALIVE for b in state.brokers.values())
        return max(1, min(3, alive))


def unknown_topic(topic: str, known: str) -> Refusal:
    """The refusal of a produce to a topic that does not exist while auto-creation is off."""
    return Refusal(
        pb.ERROR_CODE_UNKNOWN_TOPIC,
        f"topic {shorten(topic)} does not exist (known topics: {known}); create it with "
        "'raftmq topic create NAME --partitions N --replication-factor R' or the admin API, "
        "or start the brokers with --auto-create-topics",
    )


Create = Callable[[str, int, int], Awaitable[int]]
"""(name, partitions, replication factor) -> metadata version: ControllerLink.create_topic."""


class TopicCreator:
    def __init__(
        self,
        settings: AutoCreate,
        create: Create,
        metadata: Callable[[], MetadataState],
    ) -> None:
        self.settings = settings
        self._create = create
        self._metadata = metadata
        self._creating: dict[str, asyncio.Task[None]] = {}

    async def ensure(self, topic: str) -> None:
        """Return once this broker's metadata names ``topic``, creating it first if need
        be; raises Refusal when that cannot be done (now)."""
        task = self._creating.get(topic)
        if task is None:
            if len(self._creating) >= MAX_CREATIONS:
                raise Refusal(
                    pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
                    f"this broker is auto-creating {len(self._creating)} topics already; "
                    f"retry shortly and {shorten(topic)} will be created",
                )
            task = asyncio.get_running_loop().create_task(self._create_and_wait(topic))
            self._creating[topic] = task
            task.add_done_callback(lambda _: self._creating.pop(topic, None))
        try:
            await asyncio.wait_for(asyncio.shield(task), WAIT_S)
        except TimeoutError:
            raise Refusal(
                pb.ERROR_CODE_LEADER_NOT_AVAILABLE,
                f"topic {shorten(topic)} is being auto-created and is not ready after "
                f"{WAIT_S:.0f} s; retry shortly",
            ) from None

    async def _create_and_wait(self, topic: str) -> None:
        state = self._metadata()
        factor = self.settings.factor_for(state)
        try:
            version = await self._create(topic, self.settings.partitions, factor)
            log.info(
                "auto-created topic %s (%d partitions, replication factor %d) on produce",
                topic,
                self.settings.partitions,
                factor,
            )
        except LinkRefusal as exc:
            if exc.code != pb.ERROR_CODE_TOPIC_ALREADY_EXISTS:
                raise Refusal(
                    exc.code,
                    f"topic {shorten(topic)} does not exist and auto-creating it failed: {exc}",
                ) from None
            version = 0  # someone else created it: wait until it is known here
        while topic not in self._metadata().topics or self._metadata().version < version:
            await asyncio.sleep(POLL_S)

    async def close(self) -> None:
        for task in list(self._creating.values()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
