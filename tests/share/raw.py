"""A share group member spoken to in share.proto's own requests, one at a time: for the
tests of what the brokers refuse (the ShareConsumer never sends most of it), so each
refusal is seen as the wire carries it."""

from __future__ import annotations

from typing import Any

import grpc

from raftmq.api.v1 import share_pb2 as spb
from raftmq.api.v1 import share_pb2_grpc as spb_grpc
from raftmq.client import AdminClient, ClientError, LowLevelClient
from raftmq.client.errors import error_of
from raftmq.devtools.local_cluster import LocalCluster


class RawMember:
    def __init__(self, cluster: LocalCluster, group: str, topics: list[str]) -> None:
        self.group = group
        self.topics = sorted(topics)
        self.admin = AdminClient(cluster.addresses)
        self.client = LowLevelClient(cluster.addresses)
        self.member_id = ""
        self.epoch = 0
        self.metadata_version = 0

    def close(self) -> None:
        self.admin.close()
        self.client.close()

    def heartbeat(self, epoch: int | None = None) -> spb.ShareGroupHeartbeatResponse:
        """A heartbeat at ``epoch`` (None: the member's own; 0 joins)."""
        request = spb.ShareGroupHeartbeatRequest(
            group_id=self.group,
            member_id=self.member_id,
            member_epoch=self.epoch if epoch is None else epoch,
            subscriptions=self.topics,
            session_timeout_ms=30_000,
        )
        answer: spb.ShareGroupHeartbeatResponse = self.admin._call(
            "ShareGroupHeartbeat", request, spb_grpc.ShareGroupsStub
        )
        if answer.member_epoch > 0:
            self.member_id = answer.member_id
            self.epoch = answer.member_epoch
            self.metadata_version = answer.metadata_version
        return answer

    def _at_leader(self, topic: str, partition: int, rpc: str, request: Any) -> Any:
        self.client.refresh_leaders()
        address = self.client._leader(topic, partition)
        stub = spb_grpc.SharePartitionsStub(self.client._channel(address))
        try:
            return getattr(stub, rpc)(request, timeout=20)
        except grpc.RpcError as exc:
            raise error_of(exc) from None

    def fetch(
        self, topic: str, partition: int = 0, *, max_records: int = 500, max_wait_ms: int = 2000
    ) -> spb.ShareFetchResponse:
        request = spb.ShareFetchRequest(
            group_id=self.group,
            member_id=self.member_id,
            metadata_version=self.metadata_version,
            topic=topic,
            partition=partition,
            max_records=max_records,
            max_wait_ms=max_wait_ms,
        )
        answer: spb.ShareFetchResponse = self._at_leader(topic, partition, "ShareFetch", request)
        return answer

    def acknowledge(
        self, topic: str, first: int, last: int, type: int, partition: int = 0
    ) -> spb.AcknowledgeResult:
        """One range's result (raises the ClientError of a whole-request refusal)."""
        request = spb.ShareAcknowledgeRequest(
            group_id=self.group,
            member_id=self.member_id,
            metadata_version=self.metadata_version,
            topic=topic,
            partition=partition,
            acknowledgements=[
                spb.AcknowledgementBatch(first_offset=first, last_offset=last, type=type)
            ],
        )
        answer: spb.ShareAcknowledgeResponse = self._at_leader(
            topic, partition, "ShareAcknowledge", request
        )
        assert len(answer.results) == 1, answer
        return answer.results[0]


def refusal_code(call: Any) -> str:
    """The code name of a call's refusal, whole-request or in its one range's result."""
    try:
        result = call()
    except ClientError as err:
        return err.code_name
    return str(result.error.code)
