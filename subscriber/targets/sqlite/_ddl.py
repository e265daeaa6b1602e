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
- FOREIGN KEYs (with their actions) and the CHECK constraints of a SQLite source
  are written into the ``CREATE TABLE`` of a table the subscriber creates, named
  (``CONSTRAINT <name>``); on a later schema op that adds, drops or changes one, the
  table is rebuilt from its own ``CREATE TABLE`` text with those clauses edited, in
  the batch's transaction (``_rebuild.py``).  The writer runs with ``PRAGMA
  foreign_keys = OFF`` (the replica role), so the keys bind the application's own
  writes only; CHECKs bind the apply too, as on PostgreSQL (they refuse nothing
  the source accepted: ``common/constraints.py``).  A PostgreSQL source's CHECKs are
  not carried (the expression is in its dialect; the source enforces them).
- Refused: a new unique index or CHECK the target's rows violate (rows changed by hand on the
  target): :class:`WriterError` naming the table and the constraint, and the entry is
  parked as any refused entry.
"""

from __future__ import annotations

import sqlite3

from common.constraints import changed
from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import WriterError
from subscriber.targets.sqlite._rebuild import rebuild

__all__ = ["follow_clauses", "follow_indexes", "index_names", "table_clauses"]

_ACTIONS = frozenset({"CASCADE", "SET NULL", "SET DEFAULT", "RESTRICT"})


def _clause(c: pb.TableConstraint, schema: pb.TableSchema, *, named: bool = True) -> str | None:
    """The table constraint clause of ``c`` in a SQLite ``CREATE TABLE``, or None when
    this target does not carry it there (UNIQUE and indexes are indexes here)."""
    head = f"CONSTRAINT {quote_ident(c.name)} " if named else ""
    if c.kind == pb.CONSTRAINT_KIND_CHECK and schema.source_dialect == "sqlite":
        return f"{head}CHECK ({c.expression})"
    if c.kind != pb.CONSTRAINT_KIND_FOREIGN_KEY:
        return None
    cols = ", ".join(quote_ident(n) for n in c.columns)
    refs = ", ".join(quote_ident(n) for n in c.ref_columns)
    clause = (
        f"FOREIGN KEY ({cols}) REFERENCES {quote_ident(parse_table(c.ref_table).flat)} ({refs})"
    )
    for what, action in (("DELETE", c.on_delete), ("UPDATE", c.on_update)):
        if action in _ACTIONS:
            clause += f" ON {what} {action}"
    return head + clause


def table_clauses(schema: pb.TableSchema) -> list[str]:
    """``schema``'s FOREIGN KEY and (from a SQLite source) CHECK clauses, named, for
    its ``CREATE TABLE``."""
    return [t for c in schema.constraints if (t := _clause(c, schema)) is not None]


def follow_clauses(
    conn: sqlite3.Connection,
    schema: pb.TableSchema,
    previous: pb.TableSchema,
    table: str,
) -> None:
    """Make the existing target table ``table`` (its name, unquoted) carry the foreign
    keys and CHECKs of ``schema`` instead of ``previous``'s: a rebuild
    (``_rebuild.py``) when they differ."""
    drop, add = changed(previous, schema)
    gone = {
        " ".join(t.split())
        for c in drop
        for named in (True, False)  # tables made before the keys were named
        if (t := _clause(c, previous, named=named)) is not None
    }
    new = [t for c in add if (t := _clause(c, schema)) is not None]
    if not gone and not new:
        return
    rebuild(conn, schema.table, table, gone, new)


def _name(c: pb.TableConstraint) -> str:
    return "txrepl_" + c.name if c.name.startswith("sqlite_") else c.name


def _index_name(c: pb.TableConstraint) -> str:
    return quote_ident(_name(c))


def index_names(schema: pb.TableSchema | None) -> set[str]:
    """The names of the indexes a SQLite target gives ``schema``'s UNIQUE constraints
    and indexes (none: no schema)."""
    if schema is None:
        return set()
    return {
        _name(c)
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
