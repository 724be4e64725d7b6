"""Three controller voters in this process: real Raft hosts over TCP (port 0), each with
a :class:`ControllerQuorum` on disk under ``tmp``, and optionally a real gRPC server on
port 0 serving the Controller and Admin services. Nodes can be stopped (as a crash would:
nothing is flushed beyond what each round fsyncs) and started again on the same
directory."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from raftmq import net
from raftmq.broker.admin_service import AdminService, add_admin_service
from raftmq.broker.controller_service import ControllerService, add_controller_service
from raftmq.broker.groups_service import GroupsService, add_groups_service
from raftmq.broker.transactions_service import TransactionsService, add_transactions_service
from raftmq.controller.quorum import ControllerQuorum, ControllerUnavailableError
from raftmq.raft.host.host import RaftHost
from raftmq.raft.host.tcp import TcpTransport
from tests.raft.test_driver import tcp_transports, wait_for
from tests.raft.test_state_machine import new_host

VOTERS = (1, 2, 3)


class QuorumCluster:
    def __init__(self, tmp: Path, *, grpc_servers: bool = False, **options: Any) -> None:
        self.tmp = tmp
        # Brokers registered by a test but not beating stay unfenced unless a test asks.
        self.options = {"session_timeout_s": 60.0, **options}
        self.grpc_servers = grpc_servers
        self.transports: dict[int, TcpTransport] = {}
        self.hosts: dict[int, RaftHost] = {}
        self.quorums: dict[int, ControllerQuorum] = {}
        self.servers: dict[int, grpc.aio.Server] = {}
        self.groups: dict[int, GroupsService] = {}
        self.transactions: dict[int, TransactionsService] = {}
        self.addresses: dict[int, str] = {}  # voter -> its gRPC address, shared with services

    async def start(self, *nodes: int) -> QuorumCluster:
        for node in nodes or VOTERS:
            transport = tcp_transports(VOTERS)[node]
            host = new_host(node, transport)
            quorum = ControllerQuorum(host, self.tmp / f"n{node}", VOTERS, "test", **self.options)
            await host.start()  # binds port 0
            quorum.start()
            self.transports[node], self.hosts[node], self.quorums[node] = transport, host, quorum
            if self.grpc_servers:
                server = net.aio_server()
                add_controller_service(ControllerService(quorum, self.addresses), server)
                add_admin_service(AdminService(quorum, self.addresses), server)
                self.groups[node] = GroupsService(quorum, self.addresses)
                add_groups_service(self.groups[node], server)
                txns = TransactionsService(quorum, self.addresses)
                self.transactions[node] = txns
                add_transactions_service(txns, server)
                txns.start()
                port = net.add_port(server, "127.0.0.1:0")
                await server.start()
                self.servers[node] = server
                self.addresses[node] = f"127.0.0.1:{port}"
        for n, t in self.transports.items():
            for p, other in self.transports.items():
                if p != n:
                    t.set_peer_address(p, ("127.0.0.1", other.port))
        return self

    async def stop(self, *nodes: int) -> None:
        for node in nodes or list(self.hosts):
            server = self.servers.pop(node, None)
            if server is not None:
                await server.stop(0)
                self.addresses.pop(node, None)
                await self.transactions.pop(node).close()
            await self.quorums.pop(node).stop()
            self.transports.pop(node)
            await self.hosts.pop(node).stop()

    async def leader(self, timeout_s: float = 10.0) -> ControllerQuorum:
        def one() -> bool:
            return sum(q.is_leader for q in self.quorums.values()) == 1

        await wait_for(one, timeout_s, "one controller leader")
        return next(q for q in self.quorums.values() if q.is_leader)

    def follower(self) -> ControllerQuorum:
        return next(q for q in self.quorums.values() if not q.is_leader)

    async def settled(self) -> int:
        """Every running voter applied what the leader has; returns that version."""
        leader = await self.leader()
        version, _ = await retry(lambda: leader.metadata(linearizable=True))
        await wait_for(
            lambda: all(q.local_state()[0] >= version for q in self.quorums.values()),
            what="every voter to apply the leader's metadata",
        )
        return version


async def retry(call: Any, attempts: int = 100) -> Any:
    """``await call()``, again while the quorum has no leader (an election)."""
    for _ in range(attempts):
        try:
            return await call()
        except ControllerUnavailableError:
            await asyncio.sleep(0.05)
    raise AssertionError("the controller quorum stayed unavailable")
