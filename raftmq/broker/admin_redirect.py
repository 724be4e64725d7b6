"""raftmq.v1.Admin on a broker-only node (the dedicated-controller layout): every call is
answered NOT_CONTROLLER with a controller voter's address, the leader's when this broker's
controller link knows it, so an operator or a script may bootstrap from any node of the
cluster, as with Kafka's admin client; the client resends there (and a voter that does
not lead redirects it once more). Nothing is forwarded: this node holds no quorum state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.refusals import Refusal
from raftmq.broker.rpc import add_service


class AdminRedirect:
    def __init__(
        self, node_id: int, voters: Mapping[int, str], leader: Callable[[], str | None]
    ) -> None:
        """``voters``: each controller voter's client address; ``leader``: the quorum
        leader's address as last known here (None when unknown)."""
        assert voters, "a cluster has controller voters"
        self.node_id = node_id
        self.voters = list(dict(sorted(voters.items())).values())
        self.leader = leader
        self._turn = 0

    def __getattr__(self, rpc: str) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        if rpc.startswith("_"):
            raise AttributeError(rpc)

        async def refuse(request: object, context: grpc.aio.ServicerContext) -> Any:
            address = self.leader()
            if address is None:
                self._turn += 1
                address = self.voters[self._turn % len(self.voters)]
            raise Refusal(
                pb.ERROR_CODE_NOT_CONTROLLER,
                f"node {self.node_id} is a broker only, not a controller voter; resend "
                f"{rpc} to the controller at {address}",
                leader_address=address,
            )

        return refuse


def add_admin_redirect(service: AdminRedirect, server: grpc.aio.Server) -> None:
    add_service(service, server, apb, "Admin")
