"""Query snapshots at the publisher (issue 25): a raw Sync client receives each
refresh as the table's schema, a TRUNCATE and the result's rows; a query that fails
or a key the result lacks stops the publisher in one line, having written nothing."""

from __future__ import annotations

import datetime as dt
import decimal
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from common.rpc import txrepl_pb2 as pb
from common.values import decode
from tests.support.harness import Pair, admin_cli, publisher_start_fails, synced, wait_until

QUERY = "SELECT region, sum(amount) AS total FROM orders GROUP BY region"


def _pair(tmp_path: Path, **snapshot: object) -> Pair:
    tmp_path.mkdir(exist_ok=True)
    snap = {"table": "totals", "query": QUERY, "key": ["region"], **snapshot}
    pair = Pair(tmp_path, tables=["orders"], publication_extra={"snapshot": [snap]})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, region TEXT, amount INTEGER)")
    src.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(1, "eu", 10), (2, "us", 7)])
    src.close()
    return pair


def test_a_refresh_is_schema_truncate_and_rows(tmp_path: Path) -> None:
    """At start the publisher appends the query's result for ``totals``: its schema
    (the key as configured), a TRUNCATE, then one INSERT per result row."""
    pair = _pair(tmp_path)
    pair.start_publisher()
    try:
        log = tmp_path / "publisher.log"
        wait_until(lambda: "query snapshot refreshed" in log.read_text(), 20, "the refresh")
        sub = synced(pair)
        ops = [op for e in sub.received for op in pb.Entry.FromString(e).ops]
        mine = [op for op in ops if (op.schema.table or op.row.table) == "totals"]
        assert mine[0].schema.primary_key == ["region"]
        assert [c.name for c in mine[0].schema.columns] == ["region", "total"]
        assert mine[1].row.op == pb.ROW_OP_TRUNCATE
        rows = sorted(tuple(decode(v) for v in op.row.row) for op in mine[2:])
        assert rows == [("eu", 10), ("us", 7)]
        assert sub.target.snapshot()["totals"] == [("eu", 10), ("us", 7)]
    finally:
        pair.stop()


def test_a_bad_query_or_key_stops_the_publisher_in_one_line(tmp_path: Path) -> None:
    """A query naming a missing table, and a key the result lacks, are each one line
    naming the publication and the snapshot; nothing is written."""
    line = publisher_start_fails(_pair(tmp_path / "a", query="SELECT * FROM nowhere"))
    assert "'totals'" in line, line
    assert "nowhere" in line, line
    line = publisher_start_fails(_pair(tmp_path / "b", key=["id"]))
    assert "['id']" in line, line


def test_snapshot_only_publication_is_not_captured_and_refreshes_whole(tmp_path: Path) -> None:
    """A snapshot_only publication installs no capture on the source; a raw Sync
    client gets the table's contents at start, nothing for later source changes, and
    the new contents (a deleted row gone) after ``txrepl admin refresh-snapshot``."""
    tmp_path.mkdir(exist_ok=True)
    pair = Pair(tmp_path, tables=["orders"], publication_extra={"snapshot_only": True})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, region TEXT, amount INTEGER)")
    src.executemany("INSERT INTO orders VALUES (?, ?, ?)", [(1, "eu", 10), (2, "us", 7)])
    pair.start_publisher()
    try:
        log = tmp_path / "publisher.log"
        wait_until(lambda: "query snapshot refreshed" in log.read_text(), 20, "the refresh")
        triggers = src.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        assert triggers.fetchall() == []
        sub = synced(pair)
        assert sub.target.snapshot()["orders"] == [(1, "eu", 10), (2, "us", 7)]
        head = pair.head()
        src.execute("DELETE FROM orders WHERE id = 2")
        src.execute("INSERT INTO orders VALUES (3, 'apac', 1)")
        time.sleep(0.5)
        assert pair.head() == head  # no capture
        done = admin_cli(pair, "refresh-snapshot", "shop", "orders")
        assert done.returncode == 0, done.stderr
        sub = synced(pair, sub)
        assert sub.target.snapshot()["orders"] == [(1, "eu", 10), (3, "apac", 1)]
    finally:
        pair.stop()
        src.close()


@pytest.mark.postgres
def test_postgres_query_snapshot_keeps_the_result_types(tmp_path: Path, pg_server: Any) -> None:
    """On a PostgreSQL source the result's column types come from the server: a
    numeric sum arrives as an exact decimal, a count as an integer, a date as a date."""
    dsn = pg_server.create_database()
    with psycopg.connect(dsn, autocommit=True) as src:
        src.execute(
            "CREATE TABLE orders(id int PRIMARY KEY, region text, amount numeric(8,2), d date);"
            "INSERT INTO orders VALUES (1, 'eu', 1.10, '2026-01-02'), (2, 'eu', 2.25, "
            "'2026-01-03')"
        )
    query = (
        "SELECT region, sum(amount) AS total, count(*) AS n, max(d) AS last FROM orders "
        "GROUP BY region"
    )
    snap = {"table": "totals", "query": query, "key": ["region"]}
    pair = Pair(tmp_path, tables=["orders"], source_url=dsn, publication_extra={"snapshot": [snap]})
    pair.start_publisher()
    try:
        log = tmp_path / "publisher.log"
        wait_until(lambda: "query snapshot refreshed" in log.read_text(), 30, "the refresh")
        sub = synced(pair)
        assert sub.target.snapshot()["totals"] == [
            ("eu", decimal.Decimal("3.35"), 2, dt.date(2026, 1, 3))
        ]
    finally:
        pair.stop()


def test_a_refresh_failing_midway_is_abandoned_and_capture_goes_on(tmp_path: Path) -> None:
    """A refresh whose query fails after some fragments were appended (SQLite raises
    at row 1400, past the first fragments) closes its group as aborted: the subscribers
    apply none of it, the failure is logged, and captured changes keep flowing without
    capture ever failing on a group left open."""
    tmp_path.mkdir(exist_ok=True)
    query = (
        "SELECT id, CASE WHEN id = 1400 THEN abs(-9223372036854775808) ELSE id END AS v FROM orders"
    )
    snap = {"table": "bad", "query": query, "key": ["id"]}
    pair = Pair(tmp_path, tables=["orders"], publication_extra={"snapshot": [snap]})
    pair.publisher_extra = {"max_entry_bytes": 1024}
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, region TEXT, amount INTEGER)")
    src.executemany("INSERT INTO orders VALUES (?, 'eu', 1)", [(i,) for i in range(1, 1501)])
    pair.start_publisher()
    try:
        log = tmp_path / "publisher.log"
        wait_until(lambda: "query snapshot failed" in log.read_text(), 30, "the failure")
        head = pair.head()
        src.execute("INSERT INTO orders VALUES (2000, 'us', 2)")
        wait_until(lambda: pair.head() > head, 20, "capture after the failed refresh")
        sub = synced(pair)
        marks = [pb.Entry.FromString(e) for e in sub.received]
        assert any(m.aborted for m in marks)
        assert any(m.continued for m in marks)  # fragments of the abandoned group went out
        assert "capture failed" not in log.read_text()  # capture never met the open group
    finally:
        pair.stop()
        src.close()
