"""The cost of conflict checks: ``python -m tests.bench.bench_conflicts [ROWS]``.

Not a test.  One batch updating ROWS rows (default 5,000) of a table, applied through
the Applier with detection off, then on (``publisher_wins``, no conflicts: every row is
read, its version compared and written back), and with every row a conflict (changed on
the target first: the log rows too); SQLite in a temp dir and a private PostgreSQL 15.
Wall time of ``Applier.apply`` for that batch, planning included.
"""

from __future__ import annotations

import decimal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import Applier, SparkSettings, Writer, create_spark_session
from subscriber.config import ApplyConfig, SubscriptionConfig
from subscriber.targets import attach_conflicts, updatable_options
from subscriber.targets.postgres import PostgresWriter
from subscriber.targets.sqlite import SqliteWriter
from tests.bench._pg import bench_cluster, pg_reason
from tests.support.entries import INC, ITEMS, ins, schema_op, upd


def _entry(*ops: pb.Op) -> pb.Entry:
    return pb.Entry(commit_time_us=1, source_position="p", ops=list(ops))


def _once(spark: Any, writer: Writer, resolver: str, local: Any, rows: int) -> float:
    sc = SubscriptionConfig(
        publisher="p", address="127.0.0.1:1", publication="x", name="s", conflicts=resolver
    )
    attach_conflicts(writer, [sc])
    applier = Applier(spark, writer, subscription="s")
    applier.configure(updatable_options(ApplyConfig(), sc))
    one = decimal.Decimal(1)
    applier.apply(
        1, [_entry(schema_op(ITEMS), *[ins("items", i, "a", one) for i in range(rows)])],
        incarnation=INC,
    )  # fmt: skip
    if local is not None:
        local("UPDATE items SET name = 'local'")
    batch = [_entry(*[upd("items", (i,), i, "b", one + 1) for i in range(rows)])]
    started = time.perf_counter()
    applier.apply(2, batch, incarnation=INC)
    return time.perf_counter() - started


def _sqlite(spark: Any, rows: int, resolver: str, conflicts: bool) -> float:
    import sqlite3

    path = Path(tempfile.mkdtemp()) / "t.db"

    def local(sql: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(sql)

    writer = SqliteWriter(path)
    try:
        return _once(spark, writer, resolver, local if conflicts else None, rows)
    finally:
        writer.close()


def _postgres(spark: Any, dsn: str, rows: int, resolver: str, conflicts: bool) -> float:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS items, txrepl_subscriptions, txrepl_schemas, txrepl_errors, "
            "txrepl_conflicts, txrepl_row_versions CASCADE"
        )

    def local(sql: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.encode())

    writer = PostgresWriter(dsn)
    try:
        return _once(spark, writer, resolver, local if conflicts else None, rows)
    finally:
        writer.close()


CASES = [
    ("off", "", False),
    ("checked", "publisher_wins", False),
    ("conflicts", "publisher_wins", True),
]


def _bench(rows: int) -> list[dict[str, Any]]:
    spark = create_spark_session(SparkSettings(master="local[1]"))
    out: list[dict[str, Any]] = []
    try:
        for case, resolver, conflicts in CASES:
            out.append({"target": "sqlite", "case": case, "rows": rows,
                        "seconds": _sqlite(spark, rows, resolver, conflicts)})  # fmt: skip
        if pg_reason() is None:
            with bench_cluster() as server:
                for case, resolver, conflicts in CASES:
                    s = _postgres(spark, server.dsn(), rows, resolver, conflicts)
                    out.append({"target": "postgresql", "case": case, "rows": rows, "seconds": s})
    finally:
        spark.stop()
    print(f"{'TARGET':<12} {'CASE':<10} {'ROWS':>7} {'SECONDS':>8} {'US/ROW':>8}")
    for r in out:
        us = r["seconds"] / r["rows"] * 1e6
        print(f"{r['target']:<12} {r['case']:<10} {r['rows']:>7} {r['seconds']:>8.3f} {us:>8.0f}")
    return out


def run(results_dir: Path) -> list[dict[str, Any]]:
    """``python -m tests.bench conflicts``: 5,000 rows."""
    return _bench(5000)


if __name__ == "__main__":
    _bench(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
