"""A broker cluster whose every link runs through toxiproxy, so the nemesis can cut, slow or
reset any of them, in one direction or both.

- Client links: broker ``i`` binds its gRPC service on a private port (``--listen``) and
  the cluster file advertises proxy ``client-i`` instead, so metadata and NOT_LEADER hints
  keep clients behind the proxies.
- Raft links: brokers ``i < j`` share one TCP connection that ``i`` dials; ``i`` is told
  (``--peers``) to dial proxy ``raft-i-j``, whose upstream is ``j``'s Raft port. Disabling
  that proxy partitions the pair; a toxic on its ``upstream`` stream affects ``i -> j``
  only, on ``downstream`` ``j -> i`` only.
- Every port a broker binds is reserved here for the cluster's lifetime (see
  raftmq.devtools.ports); the proxies bind port 0 and report what they got.
- Final reads after healing use the private ports directly: the checker must see each
  replica as it is, not through a proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toxiproxy import Toxiproxy
from toxiproxy.proxy import Proxy

from chaos.toxiproxy.launcher import RunningToxiproxy, start_toxiproxy
from raftmq import net
from raftmq.client.sasl import client_security
from raftmq.controller.cluster_file import BrokerSpec, ClusterSpec, TopicSpec
from raftmq.controller.placement import round_robin
from raftmq.devtools.dev_credentials import secure_cluster
from raftmq.devtools.local_cluster import LocalCluster
from raftmq.devtools.ports import PortReservations

TOPIC = "chaos"


def rack_of(broker_id: int) -> str:
    return f"rack-{broker_id}"


@dataclass(frozen=True, slots=True)
class Link:
    """A proxied Raft link between two brokers; ``a`` dials ``b``."""

    a: int
    b: int

    @property
    def name(self) -> str:
        return f"raft-{self.a}-{self.b}"


class ChaosCluster:
    def __init__(
        self,
        data: Path,
        *,
        nodes: int = 3,
        partitions: int = 3,
        voters: int = 0,
        broker_args: list[str] | None = None,
        racks: bool = False,
        extra_topics: tuple[str, ...] = (),
        secure: bool = False,
    ) -> None:
        """``voters``: nodes 1..``voters`` are the controller voters (combined mode) and
        the others broker-only; 0: every node is a voter. ``racks``: every broker in a rack
        of its own (:func:`rack_of`). ``extra_topics``: more topics placed like the main
        one (the transactional workload's output). ``secure``: as ``raftmq dev --secure``
        starts a cluster (TLS everywhere, authentication, ACLs:
        raftmq.devtools.dev_credentials.SecureCluster); every client of the run then uses
        :attr:`client_settings`."""
        if not 0 <= voters <= nodes:
            raise ValueError(f"voters must be 0 to {nodes}, got {voters}")
        self.data = data
        self.nodes = list(range(1, nodes + 1))
        self.toxiproxy: RunningToxiproxy = start_toxiproxy()
        self.api = Toxiproxy()
        self.api.update_api_consumer(self.toxiproxy.host, self.toxiproxy.port)
        self.api.destroy_all()
        # Held until close: brokers bind them (SO_REUSEPORT) whenever they (re)start.
        ports = PortReservations()
        self.private = {i: ports.take() for i in self.nodes}
        raft = {i: ports.take() for i in self.nodes}
        self.proxies: dict[str, Proxy] = {}
        advertised = {}
        for i in self.nodes:
            proxy = self._proxy(f"client-{i}", self.private[i])
            advertised[i] = int(proxy.listen.rsplit(":", 1)[1])
        self.links = [Link(a, b) for a in self.nodes for b in self.nodes if a < b]
        dial: dict[int, dict[int, str]] = {i: {} for i in self.nodes}
        for link in self.links:
            proxy = self._proxy(link.name, raft[link.b])
            dial[link.a][link.b] = proxy.listen
            dial[link.b][link.a] = f"127.0.0.1:{raft[link.a]}"  # never dialed: b accepts
        factor = min(3, nodes)
        replicas = round_robin(self.nodes, partitions, factor)
        self.spec = ClusterSpec(
            "raftmq-chaos",
            {i: BrokerSpec(i, "127.0.0.1", advertised[i], raft[i]) for i in self.nodes},
            {name: TopicSpec(name, replicas) for name in (TOPIC, *extra_topics)},
            tuple(range(1, voters + 1)),
        )
        per_broker = {
            i: [
                "--listen",
                f"127.0.0.1:{self.private[i]}",
                "--peers",
                ",".join(f"{j}={addr}" for j, addr in sorted(dial[i].items())),
                *(["--rack", rack_of(i)] if racks else []),
            ]
            for i in self.nodes
        }
        protected = secure_cluster(data / "tls") if secure else None
        self.cluster = LocalCluster(
            data,
            self.spec,
            broker_args=[*(broker_args or []), *(protected.broker_args if protected else ())],
            per_broker_args=per_broker,
            ports=ports,
            **(protected.cluster_settings() if protected else {}),
        )

    @property
    def client_settings(self) -> dict[str, str]:
        """What every client of this run is given besides its addresses: Kafka's ssl_*
        and sasl_* settings for a secure cluster (it logs in as the cluster's admin),
        nothing for a plaintext one."""
        return {k: str(v) for k, v in self.cluster.client_tls.items() if v}

    @property
    def security(self) -> net.Security:
        """:attr:`client_settings` as the channel factory takes them."""
        return client_security(**self.client_settings)

    def _proxy(self, name: str, upstream_port: int) -> Proxy:
        proxy = self.api.create(
            upstream=f"127.0.0.1:{upstream_port}", name=name, listen="127.0.0.1:0"
        )
        self.proxies[name] = proxy
        return proxy

    @property
    def partitions(self) -> int:
        return self.spec.topics[TOPIC].partitions

    def replicas(self, partition: int) -> tuple[int, ...]:
        return self.spec.topics[TOPIC].replicas[partition]

    @property
    def voters(self) -> tuple[int, ...]:
        """The controller voters' ids."""
        return self.spec.voters

    def direct_address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.private[broker_id]}"

    def link(self, a: int, b: int) -> Proxy:
        lo, hi = min(a, b), max(a, b)
        return self.proxies[Link(lo, hi).name]

    def heal_network(self) -> None:
        """Enable every proxy and remove every toxic (toxiproxy's reset)."""
        self.api.reset()

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self.toxiproxy.stop()
