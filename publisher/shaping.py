"""Publication-side shaping: row filters and column lists (issue 25, xDB's table filters).

The publisher decides what leaves it: a publication's ``filter`` (a row predicate per
table) and ``columns`` (the published columns per table) are applied **before an
entry is written to the publication's log** (:meth:`Shaper.entry`, called by
``Publication.append`` for capture and ``Publish`` alike) and to every row the
``Snapshot`` RPC sends (publisher/snapshot.py).  A filtered row or a left-out column
is therefore never in the log, never on the wire, in no snapshot: a security
boundary, not a subscriber-side convenience (the subscriber's ``[apply.tables]``
``filter``/``drop`` still work on top, docs/apply.md).

Rules, per op of a shaped table (``schema`` ops keep the shape current; a row of a
shaped table whose schema this process has not seen is refused, never let through:
both captures send a table's schema before its first row in a process):

* schema: projected to the listed columns (the primary key must be among them).
* INSERT: dropped when the filter is not true for the row; else projected.
* UPDATE: the new row outside the filter becomes a DELETE of its key (the row may
  have been inside before: the publisher does not know the old values, PostgreSQL
  sends only the old key), so a row that leaves the filter leaves the target; inside,
  projected.
* DELETE, TRUNCATE: passed as they are (a DELETE carries only the key).

The filter is an SQL expression evaluated by SQLite (an in-memory database, one per
thread) over the row's source columns, whatever the source's dialect: the same
filter means the same on both sources and is checked at start.  Values are given to
it as SQLite sees them: integers, reals, text, blobs; exact decimals as reals, dates,
times and timestamps as ISO text, booleans as 0/1, JSON as its text.  Rejected: a
PostgreSQL publication's own row filter (columns of UPDATE/DELETE filters must be
in the replica identity, filters of publications sharing a slot are OR-ed, wal2json
has none) and SQLite trigger ``WHEN`` clauses (the triggers are shared by every
publication of a table): each would give a filter two meanings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import sqlite3
import threading
from collections.abc import Mapping, Sequence

from common import values
from common.names import parse_table, quote_ident
from common.rpc import txrepl_pb2 as pb
from publisher.errors import ShapeRefused

__all__ = ["BoundShape", "Shaper", "TableShaping", "shapings"]

_local = threading.local()


def _conn() -> sqlite3.Connection:
    conn: sqlite3.Connection | None = getattr(_local, "conn", None)
    if conn is None:
        conn = sqlite3.connect(":memory:")
        _local.conn = conn
    return conn


def _sql_value(v: object) -> object:
    """A decoded wire value as the filter sees it (the module docstring)."""
    if v is None or isinstance(v, (int, float, str, bytes)):
        return int(v) if isinstance(v, bool) else v
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (dt.date, dt.time, dt.datetime)):
        return v.isoformat()
    return str(v)


class RowFilter:
    """One table's filter over its source columns: ``filter(row_values) -> bool``."""

    def __init__(self, table: str, expr: str, columns: Sequence[str]) -> None:
        self.table = table
        self.expr = expr
        cols = ", ".join(f"? AS {quote_ident(c)}" for c in columns)
        self.sql = f"SELECT CASE WHEN ({expr}) THEN 1 ELSE 0 END FROM (SELECT {cols})"
        try:  # compiled once against NULLs: an unknown column or bad syntax says so now
            _conn().execute(self.sql, [None] * len(columns)).fetchall()
        except (sqlite3.Error, sqlite3.Warning) as e:
            raise ShapeRefused(
                f"filter of table {table!r} ({expr!r}) cannot be evaluated: {e} (the filter is "
                f"an SQLite expression over the columns {list(columns)})"
            ) from None

    def __call__(self, row: Sequence[pb.Value]) -> bool:
        args = [_sql_value(values.decode(v)) for v in row]
        try:
            (hit,) = _conn().execute(self.sql, args).fetchone()
        except (sqlite3.Error, sqlite3.Warning) as e:
            raise ShapeRefused(f"filter of table {self.table!r} failed on a row: {e}") from None
        return bool(hit)


@dataclasses.dataclass(frozen=True)
class BoundShape:
    """A table's shaping bound to one of its schemas."""

    schema: pb.TableSchema  # the published (projected) schema
    keep: tuple[int, ...] | None  # source column positions kept; None: all
    filter: RowFilter | None

    def passes(self, row: Sequence[pb.Value]) -> bool:
        return self.filter is None or self.filter(row)

    def project(self, row: Sequence[pb.Value]) -> list[pb.Value]:
        return list(row) if self.keep is None else [row[i] for i in self.keep]


@dataclasses.dataclass(frozen=True)
class TableShaping:
    """``filter`` and ``columns`` of one table, as configured."""

    table: str
    filter: str = ""
    columns: tuple[str, ...] | None = None

    def check(self, columns: Sequence[str], key: Sequence[str]) -> RowFilter | None:
        """Refuse (ShapeRefused, one line) what names a column the table lacks."""
        if self.columns is not None:
            unknown = [c for c in self.columns if c not in columns]
            if unknown:
                raise ShapeRefused(
                    f"columns of table {self.table!r}: no column {unknown} in the table "
                    f"(it has {list(columns)})"
                )
            missing = [k for k in key if k not in self.columns]
            if missing:
                raise ShapeRefused(
                    f"columns of table {self.table!r} leave out primary key column(s) "
                    f"{missing}: a published table keeps its whole key"
                )
        return RowFilter(self.table, self.filter, columns) if self.filter else None

    def bind(self, schema: pb.TableSchema) -> BoundShape:
        names = [c.name for c in schema.columns]
        row_filter = self.check(names, list(schema.primary_key))
        if self.columns is None:
            return BoundShape(schema, None, row_filter)
        keep = tuple(i for i, n in enumerate(names) if n in self.columns)
        out = pb.TableSchema()
        out.CopyFrom(schema)
        del out.columns[:]
        out.columns.extend(schema.columns[i] for i in keep)
        return BoundShape(out, keep, row_filter)


def shapings(
    filters: Mapping[str, str], columns: Mapping[str, Sequence[str]]
) -> dict[str, TableShaping]:
    """The configured shaping per table, by the wire's form of its name."""
    out: dict[str, TableShaping] = {}
    for name in sorted({*filters, *columns}):
        table = str(parse_table(name))
        cols = columns.get(name)
        out[table] = TableShaping(table, filters.get(name, ""), tuple(cols) if cols else None)
    return out


class Shaper:
    """One publication's shaping of the entries it appends (the module docstring)."""

    def __init__(self, tables: Mapping[str, TableShaping]) -> None:
        self.tables = dict(tables)
        self._bound: dict[str, BoundShape] = {}

    def __bool__(self) -> bool:
        return bool(self.tables)

    def entry(self, entry: pb.Entry) -> None:
        """Shape ``entry`` in place (called under the publication's append lock)."""
        if not self.tables or not any(self._shaped(op) for op in entry.ops):
            return
        ops: list[pb.Op] = []
        for op in entry.ops:
            kind = op.WhichOneof("kind")
            if kind == "schema" and op.schema.table in self.tables:
                bound = self.tables[op.schema.table].bind(op.schema)
                self._bound[op.schema.table] = bound
                ops.append(pb.Op(schema=bound.schema))
            elif kind == "row" and op.row.table in self.tables:
                shaped = self._row(op.row)
                if shaped is not None:
                    ops.append(pb.Op(row=shaped))
            else:
                ops.append(op)
        del entry.ops[:]
        entry.ops.extend(ops)

    def _shaped(self, op: pb.Op) -> bool:
        kind = op.WhichOneof("kind")
        return (kind == "schema" and op.schema.table in self.tables) or (
            kind == "row" and op.row.table in self.tables
        )

    def _row(self, rc: pb.RowChange) -> pb.RowChange | None:
        if rc.op not in (pb.ROW_OP_INSERT, pb.ROW_OP_UPDATE):
            return rc
        bound = self._bound.get(rc.table)
        if bound is None:
            raise ShapeRefused(
                f"a row of shaped table {rc.table!r} came before its schema: not published"
            )
        if not bound.passes(rc.row):
            if rc.op == pb.ROW_OP_INSERT:
                return None
            return pb.RowChange(table=rc.table, op=pb.ROW_OP_DELETE, key=rc.key)
        if bound.keep is None:
            return rc
        return pb.RowChange(table=rc.table, op=rc.op, key=rc.key, row=bound.project(rc.row))
