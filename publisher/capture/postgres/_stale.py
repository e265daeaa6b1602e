"""Table snapshots read after the table was rewritten: refused, then retaken.

An install snapshot, or the copy of a table after a schema change (``_evolve.py``),
is read under an exported snapshot some time after it was taken.  PostgreSQL's
table rewrites (``ALTER ... TYPE``, ``ADD COLUMN`` with a volatile default,
``TRUNCATE``, ``SET LOGGED``) are not MVCC-safe: under a snapshot older than the
rewrite the table reads as **empty**, and logging that copy would empty the table on
every target.  A later rename breaks the copy's column list (the COPY's names are
looked up in the current catalog) instead.

So before reading, :func:`check_fresh` compares the table's file node as of the
snapshot (``pg_class.relfilenode`` read in the snapshot's transaction) with the
current one (``pg_relation_filenode``, from the relation cache, which is always the
latest); and the session turns the COPY's "no such column/table" into the same
:class:`StaleSnapshot`.  Nothing of the table has been appended then; the session
takes a new snapshot for it (``_session.Session._cross``).  A partitioned table has
no file node of its own: it is not checked (its leaves' rewrites are not seen).
"""

from __future__ import annotations

from typing import Any

import psycopg

from publisher.capture.postgres._pgcatalog import TableName
from publisher.errors import SourceError

__all__ = ["STALE_ERRORS", "StaleSnapshot", "check_fresh"]

# What the COPY raises when the table changed shape, or went, after the snapshot.
STALE_ERRORS = (psycopg.errors.UndefinedColumn, psycopg.errors.UndefinedTable)


class StaleSnapshot(SourceError):
    """The table was rewritten or altered after the exported snapshot was taken."""


def check_fresh(conn: psycopg.Connection[Any], table: TableName) -> None:
    """Raise :class:`StaleSnapshot` if ``table`` was rewritten since ``conn``'s snapshot."""
    row = conn.execute(
        "SELECT relfilenode, pg_relation_filenode(oid) FROM pg_class WHERE oid = to_regclass(%s)",
        (table.sql,),
    ).fetchone()
    if row is None:
        raise StaleSnapshot(f"table {table.display!r} is gone since the snapshot")
    then, now = row
    if then and now is not None and then != now:
        raise StaleSnapshot(f"table {table.display!r} was rewritten after the snapshot")
