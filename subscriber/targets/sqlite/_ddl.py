"""A SQLite target follows the source's constraints and indexes (``TableSchema.constraints``).

SQLite can add and drop indexes on an existing table but not constraints (that
takes a rebuild of the table), so:

- UNIQUE constraints and indexes are indexes here, created with the table and
  followed on every schema op by name (``common/constraints.py``: dropped when gone
  or changed, added when new; why adding one at the schema op's position never
  refuses a row the source accepted is argued there).  An index is named as on the
  source, except that SQLite's own names (``sqlite_autoindex_...``, reserved) get a
  ``txrepl_`` prefix.  A SQLite source's index on expressions or partial index is
  replayed as written; another source's is skipped (its text is another dialect).
- FOREIGN KEYs are written into the ``CREATE TABLE`` of a table the subscriber
  creates, with their actions; later changes of them are not followed (a rebuild of
  the target table), and the writer runs with ``PRAGMA foreign_keys = OFF`` (the
  replica role), so they bind the application's own writes only.
- CHECK constraints are not carried to a SQLite target (the expression may be in
  another dialect; the source enforces them).
- Refused: a new unique index the target's rows violate (rows changed by hand on the
  target): :class:`WriterError` naming the table and the constraint, and the entry is
  parked as any refused entry.
"""

from __future__ import annotations

import sqlite3

from common.constraints import changed
from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import WriterError

__all__ = ["follow_indexes", "foreign_keys", "index_names"]

_ACTIONS = frozenset({"CASCADE", "SET NULL", "SET DEFAULT", "RESTRICT"})


def foreign_keys(schema: pb.TableSchema) -> list[str]:
    """``FOREIGN KEY`` clauses of ``schema`` for its ``CREATE TABLE``."""
    out = []
    for c in schema.constraints:
        if c.kind != pb.CONSTRAINT_KIND_FOREIGN_KEY:
            continue
        cols = ", ".join(quote_ident(n) for n in c.columns)
        refs = ", ".join(quote_ident(n) for n in c.ref_columns)
        clause = (
            f"FOREIGN KEY ({cols}) REFERENCES {quote_ident(parse_table(c.ref_table).flat)} ({refs})"
        )
        for what, action in (("DELETE", c.on_delete), ("UPDATE", c.on_update)):
            if action in _ACTIONS:
                clause += f" ON {what} {action}"
        out.append(clause)
    return out


def _index_name(c: pb.TableConstraint) -> str:
    return quote_ident("txrepl_" + c.name if c.name.startswith("sqlite_") else c.name)


def index_names(schema: pb.TableSchema | None) -> set[str]:
    """The names of the indexes a SQLite target gives ``schema``'s UNIQUE constraints
    and indexes (none: no schema)."""
    if schema is None:
        return set()
    return {
        "txrepl_" + c.name if c.name.startswith("sqlite_") else c.name
        for c in schema.constraints
        if c.kind in (pb.CONSTRAINT_KIND_UNIQUE, pb.CONSTRAINT_KIND_INDEX)
    }


def follow_indexes(
    conn: sqlite3.Connection,
    schema: pb.TableSchema,
    previous: pb.TableSchema | None,
    table_sql: str,
) -> None:
    """Make the target table ``table_sql`` carry ``schema``'s UNIQUE constraints and
    indexes (module doc)."""
    drop, add = changed(previous, schema)
    for c in drop:
        if c.kind in (pb.CONSTRAINT_KIND_UNIQUE, pb.CONSTRAINT_KIND_INDEX):
            conn.execute(f"DROP INDEX IF EXISTS {_index_name(c)}")
    for c in add:
        unique = c.kind == pb.CONSTRAINT_KIND_UNIQUE or c.unique
        if (
            c.kind == pb.CONSTRAINT_KIND_INDEX
            and schema.source_dialect == "sqlite"
            and c.expression
        ):
            body = c.expression
        elif c.kind in (pb.CONSTRAINT_KIND_UNIQUE, pb.CONSTRAINT_KIND_INDEX) and c.columns:
            body = "(" + ", ".join(quote_ident(n) for n in c.columns) + ")"
        else:
            continue
        head = "CREATE UNIQUE INDEX" if unique else "CREATE INDEX"
        try:
            conn.execute(f"{head} IF NOT EXISTS {_index_name(c)} ON {table_sql} {body}")
        except sqlite3.IntegrityError as exc:
            raise WriterError(
                f"the source added constraint {c.name!r} to table {schema.table!r} but the "
                f"SQLite target's rows violate it ({exc}): the target differs from the "
                "source; correct its rows (or reinit the table), then "
                "`txrepl subscriber errors retry`"
            ) from exc
