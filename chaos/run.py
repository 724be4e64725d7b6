"""One chaos test from start to verdict: start a proxied cluster, run the workload while the
nemesis injects faults, heal, measure recovery, read every replica, check, report."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chaos import checker, history, replication, report
from chaos.client_workload import ClientWorkload, ClientWorkloadOptions
from chaos.cluster import TOPIC, ChaosCluster, rack_of
from chaos.feature_workload import FeatureWorkload, FeatureWorkloadOptions
from chaos.history import Op
from chaos.metrics_watch import MetricsWatch
from chaos.monitor import Monitor
from chaos.nemesis import CATEGORIES, SEALED_SEGMENT_FAULTS, Nemesis
from chaos.share_workload import ShareWorkload
from chaos.txn_workload import OUT_TOPIC, TxnWorkload, TxnWorkloadOptions
from chaos.workload import Recorder, Workload, send_one
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.client import ClientError, ErrorCode, LowLevelClient
from raftmq.format import entry
from raftmq.format.records import decode_records


@dataclass
class ChaosOptions:
    out: Path
    nodes: int = 3
    partitions: int = 3
    duration: float = 60.0
    faults: list[str] = field(default_factory=lambda: ["partition", "kill", "pause", "latency"])
    seed: int = 0
    producers: int = 4
    recovery_limit: float = 30.0
    tick_ms: int = 50
    retention: bool | None = None
    """Small segments and aggressive retention; None: only when ``snapshot`` is a fault,
    since only a follower behind the leader's log start needs a snapshot."""
    segment_bytes: int = 2048
    sealed_segment_bytes: int = 16384
    """Segment size in runs with ``corrupt``, ``corrupt-config``, ``corrupt-index`` or
    ``fd-pressure`` (and no retention): small, so partitions seal segments within seconds
    (bit rot is put into sealed ones, and only they have index files) and hold many
    segment files (more than an open-file limit allows at one each)."""
    retention_bytes: int = 8192
    retention_check_ms: int = 250
    voters: int = 0
    """Controller voters: nodes 1..N, the others broker-only; 0: every node (combined)."""
    heal_delay_ms: int = 2000
    """How long a fenced broker waits before its replicas move (passed in runs with
    ``decommission`` only): short, so the moves happen while the other faults run."""
    heal_limit: float = 60.0
    """Runs with ``decommission``: seconds after the fault window by which every partition
    must be back at its replication factor of caught-up replicas on live brokers."""
    clients: bool = False
    """The workload of the real clients (chaos/client_workload.py): ``producers``
    Producers and ``consumers`` Consumers, instead of low-level sends and readers."""
    consumers: int = 3
    group: bool = False
    """With the clients: the consumers form a consumer group and commit (implies clients)."""
    idempotent: bool = False
    """With the clients: idempotent producers; duplicates become violations (implies
    clients)."""
    follower_reads: bool = False
    """Every broker in a rack of its own and, with the clients, each consumer reading
    from the in-sync replica in one of them (client_rack) rather than from the leader."""
    secure: bool = False
    """TLS on every listener, mutual for the clients (chaos/cluster.py); every client of
    the run presents the client certificate."""
    transactions: bool = False
    """The transactional workload too (chaos/txn_workload.py): a consume-transform-produce
    pipeline from the main topic to an output topic, direct transactional producers, and
    read_committed and read_uncommitted readers of the output (chaos/txn_checker.py)."""

    delayed: bool = False
    """The delayed-delivery workload too (chaos/feature_workload.py)."""
    tags: bool = False
    """Tagged records from the clients' producers and a consumer with a tag filter
    (chaos/feature_workload.py; implies clients)."""
    share_group: bool = False
    """The share group workload too (chaos/share_workload.py, chaos/share_checker.py)."""

    def __post_init__(self) -> None:
        if not 3 <= self.nodes <= 7:
            raise ValueError(f"--nodes must be 3 to 7, got {self.nodes}")
        if self.duration < 10:
            raise ValueError(f"--duration must be at least 10 seconds, got {self.duration}")
        if self.faults == ["all"]:
            # Every kind; decommission only where it can run (a broker beyond the factor).
            self.faults = [c for c in CATEGORIES if c != "decommission" or self.nodes >= 4]
        unknown = set(self.faults) - set(CATEGORIES)
        if unknown or not self.faults:
            raise ValueError(
                f"--faults takes all or a comma-separated list of {', '.join(CATEGORIES)}; "
                f"got {','.join(self.faults) or 'nothing'}"
            )
        self.clients = self.clients or self.group or self.idempotent or self.tags
        if self.clients and not 1 <= self.consumers <= 16:
            raise ValueError(f"--consumers must be 1 to 16, got {self.consumers}")
        if "decommission" in self.faults and (self.nodes < 4 or len(set(self.faults)) < 2):
            raise ValueError(
                "decommission kills a broker for good: it needs --nodes 4 or more (one beyond "
                "the replication factor of 3) and another fault kind to run while it heals"
            )

    def client_options(self) -> ClientWorkloadOptions:
        return ClientWorkloadOptions(
            producers=self.producers,
            consumers=self.consumers,
            group=self.group,
            idempotent=self.idempotent,
            tags=self.tags,
            racks=tuple(rack_of(i) for i in range(1, self.nodes + 1))
            if self.follower_reads
            else (),
        )

    def feature_options(self) -> FeatureWorkloadOptions:
        return FeatureWorkloadOptions(
            delayed=self.delayed, tags=self.tags, idempotent=self.idempotent, seed=self.seed
        )

    def txn_options(self) -> TxnWorkloadOptions:
        return TxnWorkloadOptions(seed=self.seed)

    @property
    def aggressive_retention(self) -> bool:
        return "snapshot" in self.faults if self.retention is None else self.retention

    def broker_args(self) -> list[str]:
        """The brokers' command line. Records are ~100 bytes and a partition takes a few
        KB/s, so retention must keep only a few KB for a follower cut off for ~10 s to fall
        below the leader's log start."""
        args = ["--tick-ms", str(self.tick_ms), "--election-ticks", "10"]
        if self.aggressive_retention:
            args += [
                "--segment-bytes",
                str(self.segment_bytes),
                "--retention-bytes",
                str(self.retention_bytes),
                "--retention-check-ms",
                str(self.retention_check_ms),
            ]
        elif SEALED_SEGMENT_FAULTS & set(self.faults):
            args += ["--segment-bytes", str(self.sealed_segment_bytes)]
        if "decommission" in self.faults:
            args += ["--heal-delay-ms", str(self.heal_delay_ms)]
        if "unsynced" in self.faults:
            # The ``unsynced`` fault cuts segments back to what the last fsync covered.
            args.append("--durability-markers")
        return args


Say = Callable[[str], None]

MIN_CATCH_UP_S = 5.0
"""The least time a final read waits for a replica to reach the leader's high watermark,
even when the recovery bound has already passed (recovery itself took long)."""

CORRUPT_RETRIES = 50
CORRUPT_RETRY_S = 0.2
"""A final read refused with CORRUPT_DATA is tried again for up to 10 s: the replica
restores the range from a peer within a round trip or two once a read has found it."""


def run(options: ChaosOptions, say: Say = print) -> checker.CheckResult:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    if (out / "data").exists():
        # A run starts from empty brokers: a previous run's logs would hand its records
        # (the same values, for the same seed) to this run's readers, which the checker
        # then counts as duplicates and phantoms of this run.
        say(f"removing the previous run's data in {out / 'data'}")
        shutil.rmtree(out / "data")
    say(f"starting {options.nodes} brokers behind toxiproxy (seed {options.seed})")
    chaos = ChaosCluster(
        out / "data",
        nodes=options.nodes,
        partitions=options.partitions,
        voters=options.voters,
        broker_args=options.broker_args(),
        racks=options.follower_reads,
        extra_topics=(OUT_TOPIC,) if options.transactions else (),
        secure=options.secure,
    )
    nemesis: Nemesis | None = None
    monitor: Monitor | None = None
    metrics: MetricsWatch | None = None
    recorder = Recorder()
    try:
        chaos.cluster.start()
        chaos.cluster.wait_for_leaders(timeout=60)
        advertised = [b.address for b in chaos.spec.brokers.values()]
        workload: Workload | ClientWorkload
        if options.clients:
            workload = ClientWorkload(
                advertised,
                TOPIC,
                options.partitions,
                recorder,
                options.client_options(),
                chaos.client_settings,
            )
        else:
            workload = Workload(
                advertised,
                TOPIC,
                options.partitions,
                recorder,
                producers=options.producers,
                client_settings=chaos.client_settings,
            )
        txn_workload = (
            TxnWorkload(
                advertised,
                TOPIC,
                options.partitions,
                recorder,
                options.txn_options(),
                client_settings=chaos.client_settings,
            )
            if options.transactions
            else None
        )
        features = (
            FeatureWorkload(
                advertised,
                TOPIC,
                options.partitions,
                recorder,
                options.feature_options(),
                client_settings=chaos.client_settings,
            )
            if options.delayed or options.tags
            else None
        )
        shares = (
            ShareWorkload(
                advertised,
                recorder,
                idempotent=options.idempotent,
                seed=options.seed,
                client_settings=chaos.client_settings,
            )
            if options.share_group
            else None
        )
        nemesis = Nemesis(chaos, options.seed, options.faults)
        monitor = Monitor(
            {i: chaos.direct_address(i) for i in chaos.nodes}, TOPIC, recorder, chaos.security
        )
        metrics = MetricsWatch({i: chaos.data / f"broker-{i}" for i in chaos.nodes}, recorder)
        recorder.t0 = time.monotonic()
        monitor.start()
        metrics.start()
        workload.start()
        if txn_workload is not None:
            txn_workload.start()
        if features is not None:
            features.start()
        if shares is not None:
            shares.start()
        time.sleep(min(3.0, options.duration / 10))
        while recorder.now() < options.duration:
            fault = nemesis.next_fault()
            recorder.add(
                Op(
                    "fault",
                    "nemesis",
                    value=fault.description,
                    status="start",
                    start=recorder.now(),
                    end=recorder.now(),
                )
            )
            say(f"{recorder.now():6.1f}s  fault: {fault.description}")
            hold, gap = nemesis.durations(fault)
            time.sleep(max(0.0, min(hold, options.duration - recorder.now())))
            fault.heal()
            recorder.add(
                Op(
                    "fault",
                    "nemesis",
                    value=fault.description,
                    status="end",
                    start=recorder.now(),
                    end=recorder.now(),
                )
            )
            time.sleep(gap)
        nemesis.heal_everything()
        healed = recorder.now()
        say(f"{healed:6.1f}s  healed everything; measuring recovery")
        recovery = _measure_recovery(advertised, options, recorder, chaos.client_settings)
        recorder.add(
            Op(
                "recovery",
                "nemesis",
                value=f"{recovery:.3f}" if recovery >= 0 else "-1",
                status="ok" if 0 <= recovery <= options.recovery_limit else "fail",
                start=healed,
                end=recorder.now(),
            )
        )
        say(f"recovered in {recovery:.1f} s" if recovery >= 0 else "did not recover")
        replicas = {p: chaos.replicas(p) for p in range(options.partitions)}
        if nemesis.gone:
            say(f"waiting for every partition to heal off broker(s) {sorted(nemesis.gone)}")
            replicas = replication.wait_healed(
                chaos, nemesis.gone, recorder, healed, options.heal_limit
            )
        time.sleep(1.0)
        workload.finish()
        if features is not None:
            say("ending the delayed and filtered consumers once every delayed record is due")
            features.finish()
        if shares is not None:
            say("draining the share group with fresh members; reading its dead letters")
            shares.finish(say)
        if txn_workload is not None:
            say("ending the transactional workload; reading its output")
            txn_workload.finish(
                [chaos.direct_address(i) for i in chaos.nodes if i not in nemesis.gone]
            )
        monitor.stop()
        metrics.stop()
        say("reading every partition from every replica")
        _final_reads(
            chaos, recorder, options, replicas, nemesis.gone, healed + options.recovery_limit
        )
        monitor.record_status(exclude=nemesis.gone)
    finally:
        if monitor is not None:
            monitor.close()
        if metrics is not None:
            metrics.stop()
        if nemesis is not None:
            nemesis.close()
        chaos.close()
    ops = recorder.ops()
    history.write(out / "history.jsonl", ops)
    result = checker.check(
        ops,
        idempotent=options.idempotent,
        recovery_limit_s=options.recovery_limit,
        heal_limit_s=options.heal_limit,
    )
    (out / "result.json").write_text(json.dumps(result.to_dict(), indent=2))
    faults = [asdict(o) for o in ops if o.kind == "fault"]
    (out / "faults.json").write_text(json.dumps(faults, indent=2))
    (out / "options.json").write_text(
        json.dumps({**asdict(options), "out": str(options.out)}, indent=2)
    )
    report.plot(ops, out / "timeline.png")
    return result


def _measure_recovery(
    addresses: list[str],
    options: ChaosOptions,
    recorder: Recorder,
    client_settings: Mapping[str, str],
) -> float:
    """Seconds until every partition has accepted an acks=all write after healing; -1 if
    that did not happen within twice the limit. The probes are sends like any other."""
    start = time.monotonic()
    pending = set(range(options.partitions))
    seq = 0
    with LowLevelClient(
        addresses,
        retries=4,
        retry_unavailable=False,
        **client_settings,  # type: ignore[arg-type]
    ) as client:
        while pending and time.monotonic() - start < 2 * options.recovery_limit:
            for p in sorted(pending):
                op = send_one(
                    client, recorder, "probe", TOPIC, p, history.send_value("probe", p, seq), 3000
                )
                seq += 1
                if op.status == "ok":
                    pending.discard(p)
            if pending:
                time.sleep(0.1)
    return time.monotonic() - start if not pending else -1.0


def _final_reads(
    chaos: ChaosCluster,
    recorder: Recorder,
    options: ChaosOptions,
    replicas: dict[int, tuple[int, ...]],
    gone: set[int],
    catch_up_until: float,
) -> None:
    """Read every replica of every partition (``replicas``: as the metadata lists them at
    the end) from its own log start to its high watermark (``range`` and ``final`` ops),
    then digest the range all of them hold. Brokers in ``gone`` were killed for good.

    A replica behind is waited for until ``catch_up_until`` (recorder time: healing plus
    the recovery limit), so one the checker finds short was given the whole bound."""
    direct = {i: chaos.direct_address(i) for i in chaos.nodes if i not in gone}
    with LowLevelClient(
        list(direct.values()),
        retries=20,
        **chaos.client_settings,  # type: ignore[arg-type]
    ) as client:
        for p in range(options.partitions):
            target = _leader_hw(client, direct, p)
            reads = {
                r: _read_replica(client, direct[r], p, target, recorder, r, catch_up_until)
                for r in replicas[p]
            }
            common_start = max(read.start for read in reads.values())
            common_end = min(read.hw for read in reads.values())
            for r, read in reads.items():
                digest = hashlib.sha256()
                for h in entry.iter_headers(read.raw, verify=False):
                    if _in_common_range(h, common_start, common_end):
                        digest.update(read.raw[h.position : h.end])
                recorder.add(
                    Op(
                        "digest",
                        f"final-{r}",
                        p,
                        digest.hexdigest(),
                        common_end,
                        start=recorder.now(),
                        end=recorder.now(),
                        replica=r,
                    )
                )


def _in_common_range(h: entry.EntryHeader, start: int, end: int) -> bool:
    """Whether every replica's final read holds the entry ``h``, so it belongs in the digest.

    Control entries (no-ops, configurations) take no offset: once retention ran (start >
    0), one sitting exactly at ``start`` may precede the first retained segment on one
    replica and be gone on another whose log starts there; one at ``end`` may lie past one
    replica's high watermark. Both are left out; everything between is on every replica,
    and with no retention (start 0) every replica holds the whole log from its first entry."""
    if h.base_offset < start or h.next_offset > end or h.base_offset >= end:
        return False
    return not (start > 0 and h.base_offset == start and h.record_count == 0)


def _leader_hw(client: LowLevelClient, direct: dict[int, str], partition: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        leader = client.refresh_leaders().get((TOPIC, partition))
        if leader is not None and leader.broker_id in direct:
            _, hw = _offsets(client, direct[leader.broker_id], partition)
            if hw >= 0:
                return hw
        time.sleep(0.2)
    return 0


@dataclass
class _ReplicaRead:
    """What one replica's final read covered: [start, hw) and the stored entry bytes."""

    start: int
    hw: int
    raw: bytes


def _offsets(client: LowLevelClient, address: str, partition: int) -> tuple[int, int]:
    """(log start, high watermark) of one replica; (-1, -1) if it does not answer."""
    try:
        resp = client.stub(address).ListOffsets(
            pb.ListOffsetsRequest(topic=TOPIC, partition=partition, position=pb.EARLIEST),
            timeout=5,
        )
    except Exception:
        return -1, -1
    return resp.log_start_offset, resp.high_watermark


def _read_replica(
    client: LowLevelClient,
    address: str,
    partition: int,
    target: int,
    recorder: Recorder,
    r: int,
    catch_up_until: float,
) -> _ReplicaRead:
    """Wait until the replica's high watermark reaches ``target`` (it catches up; at most
    until ``catch_up_until``, and at least a few seconds), then read it from its log
    start; each record becomes a ``final`` op, the range a ``range`` op (status ``fail``
    when the replica never answered: it has no log start to report).

    Retention may still move the start while we read (the last writes can push one more
    segment out); the read then starts over at the new start, so the ``range`` op always
    names a start the finals really begin at."""
    deadline = time.monotonic() + max(MIN_CATCH_UP_S, catch_up_until - recorder.now())
    start, hw = -1, -1
    while time.monotonic() < deadline:
        start, hw = _offsets(client, address, partition)
        if hw >= target:
            break
        time.sleep(0.2)
    if hw < 0:
        op = _range_op(partition, r, 0, 0, recorder, "no answer to ListOffsets")
        recorder.add(dataclasses.replace(op, status="fail"))
        return _ReplicaRead(0, 0, b"")
    error = None
    for _attempt in range(5):
        finals, pieces, restart, error = _read_range(
            client, address, partition, start, hw, r, recorder
        )
        if restart is None:
            break
        start, hw = _offsets(client, address, partition)
        if hw < 0:
            break
    recorder.add(_range_op(partition, r, start, hw, recorder, error))
    for op in finals:
        recorder.add(op)
    return _ReplicaRead(start, hw, b"".join(pieces))


def _range_op(
    partition: int, r: int, start: int, hw: int, recorder: Recorder, error: str | None = None
) -> Op:
    """``error``: why the final read stopped short of ``hw``, if it did."""
    now = recorder.now()
    return Op(
        "range", f"final-{r}", partition, None, start, "ok", now, now, hw=hw, replica=r, error=error
    )


def _read_range(
    client: LowLevelClient,
    address: str,
    partition: int,
    start: int,
    hw: int,
    r: int,
    recorder: Recorder,
) -> tuple[list[Op], list[bytes], int | None, str | None]:
    """Read [start, hw) of one replica: (final ops, entry bytes, None, None), or a new log
    start as the third item when retention moved it past ``start`` mid-read; the fourth is
    the refusal that ended the read early, if one did."""
    finals: list[Op] = []
    pieces: list[bytes] = []
    offset = start
    corrupt_retries = CORRUPT_RETRIES
    while offset < hw:
        try:
            resp = client.fetch(TOPIC, partition, offset, max_bytes=4 << 20, address=address)
        except ClientError as exc:
            moved = exc.meta.get("raftmq-log-start-offset")
            if (
                exc.code == ErrorCode.ERROR_CODE_OFFSET_OUT_OF_RANGE
                and moved is not None
                and int(moved) > offset
            ):
                return finals, pieces, int(moved), None
            if exc.code == ErrorCode.ERROR_CODE_CORRUPT_DATA and corrupt_retries > 0:
                # As the error table says: the replica restores the range from a peer;
                # read it again shortly.
                corrupt_retries -= 1
                time.sleep(CORRUPT_RETRY_S)
                continue
            return finals, pieces, None, f"{exc.label}: {exc}"
        if not resp.entries:
            break
        pieces.append(resp.entries)
        now = recorder.now()
        for h in entry.iter_headers(resp.entries):
            if h.type != entry.EntryType.DATA:
                continue
            for rec in decode_records(resp.entries, h):
                if rec.offset < hw:
                    finals.append(
                        Op(
                            "final",
                            f"final-{r}",
                            partition,
                            (rec.value or b"").decode(),
                            rec.offset,
                            "ok",
                            now,
                            now,
                            hw=hw,
                            replica=r,
                        )
                    )
        offset = resp.next_offset
    return finals, pieces, None, None
