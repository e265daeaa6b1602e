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


def _sqlite_refuses(dst: sqlite3.Connection) -> None:
    """The target's parent refuses a duplicate name, its child (foreign keys on) an
    orphan."""
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        dst.execute("INSERT INTO parent VALUES (9, 'a')")
    dst.execute("PRAGMA foreign_keys=ON")
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        dst.execute("INSERT INTO child VALUES (99, 2, 'orphan')")


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
        _sqlite_refuses(dst)
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


# The source declares its constraints; the targets start empty, so whatever they end
# with came from the published schema (TableSchema.constraints).
DECLARED = """
PRAGMA journal_mode=WAL;
CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE child (id INTEGER PRIMARY KEY,
  parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE, note TEXT);
CREATE INDEX child_note ON child (note);
INSERT INTO parent VALUES (1, 'a'), (2, 'b'), (3, 'c');
INSERT INTO child VALUES (10, 1, 'x'), (11, 2, 'y'), (12, 2, 'z');
"""


def _declared(pair: Pair) -> sqlite3.Connection:
    src = sqlite3.connect(str(pair.source_path), isolation_level=None, timeout=30)
    src.executescript(DECLARED)
    return src


def _reloaded(pair: Pair, src: sqlite3.Connection, load: Any) -> None:
    """Load, then change the rows and drop the source's index, and load again."""
    pair.start_publisher()
    wait_until(lambda: pair.head() > 0, 60, "the source in the log")
    load()
    head = pair.head()
    src.execute("DROP INDEX child_note")
    _change(src)
    wait_until(lambda: pair.head() > head, 60, "the change in the log")
    time.sleep(0.3)
    load()


def test_sqlite_reinit_creates_the_sources_constraints(tmp_path: Path, spark: Any) -> None:
    """A reinit into an empty SQLite target gives the tables the source's UNIQUE
    constraint, foreign key (with its action) and index; a second reinit after the
    source dropped its index leaves the target without it."""
    pair = Pair(tmp_path, tables=["parent", "child"])
    src = _declared(pair)
    dst = sqlite3.connect(str(pair.target_path), isolation_level=None)
    indexes = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'child'"
    try:
        first: list[object] = []

        def load() -> None:
            pair.load_snapshot(pair.target_path, spark=spark)
            first.append(sorted(r[0] for r in dst.execute(indexes)))

        _reloaded(pair, src, load)
        assert first == [["child_note"], []]
        assert _rows(dst) == _rows(src)
        fks = dst.execute("PRAGMA foreign_key_list(child)").fetchall()
        assert [(r[2], r[3], r[4], r[6]) for r in fks] == [("parent", "parent_id", "id", "CASCADE")]
        _sqlite_refuses(dst)
    finally:
        dst.close()
        pair.stop()


_ALL = (
    "SELECT conrelid::regclass::text, contype, pg_get_constraintdef(oid), convalidated"
    " FROM pg_constraint WHERE connamespace = 'public'::regnamespace AND contype IN ('f', 'u')"
    " ORDER BY 1, 2"
)
_INDEXES = "SELECT indexname FROM pg_indexes WHERE tablename = 'child' AND indexname = 'child_note'"


def test_pg_reinit_creates_the_sources_constraints(tmp_path: Path, pg_server: Any) -> None:
    """A reinit into an empty PostgreSQL target gives the tables the source's UNIQUE
    constraint, validated foreign key (with its action) and index, in the swap's
    transaction; a second reinit after the source dropped its index leaves the
    target without it."""
    pair = Pair(tmp_path, tables=["parent", "child"])
    src = _declared(pair)
    dsn = pg_server.create_database()
    seen: list[object] = []

    def load() -> None:
        pair.load_snapshot(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            seen.append(len(conn.execute(_INDEXES).fetchall()))

    try:
        _reloaded(pair, src, load)
        assert seen == [1, 0]
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert _rows(conn) == _rows(src)
            assert conn.execute(_ALL).fetchall() == [
                (
                    "child",
                    "f",
                    "FOREIGN KEY (parent_id) REFERENCES parent(id) ON DELETE CASCADE",
                    True,
                ),
                ("parent", "u", "UNIQUE (name)", True),
            ]
            with pytest.raises(psycopg.errors.UniqueViolation):
                conn.execute("INSERT INTO parent VALUES (9, 'a')")
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("INSERT INTO child VALUES (99, 2, 'orphan')")
    finally:
        pair.stop()


def test_pg_reinit_takes_the_sources_orphans_under_a_not_valid_key(
    tmp_path: Path, pg_server: Any
) -> None:
    """A SQLite source writing with foreign keys off holds a child whose parent is
    missing: the reinit loads it and adds the key NOT VALID instead of refusing it."""
    pair = Pair(tmp_path, tables=["parent", "child"])
    src = _declared(pair)
    src.execute("INSERT INTO child VALUES (13, 7, 'orphan')")
    dsn = pg_server.create_database()
    try:
        pair.start_publisher()
        wait_until(lambda: pair.head() > 0, 60, "the source in the log")
        pair.load_snapshot(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert _rows(conn) == _rows(src)
            assert [(r[1], r[3]) for r in conn.execute(_ALL)] == [("f", False), ("u", True)]
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute("INSERT INTO child VALUES (99, 8, 'new orphan')")
    finally:
        pair.stop()
