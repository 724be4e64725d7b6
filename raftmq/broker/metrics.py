"""A broker's Prometheus endpoint: its own registry, what fills it, and the HTTP listener
that serves it at ``/metrics`` (docs/metrics.md lists every metric).

Why a registry per broker, not prometheus-client's global one: tests (and tools) run
several brokers in one process, and each must export its own partitions and requests
only. The registry holds the per-RPC figures (:mod:`raftmq.broker.rpc_metrics`, kept by
the gRPC interceptor), the broker's state read at scrape time
(:mod:`raftmq.broker.metrics_collector`, fed by :class:`TopicTraffic` for the per-topic
counters), and the process's own figures (open file descriptors, memory, CPU) from
prometheus-client's process collector.

Metrics can be turned off (``raftmq broker --no-metrics``): then no listener is opened,
no interceptor is installed and nothing is counted, which is how their cost is measured.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector

from raftmq import net
from raftmq.broker.metrics_collector import BrokerCollector, BrokerView
from raftmq.broker.rpc_metrics import RpcMetrics
from raftmq.broker.topic_traffic import TopicTraffic

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)


class BrokerMetrics:
    """Everything one broker exports. Make it before the gRPC server (it gives the
    interceptor), :meth:`start` it once the broker is serving, :meth:`stop` it on stop."""

    def __init__(self, broker: BrokerView, listen: tuple[str, int]) -> None:
        """``listen``: where to serve ``/metrics`` (port 0: one the kernel picks)."""
        self.broker = broker
        self.listen = listen
        self.registry = CollectorRegistry()
        self.traffic = TopicTraffic()
        self.interceptor = RpcMetrics()
        self.registry.register(self.interceptor)
        ProcessCollector(registry=self.registry)
        self._server: WSGIServer | None = None

    def start(self) -> str:
        """Register the state collector on the running loop and open the listener; returns
        the address it bound, host:port."""
        self.registry.register(
            BrokerCollector(self.broker, self.traffic, asyncio.get_running_loop())
        )
        host, port = self.listen
        self._server = net.serve_metrics(self.registry, host, port)
        bound_port = self._server.server_address[1]
        address = f"{host}:{bound_port}"
        log.info("broker %d: serving metrics on http://%s/metrics", self.broker.id, address)
        return address

    async def stop(self) -> None:
        """Close the listener (its loop ends within half a second, waited for off the event
        loop: a scrape in progress may be waiting for the loop to read the broker)."""
        server, self._server = self._server, None
        if server is None:
            return
        await asyncio.to_thread(server.shutdown)
        server.server_close()
