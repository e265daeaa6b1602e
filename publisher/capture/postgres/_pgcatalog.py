"""Catalog look-ups for PostgreSQL capture: table schemas, type resolution, names.

A relation message (or wal2json's column list) gives column names, type OIDs and typmods
as of the decoded WAL position; the catalog adds what those lack: the primary key,
NOT NULL, the base type of domains and the declared type's spelling, identity columns
and stored generated columns (which the decoding leaves out).  Those come from the
*current* catalog (a historic catalog is not reachable from SQL): a primary key or NOT
NULL changed after the decoded change and before it is decoded shows up early.

Identity and generated columns (issue 19, docs/postgres.md): a column with
``attidentity`` ``a``/``d``, or a serial one (its default draws from a sequence it owns,
``pg_depend`` kind ``a``), is marked ``Column.identity``; a stored generated column not
among the decoded ones travels as ``TableSchema.generated`` (name, target type, the
expression as ``pg_get_expr`` prints it), left out when its type is no built-in one (its
expression would not give the ``text`` a target stores such types in).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from common.names import format_table, parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from publisher.capture.postgres._pgconstraints import read_constraints
from publisher.capture.postgres._pgoutput import RelColumn
from publisher.capture.postgres._pgtypes import TypeInfo, builtin_type, numeric_typmod
from publisher.errors import SourceError

__all__ = [
    "REFUSED",
    "Catalog",
    "TableName",
    "TableShape",
    "UnsupportedType",
    "pg_target_type",
    "qident",
    "table_name",
]

T = pb.ColumnType

# Built-in types whose values only mean something inside the source database (or have
# no input function): a target could not store them, or would store something else.
REFUSED: Final = frozenset(
    {
        "aclitem",
        "pg_node_tree",
        "pg_ndistinct",
        "pg_dependencies",
        "pg_mcv_list",
        "pg_brin_bloom_summary",
        "pg_brin_minmax_multi_summary",
        "unknown",
    }
)

_TYPE_ROW: Final = (
    "SELECT t.typtype, t.typbasetype, t.typtypmod, t.typelem, n.nspname, t.typname,"
    " format_type(t.oid, %s), e.typarray = t.oid"
    " FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
    " LEFT JOIN pg_type e ON e.oid = t.typelem WHERE t.oid = %s"
)


class UnsupportedType(SourceError):
    """A column type txrepl cannot carry exactly (see the module docstring)."""

    def __init__(self, type_name: str, why: str) -> None:
        super().__init__(f"type {type_name} cannot be replicated exactly: {why}")
        self.type_name = type_name
        self.why = why


def pg_target_type(conn: psycopg.Connection[Any], oid: int, typmod: int) -> tuple[str, bool]:
    """(the type a PostgreSQL target gives a column of type ``oid``/``typmod``, whether
    it is the source's own built-in type); raises :class:`UnsupportedType`."""
    for _ in range(32):  # domains over domains
        row = conn.execute(_TYPE_ROW, (typmod, oid)).fetchone()
        if row is None:
            raise UnsupportedType(f"oid {oid}", "the type is gone from the source")
        typtype, base, basemod, elem, nsp, name, spelled, is_array = row
        if typtype == "d":
            oid, typmod = int(base), typmod if typmod >= 0 else int(basemod)
            continue
        if typtype == "p":
            raise UnsupportedType(str(spelled), "a pseudo-type has no stored values")
        if is_array:
            inner, builtin = pg_target_type(conn, int(elem), typmod)
            return (inner + "[]", True) if builtin else ("text", False)
        if nsp != "pg_catalog":
            return "text", False
        if name in REFUSED:
            raise UnsupportedType(str(spelled), "its values describe the source database itself")
        if str(name).startswith("reg"):
            return "text", False
        return str(spelled), True
    raise UnsupportedType(f"oid {oid}", "domains nested too deep")


qident = quote_ident


@dataclass(frozen=True, slots=True)
class TableName:
    schema: str
    name: str

    @property
    def display(self) -> str:
        """The name entries carry (common/names.py): bare for ``public``, else ``schema.name``."""
        return format_table(None if self.schema == "public" else self.schema, self.name)

    @property
    def sql(self) -> str:
        return f"{qident(self.schema)}.{qident(self.name)}"


def table_name(spec: str) -> TableName:
    """``name`` (schema public) or ``schema.name``, as written in the configuration."""
    try:
        ref = parse_table(spec)
    except ValueError as e:
        raise SourceError(str(e)) from None
    return TableName(ref.schema or "public", ref.name)


@dataclass(frozen=True, slots=True)
class TableShape:
    """How to turn one relation's tuples into txrepl rows."""

    schema: pb.TableSchema
    infos: tuple[TypeInfo, ...]
    key_idx: tuple[int, ...]


_SPECIAL: Final = """
SELECT a.attname, a.attidentity, a.attgenerated, a.atttypid, a.atttypmod,
       pg_get_expr(d.adbin, d.adrelid),
       EXISTS (SELECT 1 FROM pg_depend p JOIN pg_class q ON q.oid = p.objid AND q.relkind = 'S'
                WHERE p.refobjid = a.attrelid AND p.refobjsubid = a.attnum
                  AND p.classid = 'pg_class'::regclass AND p.deptype = 'a')
  FROM pg_attribute a
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
   AND (a.attidentity <> '' OR a.attgenerated <> '' OR a.atthasdef)
 ORDER BY a.attnum
"""


class Catalog:
    """Cached catalog queries on one connection (thread-safe through ``lock``)."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]], lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock
        self._types: dict[tuple[int, int], TypeInfo] = {}

    def type_info(self, oid: int, typmod: int, type_name: str | None = None) -> TypeInfo:
        hit = self._types.get((oid, typmod))
        if hit is not None:
            return hit
        with self._lock:
            row = self._conn.execute(
                "WITH RECURSIVE d(oid, base, typmod, typtype, depth) AS ("
                "  SELECT oid, typbasetype, typtypmod, typtype, 0 FROM pg_type WHERE oid = %s"
                "  UNION ALL SELECT t.oid, t.typbasetype, t.typtypmod, t.typtype, d.depth + 1"
                "  FROM pg_type t JOIN d ON t.oid = d.base WHERE d.typtype = 'd')"
                " SELECT format_type(%s, %s),"
                "  (SELECT oid FROM d WHERE typtype <> 'd' ORDER BY depth LIMIT 1),"
                "  (SELECT typmod FROM d WHERE typtype = 'd' AND typmod >= 0"
                "   ORDER BY depth LIMIT 1)",
                (oid, oid, typmod),
            ).fetchone()
        source_type = type_name or (str(row[0]) if row and row[0] else f"oid {oid}")
        base = int(row[1]) if row and row[1] is not None else oid  # type: ignore[call-overload]
        if typmod < 0 and row and row[2] is not None:
            typmod = int(row[2])  # type: ignore[call-overload]
        ctype = builtin_type(base)
        if ctype is None:
            ctype = T.COLUMN_TYPE_TEXT  # enums, uuid-like and other types travel as text
        prec, scale = numeric_typmod(typmod) if ctype == T.COLUMN_TYPE_DECIMAL else (0, 0)
        with self._lock:
            target, _ = pg_target_type(self._conn, oid, typmod)
        info = TypeInfo(ctype, prec, scale, source_type, target)
        self._types[(oid, typmod)] = info
        return info

    def constraints(self, table: TableName) -> tuple[list[str], set[str]] | None:
        """(primary key columns in key order, NOT NULL columns), or None if the table is gone."""
        with self._lock:
            oid_row = self._conn.execute("SELECT to_regclass(%s)::oid", (table.sql,)).fetchone()
            if oid_row is None or oid_row[0] is None:
                return None
            oid = oid_row[0]
            pk = [
                str(r[0])
                for r in self._conn.execute(
                    "SELECT a.attname FROM pg_index i"
                    " CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n)"
                    " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
                    " WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n",
                    (oid,),
                )
            ]
            notnull = {
                str(r[0])
                for r in self._conn.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
                    " AND NOT attisdropped AND attnotnull",
                    (oid,),
                )
            }
        return pk, notnull

    def special(
        self, table: TableName, decoded: Collection[str]
    ) -> tuple[dict[str, str], list[pb.GeneratedColumn]]:
        """(identity kind by column, stored generated columns not in ``decoded``)."""
        identity: dict[str, str] = {}
        generated: list[pb.GeneratedColumn] = []
        with self._lock:
            rows: list[tuple[Any, ...]] = self._conn.execute(_SPECIAL, (table.sql,)).fetchall()
            for name, ident, gen, oid, typmod, expr, serial in rows:
                if ident or serial:
                    identity[str(name)] = "always" if ident == "a" else "by default"
                elif gen == "s" and name not in decoded and expr is not None:
                    try:
                        pg_type, builtin = pg_target_type(self._conn, int(oid), int(typmod))
                    except UnsupportedType:
                        continue
                    if builtin:
                        generated.append(
                            pb.GeneratedColumn(name=name, pg_type=pg_type, expression=str(expr))
                        )
        return identity, generated

    def filled(self, table: TableName, names: Collection[str]) -> set[str]:
        """Those of columns ``names`` that have a default or a missing value (rows that
        existed when the column was added take it without a row change)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
                " AND attname = ANY(%s) AND NOT attisdropped AND (atthasdef OR atthasmissing)",
                (table.sql, list(names)),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def shape(
        self,
        table: TableName,
        columns: Sequence[RelColumn],
        previous: TableShape | None = None,
    ) -> TableShape:
        """The TableSchema and row codec of ``table`` with the decoded ``columns``."""
        names = [c.name for c in columns]
        found = self.constraints(table)
        if found is None:  # dropped since: keep what we knew, or the replica identity
            pk = list(previous.schema.primary_key) if previous else []
            notnull: set[str] = set()
        else:
            pk, notnull = found
        pk = [k for k in pk if k in names]
        if not pk:
            if previous is not None and all(k in names for k in previous.schema.primary_key):
                pk = list(previous.schema.primary_key)
            else:
                raise SourceError(
                    f"table {table.display!r} has no PRIMARY KEY; txrepl needs one to "
                    "replicate a table (add one, or leave the table out of the publication)"
                )
        schema = pb.TableSchema(table=table.display, source_dialect="postgresql")
        infos: list[TypeInfo] = []
        for col in columns:
            info = self.type_info(col.type_oid, col.typmod, col.type_name)
            infos.append(info)
            schema.columns.append(
                info.column(col.name, nullable=col.name not in notnull and col.name not in pk)
            )
        schema.primary_key.extend(pk)
        if found is not None:
            with self._lock:
                schema.constraints.extend(read_constraints(self._conn, table.sql))
            identity, generated = self.special(table, names)
            for column in schema.columns:
                column.identity = identity.get(column.name, "")
            schema.generated.extend(generated)
        elif previous is not None:
            schema.constraints.extend(previous.schema.constraints)
            schema.generated.extend(previous.schema.generated)
            kept = {c.name: c.identity for c in previous.schema.columns}
            for column in schema.columns:
                column.identity = kept.get(column.name, "")
        return TableShape(schema, tuple(infos), tuple(names.index(k) for k in pk))
