"""The picture of a chaos run: acknowledged writes per second and their latency over time,
with every fault window shaded, so a reader sees at a glance what each fault did."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from chaos.history import Op


def plot(ops: list[Op], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    per_second: dict[int, int] = defaultdict(int)
    latencies: dict[int, list[float]] = defaultdict(list)
    for op in ops:
        if op.kind == "send" and op.status == "ok":
            second = int(op.end)
            per_second[second] += 1
            latencies[second].append((op.end - op.start) * 1000)
    last = max((int(op.end) for op in ops), default=0)
    seconds = list(range(last + 1))  # a second without acks is a zero, not a gap to bridge
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    top.plot(seconds, [per_second.get(s, 0) for s in seconds], color="tab:blue")
    top.set_ylabel("acked writes / s")
    timed = [s for s in seconds if latencies.get(s)]
    p99 = [sorted(latencies[s])[int(0.99 * (len(latencies[s]) - 1))] for s in timed]
    p50 = [sorted(latencies[s])[len(latencies[s]) // 2] for s in timed]
    bottom.plot(timed, p50, ".-", label="p50", color="tab:green")
    bottom.plot(timed, p99, ".-", label="p99", color="tab:red")
    bottom.set_yscale("log")
    bottom.set_ylabel("write latency (ms)")
    bottom.set_xlabel("seconds since start")
    bottom.legend(loc="upper right")
    starts: dict[str, list[float]] = defaultdict(list)
    for op in ops:
        if op.kind != "fault":
            continue
        if op.status == "start":
            starts[op.value or ""].append(op.start)
        elif starts.get(op.value or ""):
            begin = starts[op.value or ""].pop(0)
            for ax in (top, bottom):
                ax.axvspan(begin, op.start, color="orange", alpha=0.2)
            top.text(
                begin,
                top.get_ylim()[1] * 0.95,
                (op.value or "")[:28],
                fontsize=6,
                rotation=90,
                va="top",
            )
    top.set_title("raftmq chaos run: acknowledged writes (fault windows shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
