"""Figures for docs/postgres.md (marked slow; prints them, asserts only sanity).

    .venv/bin/python -m pytest -p tests.fixtures.postgres -m slow -s \
        tests/integration/test_pg_capture_bench.py
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import psycopg2
import psycopg2.extras
import pytest

from publisher.capture.postgres import PostgresCapture
from publisher.capture.postgres._pgoutput import Relation, Update, parse_pgoutput
from publisher.capture.postgres._pgtypes import (
    SESSION_GUCS,
    TypeInfo,
    builtin_type,
    numeric_typmod,
    to_value,
)
from tests.integration.test_pg_capture_util import Running, open_pub

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROWS = 100_000
TABLE = (
    "CREATE TABLE w(id bigint PRIMARY KEY, amount numeric(12,2), note text,"
    " at timestamptz, ok boolean)"
)
FILL = (
    "INSERT INTO w SELECT g, g * 1.25, 'note ' || g, '2024-01-01'::timestamptz"
    " + g * interval '1 s', g % 2 = 0 FROM generate_series({lo}, {hi}) g"
)


def _catch_up(dsn: str, root: Path, slot: str, target_head: int) -> float:
    pub = open_pub(root, slot, ["w"])
    cap = PostgresCapture(dsn, slot=slot, feedback_interval_s=0.2)
    cap.install(slot, pub.log.incarnation, ["w"])
    run = Running(cap, [pub])
    t0 = time.perf_counter()
    run.thread.start()
    run.wait_heads({slot: target_head}, timeout=600)
    took = time.perf_counter() - t0
    run.stop()
    cap.close()
    pub.log.close()
    return took


def test_figures(pg_db: str, tmp_path: Path) -> None:
    """Decode rate of the parser; catch-up, small-transaction and snapshot rates."""
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute(TABLE)
    # 1. Capture installed on the empty table, then 100k rows in 1,000 transactions and
    #    2,000 one-row transactions written while capture is down: catch-up.
    first = open_pub(tmp_path, "big", ["w"])
    cap = PostgresCapture(pg_db, slot="big")
    cap.install("big", first.log.incarnation, ["w"])
    run = Running(cap, [first])
    run.thread.start()
    run.wait_heads({"big": 1})
    run.stop()
    cap.close()
    first.log.close()
    with psycopg.connect(pg_db, autocommit=True) as conn:
        for lo in range(1, ROWS + 1, 100):
            conn.execute(FILL.format(lo=lo, hi=lo + 99))
        for i in range(ROWS + 1, ROWS + 2001):
            conn.execute(FILL.format(lo=i, hi=i))
    took = _catch_up(pg_db, tmp_path, "big", 1 + 1000 + 2000)
    print(f"\ncatch-up, 100k rows in 1,000 txns + 2,000 one-row txns: {took:.2f} s")

    # 2. Parser + value encoding alone, on the same stream read from a fresh slot.
    with psycopg.connect(pg_db, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION bench FOR TABLE w")
        conn.execute("SELECT pg_create_logical_replication_slot('raw', 'pgoutput')")
        conn.execute("UPDATE w SET note = note || '!' WHERE id <= %s", (ROWS,))
    repl = psycopg2.connect(
        pg_db, connection_factory=psycopg2.extras.LogicalReplicationConnection, options=SESSION_GUCS
    )
    cur = repl.cursor()
    cur.start_replication(
        slot_name="raw", decode=False, options={"proto_version": "1", "publication_names": "bench"}
    )
    payloads: list[bytes] = []
    t0 = time.perf_counter()
    while len(payloads) < ROWS + 3:
        msg = cur.read_message()
        if msg is None:
            time.sleep(0.001)
            continue
        payloads.append(msg.payload)
    stream_s = time.perf_counter() - t0
    repl.close()
    t0 = time.perf_counter()
    infos: list[TypeInfo] = []
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
    print(f"server decoding + transfer of {ROWS} updates (1 txn): {stream_s:.2f} s")
    print(f"parse + encode {n} row messages: {parse_s:.2f} s ({n / parse_s:,.0f}/s)")

    # 3. Snapshot of the existing 102k rows for a new publication log.
    took = _catch_up(pg_db, tmp_path, "snap", -(-(ROWS + 2000 + 2) // 10_000))
    print(f"snapshot of {ROWS + 2000} rows into a new log: {took:.2f} s")
    assert n == ROWS
