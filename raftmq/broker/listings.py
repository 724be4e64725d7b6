"""The newest metadata version that opened each local replica, for all of a broker's
replicas in one file (``replica-listings`` in the data folder).

What it is for: a copy of the metadata older than the version that opened a replica here
(a lagging voter's, after a restart) never deletes that replica as moved away; only a newer
one that lists it no more does (:meth:`Reconciler._delete_if_moved_away`). The version is
raised to the metadata's at every open and never lowered.

Why one file: it was a marker file per replica, written durably (two fsyncs and a rename)
as each replica opened, and since metadata versions only grow, again at every reopen: with
10,000 replicas on a broker, tens of seconds of a creation and of a cold restart went to
these markers alone. Now a batch of opens raises them all with one durable write. Older
brokers' per-replica files (``<replica>.listed-at``) are taken in at the first look and
removed once a write holds their values.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from raftmq.log.atomic_file import read_atomic, write_atomic

LISTINGS_FILE = "replica-listings"
LEGACY_SUFFIX = ".listed-at"


class ReplicaListings:
    """The listing version of each replica directory directly under ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._versions: dict[str, int] | None = None
        """Replica directory name -> version; None until first read."""
        self._legacy: set[Path] = set()
        """Per-replica files whose values no write of :data:`LISTINGS_FILE` holds yet."""

    def _known(self) -> dict[str, int]:
        if self._versions is None:
            versions: dict[str, int] = {}
            raw = read_atomic(self.data_dir / LISTINGS_FILE)
            for line in (raw or b"").decode().splitlines():
                name, _, version = line.rpartition(" ")
                if name and version.isdigit():
                    versions[name] = int(version)
            for legacy in self.data_dir.glob(f"*{LEGACY_SUFFIX}"):
                value = read_atomic(legacy)
                name = legacy.name[: -len(LEGACY_SUFFIX)]
                if value is not None and value.isdigit():
                    versions[name] = max(versions.get(name, 0), int(value))
                self._legacy.add(legacy)
            self._versions = versions
        return self._versions

    def listed_at(self, directory: Path) -> int | None:
        """The version that last opened the replica in ``directory``; None if unknown."""
        return self._known().get(directory.name)

    def raise_to(self, directories: Iterable[Path], version: int) -> None:
        """Durably record ``version`` for each of ``directories`` whose recorded version is
        lower (one write for all; none when nothing rises)."""
        known = self._known()
        risen = False
        for directory in directories:
            assert directory.parent == self.data_dir, (directory, self.data_dir)
            if known.get(directory.name, -1) < version:
                known[directory.name] = version
                risen = True
        if risen or self._legacy:
            payload = "".join(f"{name} {v}\n" for name, v in sorted(known.items()))
            write_atomic(self.data_dir / LISTINGS_FILE, payload.encode())
            for legacy in self._legacy:
                legacy.unlink(missing_ok=True)
            self._legacy.clear()

    def forget(self, directory: Path) -> None:
        """The replica was deleted. Its entry leaves the file with the next write: until
        then a stale entry only errs on the side of keeping (a new replica in the same
        directory is recorded at a newer version, which replaces it)."""
        self._known().pop(directory.name, None)
        legacy = directory.parent / (directory.name + LEGACY_SUFFIX)
        if legacy in self._legacy:
            legacy.unlink(missing_ok=True)
            self._legacy.discard(legacy)
