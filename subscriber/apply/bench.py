"""Measure apply latency and throughput: ``python -m subscriber.apply.bench``.

Not a test.  Prints the median and p90 wall time of ``Applier.apply`` for small
batches and the throughput of large ones (row changes per second, end to end:
Arrow encoding, Spark net effect, ``toArrow()``, target transaction), with the CPU
seconds spent by this process, the Spark JVM and (PostgreSQL on this host) the
server -- on a shared machine CPU per row is steadier than wall time.

    python -m subscriber.apply.bench                       # SQLite in a temp dir
    python -m subscriber.apply.bench --target postgresql   # a private PostgreSQL 15
    python -m subscriber.apply.bench --target postgresql --dsn postgresql://u@h:p/db
    python -m subscriber.apply.bench --target postgresql --large --w1 10000 40000

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
from subscriber.apply import (
    Applier,
    ApplyResult,
    PostgresWriter,
    SparkSettings,
    SqliteWriter,
    Writer,
    create_spark_session,
)

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


W1_SCHEMAS = [
    pb.TableSchema(
        table="accounts",
        columns=[
            pb.Column(name="id", type=T.COLUMN_TYPE_INTEGER),
            pb.Column(name="owner", type=T.COLUMN_TYPE_TEXT),
            pb.Column(name="balance", type=T.COLUMN_TYPE_INTEGER),
            pb.Column(name="updated_at", type=T.COLUMN_TYPE_TIMESTAMPTZ),
        ],
        primary_key=["id"],
    ),
    pb.TableSchema(
        table="orders",
        columns=[
            pb.Column(name="id", type=T.COLUMN_TYPE_INTEGER),
            pb.Column(name="account_id", type=T.COLUMN_TYPE_INTEGER),
            pb.Column(name="amount", type=T.COLUMN_TYPE_DECIMAL, precision=12, scale=2),
            pb.Column(name="status", type=T.COLUMN_TYPE_TEXT),
            pb.Column(name="note", type=T.COLUMN_TYPE_TEXT, nullable=True),
        ],
        primary_key=["id"],
    ),
]


def w1_entries(transactions: int, *, seed: int = 42, prefix: str = "") -> list[pb.Entry]:
    """Entries shaped like workload W1 (../shared/bench/W1.md), one per transaction.

    Transaction 0 inserts 10,000 accounts; each next one inserts an order, updates its
    account (balance, updated_at), ships an earlier order with probability 0.2 and
    deletes one with probability 0.05.  Updates carry the key, as captures send it.
    The schema ops are not included (see :data:`W1_SCHEMAS`); ``prefix`` is put
    before the table names.
    """
    import random
    import string

    rng = random.Random(seed)
    now = 1_790_000_000_000_000

    def ts(i: int) -> pb.Value:
        return pb.Value(timestamptz=pb.TimestampTz(utc_us=now + i * 997, offset_s=0))

    def row(
        table: str, op: pb.RowOp.ValueType, cells: list[pb.Value], key: int | None = None
    ) -> pb.Op:
        keys = [pb.Value(int=key)] if key is not None else []
        return pb.Op(row=pb.RowChange(table=prefix + table, op=op, key=keys, row=cells))

    balances = [0] * 10_001
    first = [
        row(
            "accounts",
            pb.ROW_OP_INSERT,
            [pb.Value(int=a), pb.Value(text=f"owner-{a}"), pb.Value(int=0), ts(0)],
        )
        for a in range(1, 10_001)
    ]
    entries = [pb.Entry(commit_time_us=now, ops=first)]
    live: list[int] = []
    orders: dict[int, list[pb.Value]] = {}
    for i in range(1, transactions):
        account = rng.randint(1, 10_000)
        cents = rng.randint(100, 50_000)
        note = "".join(rng.choices(string.ascii_lowercase, k=40))
        cells = [
            pb.Value(int=i),
            pb.Value(int=account),
            pb.Value(decimal=f"{cents // 100}.{cents % 100:02d}"),
            pb.Value(text="new"),
            pb.Value(text=note),
        ]
        orders[i] = cells
        ops = [row("orders", pb.ROW_OP_INSERT, cells)]
        balances[account] += cents
        ops.append(
            row(
                "accounts",
                pb.ROW_OP_UPDATE,
                [
                    pb.Value(int=account),
                    pb.Value(text=f"owner-{account}"),
                    pb.Value(int=balances[account]),
                    ts(i),
                ],
                account,
            )
        )
        if rng.random() < 0.2 and live:
            pick = live[rng.randrange(len(live))]
            shipped = [*orders[pick][:3], pb.Value(text="shipped"), orders[pick][4]]
            orders[pick] = shipped
            ops.append(row("orders", pb.ROW_OP_UPDATE, shipped, pick))
        if rng.random() < 0.05 and live:
            at = rng.randrange(len(live))
            pick = live[at]
            live[at] = live[-1]
            live.pop()
            ops.append(
                pb.Op(
                    row=pb.RowChange(
                        table=prefix + "orders", op=pb.ROW_OP_DELETE, key=[pb.Value(int=pick)]
                    )
                )
            )
        live.append(i)
        entries.append(pb.Entry(commit_time_us=now + i, ops=ops))
    return entries


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--large", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--target", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--dsn", default="", help="PostgreSQL target (default: a private instance)")
    ap.add_argument("--w1", type=int, nargs="*", default=[], help="W1-like batch sizes (entries)")
    ap.add_argument("--w1-repeat", type=int, default=3)
    args = ap.parse_args()
    spark = create_spark_session(SparkSettings())
    jvm: Any = spark._jvm  # the JVM's pid, for its CPU time
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    with _target(args.target, args.dsn) as writer:
        applier = Applier(spark, writer, "bench")
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
            res, line = _timed_apply(applier, writer, jvm_pid, level, batch)
            level = res.level
            print(f"large: {line}")
        if args.w1:
            _w1(applier, writer, jvm_pid, args.w1, args.w1_repeat)
    spark.stop()


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
