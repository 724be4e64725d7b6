"""The one owner of cluster metadata (docs/architecture.md): which brokers and topics
there are and where each partition's replicas live, behind the read interface in
metadata.py. The static cluster file (cluster_file.py) is its first implementation; the
Raft-replicated controller group replaces it without its readers changing: the pure
metadata state machine it will replicate is state_machine.py (docs/controller.md). Placement
(placement.py) and the preferred-leader policy (leadership.py) live here too."""
