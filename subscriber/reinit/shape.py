"""Transforms on snapshot rows: the apply's Spark SQL, applied to a snapshot.

A published table with ``[apply.tables.<table>]`` transforms (renamed, dropped and
computed columns, a row filter, another target table) is loaded into its *target*
table, in the shape the apply gives its changes (the public face of :mod:`subscriber.apply`):

1. At the snapshot's start, the target schema and the column expressions come from
   :func:`~subscriber.apply.target_schema`, as the apply derives them from
   the same source schema.
2. Each chunk of snapshot rows becomes INSERT events of the source table (the
   apply's :class:`~subscriber.apply.EventBuffer`, so expressions and the
   filter see the same in-flight forms: decimals as text, timestamps as
   microseconds), goes through :func:`~subscriber.apply.shaped_rows` (one
   Spark job per chunk; every key occurs once, so the events are their own net
   effect), and rows outside the filter are left out (a snapshot has nothing to
   delete).
3. The target rows go back to ``Value`` messages of the target schema, so the
   SQLite and PostgreSQL loaders take them like any published row.

History mode is refused (:class:`~subscriber.reinit.errors.SnapshotRefused`): a snapshot
would replace the versions the table keeps with the current rows.  A source
column whose values do not fit its declared type (SQLite) reaches Spark as
serialized values, which expressions cannot read: such a chunk fails the snapshot
by name, as the apply fails such a batch.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from common.rpc import txrepl_pb2 as pb
from subscriber.apply import (
    EventBuffer,
    SchemaError,
    TableOptions,
    arrow_frame,
    shaped_rows,
    target_schema,
)
from subscriber.reinit.errors import SnapshotError, SnapshotRefused

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

__all__ = ["Shape", "shape_rows", "shapes"]

T = pb.ColumnType
_INSERT = int(pb.ROW_OP_INSERT)


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
        if opts is None or not opts.shaped:
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
    _deletes, upserts = shaped_rows(arrow_frame(spark, events), source, shape.options, shape.exprs)
    columns = [_target_values(upserts, j, back) for j, back in enumerate(_backs(shape.target))]
    return [pb.Row(values=values) for values in zip(*columns, strict=True)] if columns else []


_NULL = pb.Value(null=True)


def _target_values(upserts: pa.Table, j: int, back: Any) -> list[pb.Value]:
    """Target column ``j`` of shaped rows as values: a column carried variant (values
    of another type than declared, e.g. a time of 24:00) holds encoded values as they
    came, like the apply's."""
    if f"v{j}" in upserts.column_names:
        raw = upserts.column(f"v{j}").to_pylist()
        return [_NULL if b is None else pb.Value.FromString(b) for b in raw]
    return [_NULL if x is None else back(x) for x in upserts.column(f"c{j}").to_pylist()]


_DAY0 = dt.date(1970, 1, 1)


_UTC0 = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _tz(x: str) -> pb.Value:
    """TIMESTAMPTZ: in flight as ``isoformat()`` text, with its offset."""
    ts = dt.datetime.fromisoformat(x)
    off = ts.utcoffset()
    if off is None:  # not written by the apply, but zone-less means UTC (common.values)
        ts, off = ts.replace(tzinfo=dt.UTC), dt.timedelta(0)
    d = ts - _UTC0
    utc_us = (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
    return pb.Value(timestamptz=pb.TimestampTz(utc_us=utc_us, offset_s=int(off.total_seconds())))


# In-flight value (writer.py's forms, never None) -> the Value of its logical type.
_BACK: dict[int, Callable[[Any], pb.Value]] = {
    T.COLUMN_TYPE_INTEGER: lambda x: pb.Value(int=x),
    T.COLUMN_TYPE_FLOAT: lambda x: pb.Value(float=x),
    T.COLUMN_TYPE_TEXT: lambda x: pb.Value(text=x),
    T.COLUMN_TYPE_JSON: lambda x: pb.Value(json=x),
    T.COLUMN_TYPE_BYTES: lambda x: pb.Value(blob=x),
    T.COLUMN_TYPE_BOOLEAN: lambda x: pb.Value(boolean=x),
    # The in-flight text is canonical already; Decimal() checks it is a number.
    T.COLUMN_TYPE_DECIMAL: lambda x: pb.Value(decimal=str(decimal.Decimal(x))),
    T.COLUMN_TYPE_DATE: lambda x: pb.Value(date=(x - _DAY0).days),
    T.COLUMN_TYPE_TIME: lambda x: pb.Value(time_us=x),
    T.COLUMN_TYPE_TIMESTAMP: lambda x: pb.Value(timestamp_us=x),
    T.COLUMN_TYPE_TIMESTAMPTZ: _tz,
}


def _backs(schema: pb.TableSchema) -> list[Callable[[Any], pb.Value]]:
    """Per column of ``schema``, its in-flight value -> ``Value`` (see :data:`_BACK`)."""
    out = []
    for c in schema.columns:
        back = _BACK.get(c.type)
        if back is None:
            raise SnapshotError(
                f"column {c.name!r} of {schema.table!r}: type {T.Name(c.type)} cannot be"
                " loaded through transforms"
            )
        out.append(back)
    return out
