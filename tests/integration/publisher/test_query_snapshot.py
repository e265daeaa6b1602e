"""Query snapshots at the publisher (issue 25): a raw Sync client receives each
refresh as the table's schema, a TRUNCATE and the result's rows; a query that fails
or a key the result lacks stops the publisher in one line, having written nothing."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from common.rpc import txrepl_pb2 as pb
from common.values import decode
from tests.support.feedclient import RawSubscriber
from tests.support.harness import Pair, publisher_start_fails, wait_until

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
        assert pair.pub is not None
        address = pair.pub.address

        async def run() -> RawSubscriber:
            sub = RawSubscriber(address, "sub1")
            await sub.start()
            try:
                await sub.wait_level(pair.head(), timeout=20)
            finally:
                await sub.close()
            return sub

        sub = asyncio.run(run())
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
