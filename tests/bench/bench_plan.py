"""Measure the apply's planning of small W1 batches: ``python -m tests.bench.bench_plan``.

Not a test.  ``Applier.plan`` (walk, decode, net effect in the driver: no Spark job
below ``spark_min_rows``) of consecutive 1- and 20-entry W1 batches, 200 of each
(``--sizes 1,20,100,400``: other sizes; from about 100 entries a batch takes the
vectorized path, ``subscriber/apply/_few.py``), against a SQLite target in a temp
dir (nothing is written).  Prints the median wall
time and the process CPU time per plan: on a shared machine the CPU time is the
steadier figure.  ``--profile`` prints the top of a ``cProfile`` by internal time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier
from subscriber.targets.sqlite import SqliteWriter
from tests.support.w1_entries import W1_SCHEMAS, w1_entries


class _NoSpark:
    """Planning small batches starts no Spark job; the applier only marks it warm."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plans", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sizes", default="1,20", help="entries per batch, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        writer = SqliteWriter(Path(tmp) / "plan.db")
        spark: Any = _NoSpark()
        applier = Applier(spark, writer, "bench")
        schemas = [pb.TableSchema() for _ in W1_SCHEMAS]
        for s, src in zip(schemas, W1_SCHEMAS, strict=True):
            s.CopyFrom(src)
            s.table = "w1_" + src.table
        sizes = [int(n) for n in args.sizes.split(",")]
        stream = w1_entries(max(3000, 3 * max(sizes)), prefix="w1_")
        ops = [pb.Op(schema=s) for s in schemas]
        level = applier.apply(1, [pb.Entry(ops=ops)], incarnation="b").level
        for size in sizes:
            at = 1
            for _ in range(20):  # warm up
                applier.plan(level + 1, stream[at : at + size])
                at = at + size if at + 2 * size < len(stream) else 1
            profile = cProfile.Profile()
            times = []
            cpu0 = time.process_time()
            for _ in range(args.plans):
                t0 = time.perf_counter()
                if args.profile:
                    profile.enable()
                applier.plan(level + 1, stream[at : at + size])
                if args.profile:
                    profile.disable()
                times.append(time.perf_counter() - t0)
                at = at + size if at + 2 * size < len(stream) else 1
            cpu = (time.process_time() - cpu0) / args.plans
            print(
                f"plan of {size:>3} W1 entries: median {statistics.median(times) * 1e3:.2f} ms,"
                f" CPU {cpu * 1e3:.2f} ms"
            )
            if args.profile:
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        writer.close()


if __name__ == "__main__":
    main()
