"""Measure apply latency and throughput into SQLite: ``python -m subscriber.apply.bench``.

Not a test.  Prints the median and p90 wall time of ``Applier.apply`` for small
batches and the throughput of large ones (row changes per second, end to end:
Arrow encoding, Spark net effect, ``toArrow()``, SQLite transaction).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, SparkSettings, SqliteWriter, create_spark_session

T = pb.ColumnType
SCHEMA = pb.TableSchema(
    table="orders",
    columns=[
        pb.Column(name="id", type=T.COLUMN_TYPE_INTEGER),
        pb.Column(name="customer", type=T.COLUMN_TYPE_TEXT, nullable=True),
        pb.Column(name="amount", type=T.COLUMN_TYPE_DECIMAL, scale=2, nullable=True),
        pb.Column(name="qty", type=T.COLUMN_TYPE_INTEGER, nullable=True),
        pb.Column(name="placed", type=T.COLUMN_TYPE_TIMESTAMP, nullable=True),
    ],
    primary_key=["id"],
)


def _entry(seq: int, rows: int, keys: int) -> pb.Entry:
    ops = []
    for j in range(rows):
        k = (seq * rows + j) % keys
        row = [
            pb.Value(int=k),
            pb.Value(text=f"customer {k % 97}"),
            pb.Value(decimal=f"{k % 1000}.{k % 100:02d}"),
            pb.Value(int=j),
            pb.Value(timestamp_us=1_700_000_000_000_000 + seq),
        ]
        op = pb.ROW_OP_UPDATE if j % 3 else pb.ROW_OP_INSERT
        key = [values.encode(k)] if op == pb.ROW_OP_UPDATE else []
        ops.append(pb.Op(row=pb.RowChange(table="orders", op=op, key=key, row=row)))
    return pb.Entry(commit_time_us=seq, ops=ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--large", type=int, nargs="*", default=[10_000, 100_000])
    args = ap.parse_args()
    spark = create_spark_session(SparkSettings())
    with tempfile.TemporaryDirectory() as tmp:
        applier = Applier(spark, SqliteWriter(Path(tmp) / "bench.db"), "bench")
        level = applier.apply(1, [pb.Entry(ops=[pb.Op(schema=SCHEMA)])], incarnation="b").level
        for _ in range(3):  # warm up the JVM and Python workers
            level = applier.apply(level + 1, [_entry(level + 1, 5, 1000)], incarnation="b").level
        for entries, rows in ((1, 1), (1, 10), (10, 10)):
            times = []
            for _ in range(args.repeat):
                batch = [_entry(level + 1 + i, rows, 100_000) for i in range(entries)]
                res = applier.apply(level + 1, batch, incarnation="b")
                level = res.level
                times.append(res.seconds)
            times.sort()
            p90 = times[int(len(times) * 0.9) - 1]
            print(
                f"small: {entries:>3} entries x {rows:>3} rows:"
                f" median {statistics.median(times):.3f} s, p90 {p90:.3f} s"
            )
        for total in args.large:
            per = 100
            batch = [_entry(level + 1 + i, per, total) for i in range(total // per)]
            t0 = time.perf_counter()
            res = applier.apply(level + 1, batch, incarnation="b")
            level = res.level
            dt = time.perf_counter() - t0
            print(
                f"large: {res.rows} row changes ({res.entries} entries, {res.written} net rows): "
                f"{dt:.2f} s, {res.rows / dt:,.0f} row changes/s"
            )
    spark.stop()


if __name__ == "__main__":
    main()
