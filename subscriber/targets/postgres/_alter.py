"""Following a source's schema change on an existing PostgreSQL target table.

A schema op is the table's full definition; the target table is altered to match,
in the batch's transaction:

* a column the schema has and the table lacks is added, nullable (the source's rows
  fill it; a copy of the table follows when the existing rows have values the WAL
  does not carry, see ``publisher/capture/postgres/_evolve.py`` and
  ``publisher/capture/sqlite/shapes.py``);
* a column the *previous* schema had and this one has not is dropped (a rename
  arrives as a drop and an add, and the copy refills the new name).  Only columns of
  the previous source schema: a column the operator added to the target stays;
* a column whose type changed between the two schemas (``Column.pg_type``, or the
  logical type) is converted with ``USING col::new_type`` when the target column
  still has the old type (a type the operator chose for the target is kept).  When
  the cast fails on the target's values (the source converted with its own
  ``USING`` expression), the column is set to NULL instead and the copy that
  follows the change writes the source's values; a NOT NULL column that cannot
  take that stops the subscription with a message naming table and column.

A shaped target (transforms, history mode) only gains columns, as before.
Rejected: dropping and re-adding a changed column (loses the values the copy
would not rewrite on a shaped target, and moves the column to the end).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import WriterError
from subscriber.targets.postgres._copy import pg_type, table_types

__all__ = ["follow_schema"]

Q = sql.Identifier


def follow_schema(
    cur: psycopg.Cursor[Any],
    target: pb.TableSchema,
    previous: pb.TableSchema | None,
    shaped: bool,
    table: sql.Composable,
) -> None:
    """Alter the existing table ``target.table`` (``table``: its SQL name) to ``target``
    (see the module doc)."""
    have = table_types(cur, target.table)
    for c in target.columns:
        if c.name not in have:
            cur.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    table, Q(c.name), sql.SQL(pg_type(c, target))
                )
            )
    if previous is None or shaped:
        return
    now = {c.name: c for c in target.columns}
    for old in previous.columns:
        if old.name not in have:
            continue
        new = now.get(old.name)
        if new is None:
            _drop(cur, table, target.table, old.name)
        elif pg_type(new, target) != pg_type(old, previous) and have[old.name] == _spelled(
            pg_type(old, previous)
        ):
            _retype(cur, table, target.table, old.name, pg_type(new, target))


# pg_type()'s spellings that format_type (the target's catalog) spells otherwise
_FORMAT_TYPE = {
    "time": "time without time zone",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
}


def _spelled(type_sql: str) -> str:
    return _FORMAT_TYPE.get(type_sql, type_sql)


def _drop(cur: psycopg.Cursor[Any], quoted: sql.Composable, table: str, column: str) -> None:
    try:
        with cur.connection.transaction():
            cur.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(quoted, Q(column)))
    except psycopg.errors.DependentObjectsStillExist as exc:
        raise WriterError(
            f"the source dropped column {column!r} of table {table!r} but the PostgreSQL "
            f"target cannot ({str(exc).strip()}): drop what uses the column on the target "
            "(view, foreign key), then `txrepl subscriber errors retry`"
        ) from exc


def _retype(
    cur: psycopg.Cursor[Any], quoted: sql.Composable, table: str, column: str, new_type: str
) -> None:
    alter = sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}")
    try:
        with cur.connection.transaction():
            cur.execute(
                alter.format(
                    quoted, Q(column), sql.SQL(new_type),
                    sql.SQL("{}::{}").format(Q(column), sql.SQL(new_type)),
                )
            )  # fmt: skip
        return
    except (psycopg.errors.DataError, psycopg.errors.SyntaxErrorOrAccessRuleViolation):
        pass  # the target's values do not cast; the copy brings the source's
    try:
        with cur.connection.transaction():
            cur.execute(alter.format(quoted, Q(column), sql.SQL(new_type), sql.SQL("NULL")))
    except psycopg.errors.NotNullViolation as exc:
        raise WriterError(
            f"the source changed the type of column {column!r} of table {table!r} to "
            f"{new_type}; the target's values do not convert and the column is NOT NULL "
            "on the target: convert it by hand, then `txrepl subscriber errors retry`"
        ) from exc
