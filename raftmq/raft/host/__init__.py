"""The effectful Raft host: runs many pure cores (raftmq.raft.core) on one event loop,
persists their Ready (group_storage.py: log, hard state, hints, opened in one place),
and sends their messages (transport.py, tcp.py, wire.py); state_machine.py runs a group
whose entries are commands applied to an object (the controller's metadata). See
docs/driver.md."""
