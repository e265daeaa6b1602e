"""Emptying a target table: the source's TRUNCATE and the install entry's.

The source's TRUNCATE (and the install entry's leading truncate) reaches the writer as
one step per table, with the source's options (``TruncateStep.cascade`` and
``restart_identity``, from pgoutput's Truncate message; the install's truncate has
neither).

* Without CASCADE: PostgreSQL refuses ``TRUNCATE parent`` while a foreign key of
  another table references it, even when that table is emptied by the next step of
  the same transaction (``cannot truncate a table referenced in a foreign key
  constraint``), and it checks this whatever ``session_replication_role`` says.  So a
  referenced table is emptied with ``DELETE FROM``: under the replica role the foreign
  keys' triggers do not fire, and the source's TRUNCATE already emptied the
  referencing tables, whose own truncate steps follow in the same transaction.  Under
  the ``origin``/``local`` roles the foreign key is checked at the end of the DELETE,
  as the source checked it.  Unreferenced tables keep the cheap TRUNCATE.
  Rejected: ``TRUNCATE ... CASCADE`` here: it would also empty target tables the
  source did not empty (a child installed before its parent, or not published).
* With CASCADE: the source emptied every table referencing this one; the target does
  the same with ``TRUNCATE ... CASCADE``, which also empties a referencing table the
  publication does not carry (left full, it would keep rows whose parent is gone).
* RESTART IDENTITY: the sequences the table's columns own (serial, identity) start
  again, on both paths (``ALTER SEQUENCE ... RESTART``, which is what ``TRUNCATE ...
  RESTART IDENTITY`` does).  A target table created by the subscriber has none; a
  table the operator created with identity columns (to take writes after a failover)
  does.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from subscriber.apply.writer import TruncateStep

__all__ = ["empty_table"]

_REFERENCED = (
    "SELECT 1 FROM pg_constraint WHERE contype = 'f' "
    "AND confrelid = to_regclass(%s) AND conrelid <> confrelid LIMIT 1"
)

_OWNED_SEQUENCES = (
    "SELECT d.objid::regclass::text FROM pg_depend d JOIN pg_class s ON s.oid = d.objid"
    " WHERE s.relkind = 'S' AND d.classid = 'pg_class'::regclass"
    " AND d.refclassid = 'pg_class'::regclass AND d.refobjid = to_regclass(%s)"
    " AND d.deptype IN ('a', 'i') ORDER BY 1"
)


def empty_table(cur: psycopg.Cursor[Any], step: TruncateStep, quoted: sql.Composable) -> None:
    """Empty ``step.table`` (``quoted`` is its SQL name), as the module doc says."""
    name = quoted.as_string(cur)
    if step.cascade:
        cur.execute(sql.SQL("TRUNCATE {} CASCADE").format(quoted))
    else:
        cur.execute(_REFERENCED, (name,))
        if cur.fetchone() is None:
            cur.execute(sql.SQL("TRUNCATE {}").format(quoted))
        else:
            cur.execute(sql.SQL("DELETE FROM {}").format(quoted))
    if step.restart_identity:
        for (seq,) in cur.execute(_OWNED_SEQUENCES, (name,)).fetchall():
            cur.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.SQL(seq)))
