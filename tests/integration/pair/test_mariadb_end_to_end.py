"""MariaDB targets end to end: real daemons, a private mariadbd, W1 checksums, a kill -9.

SQLite → MariaDB and PostgreSQL → MariaDB: a backlog before the subscriber starts and
live traffic after, the target's W1 checksum equal to the source's (and PostgreSQL
types value by value, docs/types.md); a reinit (the snapshot loader) rebuilds the
SQLite → MariaDB target.  Then the subscriber is killed (SIGKILL) mid-apply under a W1
+ ledger stream: afterwards every ledger row is on the target, written exactly once
(triggers on the target count the writes: MariaDB's triggers fire for replicated
rows), and the checksums are equal.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time
from pathlib import Path
from typing import Any

import pytest

from subscriber.targets.mariadb._conn import connect
from tests.fixtures.mariadb import MariaServer
from tests.support.chaos_stream import TABLES, StreamWriter
from tests.support.harness import Pair, wait_until
from tests.support.workload import (
    W1,
    W1_COLUMNS,
    diff_tables,
    pg_source,
    run_pg,
    run_sqlite,
    sqlite_source,
    w1_checksum,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.spark]


def _wait_equal(source: Any, url: str, timeout: float = 180) -> None:
    """Wait until the MariaDB target's W1 checksum equals the source's."""

    def equal() -> bool:
        dst = connect(url)
        try:
            return bool(w1_checksum(source) == w1_checksum(dst))
        except Exception:  # the tables may not be there yet
            return False
        finally:
            dst.close()

    try:
        wait_until(equal, timeout, "the MariaDB target to equal the source", interval=0.5)
    except TimeoutError:
        dst = connect(url)
        try:
            raise AssertionError("\n".join(diff_tables(source, dst, W1_COLUMNS))) from None
        finally:
            dst.close()


def _one(url: str, sql: str) -> tuple[Any, ...]:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            row = cur.fetchone()
            assert row is not None
            return tuple(row)
    finally:
        conn.close()


def test_w1_from_sqlite_into_mariadb_then_reinit(tmp_path: Path, maria_db: str) -> None:
    """W1 from SQLite into MariaDB: equal checksums, DECIMAL(12,2) kept; a reinit then
    loads the snapshot into the target and sets the level to its seq."""
    pair = Pair(tmp_path, tables=["accounts", "orders"], target_url=maria_db)
    src = sqlite_source(pair.source_path)
    w1 = W1(accounts=100)
    run_sqlite(src, w1.transactions(150))
    try:
        pair.start_publisher()
        pair.start_subscriber()
        run_sqlite(src, w1.transactions(100))
        _wait_equal(src, maria_db)
        head = pair.wait_caught_up()
        (kind,) = _one(
            maria_db,
            "SELECT column_type FROM information_schema.columns WHERE table_schema ="
            " DATABASE() AND table_name = 'orders' AND column_name = 'amount'",
        )
        assert kind == "decimal(12,2)"
        assert pair.sub is not None
        pair.sub.stop()
        _one(maria_db, "SELECT 1")
        conn = connect(maria_db)
        with conn.cursor() as cur:  # the target drifts; the reinit puts it right
            cur.execute("DELETE FROM orders WHERE id % 2 = 0")
        conn.commit()
        conn.close()
        run_sqlite(src, w1.transactions(20))
        seq = pair.load_snapshot(maria_db)
        assert seq >= head
        _wait_equal(src, maria_db, timeout=10)
        (level,) = _one(maria_db, "SELECT level FROM txrepl_subscriptions")
        assert level == seq
    finally:
        pair.stop()
        src.close()


_PG_TYPES = """
CREATE TABLE t_types (
    id integer PRIMARY KEY, u uuid, n numeric, n2 numeric(10,3), f double precision,
    ts timestamptz, b boolean, by bytea, j jsonb, d date, iv interval, arr int[],
    tx text, vc varchar(20)
);
INSERT INTO t_types VALUES
    (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 12345678901234567890123456789012345678.5,
     -1.250, -0.0, '2024-02-29 12:00:00.123456+02', true, '\\x00ff'::bytea,
     '{"b": 1, "a": [1, 2]}', '1969-12-31', '1 day 02:00:00', '{1,2,3}', 'Ünïcode ✓', 'a '),
    (2, NULL, 'NaN', NULL, 1e300, NULL, false, '', 'null', NULL, NULL, '{}', '', 'A');
"""


def test_w1_and_types_from_postgresql_into_mariadb(
    tmp_path: Path, pg_server: Any, maria_db: str
) -> None:
    """W1 from a PostgreSQL source (logical decoding) into MariaDB: equal checksums; and
    docs/types.md's PostgreSQL → MariaDB rows, value by value (table ``t_types``)."""
    src_dsn = pg_server.create_database()
    src = pg_source(src_dsn)
    src.execute(_PG_TYPES)
    w1 = W1(accounts=100)
    run_pg(src, w1.transactions(1))
    pair = Pair(
        tmp_path,
        tables=["accounts", "orders", "t_types"],
        source_url=src_dsn,
        target_url=maria_db,
        publisher_extra={"slot": "txrepl_w1_maria"},
    )
    try:
        pair.start_publisher()
        run_pg(src, w1.transactions(150))
        pair.start_subscriber()
        run_pg(src, w1.transactions(100))
        src.execute("UPDATE t_types SET vc = 'b' WHERE id = 2")  # a live change too
        _wait_equal(src, maria_db)
        pair.wait_caught_up()
        conn = connect(maria_db)
        with conn.cursor() as cur:
            cur.execute("SELECT * FROM t_types ORDER BY id")
            rows = [tuple(r) for r in cur.fetchall()]
            cur.execute(
                "SELECT column_name, column_type FROM information_schema.columns"
                " WHERE table_schema = DATABASE() AND table_name = 't_types'"
            )
            types = dict(cur.fetchall())
        conn.close()
    finally:
        pair.stop()
        src.close()
    assert types["n"] == "longtext"
    assert types["n2"] == "decimal(10,3)"
    assert types["ts"] == "datetime(6)"
    assert types["u"] == "longtext"
    assert rows[0] == (
        1,
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "12345678901234567890123456789012345678.5",
        decimal.Decimal("-1.250"),
        -0.0,
        dt.datetime(2024, 2, 29, 10, 0, 0, 123456),
        1,
        b"\x00\xff",
        '{"a": [1, 2], "b": 1}',
        dt.date(1969, 12, 31),
        "1 day 02:00:00",
        "{1,2,3}",
        "Ünïcode ✓",
        "a ",
    )
    assert rows[1] == (2, None, "NaN", None, 1e300, None, 0, b"", "null", None, None, "{}", "", "b")


_LEDGER_TARGET = [
    "CREATE TABLE ledger (id BIGINT NOT NULL PRIMARY KEY, txn BIGINT, note LONGTEXT)",
    "CREATE TABLE apply_count (id BIGINT NOT NULL PRIMARY KEY, n BIGINT NOT NULL)",
    "CREATE TRIGGER ledger_ai AFTER INSERT ON ledger FOR EACH ROW INSERT INTO apply_count"
    " VALUES (NEW.id, 1) ON DUPLICATE KEY UPDATE n = n + 1",
    "CREATE TRIGGER ledger_au AFTER UPDATE ON ledger FOR EACH ROW INSERT INTO apply_count"
    " VALUES (NEW.id, 1) ON DUPLICATE KEY UPDATE n = n + 1",
]


def test_subscriber_sigkill_mid_apply_loses_and_duplicates_nothing(
    tmp_path: Path, maria_server: MariaServer, maria_db: str
) -> None:
    """SIGKILL of the subscriber while it applies into MariaDB: after its restart the
    target equals the source and every ledger row was written exactly once."""
    name = maria_db.rsplit("/", 1)[1]
    for statement in _LEDGER_TARGET:
        maria_server.execute(statement, name)
    pair = Pair(tmp_path, tables=TABLES, target_url=maria_db)
    writer = StreamWriter(pair.source_path, rate=100, accounts=100)
    try:
        pair.start_publisher()
        writer.start()
        pair.start_subscriber()
        wait_until(lambda: pair.status().level > 0, 180, "a first applied batch")
        time.sleep(1.0)  # batches go in all the time at 100 txn/s
        writer.check()
        assert pair.sub is not None
        pair.sub.kill()
        pair.start_subscriber()
        time.sleep(1.0)
        committed = writer.stop()
        src = sqlite_source(pair.source_path)
        try:
            _wait_equal(src, maria_db)
        finally:
            src.close()
        pair.wait_caught_up()
        (n,) = _one(maria_db, "SELECT n FROM counter WHERE id = 1")
        rows, lo, hi = _one(maria_db, "SELECT count(*), min(id), max(id) FROM ledger")
        counted, most = _one(maria_db, "SELECT count(*), max(n) FROM apply_count")
        assert n == rows == counted == committed > 0
        assert (lo, hi) == (1, committed)
        assert most == 1, "a ledger row was written more than once"
    finally:
        if writer.is_alive():
            writer.halt.set()
        pair.stop()
