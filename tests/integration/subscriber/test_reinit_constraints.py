"""A reinit of tables with constraints on the target (issue 20): parent/child with a
foreign key and a UNIQUE column, on both targets; the target ends equal to the
source and keeps its constraints.  Real publisher, real snapshot load and swap."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.harness import Pair, wait_until

SOURCE = """
PRAGMA journal_mode=WAL;
CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL, note TEXT);
"""


def _source(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    conn.executescript(SOURCE)
    conn.executescript(
        "INSERT INTO parent VALUES (1, 'a'), (2, 'b'), (3, 'c');"
        "INSERT INTO child VALUES (10, 1, 'x'), (11, 2, 'y'), (12, 2, 'z');"
    )
    return conn


def _change(src: sqlite3.Connection) -> None:
    """Re-parenting, a swap of names through a temporary value, a delete, inserts."""
    src.executescript(
        """
        BEGIN;
        UPDATE child SET parent_id = 3 WHERE parent_id = 2;
        DELETE FROM parent WHERE id = 2;
        UPDATE parent SET name = 'tmp' WHERE id = 1;
        UPDATE parent SET name = 'a' WHERE id = 3;
        UPDATE parent SET name = 'c' WHERE id = 1;
        INSERT INTO parent VALUES (4, 'd');
        INSERT INTO child VALUES (13, 4, 'w');
        COMMIT;
        """
    )


def _rows(conn: Any) -> list[list[tuple[object, ...]]]:
    return [
        [tuple(r) for r in conn.execute("SELECT id, name FROM parent ORDER BY id").fetchall()],
        [
            tuple(r)
            for r in conn.execute("SELECT id, parent_id, note FROM child ORDER BY id").fetchall()
        ],
    ]


def _loaded(pair: Pair, src: sqlite3.Connection, load: Any) -> None:
    """Change the source, wait for it in the log, reinit."""
    head = pair.head()
    _change(src)
    wait_until(lambda: pair.head() > head, 60, "the change in the log")
    time.sleep(0.3)
    load()


def test_sqlite_reinit_keeps_the_tables_own_constraints(tmp_path: Path, spark: Any) -> None:
    pair = Pair(tmp_path, tables=["parent", "child"])
    src = _source(pair.source_path)
    dst = sqlite3.connect(str(pair.target_path), isolation_level=None)
    # The operator's own definitions, made before the first load.
    dst.executescript(
        """
        CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
        CREATE TABLE child (id INTEGER PRIMARY KEY,
          parent_id INTEGER NOT NULL REFERENCES parent (id), note TEXT CHECK (note <> ''));
        """
    )
    made = (
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name IN ('parent', 'child')"
    )
    before = sorted(dst.execute(made).fetchall())
    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the source in the log")
        pair.load_snapshot(pair.target_path, spark=spark)
        _loaded(pair, src, lambda: pair.load_snapshot(pair.target_path, spark=spark))
        assert _rows(dst) == _rows(src)
        assert sorted(dst.execute(made).fetchall()) == before
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            dst.execute("INSERT INTO parent VALUES (9, 'a')")
        dst.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            dst.execute("INSERT INTO child VALUES (99, 2, 'orphan')")
    finally:
        dst.close()
        pair.stop()


_CONSTRAINTS = (
    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
    " WHERE connamespace = 'public'::regnamespace AND contype IN ('f', 'u') ORDER BY 1, 2"
)


def test_pg_reinit_swaps_referenced_tables_and_keeps_foreign_keys(
    tmp_path: Path, pg_server: Any
) -> None:
    """Parent and child both published, a referencing table outside the publication:
    the swap replaces both and re-creates every foreign key, in one transaction."""
    pair = Pair(tmp_path, tables=["parent", "child"])
    src = _source(pair.source_path)
    dsn = pg_server.create_database()
    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the source in the log")
        pair.load_snapshot(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                """
                ALTER TABLE parent ADD CONSTRAINT parent_name UNIQUE (name);
                ALTER TABLE child ADD CONSTRAINT child_parent
                  FOREIGN KEY (parent_id) REFERENCES parent (id);
                CREATE TABLE remark (id int PRIMARY KEY,
                  parent_id bigint REFERENCES parent (id), name text REFERENCES parent (name));
                INSERT INTO remark VALUES (1, 1, 'a'), (2, 3, NULL);
                """
            )
            before = conn.execute(_CONSTRAINTS).fetchall()
        assert len(before) == 4, before
        _loaded(pair, src, lambda: pair.load_snapshot(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert _rows(conn) == _rows(src)
            assert conn.execute(_CONSTRAINTS).fetchall() == before
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("INSERT INTO remark VALUES (3, 2, NULL)")
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute("INSERT INTO parent VALUES (9, 'a')")
    finally:
        pair.stop()
