"""Measure apply latency and throughput: ``python -m tests.bench.bench_apply``.

Not a test.  Prints the median and p90 wall time of ``Applier.apply`` for small
batches and the throughput of large ones (row changes per second, end to end:
Arrow encoding, Spark net effect, ``toArrow()``, target transaction), with the CPU
seconds spent by this process, the Spark JVM and (PostgreSQL on this host) the
server -- on a shared machine CPU per row is steadier than wall time.

    python -m tests.bench.bench_apply                     # SQLite in a temp dir
    python -m tests.bench.bench_apply --target postgresql   # a private PostgreSQL 15
    python -m tests.bench.bench_apply --target postgresql --dsn postgresql://u@h:p/db
    python -m tests.bench.bench_apply --target postgresql --large --w1 10000 40000

``python -m tests.bench apply`` (and ``make bench``) runs it with the defaults
(SQLite) through :func:`run`.

``--w1 N ...`` applies consecutive parts of a W1-like stream (tables ``w1_accounts``
and ``w1_orders``) in batches of N entries (one transaction each; 10,000 is the
subscriber's default ``max_entries``), ``--w1-repeat`` times per size, and prints
the median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, ApplyResult, SparkSettings, Writer, create_spark_session
from subscriber.targets.postgres import PostgresWriter
from subscriber.targets.sqlite import SqliteWriter
from tests.support.w1_entries import W1_SCHEMAS, w1_entries

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


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _backend_cpu_s(writer: Writer) -> float:
    """CPU time of the PostgreSQL backend serving the writer (0 for other targets)."""
    if isinstance(writer, PostgresWriter) and writer.backend_pid:
        return _cpu_s(writer.backend_pid)
    return 0.0


@contextlib.contextmanager
def _target(kind: str, dsn: str) -> Iterator[Writer]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            writer: Writer = SqliteWriter(Path(tmp) / "bench.db")
            yield writer
            writer.close()
        return
    if dsn:
        writer = PostgresWriter(dsn)
        yield writer
        writer.close()
        return
    from tests.fixtures.postgres import start_pg_instance  # a dev checkout only

    # Durable settings, as a real target would run (the test defaults turn fsync off).
    with start_pg_instance(fsync="on", synchronous_commit="on", shared_buffers="'256MB'") as pg:
        writer = PostgresWriter(pg.create_database("bench"))
        yield writer
        writer.close()


def run(results_dir: Path) -> list[dict[str, Any]]:
    """``python -m tests.bench apply``: the default run (SQLite), as result rows."""
    return _bench(_parser().parse_args([]))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--large", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--target", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--dsn", default="", help="PostgreSQL target (default: a private instance)")
    ap.add_argument("--w1", type=int, nargs="*", default=[], help="W1-like batch sizes (entries)")
    ap.add_argument("--w1-repeat", type=int, default=3)
    return ap


def main() -> None:
    _bench(_parser().parse_args())


def _bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    spark = create_spark_session(SparkSettings())
    jvm: Any = spark._jvm  # the JVM's pid, for its CPU time
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    with _target(args.target, args.dsn) as writer:
        applier = Applier(spark, writer, "bench")
        level = applier.apply(1, [pb.Entry(ops=[pb.Op(schema=SCHEMA)])], incarnation="b").level
        for _ in range(3):  # warm up the JVM and Python workers
            level = applier.apply(level + 1, [_entry(level + 1, 5, 1000)], incarnation="b").level
        for entries, rows_per in ((1, 1), (1, 10), (10, 10)):
            times = []
            for _ in range(args.repeat):
                batch = [_entry(level + 1 + i, rows_per, 100_000) for i in range(entries)]
                res = applier.apply(level + 1, batch, incarnation="b")
                level = res.level
                times.append(res.seconds)
            times.sort()
            p90 = times[int(len(times) * 0.9) - 1]
            rows.append(
                {
                    "target": args.target,
                    "kind": "small",
                    "entries": entries,
                    "rows": rows_per,
                    "median_s": statistics.median(times),
                    "p90_s": p90,
                }
            )
            print(
                f"small: {entries:>3} entries x {rows_per:>3} rows:"
                f" median {statistics.median(times):.3f} s, p90 {p90:.3f} s"
            )
        for total in args.large:
            per = 100
            batch = [_entry(level + 1 + i, per, total) for i in range(total // per)]
            res, line = _timed_apply(applier, writer, jvm_pid, level, batch)
            level = res.level
            rows.append({"target": args.target, "kind": "large", "rows": res.rows, "line": line})
            print(f"large: {line}")
        if args.w1:
            _w1(applier, writer, jvm_pid, args.w1, args.w1_repeat)
    spark.stop()
    return rows


def _timed_apply(
    applier: Applier, writer: Writer, jvm_pid: int, level: int, batch: list[pb.Entry]
) -> tuple[ApplyResult, str]:
    """Apply ``batch`` after ``level``; the result and a line with its rate and CPU split."""
    g0 = _backend_cpu_s(writer)
    t0, p0, j0 = time.perf_counter(), time.process_time(), _cpu_s(jvm_pid)
    res = applier.apply(level + 1, batch, incarnation="b")
    dt = time.perf_counter() - t0
    py, jv = time.process_time() - p0, _cpu_s(jvm_pid) - j0
    pg = _backend_cpu_s(writer) - g0
    return res, (
        f"{res.rows} row changes ({res.entries} entries, {res.written} net rows): "
        f"{dt:.2f} s, {res.rows / dt:,.0f} row changes/s; CPU s: python {py:.2f}, "
        f"jvm {jv:.2f}, postgres backend {pg:.2f} "
        f"({(py + jv + pg) / res.rows * 1e6:.1f} us/row)"
    )


def _w1(applier: Applier, writer: Writer, jvm_pid: int, sizes: list[int], repeat: int) -> None:
    schemas = [pb.TableSchema() for _ in W1_SCHEMAS]
    for s, src in zip(schemas, W1_SCHEMAS, strict=True):
        s.CopyFrom(src)
        s.table = "w1_" + src.table
    stream = w1_entries(sum(sizes) * repeat + 1, prefix="w1_")
    level = applier.state.level
    level = applier.apply(
        level + 1, [pb.Entry(ops=[pb.Op(schema=s) for s in schemas])], incarnation="b"
    ).level
    level = applier.apply(level + 1, stream[:1], incarnation="b").level  # the 10,000 accounts
    at = 1
    for size in sizes:
        rates = []
        for _ in range(repeat):
            batch = stream[at : at + size]
            at += size
            t0 = time.perf_counter()
            res, line = _timed_apply(applier, writer, jvm_pid, level, batch)
            rates.append(res.rows / (time.perf_counter() - t0))
            level = res.level
            print(f"w1: {line}")
        print(f"w1: {size} entries per batch: median {statistics.median(rates):,.0f} row changes/s")


if __name__ == "__main__":
    main()
