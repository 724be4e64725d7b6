"""What the cluster says about itself while faults run, recorded beside the workload's ops.

Two things are recorded, both from each broker's own (unproxied) address:

- ``leader`` ops, while the run lasts: for each partition, the brokers that claim to lead
  it, whenever that changes. The checker measures from them how long each partition had no
  leader at all.
- ``status`` ops, once, after healing: each broker's grpc.health.v1 answer and the state
  it reports for each of its replicas (Metadata's ``replica_status``). The checker holds
  them against the final reads: a broker that is up but cannot serve must say so.
- ``assignment`` ops, with them: which brokers each broker's metadata assigns each
  partition to (PartitionInfo ``replicas``), so the checker can tell a replica reported
  as failed from one its broker does not report at all.
"""

from __future__ import annotations

import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.history import Op
from chaos.workload import Recorder
from raftmq import net
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.api.v1 import broker_pb2_grpc as pb_grpc

POLL_S = 0.25
"""How often each broker is asked who leads what: the leaderless spans the checker bounds
are seconds long, so a quarter second resolves them well at a few calls per second."""
CALL_TIMEOUT_S = 0.5
STATUS_WAIT_S = 10.0
"""How long the final status sweep waits for a broker that was just restarted to answer."""
RECONNECT_OPTIONS = [
    # Brokers are killed and restarted all run long: gRPC's default reconnect backoff
    # (growing to two minutes) would leave a channel failing fast long after its broker
    # is back, and the monitor would take a live broker for a dead one.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Monitor:
    """Polls every broker's Metadata on a thread until :meth:`stop`."""

    def __init__(
        self,
        addresses: dict[int, str],
        topic: str,
        recorder: Recorder,
        security: net.Security = net.PLAINTEXT,
    ) -> None:
        self.addresses = addresses
        self.topic = topic
        self.recorder = recorder
        self._channels = {
            i: net.channel(a, options=RECONNECT_OPTIONS, security=security)
            for i, a in addresses.items()
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-monitor", daemon=True)
        self._claims: dict[int, frozenset[int]] = {}

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def close(self) -> None:
        self.stop()
        for channel in self._channels.values():
            channel.close()

    def _metadata(
        self, broker_id: int, timeout_s: float = CALL_TIMEOUT_S, *, routing_only: bool = False
    ) -> pb.MetadataResponse | None:
        """``routing_only``: leaders and replicas, without the replicas' live state."""
        stub = pb_grpc.BrokerStub(self._channels[broker_id])
        try:
            request = pb.MetadataRequest(topics=[self.topic], routing_only=routing_only)
            return stub.Metadata(request, timeout=timeout_s)
        except grpc.RpcError:
            return None

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            claims: dict[int, set[int]] = {}
            for broker_id in self.addresses:
                meta = self._metadata(broker_id, routing_only=True)
                if meta is None:
                    continue
                for topic in meta.topics:
                    for part in topic.partitions:
                        claims.setdefault(part.partition, set())
                        if part.leader_id == broker_id:
                            claims[part.partition].add(broker_id)
            for partition, leaders in claims.items():
                frozen = frozenset(leaders)
                if self._claims.get(partition) != frozen:
                    self._claims[partition] = frozen
                    now = self.recorder.now()
                    value = ",".join(map(str, sorted(frozen)))
                    self.recorder.add(Op("leader", "monitor", partition, value, start=now, end=now))

    def record_status(self, exclude: set[int] | frozenset[int] = frozenset()) -> None:
        """One ``status`` op per broker and replica: the broker's health (``value`` is
        ``SERVING``, ``NOT_SERVING`` or ``UNREACHABLE``, on a ``partition`` -1 op; its
        ``error`` says so when the broker then did not answer Metadata) and each
        replica's state as its own broker reports it (``value`` the state's name,
        ``error`` its reason), and one ``assignment`` op per broker and partition: the
        replicas its metadata lists (``value``, comma-separated ids) and the leader it
        knows (``offset``, 0 for none). Brokers in ``exclude`` (killed for good) are not
        asked."""
        for broker_id in self.addresses:
            if broker_id in exclude:
                continue
            now = self.recorder.now()
            process = f"status-{broker_id}"
            try:
                answer = health_pb2_grpc.HealthStub(self._channels[broker_id]).Check(
                    health_pb2.HealthCheckRequest(service="raftmq.v1.Broker"),
                    timeout=STATUS_WAIT_S,
                    wait_for_ready=True,
                )
                health = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
            except grpc.RpcError:
                health = "UNREACHABLE"
            meta = self._metadata(broker_id, STATUS_WAIT_S)
            silent = None if meta is not None else "its Metadata call got no answer"
            self.recorder.add(
                Op(
                    "status",
                    process,
                    -1,
                    health,
                    start=now,
                    end=now,
                    replica=broker_id,
                    error=silent,
                )
            )
            if meta is None:
                continue
            for topic in meta.topics:
                for part in topic.partitions:
                    self.recorder.add(
                        Op(
                            "assignment",
                            process,
                            part.partition,
                            ",".join(str(b) for b in part.replicas),
                            part.leader_id,
                            start=now,
                            end=now,
                            replica=broker_id,
                        )
                    )
                    for rs in part.replica_status:
                        if rs.broker_id != broker_id:
                            continue  # what a leader says of its followers is second-hand
                        self.recorder.add(
                            Op(
                                "status",
                                process,
                                part.partition,
                                pb.ReplicaState.Name(rs.state),
                                start=now,
                                end=now,
                                replica=broker_id,
                                error=rs.reason or None,
                            )
                        )
