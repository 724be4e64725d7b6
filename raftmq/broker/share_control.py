"""The partition leaders' side of share-group membership (docs/share-groups.md): for each
share-partition this broker leads, what the metadata says is applied to the state the
partition holds. A member gone from its group has its acquired records released (a
RELEASE_MEMBER entry) without waiting for their locks to expire; a group gone, or created
again under its id (another created_version), has its state dropped.

One task per partition at a time, so a partition whose proposals hang (no quorum) holds
up only itself; a failure is logged and that partition is looked at again on the next
pass. Bounded: at most one task per partition this broker leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from raftmq.controller.model import MetadataState
from raftmq.partition.errors import PartitionError
from raftmq.partition.replica import PartitionReplica
from raftmq.partition.share_partition import ShareGroupView
from raftmq.partition.share_state import RecordState

log = logging.getLogger(__name__)

CHECK_S = 0.25
"""How often the leaders' share states are compared with the metadata."""

Key = tuple[str, int]


class ShareControl:
    def __init__(
        self,
        replicas: Mapping[Key, PartitionReplica],
        metadata: Callable[[], MetadataState],
        stopping: Callable[[], bool],
        extra: list[Callable[[PartitionReplica, MetadataState], object]] | None = None,
    ) -> None:
        """``extra``: more per-partition work of the same loop (the dead-letter writer),
        each an awaitable-returning call, isolated like the rest."""
        self._replicas = replicas
        self._metadata = metadata
        self._stopping = stopping
        self._extra = extra or []
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._seen: dict[Key, tuple[int, int, int]] = {}
        """(metadata version, share changes, led term) a partition was last brought up to
        date at: nothing to do until one of them moves."""

    async def run(self) -> None:
        try:
            while not self._stopping():
                self.pass_once()
                await asyncio.sleep(CHECK_S)
        finally:
            for task in self._tasks.values():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def pass_once(self) -> None:
        """Start a task for each led partition with share state and none running."""
        state = self._metadata()
        for key, replica in list(self._replicas.items()):
            if not replica.is_leader or not replica.shares.states.groups:
                continue
            seen = (state.version, replica.shares.changes, replica.led_term)
            if self._seen.get(key) == seen:
                continue
            task = self._tasks.get(key)
            if task is not None and not task.done():
                continue
            self._tasks[key] = asyncio.get_running_loop().create_task(
                self._guarded(key, replica, state, seen)
            )
        for key in [k for k, t in self._tasks.items() if t.done() and k not in self._replicas]:
            del self._tasks[key]
            self._seen.pop(key, None)

    async def _guarded(
        self,
        key: Key,
        replica: PartitionReplica,
        state: MetadataState,
        seen: tuple[int, int, int],
    ) -> None:
        try:
            await apply_metadata(replica, state)
            for work in self._extra:
                await work(replica, state)  # type: ignore[misc]
            # Up to date as of ``seen`` (its own entries moved the changes on: a look
            # more confirms there is nothing left, and costs one pass), unless dead
            # letters still wait: their topic refused them, and they are tried again.
            if not any(st.waiting_dead_letter() for st in replica.shares.states.groups.values()):
                self._seen[key] = seen
        except asyncio.CancelledError:
            raise
        except PartitionError as exc:
            # Leadership moved, or a quorum is missing: the next pass (or leader) sees to it.
            log.debug("%s/%d: share state not brought up to the metadata: %s", *key, exc)
        except Exception:
            log.exception("%s/%d: share state not brought up to the metadata", *key)


async def apply_metadata(replica: PartitionReplica, state: MetadataState) -> None:
    """Release the records of members gone; drop the state of groups gone or replaced.
    Not with metadata older than what a leader judged the group's members at (this
    broker may have become leader with a copy that lags): a member or group missing
    from it may be one it has not seen join yet."""
    for gid, st in list(replica.shares.states.groups.items()):
        if state.version < st.seen_version:
            continue
        group = state.share_groups.get(gid)
        if group is None or group.created_version != st.created_version:
            created = st.created_version if group is None else group.created_version
            await replica.share.drop_group(gid, created)
            continue
        holders = {r.member_id for r in st.records.values() if r.state == RecordState.ACQUIRED}
        view = ShareGroupView(gid, group.created_version, group.settings, state.version)
        for member in sorted(holders - set(group.members)):
            await replica.share.release_member(view, member)
