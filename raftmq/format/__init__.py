"""The bytes every layer and every client shares: the entry header (entry.py), the
Kafka-style record batch inside it (records.py), its tag block (tags.py) and the tag
expressions consumers filter with (tag_filter.py). The bottom floor: imports nothing else
from raftmq (see docs/format.md and docs/architecture.md)."""
