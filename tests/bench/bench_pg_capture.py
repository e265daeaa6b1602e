"""Benchmark of PostgreSQL capture (logical decoding into publication logs).

Formerly ``tests/integration/test_pg_capture_bench.py`` (a benchmark is not a test).
On a private PostgreSQL 15 cluster (``tests/bench/_pg.py``), with logs on
``fsync="always"``, one 5-column table ``w`` (bigint key, numeric(12,2), text,
timestamptz, boolean):

``catch-up``   capture installed on the empty table and stopped; 100,000 rows in
               1,000 transactions plus 2,000 one-row transactions written; capture
               started again and timed until all 3,000 entries are in the log.
``decode``     the server's decoding and transfer of one 100,000-row UPDATE
               transaction from a fresh pgoutput slot, then txrepl's pgoutput parser
               and value encoding alone over the same messages (rows/s: ``parse +
               encode``, the events' path), and the capture's own path from the
               messages to their ops' bytes (``messages to ops``,
               ``RowWriter.from_message``).
``snapshot``   the 102,000 existing rows installed into a new publication log
               (capture's install snapshot), timed until its entries are logged.

Run with ``python -m tests.bench pg_capture``; ``run(results_dir)`` prints a table,
writes ``bench_pg_capture.json`` there and returns the rows.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras

from publisher.capture.postgres import PostgresCapture
from publisher.capture.postgres._pgoutput import Relation, Update, parse_pgoutput
from publisher.capture.postgres._pgtypes import (
    SESSION_GUCS,
    TypeInfo,
    builtin_type,
    numeric_typmod,
    to_value,
)
from publisher.capture.postgres._pgwire import RowWriter
from publisher.config import PublicationConfig
from publisher.log import open_log
from publisher.publication import Publication
from tests.bench._pg import bench_cluster, pg_reason

__all__ = ["run"]

ROWS = 100_000
TABLE = (
    "CREATE TABLE w(id bigint PRIMARY KEY, amount numeric(12,2), note text,"
    " at timestamptz, ok boolean)"
)
FILL = (
    "INSERT INTO w SELECT g, g * 1.25, 'note ' || g, '2024-01-01'::timestamptz"
    " + g * interval '1 s', g % 2 = 0 FROM generate_series({lo}, {hi}) g"
)


def _capture(dsn: str, root: Path, slot: str, head: int) -> float:
    """Seconds for capture on ``slot`` to bring the log ``root/slot`` to ``head``."""
    pub = Publication(
        PublicationConfig(name=slot, tables=["w"]), open_log(root / slot, fsync="always")
    )
    cap = PostgresCapture(dsn, slot=slot, feedback_interval_s=0.2)
    halt = threading.Event()
    failed: list[BaseException] = []

    def capture() -> None:
        try:
            cap.run([pub], halt)
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=capture, daemon=True)
    try:
        cap.install(slot, pub.log.incarnation, ["w"])
        started = time.perf_counter()
        thread.start()
        deadline = time.monotonic() + 600
        while pub.log.head < head:
            if failed:
                raise RuntimeError(f"capture failed: {failed[0]!r}") from failed[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"log {slot} at {pub.log.head}, waited for {head}")
            time.sleep(0.02)
        return time.perf_counter() - started
    finally:
        halt.set()
        thread.join(30)
        cap.close()
        pub.log.close()


def _decode(dsn: str) -> tuple[float, float, float, int]:
    """(server decode + transfer s, parse + encode s, the capture's path s, row messages)
    for one 100k-row txn."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION bench FOR TABLE w")
        conn.execute("SELECT pg_create_logical_replication_slot('raw', 'pgoutput')")
        conn.execute("UPDATE w SET note = note || '!' WHERE id <= %s", (ROWS,))
    repl = psycopg2.connect(
        dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, options=SESSION_GUCS
    )
    try:
        cur = repl.cursor()
        cur.start_replication(
            slot_name="raw",
            decode=False,
            options={"proto_version": "1", "publication_names": "bench"},
        )
        payloads: list[bytes] = []
        t0 = time.perf_counter()
        while len(payloads) < ROWS + 3:  # BEGIN, RELATION, the updates, COMMIT
            msg = cur.read_message()
            if msg is None:
                time.sleep(0.001)
                continue
            payloads.append(msg.payload)
        stream_s = time.perf_counter() - t0
    finally:
        repl.close()
    t0 = time.perf_counter()
    infos: Sequence[TypeInfo] = []
    n = 0
    for p in payloads:
        ev = parse_pgoutput(p)
        if isinstance(ev, Relation):
            infos = [
                TypeInfo(builtin_type(c.type_oid) or 4, *numeric_typmod(c.typmod), "")
                for c in ev.columns
            ]
        elif isinstance(ev, Update):
            for d, info in zip(ev.new, infos, strict=True):
                to_value(d if isinstance(d, str) else None, info)
            n += 1
    parse_s = time.perf_counter() - t0
    # The capture's own path: each row message straight into its Op (_pgwire.py).
    writer = RowWriter("w", infos, [0])
    rows = [p for p in payloads if p[:1] == b"U"]
    t0 = time.perf_counter()
    for p in rows:
        writer.from_message(p)
    return stream_s, parse_s, time.perf_counter() - t0, n


def run(results_dir: Path) -> list[dict[str, Any]]:
    """Run the benchmark; print a table; write and return the result rows."""
    reason = pg_reason()
    if reason is not None:
        print(f"bench_pg_capture skipped: {reason}")
        return []
    rows: list[dict[str, Any]] = []
    with bench_cluster() as server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.create_database("capture_bench")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
        work = Path(tmp)
        _capture(dsn, work, "big", 1)  # installed on the empty table: one schema entry
        with psycopg.connect(dsn, autocommit=True) as conn:
            for lo in range(1, ROWS + 1, 100):
                conn.execute(FILL.format(lo=lo, hi=lo + 99))
            for i in range(ROWS + 1, ROWS + 2001):
                conn.execute(FILL.format(lo=i, hi=i))
        took = _capture(dsn, work, "big", 1 + 1000 + 2000)
        rows.append({"measure": "catch-up", "entries": 3000, "rows": ROWS + 2000, "s": took})
        stream_s, parse_s, ops_s, n = _decode(dsn)
        rows.append({"measure": "server decode + transfer", "rows": ROWS, "s": stream_s})
        rows.append({"measure": "parse + encode", "rows": n, "s": parse_s, "rows_s": n / parse_s})
        rows.append({"measure": "messages to ops", "rows": n, "s": ops_s, "rows_s": n / ops_s})
        took = _capture(dsn, work, "snap", -(-(ROWS + 2000 + 2) // 10_000))
        rows.append({"measure": "snapshot into a new log", "rows": ROWS + 2000, "s": took})
    for row in rows:
        rate = f"  ({row['rows'] / row['s']:,.0f} rows/s)" if row.get("rows") else ""
        print(f"{row['measure']:<28} {row['s']:8.2f} s{rate}")
    (results_dir / "bench_pg_capture.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows
