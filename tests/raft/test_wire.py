"""The frame encoding of what the driver sends between processes, field for field."""

from __future__ import annotations

from raftmq.raft.host import wire
from raftmq.raft.host.transport import AuditReply, AuditRequest, RepairReply, RepairRequest
from raftmq.raft.membership import Membership
from raftmq.raft.messages import Message, MsgType, SnapshotMeta


def round_trip(batch):
    bodies = wire.split_frames(bytearray(wire.encode_messages(batch)))
    assert len(bodies) == 1
    kind, decoded = wire.decode_body(bodies[0])
    assert kind == wire.KIND_MESSAGES
    return decoded


def test_rejoin_fields_and_flags_survive_the_wire():
    batch = [
        (
            "g",
            Message(MsgType.APP_RESP, 1, 2, 7, index=5, reject=True, reject_hint=3, rejoining=True),
        ),
        ("g", Message(MsgType.HEARTBEAT_RESP, 1, 2, 7, rejoining=True, incarnation=1 << 61)),
        ("h", Message(MsgType.APP, 2, 1, 7, index=4, commit=4, rejoin_to=9, incarnation=3)),
        ("h", Message(MsgType.APP_RESP, 1, 2, 7, index=5)),
    ]
    assert round_trip(batch) == batch


def test_repair_and_audit_messages_survive_the_wire():
    batch = [
        ("t/0", RepairRequest(1, 2, 10, 40)),
        ("t/0", RepairReply(2, 1, 10, 25, b"entries as stored")),
        ("t/0", RepairReply(2, 1, 10, 10, error="corrupt here too")),
        ("t/0", AuditRequest(1, 2, 10, 40, 0xFFFFFFFF)),
        ("t/0", AuditReply(2, 1, 10, 40, 12345, True)),
        ("t/0", AuditReply(2, 1, 10, 40, -1, False)),
        ("t/0", (1, 2, 7, 40, 40)),  # a quiesce notice beside them
    ]
    assert round_trip(batch) == batch


def test_a_snapshot_message_carries_its_metadata_and_the_state_machine_bytes():
    meta = SnapshotMeta(1234, 7, 0, Membership(frozenset({1, 2, 3}), frozenset({4})))
    data = bytes(range(256)) * 2048  # 512 KiB: larger than a bulk frame's target
    batch = [
        ("__meta", Message(MsgType.SNAP, 1, 3, 7, snapshot=meta, data=data)),
        ("__meta", Message(MsgType.HEARTBEAT, 1, 3, 7, commit=1200, context=b"read-ctx")),
    ]
    assert round_trip(batch) == batch


def test_frames_decode_where_they_arrived_and_a_partial_one_waits():
    appends = [("g", Message(MsgType.APP, 2, 1, 7, index=4, entries=b"x" * 5000))]
    one = wire.encode_messages(appends)
    assert one == wire.frame(one[8:])  # one copy of the parts, the same frame
    data = one + wire.ping(wire.KIND_PING, 9) + one[:100]
    bodies, used = wire.frames_in(data)
    assert used == len(data) - 100  # the partial frame is left for the next read
    assert [wire.decode_body(b) for b in bodies] == [
        (wire.KIND_MESSAGES, appends),
        (wire.KIND_PING, 9),
    ]
    assert wire.decode_body(wire.frames_in(wire.hello(3, "c1"))[0][0]) == (
        wire.KIND_HELLO,
        (3, "c1"),
    )
