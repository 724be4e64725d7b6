"""The one owner of cluster metadata (docs/architecture.md): which brokers and topics
there are and where each partition's replicas live. A Raft group of controller voters
(quorum.py) replicates the metadata state machine (state_machine.py, transitions.py) whose
immutable state (model.py) every broker follows and reads (metadata.py); the bootstrap file
(cluster_file.py) only names the nodes and the voters. Placement (placement.py), healing
and moves (healing.py, mover.py), consumer groups (groups.py, coordinator.py) and the
preferred-leader policy (leadership.py) live here too."""
