"""Benchmarks: run as modules, e.g. ``python -m benchmarks.raft_bench --quick``."""
