"""Row changes -> Arrow event tables -> net effect per primary key, through Spark.

An *event* is one upsert or one delete of one primary key.  An event table has the
columns ``_seq`` (int64), ``_pos`` (int64, the event's position in the batch,
increasing in op order), ``_del`` (bool), then one column per schema column named
as described in :mod:`subscriber.apply.writer`, then ``_op`` (int8, the RowOp the
event came from; history mode records it).  A delete event fills only the key
columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from common import values
from common.rpc import txrepl_pb2 as pb

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = pb.ColumnType

__all__ = ["EventBuffer", "net_effect", "net_effect_df"]


class _Mismatch(Exception):
    """A value does not fit its column's typed Arrow form."""


def _kind(v: pb.Value) -> str | None:
    k = v.WhichOneof("kind")
    return None if k == "null" else k


def _int(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "int":
        return v.int
    raise _Mismatch


def _decimal(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "decimal":
        return v.decimal
    if k == "int":
        return str(v.int)
    raise _Mismatch


def _float(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "float":
        return v.float
    raise _Mismatch


def _text(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "text":
        return v.text
    raise _Mismatch


def _json(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "json":
        return v.json
    if k == "text":
        return v.text
    raise _Mismatch


def _blob(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "blob":
        return v.blob
    raise _Mismatch


def _bool(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "boolean":
        return v.boolean
    raise _Mismatch


def _date(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "date":
        return v.date
    raise _Mismatch


def _time(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "time_us":
        return v.time_us
    raise _Mismatch


def _timestamp(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "timestamp_us":
        return v.timestamp_us
    raise _Mismatch


def _timestamptz(v: pb.Value) -> object:
    k = _kind(v)
    if k is None:
        return None
    if k == "timestamptz":
        return values.decode(v).isoformat()  # type: ignore[attr-defined]
    raise _Mismatch


def _never(v: pb.Value) -> object:
    raise _Mismatch


_TYPED: dict[int, tuple[Callable[[pb.Value], object], pa.DataType]] = {
    T.COLUMN_TYPE_INTEGER: (_int, pa.int64()),
    T.COLUMN_TYPE_DECIMAL: (_decimal, pa.string()),
    T.COLUMN_TYPE_FLOAT: (_float, pa.float64()),
    T.COLUMN_TYPE_TEXT: (_text, pa.string()),
    T.COLUMN_TYPE_JSON: (_json, pa.string()),
    T.COLUMN_TYPE_BYTES: (_blob, pa.binary()),
    T.COLUMN_TYPE_BOOLEAN: (_bool, pa.bool_()),
    T.COLUMN_TYPE_DATE: (_date, pa.int32()),  # cast to date32 below
    T.COLUMN_TYPE_TIME: (_time, pa.int64()),
    T.COLUMN_TYPE_TIMESTAMP: (_timestamp, pa.int64()),
    T.COLUMN_TYPE_TIMESTAMPTZ: (_timestamptz, pa.string()),
}


def _column(index: int, column: pb.Column, cells: list[pb.Value | None]) -> tuple[str, pa.Array]:
    conv, atype = _TYPED.get(column.type, (_never, pa.binary()))
    try:
        data = [None if c is None else conv(c) for c in cells]
        arr = pa.array(data, type=atype)
        if column.type == T.COLUMN_TYPE_DATE:
            arr = arr.cast(pa.date32())
        return f"c{index}", arr
    except _Mismatch:
        blobs = [None if c is None or _kind(c) is None else c.SerializeToString() for c in cells]
        return f"v{index}", pa.array(blobs, type=pa.binary())


@dataclass
class EventBuffer:
    """The events of one table within one segment, in arrival order."""

    schema: pb.TableSchema
    seqs: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    deletes: list[bool] = field(default_factory=list)
    rows: list[Sequence[pb.Value | None]] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)  # the RowOp each event came from
    key_index: list[int] = field(init=False)

    def __post_init__(self) -> None:
        names = [c.name for c in self.schema.columns]
        self.key_index = [names.index(k) for k in self.schema.primary_key]

    def add(
        self, seq: int, pos: int, delete: bool, row: Sequence[pb.Value | None], op: int = 0
    ) -> None:
        self.seqs.append(seq)
        self.positions.append(pos)
        self.deletes.append(delete)
        self.rows.append(row)
        self.ops.append(op)

    def to_arrow(self) -> pa.Table:
        arrays: list[pa.Array] = [
            pa.array(self.seqs, type=pa.int64()),
            pa.array(self.positions, type=pa.int64()),
            pa.array(self.deletes, type=pa.bool_()),
        ]
        names = ["_seq", "_pos", "_del"]
        for i, col in enumerate(self.schema.columns):
            name, arr = _column(i, col, [r[i] for r in self.rows])
            names.append(name)
            arrays.append(arr)
        # Last, so that schema column i stays at position 3 + i.
        names.append("_op")
        arrays.append(pa.array(self.ops, type=pa.int8()))
        return pa.Table.from_arrays(arrays, names=names)


def net_effect_df(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Keep, per primary key, only the last event in (_seq, _pos) order (lazy)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*key_columns).orderBy(F.col("_seq").desc(), F.col("_pos").desc())
    return df.withColumn("_rn", F.row_number().over(order)).where(F.col("_rn") == 1).drop("_rn")


def net_effect(spark: SparkSession, events: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """Keep, per primary key, only the last event in (_seq, _pos) order (Spark job)."""
    out: pa.Table = net_effect_df(spark.createDataFrame(events), key_columns).toArrow()
    return out
