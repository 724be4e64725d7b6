"""Raft consensus for one partition, as a pure state machine (see docs/raft.md)."""

from raftmq.raft.config import Config
from raftmq.raft.core import RaftCore
from raftmq.raft.errors import NotLeaderError, ProposalDroppedError, RaftError
from raftmq.raft.hardstate import HardState
from raftmq.raft.membership import Membership
from raftmq.raft.messages import Message, MsgType, SnapshotMeta
from raftmq.raft.ready import ReadState, Ready, Role, SoftState, write_to_storage
from raftmq.raft.storage import MemoryStorage, Storage

__all__ = [
    "Config",
    "HardState",
    "Membership",
    "MemoryStorage",
    "Message",
    "MsgType",
    "NotLeaderError",
    "ProposalDroppedError",
    "RaftCore",
    "RaftError",
    "ReadState",
    "Ready",
    "Role",
    "SnapshotMeta",
    "SoftState",
    "Storage",
    "write_to_storage",
]
