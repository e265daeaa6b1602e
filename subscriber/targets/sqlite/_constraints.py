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

from subscriber.apply.errors import WriterError

__all__ = ["SqliteOrderedTables"]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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
                            f"PRAGMA index_list({_quote(t)})"
                        )
                    )
                )
            except sqlite3.Error as exc:
                raise WriterError(f"cannot read the indexes of the SQLite target: {exc}") from exc
