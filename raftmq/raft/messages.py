"""What members say to each other. Plain data: the driver chooses the wire encoding."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from raftmq.raft.membership import Membership


class MsgType(IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APP = 5
    APP_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAP = 9
    TIMEOUT_NOW = 10
    READ_INDEX = 11
    READ_INDEX_RESP = 12


CAMPAIGN_TRANSFER = b"transfer"
"""Context of a vote request caused by TimeoutNow: voters then ignore their leader lease."""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a snapshot sits in the log: enough to restart an empty log right after it.

    The application's snapshot bytes are not here: they travel beside the message (the
    transport may stream them in chunks) and reach the core only as this metadata, once
    they are complete on the receiver.
    """

    index: int
    term: int
    next_offset: int
    """Message offset of the first entry after the snapshot."""
    membership: Membership


@dataclass(slots=True)
class Message:
    """One Raft RPC. Field meanings follow the paper; unused fields stay zero.

    APP: ``index``/``log_term`` are prevLogIndex/prevLogTerm, ``entries`` the encoded
    entries exactly as stored, ``commit`` the leader's commit. APP_RESP: ``index`` is the
    last index the follower now matches (or, with ``reject``, the rejected prevLogIndex),
    ``reject_hint``/``log_term`` point at the follower's conflicting position.

    Rejoining after disk loss (docs/raft.md): ``rejoining`` on APP_RESP/HEARTBEAT_RESP
    says the follower may have lost entries it once acknowledged, so the leader must not
    trust what it recorded for it, and ``incarnation`` names that life of the follower
    (its process since the loss); ``rejoin_to`` on APP, for the ``incarnation`` the leader
    heard of, tells such a follower the index through which it must hold the leader's log
    before it may vote again.
    """

    type: MsgType
    src: int
    dst: int
    term: int
    log_term: int = 0
    index: int = 0
    entries: bytes = b""
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    context: bytes = b""
    rejoining: bool = False
    rejoin_to: int = 0
    incarnation: int = 0
    snapshot: SnapshotMeta | None = None
    data: bytes = field(default=b"", repr=False)
    """SNAP only: the application's snapshot bytes, filled in by the sender's driver."""
