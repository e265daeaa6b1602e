"""Per-table shaping in Spark: transforms (the "Manipulate" step) and history mode.

**Transforms** (``TableOptions.rename/drop/computed/filter/target``).  The target
table's schema is derived from the source's once per schema op: kept columns (renamed),
then computed columns, whose logical types come from Spark's analysis of the
expressions on an empty DataFrame of the source columns.  For a segment, the net
effect's survivors get their source column names back, rows for which ``filter``
is not true turn into deletes of their key (so a row that leaves the filter leaves
the target), and the target columns are selected.  Expressions see the columns in
their in-flight Arrow forms (see :mod:`subscriber.apply.writer`: decimals as text,
timestamps and times as microseconds).  The primary key cannot be dropped or
computed (it identifies the target row).

**History** (``TableOptions.history``).  The target keeps every version: the source
columns, then ``_first_seq`` (the seq that wrote the version), ``_last_seq`` (the
last seq it was current at; NULL while current), ``_op`` (I, U or D; a delete is a
version without values) and ``_commit_time`` (the entry's commit time, UTC);
primary key = source key + ``_first_seq``.  Within one entry only the last event
per key is a version (an entry is one or more whole source transactions, whose
intermediate states were never visible).  In Spark: the last event per (key, seq),
then ``lead(_seq)`` over the key gives ``_last_seq``; the writer closes each key's
open version at its first new version and inserts the versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from common.rpc import txrepl_pb2 as pb
from subscriber.apply.errors import SchemaError
from subscriber.apply.options import TableOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["HISTORY_COLUMNS", "history_versions", "shaped_rows", "target_schema"]

T = pb.ColumnType
HISTORY_COLUMNS = ("_first_seq", "_last_seq", "_op", "_commit_time")
_OP_LETTER = {1: "I", 2: "U", 3: "D"}


def _spark_type_to_logical(dtype: Any) -> tuple[int, str]:
    """(logical type, Spark cast for the in-flight form) of a computed column."""
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import types as st

    if isinstance(dtype, st.LongType | st.IntegerType | st.ShortType | st.ByteType):
        return T.COLUMN_TYPE_INTEGER, "bigint"
    if isinstance(dtype, st.DoubleType | st.FloatType):
        return T.COLUMN_TYPE_FLOAT, "double"
    if isinstance(dtype, st.BooleanType):
        return T.COLUMN_TYPE_BOOLEAN, "boolean"
    if isinstance(dtype, st.DecimalType):
        return T.COLUMN_TYPE_DECIMAL, "string"
    if isinstance(dtype, st.BinaryType):
        return T.COLUMN_TYPE_BYTES, "binary"
    if isinstance(dtype, st.DateType):
        return T.COLUMN_TYPE_DATE, "date"
    return T.COLUMN_TYPE_TEXT, "string"


_ARROW_OF: dict[int, pa.DataType] = {
    T.COLUMN_TYPE_INTEGER: pa.int64(),
    T.COLUMN_TYPE_DECIMAL: pa.string(),
    T.COLUMN_TYPE_FLOAT: pa.float64(),
    T.COLUMN_TYPE_TEXT: pa.string(),
    T.COLUMN_TYPE_JSON: pa.string(),
    T.COLUMN_TYPE_BYTES: pa.binary(),
    T.COLUMN_TYPE_BOOLEAN: pa.bool_(),
    T.COLUMN_TYPE_DATE: pa.date32(),
    T.COLUMN_TYPE_TIME: pa.int64(),
    T.COLUMN_TYPE_TIMESTAMP: pa.int64(),
    T.COLUMN_TYPE_TIMESTAMPTZ: pa.string(),
}


def _source_frame(spark: SparkSession, source: pb.TableSchema) -> DataFrame:
    """An empty DataFrame with the source columns, by name, in their in-flight types."""
    fields = [pa.field(c.name, _ARROW_OF.get(c.type, pa.binary())) for c in source.columns]
    return spark.createDataFrame(pa.schema(fields).empty_table())


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def target_schema(
    spark: SparkSession, source: pb.TableSchema, opts: TableOptions, seq: int
) -> tuple[pb.TableSchema, list[tuple[str, str]]]:
    """The target table's schema, and per target column (name, Spark SQL producing it)."""
    names = [c.name for c in source.columns]
    for col in [*opts.drop, *opts.rename]:
        if col not in names:
            raise SchemaError(
                f"transform names unknown column {col!r}", seq=seq, table=source.table
            )
    if set(opts.drop) & set(source.primary_key):
        raise SchemaError("a transform cannot drop a key column", seq=seq, table=source.table)
    out = pb.TableSchema(table=opts.target or source.table, source_dialect=source.source_dialect)
    exprs: list[tuple[str, str]] = []
    for c in source.columns:
        if c.name in opts.drop:
            continue
        tc = out.columns.add()
        tc.CopyFrom(c)
        tc.name = opts.rename.get(c.name, c.name)
        tc.identity = ""  # a shaped table is made plain (history rows repeat keys)
        exprs.append((tc.name, _q(c.name)))
    if opts.computed:
        frame = _source_frame(spark, source)
        try:
            analysed = frame.selectExpr(*opts.computed.values()).schema
        except Exception as exc:  # Spark's AnalysisException and friends
            raise SchemaError(
                f"computed column expression does not analyse: {exc}", seq=seq, table=source.table
            ) from exc
        for (name, text), field in zip(opts.computed.items(), analysed.fields, strict=True):
            ltype, cast = _spark_type_to_logical(field.dataType)
            out.columns.add(name=name, type=ltype, nullable=True)
            exprs.append((name, f"CAST(({text}) AS {cast})"))
    out.primary_key.extend(opts.rename.get(k, k) for k in source.primary_key)
    if opts.history:
        out.columns.add(name="_first_seq", type=T.COLUMN_TYPE_INTEGER)
        out.columns.add(name="_last_seq", type=T.COLUMN_TYPE_INTEGER, nullable=True)
        out.columns.add(name="_op", type=T.COLUMN_TYPE_TEXT)
        out.columns.add(name="_commit_time", type=T.COLUMN_TYPE_TIMESTAMP)
        out.primary_key.append("_first_seq")
        for c in out.columns:
            if c.name not in out.primary_key:
                c.nullable = True  # a delete version carries only its key
    if len({c.name for c in out.columns}) != len(out.columns):
        raise SchemaError("transform gives two columns one name", seq=seq, table=source.table)
    return out, exprs


def _named(df: DataFrame, source: pb.TableSchema) -> DataFrame:
    """Positional columns (c{i} / v{i}) -> the source's names."""
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import functions as F

    cols = [F.col("_seq"), F.col("_pos"), F.col("_del"), F.col("_op")]
    for i, c in enumerate(source.columns):
        pos = f"c{i}" if f"c{i}" in df.columns else f"v{i}"
        cols.append(F.col(pos).alias(c.name))
    return df.select(*cols)


def _positional(
    df: DataFrame, exprs: Sequence[tuple[str, str]], keep: Sequence[str], variant: set[str]
) -> DataFrame:
    """Target columns by position: ``v{j}`` where the expression is a source column
    carried variant (its encoded ``Value`` bytes: a time past 24:00, a value of an
    untyped SQLite column), ``c{j}`` otherwise, so the writer decodes it as such."""
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import functions as F

    cols = [F.col(k) for k in keep]
    cols += [
        F.expr(text).alias(f"{'v' if text in variant else 'c'}{j}")
        for j, (_, text) in enumerate(exprs)
    ]
    return df.select(*cols)


def shaped_rows(
    survivors: DataFrame,
    source: pb.TableSchema,
    opts: TableOptions,
    exprs: Sequence[tuple[str, str]],
) -> tuple[pa.Table, pa.Table]:
    """(deletes, upserts) of the target table, from the net effect's survivors."""
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import functions as F

    df = _named(survivors, source)
    variant = {_q(c.name) for i, c in enumerate(source.columns) if f"v{i}" in survivors.columns}
    if opts.filter:
        df = df.withColumn("_del", F.col("_del") | ~F.coalesce(F.expr(opts.filter), F.lit(False)))
    out: pa.Table = _positional(df, exprs, ["_del"], variant).toArrow()
    flags = out.column("_del")
    return out.filter(flags), out.filter(pc.invert(flags))


def history_versions(
    events: DataFrame,
    source: pb.TableSchema,
    key_columns: Sequence[str],
    commit_times: pa.Array,
    first_seq: int,
) -> pa.Table:
    """Every version of the segment, with its seq range, op and commit time (target order)."""
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_seq = Window.partitionBy(*key_columns, "_seq").orderBy(F.col("_pos").desc())
    per_key = Window.partitionBy(*key_columns).orderBy("_seq")
    versions = (
        events.withColumn("_rn", F.row_number().over(per_seq))
        .where(F.col("_rn") == 1)
        .withColumn("_next", F.lead("_seq").over(per_key))
        .withColumn("_first", F.row_number().over(per_key) == 1)
        .drop("_rn")
    )
    table: pa.Table = versions.toArrow()
    n = len(source.columns)
    seqs = table.column("_seq")
    ops = pc.if_else(table.column("_del"), 3, table.column("_op").cast(pa.int8()))
    letters = pa.array([_OP_LETTER.get(o, "U") for o in ops.to_pylist()], pa.string())
    when = pc.take(commit_times, pc.subtract(seqs, first_seq))
    cols: dict[str, Any] = {}
    for i in range(n):
        name = f"c{i}" if f"c{i}" in table.column_names else f"v{i}"
        cols[name] = table.column(name)
    cols[f"c{n}"] = seqs
    cols[f"c{n + 1}"] = pc.subtract(table.column("_next"), 1)
    cols[f"c{n + 2}"] = letters
    cols[f"c{n + 3}"] = when
    cols["_first"] = table.column("_first")
    return pa.table(cols)
