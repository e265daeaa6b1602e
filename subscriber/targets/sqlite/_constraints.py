"""Which SQLite target tables need the constraint-safe order (``subscriber/apply/_order.py``).

A table with a UNIQUE constraint or unique index other than its primary key:
``pragma index_list`` lists both (``unique = 1``), with origin ``u`` (a UNIQUE
constraint) or ``c`` (CREATE UNIQUE INDEX); the primary key's own index, if the
table has one, has origin ``pk``.  SQLite checks every constraint row by row and
can defer none of them (``defer_foreign_keys`` is for foreign keys only, which the
writer does not enforce: ``PRAGMA foreign_keys = OFF``, the replica role's
counterpart).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable

from common.names import parse_table, quote_ident
from subscriber.apply.errors import WriterError

__all__ = ["SqliteOrderedTables"]


def _table(table: str) -> str:
    """The SQLite name of wire table ``table``, quoted (``schema.name`` is one flat name)."""
    return quote_ident(parse_table(table).flat)


class SqliteOrderedTables:
    """``Writer.ordered_tables`` for :class:`subscriber.targets.sqlite.writer.SqliteWriter`."""

    _conn: sqlite3.Connection
    _lock: threading.Lock

    def ordered_tables(self, tables: Iterable[str]) -> frozenset[str]:
        with self._lock:
            try:
                return frozenset(
                    t
                    for t in tables
                    if any(
                        unique and origin != "pk"
                        for _, _, unique, origin, _ in self._conn.execute(
                            f"PRAGMA index_list({_table(t)})"
                        )
                    )
                )
            except sqlite3.Error as exc:
                raise WriterError(f"cannot read the indexes of the SQLite target: {exc}") from exc


def refused_row(
    conn: sqlite3.Connection,
    table: str,
    statement: str,
    rows: Iterable[tuple[object, ...]],
    names: list[str],
    key: list[str],
) -> str:
    """Which row of a failed ``executemany(statement, rows)`` the target refused, and
    by which unique index: ``key (id)=(11), index child_v (v)=('same')``.

    Only after a failure: the rows are tried again one by one in a savepoint that is
    rolled back (those before the refused one were applied already, and applying
    them again changes nothing: upserts by primary key).
    """
    conn.execute("SAVEPOINT txrepl_probe")
    try:
        for row in rows:
            try:
                conn.execute(statement, row)
            except sqlite3.IntegrityError:
                return _describe(conn, table, dict(zip(names, row, strict=True)), key)
        return "row not found"
    finally:
        conn.execute("ROLLBACK TO txrepl_probe")
        conn.execute("RELEASE txrepl_probe")


def _describe(conn: sqlite3.Connection, table: str, row: dict[str, object], key: list[str]) -> str:
    def pairs(cols: list[str]) -> str:
        values = ", ".join(repr(row.get(c)) for c in cols)
        return f"({', '.join(cols)})=({values})"

    out = [f"key {pairs(key)}"]
    for _, index, unique, origin, _ in conn.execute(f"PRAGMA index_list({_table(table)})"):
        cols = [r[2] for r in conn.execute(f"PRAGMA index_info({quote_ident(index)})")]
        if not unique or origin == "pk" or None in cols or any(row.get(c) is None for c in cols):
            continue
        match = " AND ".join(f"{quote_ident(c)} IS ?" for c in cols)
        other = " OR ".join(f"{quote_ident(k)} IS NOT ?" for k in key)
        args = [row[c] for c in cols] + [row[k] for k in key]
        if conn.execute(
            f"SELECT 1 FROM {_table(table)} WHERE {match} AND ({other})", args
        ).fetchone():
            out.append(f"index {index} {pairs(cols)}")
    return ", ".join(out)
