"""The bytes every layer and every client shares: the entry header (entry.py) and the
Kafka-style record batch inside it (records.py). The bottom floor: imports nothing else
from raftmq (see docs/format.md and docs/architecture.md)."""
