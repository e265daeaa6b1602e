"""A SQLite source table's secondary constraints and indexes, as ``pb.TableConstraint``.

Read with the rest of the table's schema (``SqliteCapture.read_schema``), so a
``CREATE INDEX``, ``DROP INDEX`` or a rebuild that adds a UNIQUE constraint or a
foreign key moves ``PRAGMA schema_version``; the next poll's refresh sees the schema
differ from its latest generation's and logs an ``'S'`` row at that point of the
capture order (shapes.py).  When only constraints changed, the rows still decode
with the old column list, so no copy of the table is logged.

- UNIQUE constraints: the indexes SQLite made for them (``origin = 'u'``), named as
  SQLite names them (``sqlite_autoindex_<table>_<n>``);
- indexes (``origin = 'c'``): their columns, or, for an index on expressions or a
  partial one, no columns and the text after ``ON <table>`` of their ``CREATE INDEX``
  (a SQLite target replays it; a PostgreSQL target skips such an index);
- foreign keys: ``PRAGMA foreign_key_list``, named ``<table>_fk<id>`` (SQLite keeps no
  names for them); a reference to the parent's primary key names its columns.

- CHECK constraints: from the text of the table's ``CREATE TABLE``
  (``common/sqlite_sql.py``), column and table ones alike, named as written or
  ``<table>_ck<n>`` (the n-th unnamed one); the expression as written (SQLite's
  dialect: a SQLite target carries it, a PostgreSQL target does not).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection

from common.constraints import for_publication
from common.names import format_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from common.sqlite_sql import checks

__all__ = ["published", "read_constraints"]


def _index_text(sql: str | None) -> str:
    """``(cols) [WHERE ...]`` of a ``CREATE INDEX`` statement."""
    if not sql:
        return ""
    on = sql.upper().find(" ON ")
    start = sql.find("(", on) if on >= 0 else -1
    return sql[start:].strip() if start >= 0 else ""


def read_constraints(conn: sqlite3.Connection, table: str) -> list[pb.TableConstraint]:
    """The table's UNIQUE constraints, indexes and foreign keys (see the module doc)."""
    t = quote_ident(table)
    out: list[pb.TableConstraint] = []
    for _seq, name, unique, origin, partial in conn.execute(f"PRAGMA index_list({t})"):
        if origin == "pk":
            continue
        cols = [r[2] for r in conn.execute(f"PRAGMA index_info({quote_ident(name)})")]
        plain = not partial and all(c is not None for c in cols)
        if origin == "u":
            out.append(pb.TableConstraint(name=name, kind=pb.CONSTRAINT_KIND_UNIQUE, columns=cols))
            continue
        row = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        out.append(
            pb.TableConstraint(
                name=name,
                kind=pb.CONSTRAINT_KIND_INDEX,
                unique=bool(unique),
                columns=cols if plain else [],
                expression=_index_text(row[0] if row else None),
            )
        )
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    unnamed = 0
    for name, expression in checks(row[0] if row and row[0] else ""):
        if name is None:
            name, unnamed = f"{table}_ck{unnamed}", unnamed + 1
        out.append(
            pb.TableConstraint(name=name, kind=pb.CONSTRAINT_KIND_CHECK, expression=expression)
        )
    fks: dict[int, pb.TableConstraint] = {}
    parents: dict[int, str] = {}
    for fid, _seq, parent, src, dst, on_update, on_delete, _match in conn.execute(
        f"PRAGMA foreign_key_list({t})"
    ):
        fk = fks.get(fid)
        if fk is None:
            parents[fid] = parent
            fk = fks[fid] = pb.TableConstraint(
                name=f"{table}_fk{fid}",
                kind=pb.CONSTRAINT_KIND_FOREIGN_KEY,
                ref_table=format_table(None, parent),
                on_delete="" if on_delete == "NO ACTION" else on_delete,
                on_update="" if on_update == "NO ACTION" else on_update,
            )
        fk.columns.append(src)
        if dst is not None:
            fk.ref_columns.append(dst)
    for fid, fk in fks.items():
        if not fk.ref_columns:  # REFERENCES parent: its primary key
            info = conn.execute(f"PRAGMA table_info({quote_ident(parents[fid])})").fetchall()
            fk.ref_columns.extend(r[1] for r in sorted(info, key=lambda r: r[5]) if r[5])
        out.append(fk)
    out.sort(key=lambda c: c.name)
    return out


def published(op: pb.Op, tables: Collection[str]) -> pb.Op:
    """A schema ``op`` for a publication of ``tables`` (source names): its foreign keys
    to tables outside the publication left out."""
    kept = for_publication(op.schema, {format_table(None, t) for t in tables})
    if kept is not op.schema:
        op.schema.CopyFrom(kept)
    return op
