"""One large source transaction end to end: time and peak RSS of every process (issue 21).

A SQLite source transaction of ``TXREPL_BENCH_BIG_SQLITE_ROWS`` (default 500,000)
row inserts and a PostgreSQL one of ``TXREPL_BENCH_BIG_PG_ROWS`` (default 2,000,000),
each written while publisher and subscriber run, are carried as a group of entries of
at most ``max_entry_bytes`` (default 4 MiB) and applied into a SQLite target in
pieces of ``[batch]`` limits inside one held target transaction.  The publisher's,
the subscriber's and the subscriber's JVM's VmRSS (and the daemons' RssAnon: VmRSS
also counts the publisher's mmapped log pages, reclaimable) are sampled every 0.25 s
from the commit of the source transaction until the target holds all of it.

    .venv/bin/python -m tests.bench big_txn
    TXREPL_BENCH_BIG_BATCH_BYTES=16777216 .venv/bin/python -m tests.bench big_txn
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench._pg import bench_cluster, pg_reason
from tests.bench.bench_w1 import _env_int, scrubbed_bench_env
from tests.support.harness import Pair, wait_until
from tests.support.rss import Sampler


def _count(target: Path) -> int:
    try:
        with sqlite3.connect(str(target), timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM docs").fetchone()[0])
    except sqlite3.Error:
        return -1


# The subscriber's [batch] max_bytes: a piece of a large transaction holds this much.
BATCH_BYTES = _env_int("TXREPL_BENCH_BIG_BATCH_BYTES", 0)


def _measure(kind: str, pair: Pair, rows: int, write: Any) -> dict[str, Any]:
    if BATCH_BYTES:
        pair.subscriber_extra = {"batch": {"max_bytes": BATCH_BYTES}}
    pair.start_publisher()
    pair.start_subscriber()
    wait_until(lambda: _count(pair.target_path) == 1, 600, "the table on the target")
    assert pair.pub is not None
    assert pair.sub is not None
    assert pair.pub.proc is not None
    assert pair.sub.proc is not None
    pub = Sampler(pair.pub.proc.pid)
    sub = Sampler(pair.sub.proc.pid, with_children=True)
    pub.start()
    sub.start()
    started = time.perf_counter()
    write()
    committed = time.perf_counter()
    wait_until(lambda: _count(pair.target_path) == rows + 1, 3600, "the transaction applied")
    done = time.perf_counter()
    ps, ss = pub.stop(), sub.stop()
    row = {
        "measure": "big_transaction",
        "source": kind,
        "rows": rows,
        "entries": pair.head(),
        "batch_max_bytes": BATCH_BYTES or "default",
        "write_s": round(committed - started, 1),
        "commit_to_applied_s": round(done - committed, 1),
        "publisher_rss_peak_mib": round(max((s[1] for s in ps), default=0) / 1024, 1),
        "publisher_anon_peak_mib": round(max((s[3] for s in ps), default=0) / 1024, 1),
        "subscriber_rss_peak_mib": round(max((s[1] for s in ss), default=0) / 1024, 1),
        "subscriber_anon_peak_mib": round(max((s[3] for s in ss), default=0) / 1024, 1),
        "jvm_rss_peak_mib": round(max((s[2] for s in ss), default=0) / 1024, 1),
    }
    print(f"  {row}", flush=True)
    return row


def sqlite_transaction(rows: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="txrepl-bench-bigtxn-"))
    pair = Pair(base, tables=["docs"])
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("PRAGMA journal_mode=WAL")
    src.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, n INTEGER, t TEXT)")
    src.execute("INSERT INTO docs VALUES (0, 0, 'first')")

    def write() -> None:
        src.execute("BEGIN")
        src.executemany(
            "INSERT INTO docs VALUES (?, ?, ?)", ((i, i, f"row {i}") for i in range(1, rows + 1))
        )
        src.execute("COMMIT")

    try:
        return _measure("sqlite", pair, rows, write)
    finally:
        pair.stop()
        src.close()


def pg_transaction(rows: int) -> dict[str, Any] | None:
    reason = pg_reason()
    if reason is not None:
        print(f"  PostgreSQL skipped: {reason}")
        return None
    import psycopg

    base = Path(tempfile.mkdtemp(prefix="txrepl-bench-bigtxn-pg-"))
    with bench_cluster() as server:
        dsn = server.create_database()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE docs(id bigint PRIMARY KEY, n bigint, t text)")
            conn.execute("INSERT INTO docs VALUES (0, 0, 'first')")
        pair = Pair(base, tables=["docs"], source_url=dsn, publisher_extra={"slot": "bigtxn"})

        def write() -> None:
            with psycopg.connect(dsn) as conn:
                conn.execute(
                    "INSERT INTO docs SELECT i, i, 'row ' || i FROM generate_series(1, %s) i",
                    (rows,),
                )

        try:
            return _measure("postgresql", pair, rows, write)
        finally:
            pair.stop()


def run(results_dir: Path) -> list[dict[str, Any]]:
    del results_dir
    out: list[dict[str, Any]] = []
    sqlite_rows = _env_int("TXREPL_BENCH_BIG_SQLITE_ROWS", 500_000)
    pg_rows = _env_int("TXREPL_BENCH_BIG_PG_ROWS", 2_000_000)
    with scrubbed_bench_env():
        if sqlite_rows:
            out.append(sqlite_transaction(sqlite_rows))
        if pg_rows:
            pg = pg_transaction(pg_rows)
            if pg is not None:
                out.append(pg)
    return out


if __name__ == "__main__":  # pragma: no cover
    print(run(Path(os.getcwd())))
