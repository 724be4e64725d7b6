"""A broker as an operating-system process: it runs until SIGTERM or SIGINT (or until the
process that started it is gone), writes its ready file once both listeners are bound, and
exits at once, crash-only, when its Raft host fails, so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from raftmq.broker import ready_file
from raftmq.broker.runtime import tune_gc, tune_malloc
from raftmq.broker.server import Broker

log = logging.getLogger(__name__)

HOST_FAILED_EXIT = 3
"""Exit status of a broker whose Raft host failed (not one partition: the host itself)."""
PARENT_CHECK_SECONDS = 0.5
STOP_AFTER_FAILURE_S = 10.0
"""How long a broker whose host failed tries to close its files before it exits anyway."""


async def run(broker: Broker, *, parent_pid: int | None = None) -> int:
    """Run until SIGTERM or SIGINT, or until process ``parent_pid`` is no longer this
    process's parent; then stop gracefully and return 0. If the Raft host fails meanwhile,
    stop at once and return HOST_FAILED_EXIT: the process must exit, not live on unable to
    serve while it still answers Metadata.

    Why the parent watch: a local cluster starts its brokers in their own session, so a
    terminal closing or a SIGKILL of ``raftmq dev`` reaches none of them, and they would
    run on, holding ports and data folders, with nobody left to stop them.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tune_malloc()
    await broker.start()
    tune_gc()
    print(f"broker {broker.id}: {broker.open_files_note}", flush=True)
    assert broker.bound is not None, "start() binds both listeners"
    ready_file.write(broker.data_dir, broker.bound)
    print(f"broker {broker.id} ready", flush=True)
    watch = None
    if parent_pid is not None:
        watch = loop.create_task(_stop_when_orphaned(broker.id, parent_pid, stop))
    host_failed = loop.create_task(broker.host.wait_failed())
    stopped = loop.create_task(stop.wait())
    await asyncio.wait({host_failed, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if watch is not None:
        watch.cancel()
    if host_failed.done():
        stopped.cancel()
        exc = host_failed.result()
        log.error(
            "broker %d: its Raft host failed (%s: %s), so it can serve no partition; exiting "
            "with status %d so that a supervisor restarts it",
            broker.id,
            type(exc).__name__,
            exc,
            HOST_FAILED_EXIT,
        )
        try:
            await asyncio.wait_for(broker.stop(graceful=False), STOP_AFTER_FAILURE_S)
        except Exception as stop_exc:  # crash-only: exiting matters, a clean close does not
            log.warning("broker %d: stopping after the failure: %r", broker.id, stop_exc)
        return HOST_FAILED_EXIT
    host_failed.cancel()
    await broker.stop(graceful=True)
    return 0


async def _stop_when_orphaned(broker_id: int, parent_pid: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent_pid:
        await asyncio.sleep(PARENT_CHECK_SECONDS)
    log.warning("broker %d: its parent (pid %d) exited; stopping", broker_id, parent_pid)
    stop.set()
