"""The Admin service's SCRAM user RPCs, Kafka's AlterUserScramCredentials and
DescribeUserScramCredentials (admin.proto), kept apart from the topic and cluster RPCs:
:class:`raftmq.broker.admin_service.AdminService` takes them in as a base class.

The credentials arrive computed by the client (salt, StoredKey, ServerKey); the controller
checks their shape (raftmq.controller.scram_users) and stores them in the metadata. A
description never carries a key.
"""

from __future__ import annotations

import base64

import grpc

from raftmq.api.v1 import admin_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.controller_service import ControllerFace
from raftmq.broker.refusals import Refusal, name_list
from raftmq.controller.scram_users import (
    MAX_USERS,
    AlterScramCredentials,
    ScramCredential,
    ScramUpsertion,
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class ScramAdmin(ControllerFace):
    async def AlterUserScramCredentials(
        self, request: apb.AlterUserScramCredentialsRequest, context: grpc.aio.ServicerContext
    ) -> apb.ChangeResponse:
        if len(request.upsertions) + len(request.deletions) > MAX_USERS:
            raise Refusal(
                pb.ERROR_CODE_UNACCEPTABLE_CREDENTIAL,
                f"at most {MAX_USERS} users in one request",
            )
        for deletion in request.deletions:
            if deletion.mechanism not in ("", "SCRAM-SHA-256"):
                raise Refusal(
                    pb.ERROR_CODE_UNACCEPTABLE_CREDENTIAL,
                    f"mechanism {deletion.mechanism[:40]!r} is not supported; use SCRAM-SHA-256",
                )
        command = AlterScramCredentials(
            tuple(
                ScramUpsertion(
                    u.name,
                    ScramCredential(
                        u.iterations,
                        _b64(u.salt),
                        _b64(u.stored_key),
                        _b64(u.server_key),
                        u.mechanism or "SCRAM-SHA-256",
                    ),
                )
                for u in request.upsertions
            ),
            tuple(d.name for d in request.deletions),
        )
        await self.call(self.quorum.propose_change(command))
        return apb.ChangeResponse(metadata_version=self.quorum.local_state()[0])

    async def DescribeUserScramCredentials(
        self,
        request: apb.DescribeUserScramCredentialsRequest,
        context: grpc.aio.ServicerContext,
    ) -> apb.DescribeUserScramCredentialsResponse:
        _, state = await self.call(self.quorum.metadata(linearizable=True))
        users = state.scram_users
        names = list(dict.fromkeys(request.users)) or sorted(users)
        missing = [n for n in names if n not in users]
        if missing:
            raise Refusal(
                pb.ERROR_CODE_RESOURCE_NOT_FOUND,
                f"no SCRAM credentials are stored for {name_list(missing)}",
            )
        return apb.DescribeUserScramCredentialsResponse(
            results=[
                apb.UserScramCredentials(
                    name=name,
                    credentials=[
                        apb.ScramCredentialInfo(
                            mechanism=users[name].mechanism, iterations=users[name].iterations
                        )
                    ],
                )
                for name in names
            ]
        )
