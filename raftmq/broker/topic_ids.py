"""Which topic each local replica belongs to: a marker file beside each replica's directory
(``<topic>-<partition>.topic-id``, holding the topic's id), so a replica whose topic is gone
from the metadata, or was deleted and created again under its name, is found and deleted,
also when the broker was down at the time of the delete.

The markers are read from disk once, at the first look, and kept in memory after that:
every write and removal goes through :class:`TopicIdMarkers`. Why: the broker compares
them with every metadata version it applies, and reading 1,000 marker files per version
took three quarters of a controller voter's event loop while metadata changed
(benchmarks/controller_bench.py: a config change took ~50 ms to commit with 1,000
partitions, against ~10 ms with 100).
"""

from __future__ import annotations

from pathlib import Path

from raftmq.controller.model import MetadataState
from raftmq.log.atomic_file import read_atomic, write_atomic

TOPIC_ID_SUFFIX = ".topic-id"


def marker_path(directory: Path) -> Path:
    """The marker of the replica in ``directory``."""
    return directory.parent / (directory.name + TOPIC_ID_SUFFIX)


class TopicIdMarkers:
    """The topic-id markers of the replica directories directly under ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._ids: dict[Path, tuple[str, int, int]] | None = None
        """Replica directory -> (topic, partition, topic id); None until first read."""

    def count_on_disk(self) -> int:
        """How many replicas the disk holds markers for (before anything is read)."""
        return len(list(self.data_dir.glob(f"*{TOPIC_ID_SUFFIX}")))

    def _known(self) -> dict[Path, tuple[str, int, int]]:
        if self._ids is None:
            ids = {}
            for marker in sorted(self.data_dir.glob(f"*{TOPIC_ID_SUFFIX}")):
                stem = marker.name[: -len(TOPIC_ID_SUFFIX)]
                name, _, part = stem.rpartition("-")
                raw = read_atomic(marker)
                if name and part.isdigit() and raw:
                    ids[marker.parent / stem] = (name, int(part), int(raw))
            self._ids = ids
        return self._ids

    def write(self, directory: Path, topic_id: int) -> None:
        """Durably mark ``directory`` as a replica of the topic with ``topic_id``. A marker
        that says so already is left as it is: rewriting it (two fsyncs and a rename) for
        each replica a restarted broker reopens took most of the reopen's time."""
        known = self._known()
        name, _, part = directory.name.rpartition("-")
        if known.get(directory) == (name, int(part), topic_id):
            return
        write_atomic(marker_path(directory), str(topic_id).encode())
        known[directory] = (name, int(part), topic_id)

    def remove(self, directory: Path) -> None:
        marker_path(directory).unlink(missing_ok=True)
        self._known().pop(directory, None)

    def gone(self, state: MetadataState) -> list[tuple[str, int, Path]]:
        """(topic, partition, directory) of each marked replica whose topic id ``state`` no
        longer holds. Only when the metadata is at least as new as the topic (its id is the
        index of the entry that created it, the version the index of the last applied): a
        lagging voter's older copy lacks topics created since, and must not delete them."""
        out = []
        for directory, (name, partition, topic_id) in self._known().items():
            topic = state.topics.get(name)
            if topic is not None and topic.topic_id == topic_id:
                continue
            if topic_id > state.version:
                continue
            out.append((name, partition, directory))
        return out

    def kept(self, state: MetadataState) -> list[tuple[str, int, Path]]:
        """(topic, partition, directory) of each marked replica whose topic ``state`` still
        holds under the same id (one of them may have moved away from this broker)."""
        out = []
        for directory, (name, partition, topic_id) in self._known().items():
            topic = state.topics.get(name)
            if topic is not None and topic.topic_id == topic_id:
                out.append((name, partition, directory))
        return out
