"""Query snapshots end to end (issue 25, Virtuoso's non-incremental snapshots): a
real subscriber's target table holds a query's result over the source, replaced
whole at each scheduled refresh."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.support.harness import Pair, wait_until

pytestmark = pytest.mark.spark

QUERY = "SELECT region, sum(amount) AS total, count(*) AS n FROM orders GROUP BY region"


def _target(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(str(path))
    try:
        return sorted(conn.execute("SELECT region, total, n FROM totals").fetchall())
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def test_query_snapshot_is_replaced_at_each_scheduled_refresh(tmp_path: Path) -> None:
    """The target's ``totals`` equals the query's result; after the source changes (a
    region gone, one added, amounts moved) the next refresh replaces it whole, the
    vanished region included, while the captured table keeps replicating."""
    snapshot = {"table": "totals", "query": QUERY, "key": ["region"], "every_s": 1.0}
    pair = Pair(tmp_path, tables=["orders"], publication_extra={"snapshot": [snapshot]})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, region TEXT, amount INTEGER)")
    src.executemany(
        "INSERT INTO orders VALUES (?, ?, ?)", [(1, "eu", 10), (2, "eu", 5), (3, "us", 7)]
    )
    try:
        pair.start_publisher()
        pair.start_subscriber()
        wait_until(
            lambda: _target(pair.target_path) == [("eu", 15, 2), ("us", 7, 1)], 120, "totals"
        )
        src.execute("DELETE FROM orders WHERE region = 'us'")
        src.execute("INSERT INTO orders VALUES (4, 'apac', 3)")
        src.execute("UPDATE orders SET amount = 20 WHERE id = 1")
        wait_until(
            lambda: _target(pair.target_path) == [("apac", 3, 1), ("eu", 25, 2)], 30, "a refresh"
        )

        def ids() -> list[tuple[object, ...]]:
            dst = sqlite3.connect(str(pair.target_path))
            try:
                return sorted(dst.execute("SELECT id FROM orders").fetchall())
            finally:
                dst.close()

        wait_until(lambda: ids() == [(1,), (2,), (4,)], 30, "the captured table")
    finally:
        pair.stop()
        src.close()
