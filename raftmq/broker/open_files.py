"""The open-file limit a broker runs with: raised to the hard limit at start, and the cap on
open segment files set from it (raftmq.log.handles), said in one line that warns when the
cap is too low for the replicas hosted here (segment files would be reopened constantly)."""

from __future__ import annotations

from raftmq.log.handles import HANDLES, HANDLES_PER_REPLICA, cap_for_limit, raise_nofile_limit


def open_files_note(replicas: int) -> tuple[str, bool]:
    """Raise this process's open-file limit to the hard limit, cap the segment handles by
    it, and say so in one line; True beside it when the cap is too low for ``replicas``
    logs (the line then says what to do)."""
    soft, hard = raise_nofile_limit()
    cap = cap_for_limit(soft)
    HANDLES.set_cap(cap)
    hard_text = "unlimited" if hard < 0 else str(hard)
    note = f"open files: limit {soft} (hard {hard_text}), segment handle cap {cap}"
    if cap < HANDLES_PER_REPLICA * replicas:
        return (
            f"{note}: TOO LOW for {replicas} replicas (under {HANDLES_PER_REPLICA} per "
            "replica): segment files will be reopened constantly; raise the hard limit "
            "(ulimit -Hn, LimitNOFILE=) or host fewer partitions here"
        ), True
    return f"{note}, enough for {replicas} replicas", False
