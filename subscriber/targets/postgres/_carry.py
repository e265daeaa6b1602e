"""What a reinit carries from an old PostgreSQL table over to the new one (snapshot.py).

Step 3 of the swap (snapshot.py, "Atomicity argument"), inside the one target
transaction T.  What an operator added to an old table (:func:`carried_items`) is read
from the catalogs once the table is locked, and re-created on the new table right
after the swap, still in T: constraints other than the primary key (unique,
check, exclusion, foreign keys), other indexes, triggers with their enabled state
(``ENABLE REPLICA``/``ALWAYS``, ``DISABLE``), grants, storage parameters, and
comments on the table and on the columns it still has.  If one cannot be
re-created (an index on a column the publisher does not send, a check the new
rows violate), the reinit fails naming it and T rolls back: the target is
unchanged.  The indexes are built under the swap's exclusive lock, so readers
wait for them (rejected: building them on the shadow before the lock, which
needs the definitions rewritten to the shadow's name).

Foreign keys that reference an old table (:func:`unhook`): all are dropped
before the old tables are, still in T; those of swapped tables come back with the
carried items above, those of tables outside the swap are re-created (and
validated against the new rows) after them.  Carried foreign keys
run last, once every new table has its unique constraints (parents first).  A
referencing row the new parent no longer has fails the reinit naming the key.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from common.names import parse_table

__all__ = ["carried_items", "table_exists", "unhook"]

Q = sql.Identifier


def carried_items(
    cur: psycopg.Cursor[Any], home: str, table: str, columns: set[str], source: set[str]
) -> list[tuple[str, sql.SQL | sql.Composed]]:
    """What the operator added to the old table, as statements for the new one.
    ``source``: names of the constraints and indexes the old table had from the
    source (its recorded schema's): not carried, the new schema's are created.

    (what, statement) for: constraints other than the primary key (unique,
    check, exclusion, foreign keys), indexes that back no constraint, triggers
    with their enabled state, grants, storage parameters, and comments on the
    table and on columns the new table has.  Read from the catalogs while the
    old table is locked; run after the swap, by name (``<home>.<table>`` is
    the new table by then).
    """
    t = sql.SQL("{}.{}").format(Q(home), Q(parse_table(table).name))
    out: list[tuple[str, sql.SQL | sql.Composed]] = []
    cur.execute("SELECT to_regclass(%s)::oid", (t.as_string(cur),))
    row = cur.fetchone()
    assert row is not None
    old = row[0]
    cur.execute(
        "SELECT conname, pg_get_constraintdef(oid), contype FROM pg_constraint"
        " WHERE conrelid = %s AND contype IN ('u', 'c', 'x', 'f') ORDER BY contype, conname",
        (old,),
    )
    for name, definition, kind in cur.fetchall():
        if name in source:
            continue
        out.append(
            (
                f"{'foreign key' if kind == 'f' else 'constraint'} {name!r} of {table!r}",
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                    t, Q(name), sql.SQL(definition)
                ),
            )
        )
    cur.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = %s AND NOT i.indisprimary AND NOT EXISTS"
        " (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = %s)"
        " ORDER BY c.relname",
        (old, old),
    )
    for name, definition in cur.fetchall():
        if name not in source:
            out.append((f"index {name!r} of {table!r}", sql.SQL(definition)))
    cur.execute(
        "SELECT tgname, pg_get_triggerdef(oid), tgenabled FROM pg_trigger"
        " WHERE tgrelid = %s AND NOT tgisinternal ORDER BY tgname",
        (old,),
    )
    enable = {"D": "DISABLE", "R": "ENABLE REPLICA", "A": "ENABLE ALWAYS"}
    for name, definition, state in cur.fetchall():
        what = f"trigger {name!r} of {table!r}"
        out.append((what, sql.SQL(definition)))
        if state in enable:
            out.append(
                (
                    what,
                    sql.SQL("ALTER TABLE {} {} TRIGGER {}").format(
                        t, sql.SQL(enable[state]), Q(name)
                    ),
                )
            )
    cur.execute(
        "SELECT a.privilege_type, a.grantee, r.rolname, a.is_grantable"
        " FROM pg_class c, aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee"
        " WHERE c.oid = %s ORDER BY 3, 1",
        (old,),
    )
    for privilege, grantee, rolname, grantable in cur.fetchall():
        to = sql.SQL("PUBLIC") if grantee == 0 else Q(rolname)
        out.append(
            (
                f"grant of {privilege} on {table!r} to {rolname or 'PUBLIC'}",
                sql.SQL("GRANT {} ON {} TO {}{}").format(
                    sql.SQL(privilege),
                    t,
                    to,
                    sql.SQL(" WITH GRANT OPTION" if grantable else ""),
                ),
            )
        )
    cur.execute(
        "SELECT reloptions, obj_description(oid, 'pg_class') FROM pg_class WHERE oid = %s",
        (old,),
    )
    found = cur.fetchone()
    assert found is not None
    options, comment = found
    if options:
        out.append(
            (
                f"storage parameters of {table!r}",
                sql.SQL("ALTER TABLE {} SET ({})").format(
                    t, sql.SQL(", ").join(sql.SQL(o) for o in options)
                ),
            )
        )
    if comment is not None:
        out.append(
            (
                f"comment on {table!r}",
                sql.SQL("COMMENT ON TABLE {} IS {}").format(t, sql.Literal(comment)),
            )
        )
    cur.execute(
        "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute"
        " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " AND col_description(attrelid, attnum) IS NOT NULL ORDER BY attnum",
        (old,),
    )
    for column, text in cur.fetchall():
        if column not in columns:
            continue  # the column is not published (any more): nothing to comment
        out.append(
            (
                f"comment on column {column!r} of {table!r}",
                sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(t, Q(column), sql.Literal(text)),
            )
        )
    return out


def unhook(
    cur: psycopg.Cursor[Any], homes: dict[str, str]
) -> list[tuple[str, sql.SQL | sql.Composed]]:
    """Drop every foreign key that references an old table (so it can be dropped);
    return the statements that re-create those of tables outside the swap (the
    swapped tables' own are in :func:`carried_items`), to run after it, still in T."""
    olds = [
        sql.SQL("{}.{}").format(Q(home), Q(parse_table(table).name)).as_string(cur)
        for table, home in homes.items()
        if table_exists(cur, home, table)
    ]
    cur.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid),"
        " conrelid = ANY(%(olds)s::text[]::regclass[])"
        " FROM pg_constraint WHERE contype = 'f'"
        " AND confrelid = ANY(%(olds)s::text[]::regclass[]) ORDER BY 1, 2",
        {"olds": olds},
    )
    out: list[tuple[str, sql.SQL | sql.Composed]] = []
    for child, name, definition, swapped in cur.fetchall():
        cur.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(sql.SQL(child), Q(name)))
        if not swapped:
            out.append(
                (
                    f"foreign key {name!r} of {child!r}",
                    sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                        sql.SQL(child), Q(name), sql.SQL(definition)
                    ),
                )
            )
    return out


def table_exists(cur: psycopg.Cursor[Any], home: str, table: str) -> bool:
    cur.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        (home, parse_table(table).name),
    )
    return cur.fetchone() is not None
