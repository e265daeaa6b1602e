"""ALTER TABLE on a published SQLite table, and a SQLite target's own triggers, end to end.

Real daemons (publisher, subscriber) on real files; a private PostgreSQL for the
PostgreSQL target.  The application's migrations must succeed on the source, and
the target must equal the source row for row, whether the subscriber applies
each change as it comes (running) or everything in one batch (paused: started
after the changes).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import Pair, wait_until
from tests.support.workload import diff_tables

pytestmark = pytest.mark.spark


def _source(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, c TEXT)")
    conn.executemany(
        "INSERT INTO items VALUES (?, ?, ?)", [(i, f"n{i}", f"c{i}") for i in range(5)]
    )
    return conn


def _columns(conn: sqlite3.Connection) -> list[str]:
    return [r[1] for r in conn.execute("PRAGMA table_info(items)")]


def _wait_equal(src: sqlite3.Connection, target: Any) -> None:
    """Target rows = source rows on the source's current columns (``target()``: a connection)."""
    cols = {"items": tuple(_columns(src))}
    last: list[str] = []

    def same() -> bool:
        nonlocal last
        dst = target()
        try:
            last = diff_tables(src, dst, cols, limit=3)
        except Exception as exc:  # the target may be mid-change
            last = [str(exc)]
        finally:
            dst.close()
        return not last

    try:
        wait_until(same, 90, "the target to equal the source", interval=0.2)
    except TimeoutError:
        raise AssertionError("target differs from source:\n" + "\n".join(last)) from None


def _migrations(src: sqlite3.Connection) -> list[str]:
    """Each schema change with writes around it; returns each step's name."""
    steps = []
    # ADD COLUMN with a default, used in the same transaction (the usual backfill).
    src.executescript(
        "BEGIN; ALTER TABLE items ADD COLUMN note TEXT DEFAULT 'n';"
        " UPDATE items SET note = 'set' WHERE id = 1; INSERT INTO items VALUES (10, 'x', 'y', 'z');"
        " COMMIT;"
    )
    src.execute("INSERT INTO items(id, name, c) VALUES (11, 'n11', 'c11')")
    steps.append("add column")
    # DROP COLUMN: failed in the application before ("error in trigger _txrepl_i_items").
    src.execute("ALTER TABLE items DROP COLUMN c")
    src.execute("INSERT INTO items(id, name) VALUES (12, 'n12')")
    src.execute("DELETE FROM items WHERE id = 0")
    steps.append("drop column")
    src.execute("ALTER TABLE items RENAME COLUMN name TO title")
    src.execute("UPDATE items SET title = 'renamed' WHERE id = 2")
    steps.append("rename column")
    # The SQLite way of changing anything else: create, copy, drop, rename.
    src.executescript(
        "BEGIN; CREATE TABLE items_new(id INTEGER PRIMARY KEY, title TEXT, note TEXT,"
        " qty INTEGER DEFAULT 7); INSERT INTO items_new(id, title, note)"
        " SELECT id, title, note FROM items; DROP TABLE items;"
        " ALTER TABLE items_new RENAME TO items; COMMIT;"
    )
    src.execute("INSERT INTO items VALUES (13, 't13', 'n13', 1)")
    src.execute("DELETE FROM items WHERE id = 3")
    steps.append("rebuild")
    return steps


def _sqlite_target(pair: Pair) -> Any:
    return lambda: sqlite3.connect(str(pair.target_path), timeout=30)


@pytest.mark.parametrize("mode", ["running", "paused"])
def test_alter_table_on_a_published_sqlite_table(tmp_path: Path, mode: str) -> None:
    """ADD (with a default), DROP, RENAME COLUMN and a rebuild: the application's ALTERs
    succeed and the SQLite target ends equal to the source, columns included."""
    pair = Pair(tmp_path, tables=["items"])
    src = _source(pair.source_path)
    target = _sqlite_target(pair)
    try:
        pair.start_publisher()
        if mode == "running":
            pair.start_subscriber()
            _wait_equal(src, target)
        _migrations(src)
        if mode == "paused":
            pair.start_subscriber()
        _wait_equal(src, target)
        dst = target()
        # A rename arrives as a drop and an add: the same columns, maybe in another order.
        assert sorted(r[1] for r in dst.execute("PRAGMA table_info(items)")) == sorted(
            _columns(src)
        )
        dst.close()
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()


def test_alter_table_while_the_publisher_is_down(tmp_path: Path) -> None:
    """Schema changes and writes while the publisher is stopped: after its restart the
    log holds no rows of two widths and the target equals the source."""
    pair = Pair(tmp_path, tables=["items"])
    src = _source(pair.source_path)
    target = _sqlite_target(pair)
    try:
        pair.start_publisher()
        pair.start_subscriber()
        _wait_equal(src, target)
        assert pair.pub is not None
        listen = "127.0.0.1:" + pair.pub.address.rsplit(":", 1)[1]  # the subscriber's address
        pair.pub.stop()
        src.execute("ALTER TABLE items ADD COLUMN note TEXT DEFAULT 'n'")
        src.execute("INSERT INTO items VALUES (20, 'a', 'b', 'c')")
        src.execute("ALTER TABLE items DROP COLUMN c")
        src.execute("UPDATE items SET note = 'later' WHERE id = 4")
        pair.start_publisher(listen=listen)
        src.execute("INSERT INTO items VALUES (21, 'd', 'e')")
        _wait_equal(src, target)
        src.execute("ALTER TABLE items RENAME COLUMN note TO remark")
        pair.pub.stop()
        src.execute("UPDATE items SET remark = 'after restart' WHERE id = 1")
        pair.start_publisher(listen=listen)
        _wait_equal(src, target)
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["running", "paused"])
def test_alter_table_into_postgresql(tmp_path: Path, pg_server: Any, mode: str) -> None:
    """The same migrations into a PostgreSQL target: rows equal on the source's columns."""
    import psycopg

    dsn = pg_server.create_database()
    pair = Pair(tmp_path, tables=["items"], target_url=dsn)
    src = _source(pair.source_path)
    try:
        pair.start_publisher()
        if mode == "running":
            pair.start_subscriber()
            _wait_equal(src, lambda: psycopg.connect(dsn))
        _migrations(src)
        if mode == "paused":
            pair.start_subscriber()
        _wait_equal(src, lambda: psycopg.connect(dsn))
        assert pair.status().state == "in_sync"
    finally:
        pair.stop()


AUDIT = """
CREATE TABLE IF NOT EXISTS items(id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE IF NOT EXISTS audit(id INTEGER PRIMARY KEY AUTOINCREMENT, item INTEGER, what TEXT);
CREATE TRIGGER IF NOT EXISTS items_audit AFTER INSERT ON items
BEGIN INSERT INTO audit(item, what) VALUES (NEW.id, 'insert'); END;
"""


def test_target_triggers_do_not_fire_for_replicated_rows(tmp_path: Path) -> None:
    """Triggers on the target do not fire for replicated rows: the replicated audit
    table equals the source's, a target-only audit table stays empty; the
    application's own writes on the target still fire them, and a trigger marked
    txrepl:always fires for replicated rows too."""
    pair = Pair(tmp_path, tables=["items", "audit"])
    src = sqlite3.connect(str(pair.source_path), isolation_level=None, timeout=30)
    src.execute("PRAGMA journal_mode=WAL")
    src.executescript(AUDIT)
    dst = sqlite3.connect(str(pair.target_path), isolation_level=None, timeout=30)
    dst.executescript(AUDIT)
    dst.executescript(
        "CREATE TABLE audit_local(item INTEGER, what TEXT);"
        " CREATE TRIGGER items_local AFTER UPDATE ON items"
        " BEGIN INSERT INTO audit_local VALUES (NEW.id, 'update'); END;"
        " CREATE TABLE seen(item INTEGER);"
        " CREATE TRIGGER items_seen AFTER INSERT ON items"
        " BEGIN /* txrepl:always */ INSERT INTO seen VALUES (NEW.id); END;"
    )
    src.execute("INSERT INTO items VALUES (1, 'before')")
    cols = {"items": ("id", "name"), "audit": ("id", "item", "what")}
    try:
        pair.start_publisher()
        pair.start_subscriber()
        src.executemany("INSERT INTO items VALUES (?, ?)", [(i, f"n{i}") for i in range(2, 6)])
        src.execute("UPDATE items SET name = 'changed' WHERE id = 2")

        def same() -> bool:
            try:
                return not diff_tables(src, dst, cols, limit=1)
            except sqlite3.Error:
                return False

        wait_until(same, 90, "the target to equal the source", interval=0.2)
        wait_until(lambda: pair.status().level == pair.head(), 30, "the last level")
        assert diff_tables(src, dst, cols) == []
        assert [r[0] for r in dst.execute("SELECT item FROM seen ORDER BY item")] == [1, 2, 3, 4, 5]
        # The target's own trigger did not fire for the replicated update.
        assert dst.execute("SELECT * FROM audit_local").fetchall() == []
        dst.execute("UPDATE items SET name = 'local' WHERE id = 3")
        assert dst.execute("SELECT * FROM audit_local").fetchall() == [(3, "update")]
        # The application's own write on the target still fires the trigger.
        dst.execute("INSERT INTO items VALUES (100, 'local')")
        assert dst.execute("SELECT what FROM audit WHERE item = 100").fetchall() == [("insert",)]
    finally:
        pair.stop()
        dst.close()


def test_subscriber_sigkill_while_it_applies_schema_changes(tmp_path: Path) -> None:
    """SIGKILL the subscriber while it applies the schema changes and table copies of a
    20,000-row table, three times; restarted, the target equals the source."""
    import random
    import time

    pair = Pair(tmp_path, tables=["items"])
    src = _source(pair.source_path)
    src.executemany(
        "INSERT INTO items VALUES (?, ?, ?)", [(i, f"n{i}", f"c{i}") for i in range(100, 20_100)]
    )
    rng = random.Random(5)
    try:
        pair.start_publisher()
        _migrations(src)
        for _ in range(3):
            pair.start_subscriber()
            wait_until(lambda: pair.status().level > 0, 120, "a first applied batch")
            time.sleep(rng.uniform(0.0, 0.5))
            assert pair.sub is not None
            pair.sub.kill()
            src.execute(
                "UPDATE items SET note = 'between kills' WHERE id = ?", (rng.randrange(20),)
            )
        pair.start_subscriber()
        _wait_equal(src, _sqlite_target(pair))
    finally:
        pair.stop()
