"""The client-quota RPCs of raftmq.v1.Admin (admin.proto): Kafka's AlterClientQuotas and
DescribeClientQuotas, over the controller quorum (raftmq.controller.quotas holds the rules;
the state machine judges every change, so one rule holds whichever way it arrives).

Checked here only what could make a command huge or a message long (many alterations, a
long name), so it is refused quoted short before it is proposed.
"""

from __future__ import annotations

import grpc

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.controller_service import ControllerFace
from raftmq.broker.refusals import Refusal, name_list, shorten
from raftmq.controller.commands import AlterClientQuotas, QuotaAlteration
from raftmq.controller.quotas import KEYS, MAX_ALTERATIONS, entity_problem


class QuotaAdmin(ControllerFace):
    """AdminService's quota methods (a base class of it)."""

    async def AlterClientQuotas(
        self, request: apb.AlterClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        if len(request.alterations) > MAX_ALTERATIONS:
            raise Refusal(
                pb.ERROR_CODE_INVALID_CLIENT_QUOTA,
                f"{len(request.alterations)} entities named; at most {MAX_ALTERATIONS} "
                "change at once",
            )
        alterations = []
        for a in request.alterations:
            user, client_id = a.entity.user, a.entity.client_id
            problem = entity_problem(user, client_id)
            if problem is not None:
                raise Refusal(
                    pb.ERROR_CODE_INVALID_CLIENT_QUOTA,
                    f"user {shorten(user)}, client id {shorten(client_id)}: {problem}",
                )
            unknown = [k for k in (*a.set, *a.remove) if k not in KEYS]
            if unknown:
                raise Refusal(
                    pb.ERROR_CODE_INVALID_CLIENT_QUOTA,
                    f"{name_list(unknown)}: not a quota; the quotas are {', '.join(KEYS)}",
                )
            alterations.append(QuotaAlteration(user, client_id, dict(a.set), tuple(a.remove)))
        await self.call(self.quorum.propose_change(AlterClientQuotas(tuple(alterations))))
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def DescribeClientQuotas(
        self, request: apb.DescribeClientQuotasRequest, context: grpc.aio.ServicerContext
    ) -> apb.DescribeClientQuotasResponse:
        version, state = await self.call(self.quorum.metadata(linearizable=True))
        return apb.DescribeClientQuotasResponse(
            quotas=[
                apb.ClientQuota(
                    entity=apb.ClientQuotaEntity(user=q.user, client_id=q.client_id),
                    values=dict(q.values),
                )
                for q in state.client_quotas
                if request.user in ("", q.user) and request.client_id in ("", q.client_id)
            ],
            metadata_version=version,
        )
