"""The open-file limit a broker runs with: raised to the hard limit at start, and the cap on
open segment files set from it (raftmq.log.handles), said in one line that warns when the
cap is too low for the replicas hosted here (segment files would be reopened constantly)."""

from __future__ import annotations

import resource

from raftmq.log.handles import (
    HANDLES,
    HANDLES_PER_REPLICA,
    MAX_CAP,
    RESERVE,
    cap_for_limit,
    raise_nofile_limit,
)

MIN_CONNECTIONS = 16
"""The fewest client connections a broker accepts at once, however low its limit."""


def connection_cap(limit: int) -> int | None:
    """Client connections a broker with open-file limit ``limit`` accepts at once (None: no
    cap worth setting): half of what the segment cap leaves, the other half kept for its
    own channels to other brokers, Raft peers and the short-lived files of persists.
    Without a cap, a burst of connections (clients retrying through a hung link, TLS
    handshakes that never finish) took the descriptors a persist needed, and EMFILE
    failed durable writes of every replica on the broker."""
    if limit == resource.RLIM_INFINITY or limit <= 0 or cap_for_limit(limit) >= MAX_CAP:
        return None
    return max(MIN_CONNECTIONS, (limit - cap_for_limit(limit)) // 2)


def open_files_note(replicas: int) -> tuple[str, bool]:
    """Raise this process's open-file limit to the hard limit, cap the segment handles by
    it, and say so in one line; True beside it when the cap is too low for ``replicas``
    logs (the line then says what to do)."""
    soft, hard = raise_nofile_limit()
    cap = cap_for_limit(soft)
    HANDLES.set_cap(cap)
    RESERVE.fill()
    hard_text = "unlimited" if hard < 0 else str(hard)
    connections = connection_cap(soft)
    note = (
        f"open files: limit {soft} (hard {hard_text}), client connections "
        f"{'unbounded' if connections is None else connections}, segment handle cap {cap}"
    )
    if cap < HANDLES_PER_REPLICA * replicas:
        return (
            f"{note}: TOO LOW for {replicas} replicas (under {HANDLES_PER_REPLICA} per "
            "replica): segment files will be reopened constantly; raise the hard limit "
            "(ulimit -Hn, LimitNOFILE=) or host fewer partitions here"
        ), True
    return f"{note}, enough for {replicas} replicas", False
