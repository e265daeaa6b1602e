"""A PostgreSQL table's secondary constraints and indexes, as ``pb.TableConstraint``.

Read from the current catalog with the rest of the table's shape (``_pgcatalog``):
UNIQUE, CHECK, FOREIGN KEY and exclusion constraints, and the indexes that back no
constraint.  A CHECK or foreign key added ``NOT VALID`` is carried with
``not_valid`` set (its ``VALIDATE CONSTRAINT`` changes it; what a target does with
it: ``subscriber/targets/postgres/_ddl.py``); an exclusion constraint as
``pg_get_constraintdef``'s text (``EXCLUDE USING gist (...) [WHERE (...)]``: only
a PostgreSQL target carries it).
Left out: the primary key and NOT NULL (carried by the columns), and indexes not
yet valid (``CREATE INDEX CONCURRENTLY`` in progress).

How a change is noticed: ``ALTER TABLE ... ADD/DROP CONSTRAINT`` and ``CREATE/DROP
INDEX`` invalidate the table's relation cache entry, so pgoutput sends a relation
message before the table's next change; the session then reads the shape again and
logs a schema op when it differs from the one logged (``_session._ops``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from common.names import format_table
from common.rpc import txrepl_pb2 as pb

__all__ = ["read_constraints"]

_ACTIONS = {"r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}

_CONSTRAINTS = """
SELECT c.conname, c.contype,
  ARRAY(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n ORDER BY k.i),
  CASE WHEN c.contype = 'c' THEN pg_get_expr(c.conbin, c.conrelid)
       WHEN c.contype = 'x' THEN pg_get_constraintdef(c.oid) END,
  rn.nspname, r.relname,
  ARRAY(SELECT a.attname FROM unnest(c.confkey) WITH ORDINALITY k(n, i)
        JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n ORDER BY k.i),
  c.confdeltype, c.confupdtype, c.convalidated
FROM pg_constraint c
LEFT JOIN pg_class r ON r.oid = c.confrelid
LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace
WHERE c.conrelid = to_regclass(%s) AND c.contype IN ('u', 'c', 'f', 'x')
ORDER BY c.conname
"""

_INDEXES = """
SELECT ci.relname, i.indisunique, pg_get_indexdef(i.indexrelid),
  CASE WHEN i.indexprs IS NULL AND i.indpred IS NULL THEN
    ARRAY(SELECT a.attname FROM unnest(i.indkey[0:i.indnkeyatts - 1]) WITH ORDINALITY k(n, j)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.j)
  END
FROM pg_index i JOIN pg_class ci ON ci.oid = i.indexrelid
WHERE i.indrelid = to_regclass(%s) AND NOT i.indisprimary AND i.indisvalid
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                  WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid)
ORDER BY ci.relname
"""


def read_constraints(conn: psycopg.Connection[Any], table: str) -> list[pb.TableConstraint]:
    """The constraints and indexes of ``table`` (its SQL name), by name (module doc)."""
    out: list[pb.TableConstraint] = []
    for name, kind, cols, text, ref_ns, ref_rel, ref_cols, on_del, on_upd, valid in conn.execute(
        _CONSTRAINTS, (table,)
    ):
        c = pb.TableConstraint(name=str(name), columns=[str(x) for x in cols], not_valid=not valid)
        if kind == "u":
            c.kind = pb.CONSTRAINT_KIND_UNIQUE
        elif kind == "c":
            c.kind = pb.CONSTRAINT_KIND_CHECK
            c.expression = str(text)
        elif kind == "x":
            c.kind = pb.CONSTRAINT_KIND_EXCLUDE
            c.expression = str(text)
        else:
            c.kind = pb.CONSTRAINT_KIND_FOREIGN_KEY
            c.ref_table = format_table(None if ref_ns == "public" else str(ref_ns), str(ref_rel))
            c.ref_columns.extend(str(x) for x in ref_cols)
            c.on_delete = _ACTIONS.get(str(on_del), "")
            c.on_update = _ACTIONS.get(str(on_upd), "")
        out.append(c)
    for name, unique, definition, cols in conn.execute(_INDEXES, (table,)):
        text = str(definition)
        at = text.find(" USING ")
        out.append(
            pb.TableConstraint(
                name=str(name),
                kind=pb.CONSTRAINT_KIND_INDEX,
                unique=bool(unique),
                columns=[str(x) for x in cols or ()],
                expression=text[at + 1 :] if at >= 0 else "",
            )
        )
    return out
