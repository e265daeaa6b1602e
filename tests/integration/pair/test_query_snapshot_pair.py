"""Query snapshots end to end (issue 25, Virtuoso's non-incremental snapshots): a
real subscriber's target table holds a query's result over the source, replaced
whole at each scheduled refresh and on demand (``txrepl admin refresh-snapshot``),
no longer refreshed once dropped, and gone from the target when dropped with delete."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.harness import Pair, admin_cli, wait_until

pytestmark = pytest.mark.spark

TOTALS = "SELECT region, sum(amount) AS total, count(*) AS n FROM orders GROUP BY region"
COUNTS = "SELECT 1 AS k, count(*) AS n FROM orders"


def _target(path: Path, sql: str) -> list[tuple[object, ...]] | None:
    """``sql``'s rows on the target; None while its table does not exist."""
    conn = sqlite3.connect(str(path))
    try:
        return sorted(conn.execute(sql).fetchall())
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()


def test_query_snapshots_refreshed_on_schedule_on_demand_and_dropped(tmp_path: Path) -> None:
    """``totals`` (every second) follows the source, a vanished region included;
    ``counts`` (on demand) changes only when refresh-snapshot is called; a dropped
    ``totals`` stays on the target, frozen; ``counts`` dropped with delete leaves it;
    the captured table replicates throughout; a dropped snapshot's refresh is refused
    in one line."""
    snapshots = [
        {"table": "totals", "query": TOTALS, "key": ["region"], "every_s": 1.0},
        {"table": "counts", "query": COUNTS, "key": ["k"]},
    ]
    pair = Pair(tmp_path, tables=["orders"], publication_extra={"snapshot": snapshots})
    src = sqlite3.connect(str(pair.source_path), isolation_level=None)
    src.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, region TEXT, amount INTEGER)")
    src.executemany(
        "INSERT INTO orders VALUES (?, ?, ?)", [(1, "eu", 10), (2, "eu", 5), (3, "us", 7)]
    )
    dst = pair.target_path
    totals = "SELECT region, total, n FROM totals"
    counts = "SELECT n FROM counts"
    try:
        pair.start_publisher()
        pair.start_subscriber()
        wait_until(lambda: _target(dst, totals) == [("eu", 15, 2), ("us", 7, 1)], 120, "totals")
        assert _target(dst, counts) == [(3,)]

        src.execute("DELETE FROM orders WHERE region = 'us'")
        src.execute("INSERT INTO orders VALUES (4, 'apac', 3), (6, 'apac', 1)")
        src.execute("UPDATE orders SET amount = 20 WHERE id = 1")
        wait_until(lambda: _target(dst, totals) == [("apac", 4, 2), ("eu", 25, 2)], 30, "a refresh")
        wait_until(
            lambda: _target(dst, "SELECT id FROM orders") == [(1,), (2,), (4,), (6,)], 30, "orders"
        )
        assert _target(dst, counts) == [(3,)]  # on demand only: not refreshed yet
        done = admin_cli(pair, "refresh-snapshot", "shop", "counts")
        assert done.returncode == 0, done.stderr
        assert "1 rows" in done.stdout
        wait_until(lambda: _target(dst, counts) == [(4,)], 30, "counts on demand")

        assert admin_cli(pair, "drop-snapshot", "shop", "totals").returncode == 0
        src.execute("INSERT INTO orders VALUES (5, 'eu', 1)")
        assert admin_cli(pair, "refresh-snapshot", "shop", "counts").returncode == 0
        wait_until(lambda: _target(dst, counts) == [(5,)], 30, "counts after the insert")
        time.sleep(2.5)  # two periods of totals: no refresh comes
        assert _target(dst, totals) == [("apac", 4, 2), ("eu", 25, 2)]

        done = admin_cli(pair, "drop-snapshot", "shop", "counts", "--with-delete")
        assert done.returncode == 0, done.stderr
        wait_until(lambda: _target(dst, counts) is None, 30, "counts dropped on the target")
        assert _target(dst, totals) == [("apac", 4, 2), ("eu", 25, 2)]
        refused = admin_cli(pair, "refresh-snapshot", "shop", "counts")
        assert refused.returncode != 0
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "no query snapshot 'counts'" in refused.stderr
    finally:
        pair.stop()
        src.close()
