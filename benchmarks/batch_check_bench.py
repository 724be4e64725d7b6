"""What the produce-path record check costs: ``check_produce`` (headers, CRC and the walk of
every record's length prefixes) on a 16 KiB batch of 100 records, beside the CRC32C alone
and a full decode into Record objects (what a consumer pays).

Run: ``python -m benchmarks.batch_check_bench [--quick] [--json]``. Absolute times depend on
the machine and its load; the ratios to the CRC and to a full decode mostly do not.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from benchmarks.harness import add_run_options, print_json_last
from raftmq.format import entry
from raftmq.format.records import Record, build_batch, iter_records
from raftmq.partition.batch_check import check_produce

RECORDS = 100
VALUE_BYTES = 150


def per_call_us(fn: Callable[[], object], repeat: int, rounds: int = 5) -> float:
    """Microseconds per call: the best of ``rounds`` timings of ``repeat`` calls."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - started) / repeat)
    return best * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, "a fifth of the calls (a second instead of a few)")
    args = parser.parse_args(argv)
    scale = 5 if args.quick else 1
    now = int(time.time() * 1000)
    records = [
        Record(b"key-%05d" % i, b"v" * VALUE_BYTES, now + i, (("tag", b"a"),) if i % 4 == 0 else ())
        for i in range(RECORDS)
    ]
    batch = build_batch(records)
    header = entry.parse_header(batch)
    check_us = per_call_us(
        lambda: check_produce(batch, max_entry_bytes=1 << 20, max_future_ms=3_600_000, now_ms=now),
        500 // scale,
    )
    crc_us = per_call_us(lambda: entry.crc_ok(batch, header), 5000 // scale)
    decode_us = per_call_us(lambda: list(iter_records(batch)), 100 // scale)
    print(f"batch: {len(batch):,} bytes, {RECORDS} records")
    print(f"check_produce: {check_us:8.1f} us  ({check_us / RECORDS:.2f} us per record)")
    print(f"CRC32C alone:  {crc_us:8.1f} us")
    print(f"full decode:   {decode_us:8.1f} us  (check is {check_us / decode_us:.0%} of it)")
    if args.json:
        print_json_last(
            {
                "quick": args.quick,
                "batch_bytes": len(batch),
                "records": RECORDS,
                "check_produce_us": check_us,
                "crc32c_us": crc_us,
                "full_decode_us": decode_us,
                "check_to_decode_ratio": check_us / decode_us,
                "check_to_crc_ratio": check_us / crc_us,
            }
        )


if __name__ == "__main__":
    main()
