"""Catch-up batches, net effect in Spark or in the driver, side by side (issue 23).

Not a test.  One process, one warm JVM, one private PostgreSQL: the same W1 batches
of ``--entries`` entries (default 64,000, the subscriber's ``[batch] max_entries``)
go into two databases, one applier with the default ``spark_min_rows`` (10,000: a
Spark job per batch), one with 1,000,000 (the net effect in the driver), alternating
which goes first.  Per batch it prints the plan
(``Applier.plan``: walk, decoding, net effect) and the write (``Applier.apply`` of
that plan: the target transaction); with plan ahead the longer of the two sets a
catch-up's rate.

    python -m tests.bench.bench_catchup_ab --batches 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, SparkSettings, create_spark_session
from subscriber.apply.entry import RawEntry
from subscriber.apply.options import ApplyOptions
from subscriber.targets.postgres import PostgresWriter
from tests.support.w1_entries import W1_SCHEMAS, w1_entries

VARIANTS = (("spark", ApplyOptions().spark_min_rows), ("driver", 1_000_000))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=64_000)
    ap.add_argument("--batches", type=int, default=5)
    args = ap.parse_args()
    from tests.fixtures.postgres import start_pg_instance  # a dev checkout only

    n = args.entries
    spark = create_spark_session(SparkSettings())
    stream = [RawEntry(e.SerializeToString()) for e in w1_entries(args.batches * n + 1)]
    appliers: dict[str, tuple[Applier, PostgresWriter]] = {}
    levels: dict[str, int] = {}
    times: dict[str, tuple[list[float], list[float]]] = {}
    with start_pg_instance() as pg:
        for name, min_rows in VARIANTS:
            writer = PostgresWriter(pg.create_database(f"ab_{name}"))
            applier = Applier(spark, writer, name, options=ApplyOptions(spark_min_rows=min_rows))
            schemas = pb.Entry(ops=[pb.Op(schema=s) for s in W1_SCHEMAS])
            level = applier.apply(1, [schemas], incarnation="b").level
            levels[name] = applier.apply(level + 1, stream[:1], incarnation="b").level
            appliers[name] = (applier, writer)
            times[name] = ([], [])
        at = 1
        for i in range(args.batches):
            batch = stream[at : at + n]
            at += n
            order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
            for name, _ in order:
                applier = appliers[name][0]
                t0 = time.perf_counter()
                plan = applier.plan(levels[name] + 1, batch)
                t1 = time.perf_counter()
                res = applier.apply(levels[name] + 1, batch, incarnation="b", planned=plan)
                t2 = time.perf_counter()
                levels[name] = res.level
                times[name][0].append(t1 - t0)
                times[name][1].append(t2 - t1)
                print(f"batch {i} {name}: plan {t1 - t0:.3f} s, write {t2 - t1:.3f} s, "
                      f"{res.rows} row changes", flush=True)  # fmt: skip
        for name, (plans, writes) in times.items():
            print(
                f"{name}: plan median {statistics.median(plans):.3f} s "
                f"[{min(plans):.3f}-{max(plans):.3f}], write median "
                f"{statistics.median(writes):.3f} s [{min(writes):.3f}-{max(writes):.3f}]"
            )
        for _, writer in appliers.values():
            writer.close()
    spark.stop()


if __name__ == "__main__":
    main()
