"""Test and development aids on top of everything else: the local cluster launcher
(local_cluster.py) used by ``raftmq dev``, the integration tests, the benchmarks and the
chaos harness, and the port reservations they share (ports.py). The top floor: nothing
in raftmq imports it but the CLI."""
