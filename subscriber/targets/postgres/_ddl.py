"""A PostgreSQL target follows the source's constraints and indexes (``TableSchema.constraints``).

On each schema op, after the columns (``_alter.py``), in the batch's transaction:
the constraints of the previous source schema that are gone or changed are dropped
(``IF EXISTS``: dropping a column took its constraints with it), and the new ones
are added unless the table already has a constraint or index of that name (the
operator's own, or a replay).  Why adding one at the schema op's position never
refuses a row the source accepted: ``common/constraints.py``.

- UNIQUE: ``ADD CONSTRAINT ... UNIQUE (cols)``; CHECK and EXCLUDE: from a
  PostgreSQL source only (the expression is in the source's dialect; an exclusion
  constraint needs the operator classes it names, ``btree_gist`` say, installed on
  the target, or the schema op is refused with PostgreSQL's message); a foreign key
  ``NOT VALID`` on the source is added ``NOT VALID`` (the source holds rows that
  violate it; replicated writes do not check it, ``session_replication_role``); a
  CHECK ``NOT VALID`` is not carried until the source validates it: the catalog is
  read when the table's next change is decoded (``common/constraints.py``), so the
  schema op can come before rows the source wrote before adding it, which violate
  it by definition and which the target would check as they are written (rejected
  until the constraints of a schema op are created at the end of its batch); INDEX: a
  PostgreSQL source's definition as it is, another source's columns, and an index on expressions of
  another dialect is skipped.
- FOREIGN KEY: when the referenced table exists on the target.  A table installed
  before the table it references (installs go by name) gets the key when the
  referenced table is created (:func:`adopt_children`), ``NOT VALID``: the child's
  rows are in, the parent's are not yet (they follow in the parent's install), so
  validating then would refuse what the source holds; PostgreSQL still checks it for
  the application's own later writes.  A foreign key the target lacks is added at
  every schema op of its table, so one skipped earlier is not lost.
- A shaped table (transforms, history mode) gets none: its columns are not the
  source's.
- ``VALIDATE CONSTRAINT`` of a foreign key on the source: the target validates its
  ``NOT VALID`` copy, in a savepoint.  Rows of the target that violate it there are rows the
  source corrected before it validated, not yet applied: the catalog is read when
  the table's next change is decoded (``common/constraints.py``), so the schema op
  can come before them, and "fix the rows, then validate" is how a constraint gets
  validated.  The target's copy then stays ``NOT VALID`` rather than refusing the
  batch (rejected: refusing it, which stops replication on what the source
  accepted; re-validating at a later point, which no entry marks).
- Refused: a new constraint the target's rows violate (rows changed by hand on the
  target): :class:`WriterError` naming the table and the constraint, and the entry
  is parked as any refused entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from common.constraints import changed
from common.names import parse_table
from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import WriterError
from subscriber.targets.postgres._names import table_sql

__all__ = ["adopt_children", "create_constraints", "follow_constraints", "source_names"]

Q = sql.Identifier
FK = pb.CONSTRAINT_KIND_FOREIGN_KEY

_NAMES = """
SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%(t)s)
UNION SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass(%(t)s)
"""

_ACTIONS = frozenset({"CASCADE", "SET NULL", "SET DEFAULT", "RESTRICT"})

_VIOLATED = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.CheckViolation,
    psycopg.errors.ForeignKeyViolation,
    psycopg.errors.NotNullViolation,
    psycopg.errors.ExclusionViolation,
)


def follow_constraints(
    cur: psycopg.Cursor[Any],
    schema: pb.TableSchema,
    previous: pb.TableSchema | None,
    *,
    not_valid: bool = False,
) -> None:
    """Make the target table ``schema.table`` carry ``schema``'s constraints (module doc)."""
    table = table_sql(schema.table)
    drop, add = changed(previous, schema)
    add += [c for c in schema.constraints if c.kind == FK and c not in add]
    name = table.as_string(cur)
    validating = any(c.not_valid for c in drop)
    have = {str(r[0]) for r in cur.execute(_NAMES, {"t": name})} if validating else set()
    for c in _validated(drop, add, have):
        drop, add = [d for d in drop if d.name != c.name], [a for a in add if a.name != c.name]
        try:
            with cur.connection.transaction():
                cur.execute(
                    sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(table, Q(c.name))
                )
        except _VIOLATED:
            pass  # stays NOT VALID: the rows that fix it follow (module doc)
    for c in drop:
        if c.kind == pb.CONSTRAINT_KIND_INDEX:
            cur.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(_index_name(schema.table, c)))
        else:
            cur.execute(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(table, Q(c.name))
            )
    if not add:
        return
    have = {str(r[0]) for r in cur.execute(_NAMES, {"t": name})}  # after the drops
    for c in add:
        if c.name in have:
            continue
        ddl: Any = _add_sql(cur, schema, table, c)
        if ddl is not None and (c.not_valid or (not_valid and c.kind == FK)):
            ddl += sql.SQL(" NOT VALID")
        if ddl is None:
            continue
        try:
            with cur.connection.transaction():
                cur.execute(ddl)
        except _VIOLATED as exc:
            raise WriterError(
                f"the source added constraint {c.name!r} to table {schema.table!r} but the "
                f"PostgreSQL target's rows violate it ({str(exc).strip().splitlines()[0]}): "
                "the target differs from the source; correct its rows (or reinit the "
                "table), then `txrepl subscriber errors retry`"
            ) from exc


def _validated(
    drop: list[pb.TableConstraint], add: list[pb.TableConstraint], have: set[str]
) -> list[pb.TableConstraint]:
    """The constraints of ``add`` whose only change is that the source validated them
    (and that the target has, ``have``)."""
    before = {c.name: c for c in drop}
    out = []
    for c in add:
        old = before.get(c.name)
        if old is None or not old.not_valid or c.not_valid or c.name not in have:
            continue
        same = pb.TableConstraint()
        same.CopyFrom(old)
        same.not_valid = False
        if same == c:
            out.append(c)
    return out


def adopt_children(
    cur: psycopg.Cursor[Any], table: str, schemas: Mapping[str, pb.TableSchema]
) -> None:
    """The new target table ``table`` is referenced by foreign keys of tables created
    before it (``schemas``: the subscription's recorded source schemas): add them."""
    for child in schemas.values():
        if child.table != table and any(
            c.kind == FK and c.ref_table == table for c in child.constraints
        ):
            follow_constraints(cur, child, child, not_valid=True)


def source_names(schema: pb.TableSchema | None) -> set[str]:
    """The names the target gives ``schema``'s constraints and indexes (none: no schema)."""
    return {c.name for c in schema.constraints} if schema is not None else set()


def create_constraints(cur: psycopg.Cursor[Any], schemas: Sequence[pb.TableSchema]) -> None:
    """Tables created together, rows and all (a reinit's swap): give each its source
    constraints.  Every table's own ones first (UNIQUE, CHECK, indexes), then the
    foreign keys, so the UNIQUE a key references exists when the key is added.
    A foreign key the rows violate is added ``NOT VALID``: the rows are the
    source's at one seq, so the source holds the orphans too (a SQLite source with
    ``foreign_keys`` off, a key ``NOT VALID`` on the source) and the target must
    take them; PostgreSQL still checks the application's own later writes."""
    for schema in schemas:
        own = pb.TableSchema()
        own.CopyFrom(schema)
        del own.constraints[:]
        own.constraints.extend(c for c in schema.constraints if c.kind != FK)
        follow_constraints(cur, own, None)
    for schema in schemas:
        try:
            follow_constraints(cur, schema, None)  # the keys (the rest have their names)
        except WriterError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.ForeignKeyViolation):
                raise
            follow_constraints(cur, schema, None, not_valid=True)


def _index_name(table: str, c: pb.TableConstraint) -> sql.Identifier:
    ns = parse_table(table).schema
    return Q(c.name) if ns is None else Q(ns, c.name)


def _cols(names: Any) -> sql.Composable:
    return sql.SQL(", ").join(Q(n) for n in names)


def _add_sql(
    cur: psycopg.Cursor[Any], schema: pb.TableSchema, table: sql.Composable, c: pb.TableConstraint
) -> sql.Composable | None:
    """The DDL adding ``c`` to ``table``, or None when this target does not carry it."""
    same = schema.source_dialect == "postgresql"
    add = sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(table, Q(c.name))
    if c.kind == pb.CONSTRAINT_KIND_UNIQUE:
        return add + sql.SQL("UNIQUE ({})").format(_cols(c.columns))
    if c.kind == pb.CONSTRAINT_KIND_CHECK:
        if not same or c.not_valid:
            return None
        return add + sql.SQL("CHECK ({})").format(sql.SQL(c.expression))
    if c.kind == pb.CONSTRAINT_KIND_EXCLUDE:
        return add + sql.SQL(c.expression) if same else None
    if c.kind == FK:
        ref = table_sql(c.ref_table)
        row = cur.execute("SELECT to_regclass(%s)", (ref.as_string(cur),)).fetchone()
        if row is None or row[0] is None:
            return None
        fk = sql.SQL("FOREIGN KEY ({}) REFERENCES {} ({})").format(
            _cols(c.columns), ref, _cols(c.ref_columns)
        )
        for what, action in (("DELETE", c.on_delete), ("UPDATE", c.on_update)):
            if action in _ACTIONS:
                fk += sql.SQL(f" ON {what} {action}")
        return add + fk
    if c.kind == pb.CONSTRAINT_KIND_INDEX:
        head = sql.SQL("CREATE UNIQUE INDEX" if c.unique else "CREATE INDEX")
        if same and c.expression:
            return sql.SQL("{} {} ON {} {}").format(head, Q(c.name), table, sql.SQL(c.expression))
        if c.columns:
            return sql.SQL("{} {} ON {} ({})").format(head, Q(c.name), table, _cols(c.columns))
    return None
