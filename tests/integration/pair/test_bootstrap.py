"""Bootstrap (snapshot load) from a PostgreSQL source: parallel readers, key ranges,
COPY text into PostgreSQL, rows into SQLite; progress in ``status``; a kill -9 of
the reinit command mid-load leaves the old target and a rerun completes.

Real daemons, a real private PostgreSQL (tests/fixtures/postgres.py); the
publisher is configured with a tiny ``snapshot_range_rows`` so a few hundred rows
are read as several key ranges by several readers.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import ROOT, Pair, wait_until
from tests.support.workload import W1, W1_COLUMNS, diff_tables, pg_source, run_pg

SPLIT = {"snapshot_range_rows": 40, "snapshot_readers": 3}


def _rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


def _level(dsn: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT level, incarnation FROM txrepl_subscriptions WHERE subscription = 'pub1.shop'"
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _reads(pair: Pair) -> list[dict[str, Any]]:
    """The publisher's "snapshot reading" log lines (JSON: it logs to a file)."""
    log = (pair.workdir / "publisher.log").read_text()
    return [json.loads(line) for line in log.splitlines() if '"snapshot reading"' in line]


def _pg_pair(
    tmp_path: Path, pg_server: Any, w1: W1, slot: str, **more: Any
) -> tuple[Pair, Any, str, str]:
    """A PostgreSQL source holding W1's accounts and 30 order transactions, and a pair
    reading it with SPLIT; (pair, source connection, source dsn, target dsn)."""
    src_dsn = pg_server.create_database()
    dst_dsn = pg_server.create_database()
    src = pg_source(src_dsn)
    run_pg(src, w1.transactions(31))
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders"],
        source_url=src_dsn,
        publisher_extra={"slot": slot, **SPLIT},
        **more,
    )
    return pair, src, src_dsn, dst_dsn


@pytest.mark.spark
def test_key_range_split_load_of_two_tables_equals_the_source_on_both_targets(
    tmp_path: Path, pg_server: Any, spark: Any
) -> None:
    """Two tables, the bigger read as several key ranges by three readers: the
    PostgreSQL target (COPY text) and the SQLite target (rows) equal the source row
    by row."""
    pair, src, src_dsn, dst_dsn = _pg_pair(tmp_path, pg_server, W1(accounts=300), "boot_split")
    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the install snapshot in the log")
        pair.load_snapshot(dst_dsn)
        pair.load_snapshot(tmp_path / "target.db", spark=spark)
    finally:
        pair.stop()
    reads = _reads(pair)
    assert [r["copy_text"] for r in reads] == [True, False], reads  # PostgreSQL, SQLite
    assert all(r["readers"] == 3 for r in reads), reads
    assert all(r["pieces"] > 2 for r in reads), reads  # key ranges, not just 2 tables
    try:
        for table in ("accounts", "orders"):
            assert _rows(dst_dsn, table) == _rows(src_dsn, table), table
        target = sqlite3.connect(tmp_path / "target.db")
        assert diff_tables(src, target, W1_COLUMNS) == []
        target.close()
    finally:
        src.close()


def test_reinit_shows_progress_in_status_survives_a_kill_and_completes_on_rerun(
    tmp_path: Path, pg_server: Any
) -> None:
    """While ``txrepl subscriber reinit`` loads (its swap held by a reader), the
    daemon's status shows rows, rows/s and ETA; kill -9 leaves the old target and
    level; a rerun completes and the target equals the source."""
    w1 = W1(accounts=200)
    pair, src, src_dsn, dst_dsn = _pg_pair(
        tmp_path, pg_server, w1, "boot_kill", subscription_extra={"initial": "snapshot"}
    )
    pair.target_url = dst_dsn
    try:
        pair.start_publisher()
        pair.start_subscriber()
        run_pg(src, w1.transactions(5))
        pair.wait_caught_up(timeout=120)
        level0 = _level(dst_dsn)
        old = _rows(dst_dsn, "accounts")
        with psycopg.connect(dst_dsn) as holder:
            holder.execute("SELECT count(*) FROM accounts").fetchone()  # holds the swap back
            proc = subprocess.Popen(
                pair.reinit_argv(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )

            def loading() -> bool:
                st = pair.status()
                return st.HasField("snapshot") and st.snapshot.rows_loaded > 0

            wait_until(loading, 120, "the reinit's progress in the daemon's status")
            load = pair.status().snapshot
            assert load.by == "reinit"
            assert load.rows_expected >= load.rows_loaded > 0
            assert load.rows_per_s > 0
            assert load.eta_s >= 0
            assert pair.sub is not None
            status = [*pair.reinit_argv()[:4], "status", "--control", pair.sub.address]
            shown = subprocess.run(status, cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert "snapshot load (reinit):" in shown.stdout, shown
            assert "rows/s, ETA" in shown.stdout, shown
            as_json = subprocess.run(
                [*status, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60
            )
            (sub,) = json.loads(as_json.stdout)["subscriptions"]
            assert sub["snapshot"]["by"] == "reinit", sub
            assert int(sub["snapshot"]["rows_loaded"]) > 0, sub
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(30) == -signal.SIGKILL
            assert proc.stdout is not None
            out = proc.stdout.read()
            proc.stdout.close()
            assert b"rows/s ETA" in out, out  # the command printed its progress
            holder.rollback()
        wait_until(lambda: not pair.status().HasField("snapshot"), 30, "the status to drop it")
        assert _level(dst_dsn) == level0
        assert _rows(dst_dsn, "accounts") == old

        done = subprocess.run(
            pair.reinit_argv(), cwd=ROOT, capture_output=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert b"loaded snapshot" in done.stdout, done.stdout
        wait_until(
            lambda: all(_rows(dst_dsn, t) == _rows(src_dsn, t) for t in ("accounts", "orders")),
            60,
            "the target to equal the source",
        )
        assert not pair.status().HasField("snapshot")
    finally:
        pair.stop()
        src.close()
