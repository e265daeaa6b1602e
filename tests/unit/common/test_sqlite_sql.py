"""The text of a SQLite CREATE TABLE: its CHECKs read, its items edited (common/sqlite_sql.py)."""

from __future__ import annotations

import sqlite3

import pytest

from common.sqlite_sql import body_items, checks, with_items

TABLE = """CREATE TABLE t (id INTEGER PRIMARY KEY, -- a comment, with CHECK (x)
  q INT CHECK (q > 0) DEFAULT 1,
  "a,b" TEXT /* CHECK (no), */ CONSTRAINT [nm] CHECK(length("a,b") < 5 AND 'x)' <> ''),
  note TEXT DEFAULT 'CHECK (not one)',
  CONSTRAINT "t c" CHECK (q < 100), FOREIGN KEY (q) REFERENCES p(id)) WITHOUT ROWID"""


def test_checks_are_the_ones_sqlite_enforces() -> None:
    """Column and table CHECKs, named or not, and none from strings or comments."""
    assert checks(TABLE) == [
        (None, "q > 0"),
        ("nm", "length(\"a,b\") < 5 AND 'x)' <> ''"),
        ("t c", "q < 100"),
    ]
    conn = sqlite3.connect(":memory:")
    conn.execute(TABLE)
    for values in ((1, 0, "a", "n"), (2, 1, "abcdef", "n"), (3, 100, "a", "n")):
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("INSERT INTO t VALUES (?, ?, ?, ?)", values)
    conn.execute("INSERT INTO t VALUES (4, 5, 'a', 'n')")


def test_items_edited_make_a_table_sqlite_takes() -> None:
    """A table made from the edited items keeps the others and the table options."""
    items = body_items(TABLE)
    assert len(items) == 6
    assert items[-1] == "FOREIGN KEY (q) REFERENCES p(id)"
    edited = with_items(TABLE, '"t2"', [*items[:4], "CONSTRAINT k CHECK (q <> 7)"])
    conn = sqlite3.connect(":memory:")
    conn.execute(edited)
    assert conn.execute("PRAGMA foreign_key_list(t2)").fetchall() == []
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed: k"):
        conn.execute("INSERT INTO t2 VALUES (1, 7, 'a', 'n')")
    conn.execute("INSERT INTO t2 VALUES (1, 100, 'a', 'n')")  # "t c" was left out
    assert edited.endswith(") WITHOUT ROWID")
