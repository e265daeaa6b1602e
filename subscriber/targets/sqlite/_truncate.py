"""A source TRUNCATE on a SQLite target, with the source's options.

SQLite has no TRUNCATE: the table is emptied with ``DELETE FROM`` (foreign keys are
not enforced on the writer's connection, and the target's own triggers are guarded,
``triggers.py``).  The options of the source's statement (``TruncateStep``):

* CASCADE: the source emptied every table referencing this one; so are the target
  tables whose foreign keys reference it, transitively (``PRAGMA
  foreign_key_list``), including ones the publication does not carry, which would
  otherwise keep rows whose parent is gone.  Published tables the cascade reached on
  the source have their own truncate steps too (pgoutput lists them), harmlessly.
* RESTART IDENTITY: an ``AUTOINCREMENT`` table's counter (its ``sqlite_sequence``
  row) is removed, so the next row the target's own application inserts gets 1, as
  on the source.  A plain ``INTEGER PRIMARY KEY`` takes max + 1 anyway.
"""

from __future__ import annotations

import sqlite3

from common.names import parse_table
from common.names import quote_ident as _quote
from subscriber.apply.writer import TruncateStep

__all__ = ["empty_table"]


def _referencing(conn: sqlite3.Connection, table: str) -> list[str]:
    """The tables whose foreign keys reference ``table``, transitively (not itself)."""
    names = [
        str(r[0])
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    refs = {
        n: {str(r[2]).lower() for r in conn.execute(f"PRAGMA foreign_key_list({_quote(n)})")}
        for n in names
    }
    found: list[str] = []
    todo = [table.lower()]
    while todo:
        parent = todo.pop()
        for n, to in refs.items():
            if parent in to and n.lower() != table.lower() and n not in found:
                found.append(n)
                todo.append(n.lower())
    return found


def empty_table(conn: sqlite3.Connection, step: TruncateStep) -> None:
    table = parse_table(step.table).flat  # the wire's name as a SQLite table (common/names.py)
    tables = [table, *(_referencing(conn, table) if step.cascade else [])]
    for t in tables:
        conn.execute(f"DELETE FROM {_quote(t)}")
    if (
        step.restart_identity
        and conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'").fetchone()
    ):
        conn.execute("DELETE FROM sqlite_sequence WHERE name = ?", (table,))
