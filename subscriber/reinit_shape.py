"""Transforms on snapshot rows: the apply's Spark SQL, applied to a snapshot.

A published table with ``[apply.tables.<table>]`` transforms (renamed, dropped and
computed columns, a row filter, another target table) is loaded into its *target*
table, in the shape the apply gives its changes (subscriber/apply/_shape.py):

1. At the snapshot's start, the target schema and the column expressions come from
   :func:`~subscriber.apply._shape.target_schema`, as the apply derives them from
   the same source schema.
2. Each chunk of snapshot rows becomes INSERT events of the source table (the
   apply's :class:`~subscriber.apply._events.EventBuffer`, so expressions and the
   filter see the same in-flight forms: decimals as text, timestamps as
   microseconds), goes through :func:`~subscriber.apply._shape.shaped_rows` (one
   Spark job per chunk; every key occurs once, so the events are their own net
   effect), and rows outside the filter are left out (a snapshot has nothing to
   delete).
3. The target rows go back to ``Value`` messages of the target schema, so the
   SQLite and PostgreSQL loaders take them like any published row.

History mode is refused (:class:`~subscriber.reinit.SnapshotRefused`): a snapshot
would replace the versions the table keeps with the current rows.  A source
column whose values do not fit its declared type (SQLite) reaches Spark as
serialized values, which expressions cannot read: such a chunk fails the snapshot
by name, as the apply fails such a batch.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from common.rpc import txrepl_pb2 as pb
from common.values import encode
from subscriber.apply._events import EventBuffer
from subscriber.apply._shape import shaped_rows, target_schema
from subscriber.apply.errors import SchemaError
from subscriber.apply.options import TableOptions
from subscriber.apply.session import arrow_frame
from subscriber.reinit import SnapshotError, SnapshotRefused

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Shape", "shape_rows", "shapes"]

T = pb.ColumnType
_INSERT = int(pb.ROW_OP_INSERT)
_EPOCH = dt.datetime(1970, 1, 1)


class Shape(NamedTuple):
    """How one published table is loaded: into ``target``, through ``exprs``."""

    source: pb.TableSchema
    target: pb.TableSchema
    exprs: list[tuple[str, str]]
    options: TableOptions


def shapes(
    spark: SparkSession | None,
    start: pb.SnapshotStart,
    options: Mapping[str, TableOptions],
) -> dict[str, Shape]:
    """Source table -> its :class:`Shape`, for the snapshot's tables that have one."""
    out: dict[str, Shape] = {}
    for t in start.tables:
        opts = options.get(t.schema.table)
        if opts is None or not (opts.transforms or opts.target or opts.history):
            continue
        if opts.history:
            raise SnapshotRefused(
                f"snapshot refused: [apply.tables.{t.schema.table}] sets history, and a"
                " snapshot would replace the versions the table keeps with the current rows;"
                " nothing was loaded"
            )
        if spark is None:
            raise SnapshotError(
                f"table {t.schema.table!r} has transforms: loading it needs a Spark session"
            )
        try:
            target, exprs = target_schema(spark, t.schema, opts, start.seq)
        except SchemaError as exc:
            raise SnapshotError(f"[apply.tables.{t.schema.table}]: {exc}") from exc
        out[t.schema.table] = Shape(t.schema, target, exprs, opts)
    names = [out[t.schema.table].target.table if t.schema.table in out else t.schema.table
             for t in start.tables]  # fmt: skip
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise SnapshotError(f"two published tables would load into the same target table: {clash}")
    return out


def shape_rows(spark: SparkSession, shape: Shape, seq: int, rows: Sequence[pb.Row]) -> list[pb.Row]:
    """A chunk of the source table's snapshot rows as rows of the target table."""
    source = shape.source
    width = len(source.columns)
    buf = EventBuffer(source)
    for i, r in enumerate(rows):
        if len(r.values) != width:
            raise SnapshotError(
                f"snapshot row of {source.table!r} has {len(r.values)} values,"
                f" the table {width} columns"
            )
        buf.add(seq, i, False, [v.SerializeToString() for v in r.values], _INSERT)
    events = buf.to_arrow()
    mixed = [source.columns[int(n[1:])].name for n in events.column_names if n[:1] == "v"]
    if mixed:
        raise SnapshotError(
            f"table {source.table!r}: column(s) {mixed} hold values of another type than"
            " declared, which transforms cannot read"
        )
    _deletes, upserts = shaped_rows(arrow_frame(spark, events), source, shape.options, shape.exprs)
    columns = [
        [_value(c, x) for x in upserts.column(f"c{j}").to_pylist()]
        for j, c in enumerate(shape.target.columns)
    ]
    return [pb.Row(values=values) for values in zip(*columns, strict=True)] if columns else []


def _value(column: pb.Column, x: Any) -> pb.Value:
    """An in-flight value (writer.py's forms) as the ``Value`` of its logical type."""
    ctype = column.type
    if x is None:
        return encode(None, ctype)
    if ctype == T.COLUMN_TYPE_DECIMAL:
        x = decimal.Decimal(x)  # exact: the in-flight form is the canonical text
    elif ctype == T.COLUMN_TYPE_TIME:
        x = (_EPOCH + dt.timedelta(microseconds=x)).time()
    elif ctype == T.COLUMN_TYPE_TIMESTAMP:
        x = _EPOCH + dt.timedelta(microseconds=x)
    elif ctype == T.COLUMN_TYPE_TIMESTAMPTZ:
        x = dt.datetime.fromisoformat(x)
    return encode(x, ctype)
