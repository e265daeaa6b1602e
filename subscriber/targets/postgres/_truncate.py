"""Emptying a target table that other tables reference by foreign key.

The source's TRUNCATE (and the install entry's leading truncate) reaches the writer as
one step per table.  PostgreSQL refuses ``TRUNCATE parent`` while a foreign key of
another table references it, even when that table is emptied by the next step of the
same transaction (``cannot truncate a table referenced in a foreign key constraint``),
and it checks this whatever ``session_replication_role`` says.  So a referenced table
is emptied with ``DELETE FROM``: under the replica role the foreign keys' triggers do
not fire, and the source's TRUNCATE already emptied (or CASCADE-emptied) the
referencing tables, whose own truncate steps follow in the same transaction.  Under
the ``origin``/``local`` roles the foreign key is checked at the end of the DELETE,
as the source checked it.  Unreferenced tables keep the cheap TRUNCATE.

Rejected: ``TRUNCATE ... CASCADE`` on the target: it would also empty target tables
the source did not empty (a child installed before its parent, or not published).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = ["empty_table"]

_REFERENCED = (
    "SELECT 1 FROM pg_constraint WHERE contype = 'f' "
    "AND confrelid = to_regclass(%s) AND conrelid <> confrelid LIMIT 1"
)


def empty_table(cur: psycopg.Cursor[Any], table: str, quoted: sql.Composable) -> None:
    """Empty ``table`` (``quoted`` is its SQL name): TRUNCATE, or DELETE if referenced."""
    cur.execute(_REFERENCED, (quoted.as_string(cur),))
    if cur.fetchone() is None:
        cur.execute(sql.SQL("TRUNCATE {}").format(quoted))
    else:
        cur.execute(sql.SQL("DELETE FROM {}").format(quoted))
