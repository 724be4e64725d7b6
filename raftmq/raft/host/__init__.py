"""The effectful Raft host: runs many pure cores (raftmq.raft.core) on one event loop,
persists their Ready (group_storage.py: log, hard state, hints, opened in one place),
and sends their messages (transport.py, tcp.py, wire.py). See docs/driver.md."""
