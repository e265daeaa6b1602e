"""PostgreSQL capture: a table's install snapshot crossed where the stream passes it."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from publisher.capture.postgres import PostgresCapture
from tests.support.pg_capture import capturing, execute, open_pub, read_entries, row_ops, wait_for

pytestmark = pytest.mark.postgres

SCHEMA = (
    "CREATE TABLE x(id int PRIMARY KEY, v int)",
    "CREATE TABLE y(id int PRIMARY KEY, n int)",
    "INSERT INTO y VALUES (1, 0)",
)
BACKLOG_ROWS = 100_000  # one transaction: the walsender is still decoding it when y changes


def _replayed(ops: list[tuple[str, str, list[object], list[object]]]) -> dict[object, object]:
    """The rows a log's ops of one table leave (key -> row), as a target applies them."""
    rows: dict[object, object] = {}
    for op, key, row in ((op, k, r) for _, op, k, r in ops):
        if op == "TRUNCATE":
            rows.clear()
        elif op == "DELETE":
            rows.pop(key[0])
        else:
            rows[row[0]] = row
    return rows


def test_a_change_right_after_a_snapshot_point_read_in_a_backlog_is_not_lost(
    pg_db: str, tmp_path: Path
) -> None:
    """A table added while capture is down has its snapshot taken when capture starts;
    a change to it committed just after that, read back to back with the backlog before
    it (no pause in the stream where the snapshot could be logged), still reaches the
    log: the table's rows in the log end as the source's, none lost or doubled."""
    execute(pg_db, *SCHEMA)
    pub = open_pub(tmp_path, "p1", ["x"])
    with capturing(pg_db, [pub]) as run:  # x captured, y not yet published
        execute(pg_db, "INSERT INTO x VALUES (0, 0)")
        run.wait_heads({"p1": 2})
    execute(pg_db, f"INSERT INTO x SELECT g, g FROM generate_series(1, {BACKLOG_ROWS}) g")
    cap = PostgresCapture(pg_db, slot="txrepl_test")
    try:
        assert cap.install("p1", pub.log.incarnation, ["x", "y"]) == ["y"]
    finally:
        cap.close()
    with (
        psycopg.connect(pg_db, autocommit=True) as conn,
        capturing(pg_db, [pub], install=False) as run,
    ):
        # The snapshot's slot is made as capture starts, before the stream: y's change
        # commits at once after it, while the walsender still decodes the backlog.
        query = "SELECT count(*) FROM pg_replication_slots WHERE temporary"
        while not (row := conn.execute(query).fetchone()) or not row[0]:
            time.sleep(0.001)
        conn.execute("UPDATE y SET n = 1 WHERE id = 1")
        conn.execute(f"INSERT INTO x VALUES ({BACKLOG_ROWS + 1}, 0)")
        wait_for(
            lambda: any(
                t == "x" and v[:1] == [BACKLOG_ROWS + 1]
                for t, _, _, v in row_ops(read_entries(pub))
            ),
            timeout=120,
            what="the last transaction logged",
        )
    ops = row_ops(read_entries(pub))
    assert _replayed([o for o in ops if o[0] == "y"]) == {1: [1, 1]}
    assert len(_replayed([o for o in ops if o[0] == "x"])) == BACKLOG_ROWS + 2
