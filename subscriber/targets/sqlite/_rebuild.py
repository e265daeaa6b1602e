"""Rebuild a SQLite target table with other foreign keys and CHECKs, in the batch.

SQLite cannot add or drop a foreign key or a CHECK on an existing table; its
documented way ("Making Other Kinds Of Table Schema Changes", the twelve steps of
``lang_altertable.html``) is a rebuild.  Here, for a schema op whose table gained
or lost one (``_ddl.follow_clauses``), on the writer's connection, inside the
batch's transaction (``BEGIN IMMEDIATE`` ... the level row ... ``COMMIT``):

1. read the table's ``CREATE TABLE`` text and the SQL of its indexes and triggers
   from ``sqlite_master``;
2. create ``txrepl_rebuild__<table>`` from that text with the body's items edited
   (``common/sqlite_sql.py``): the source's clauses that are gone removed, the new
   ones appended; every other item (columns, the primary key, what the operator
   wrote) and the table options stay as they were;
3. copy the rows (every column ``PRAGMA table_info`` lists, so generated columns
   are computed again); a CHECK the rows violate raises here: the table and the
   constraint are named and the entry parked, as for a unique index
   (``common/constraints.py`` argues the source's rows never do);
4. drop the table, rename the copy to its name with ``legacy_alter_table`` on (so
   the rename neither rewrites nor re-checks views and triggers of other tables that
   name the table: between 4's drop and rename it does not exist), and run the
   saved index and trigger SQL again.

Atomicity: all four steps are statements of the batch's transaction (SQLite's DDL
is transactional), so a kill -9 of the subscriber anywhere in them rolls the
batch back whole: the old table, its rows and the old level (invariant 3); the
retry rebuilds again.  The writer's ``foreign_keys = OFF`` (the replica role) is
what lets step 4 drop a table that other tables' keys reference and lets the copy
of a child run before its parent exists in the same batch; the ``REFERENCES`` of
other tables name the table, not its rowid, so they hold after the rename.
Cost: one copy of the table per schema op that changes its keys or CHECKs (never
for other schema ops, nor for rows).  Rejected: ``PRAGMA writable_schema`` edits
of ``sqlite_master`` (undocumented for this, and the rows are never checked
against the new CHECK).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence

from common.names import quote_ident
from common.sqlite_sql import body_items, with_items
from subscriber.apply.errors import WriterError

__all__ = ["PREFIX", "rebuild"]

PREFIX = "txrepl_rebuild__"


def rebuild(
    conn: sqlite3.Connection,
    wire_table: str,
    table: str,
    gone: Collection[str],
    new: Sequence[str],
) -> None:
    """Rebuild ``table`` without the items whose text (blanks collapsed) is in
    ``gone`` and with the items ``new`` (module doc); ``wire_table``: its name in
    messages."""
    found = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if found is None or not found[0]:
        return
    items = [i for i in body_items(found[0]) if " ".join(i.split()) not in gone]
    have = {" ".join(i.split()) for i in items}
    items += [i for i in new if " ".join(i.split()) not in have]
    saved = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type IN ('index', 'trigger')"
        " AND tbl_name = ? AND sql IS NOT NULL ORDER BY type, name",
        (table,),
    ).fetchall()
    cols = ", ".join(
        quote_ident(r[1]) for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")
    )
    copy = quote_ident(PREFIX + table)
    conn.execute(f"DROP TABLE IF EXISTS {copy}")
    conn.execute(with_items(found[0], copy, items))
    try:
        conn.execute(f"INSERT INTO {copy} ({cols}) SELECT {cols} FROM {quote_ident(table)}")
    except sqlite3.IntegrityError as exc:
        raise WriterError(
            f"the source added a constraint to table {wire_table!r} but the SQLite "
            f"target's rows violate it ({exc}): the target differs from the source; "
            "correct its rows (or reinit the table), then `txrepl subscriber errors retry`"
        ) from exc
    conn.execute(f"DROP TABLE {quote_ident(table)}")
    conn.execute("PRAGMA legacy_alter_table = ON")
    try:
        conn.execute(f"ALTER TABLE {copy} RENAME TO {quote_ident(table)}")
    finally:
        conn.execute("PRAGMA legacy_alter_table = OFF")
    for (statement,) in saved:
        conn.execute(statement)
