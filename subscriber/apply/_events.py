"""Row changes -> Arrow event tables -> net effect per primary key, through Spark.

An *event* is one upsert or one delete of one primary key.  An event table has the
columns ``_seq`` (int64), ``_pos`` (int64, the event's position in the batch,
increasing in op order), ``_del`` (bool), then one column per schema column named
as described in :mod:`subscriber.apply.writer`, then ``_op`` (int8, the RowOp the
event came from; history mode records it).  A delete event fills only the key
columns (its other cells are NULL).

Decoding is column-wise: the events keep their cells as serialized ``Value``
bytes (:mod:`subscriber.apply._wire`), and a column is decoded at once by numpy
when all its cells have the column's own kind or are NULL.  Otherwise the cells
are parsed as ``Value`` objects and converted per column (one C-level ``map``
when the kinds allow, TIMESTAMPTZ text formatted by Arrow) or per cell; the
per-cell conversions below define the semantics (a decimal sent as an int, JSON
sent as text, a value of the wrong kind: a variant column), and
``tests/unit/subscriber/test_apply_wire.py`` checks the fast paths against them.
numpy's fixed cost per column (about 50-100 us, 0.4 ms for TIMESTAMPTZ text) is
more than the per-cell path's below about a hundred cells: a table's events
numbering at most :data:`FEW_EVENTS` are parsed cell by cell, TIMESTAMPTZ text
formatted by ``datetime.isoformat`` (the reference), and never by numpy.

Net effect of plain tables (:func:`net_effect_positions`): Spark receives only the
key columns and ``_pos`` of every segment of the batch, in ONE DataFrame (``_s``
numbers the segment), and returns the position of the last event per
``(_s, key)`` (``max(_pos)``: ``_pos`` increases batch-wide in op order, so it
orders events exactly as ``(_seq, _pos)`` does), and of the first (``min(_pos)``:
a key whose first event is a source INSERT was absent when the segment began, see
``RowsStep.fresh``).  The surviving events are then taken from the Arrow event
tables by position.  Tables with transforms or history send their whole event table
(:func:`net_effect_df`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common import values
from common.rpc import txrepl_pb2 as pb
from subscriber.apply._wire import decode_column, gather
from subscriber.apply.session import arrow_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = pb.ColumnType

__all__ = ["EventBuffer", "WireEvents", "net_effect", "net_effect_df", "net_effect_positions"]

_WHICH = methodcaller("WhichOneof", "kind")
# At most this many events: cells parsed one by one (the per-cell path), not by numpy.
FEW_EVENTS = 128
_NULLS = frozenset((None, "null"))


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


# The Value field that holds a column's own kind, for the column-wise fast path.
_FIELD: dict[int, str] = {
    T.COLUMN_TYPE_INTEGER: "int",
    T.COLUMN_TYPE_DECIMAL: "decimal",
    T.COLUMN_TYPE_FLOAT: "float",
    T.COLUMN_TYPE_TEXT: "text",
    T.COLUMN_TYPE_JSON: "json",
    T.COLUMN_TYPE_BYTES: "blob",
    T.COLUMN_TYPE_BOOLEAN: "boolean",
    T.COLUMN_TYPE_DATE: "date",
    T.COLUMN_TYPE_TIME: "time_us",
    T.COLUMN_TYPE_TIMESTAMP: "timestamp_us",
}

# Plain ints: a protobuf enum's attribute costs ~1 us a read (per column of a batch).
_DATE = int(T.COLUMN_TYPE_DATE)
_TSTZ = int(T.COLUMN_TYPE_TIMESTAMPTZ)

# Local times Arrow formats exactly as datetime.isoformat (four-digit years).
_LOW_US = -30_610_224_000_000_000  # 1000-01-01T00:00
_HIGH_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999


def _offset_text(seconds: int) -> str:
    """The offset suffix ``datetime.isoformat`` writes (``+00:00``, ``-05:30``, ...)."""
    zone = dt.timezone(dt.timedelta(seconds=seconds))
    return dt.datetime(2000, 1, 1, tzinfo=zone).isoformat()[19:]


def _timestamptz_column(cells: list[pb.Value]) -> pa.Array | None:
    """ISO text with offset of non-NULL TIMESTAMPTZ cells (see :func:`tz_text`)."""
    n = len(cells)
    subs = list(map(attrgetter("timestamptz"), cells))
    utc = np.fromiter(map(attrgetter("utc_us"), subs), np.int64, n)
    off = np.fromiter(map(attrgetter("offset_s"), subs), np.int64, n)
    return tz_text(utc, off)


def _iso(ts: pa.Array) -> pa.Array:
    """Timestamps (no NULLs, four-digit years) as ``YYYY-MM-DDTHH:MM:SS[.ffffff]``.

    Arrow's cast to string writes a space where ISO has its ``T``, in the same
    place of every value; the ``T`` is put there in the bytes.  A quarter of the
    time of ``pc.strftime`` here (12 vs 54 ms for 32,000 values).
    """
    text = ts.cast(pa.string())
    _, offsets, data = text.buffers()
    assert offsets is not None
    assert data is not None
    starts = np.frombuffer(offsets, np.int32)[text.offset : text.offset + len(text)]
    raw = np.frombuffer(data, np.uint8).copy()
    raw[starts + 10] = ord("T")
    out: pa.Array = pa.Array.from_buffers(
        pa.string(), len(text), [None, offsets, pa.py_buffer(raw)], offset=text.offset
    )
    return out


def tz_text(utc: np.ndarray, off: np.ndarray) -> pa.Array | None:
    """TIMESTAMPTZ values as ISO text with their offset, formatted by Arrow.

    Exactly what ``values.decode(v).isoformat()`` gives; None when some value is
    outside the range where that holds (the per-cell path then decides).
    """
    if utc.size == 0 or np.abs(off).max() >= 86_400:
        return None
    if utc.min() < _LOW_US + 86_400_000_000 or utc.max() > _HIGH_US - 86_400_000_000:
        return None
    local = utc + off * 1_000_000
    ts = pa.array(local, pa.timestamp("us"))
    text = _iso(ts)  # seconds with six decimals
    whole = local % 1_000_000 == 0
    if whole.any():  # isoformat drops ".000000"
        secs = _iso(ts.cast(pa.timestamp("s"), safe=False))
        text = pc.if_else(pa.array(whole), secs, text)
    uniq, inverse = np.unique(off, return_inverse=True)
    suffix = pa.array([_offset_text(int(o)) for o in uniq], pa.string()).take(
        pa.array(inverse.astype(np.int64))
    )
    out: pa.Array = pc.binary_join_element_wise(text, suffix, "")
    return out


def _fast_column(ctype: int, cells: list[pb.Value]) -> pa.Array | None:
    """The typed Arrow column when every cell has the column's own kind or is NULL."""
    kinds = list(map(_WHICH, cells))
    present = set(kinds)
    if ctype == _TSTZ:  # few: per cell, Arrow's set-up costs more
        few = len(cells) <= FEW_EVENTS
        return _timestamptz_column(cells) if present == {"timestamptz"} and not few else None
    fld = _FIELD.get(ctype)
    if fld is None:
        return None
    get = attrgetter(fld)
    if present == {fld}:
        data = list(map(get, cells))
    elif present <= {fld, *_NULLS}:
        data = [get(c) if k == fld else None for c, k in zip(cells, kinds, strict=True)]
    else:
        return None
    arr = pa.array(data, type=_TYPED[ctype][1])
    if ctype == _DATE:
        arr = arr.cast(pa.date32())
    return arr


def _column(index: int, column: pb.Column, cells: list[pb.Value]) -> tuple[str, pa.Array]:
    conv, atype = _TYPED.get(column.type, (_never, pa.binary()))
    fast = _fast_column(column.type, cells)
    if fast is not None:
        return f"c{index}", fast
    try:
        data = [None if c is None else conv(c) for c in cells]
        arr = pa.array(data, type=atype)
        if column.type == _DATE:
            arr = arr.cast(pa.date32())
        return f"c{index}", arr
    except _Mismatch:
        blobs = [None if c is None or _kind(c) is None else c.SerializeToString() for c in cells]
        return f"v{index}", pa.array(blobs, type=pa.binary())


def _wire_column(
    index: int, column: pb.Column, cells: list[bytes] | pa.Array
) -> tuple[str, pa.Array]:
    """Column ``index`` of serialized ``Value`` cells (a list or one Arrow binary
    array): decoded by numpy when it can be."""
    got = decode_column(column.type, cells)
    if got is not None:
        arr, valid = got
        if column.type != _TSTZ:
            return f"c{index}", arr
        text = tz_text(arr.field(0).to_numpy(), arr.field(1).to_numpy())
        if text is not None:
            if not valid.all():
                text = pc.if_else(pa.array(valid), text, pa.scalar(None, pa.string()))
            return f"c{index}", text
    if isinstance(cells, pa.Array):
        cells = cells.to_pylist()
    return _column(index, column, [pb.Value.FromString(b) for b in cells])


@dataclass(frozen=True)
class WireEvents:
    """Events held as arrays, their cells as spans of one byte buffer (see ``_walk.py``).

    ``starts`` and ``lengths`` are ``(width, events)``: the serialized ``Value`` of
    schema column ``i`` of event ``j`` is ``data[starts[i, j] : starts[i, j] +
    lengths[i, j]]`` (an empty span is NULL).
    """

    seqs: np.ndarray  # int64
    positions: np.ndarray  # int64
    deletes: np.ndarray  # bool
    ops: np.ndarray  # int8
    data: np.ndarray  # uint8
    starts: np.ndarray  # int64
    lengths: np.ndarray  # int64


@dataclass
class EventBuffer:
    """The events of one table within one segment, in arrival order.

    Either built event by event (:meth:`add`): ``cells`` holds the events' rows
    flat, ``width`` serialized ``Value`` cells per event (``b""``, NULL, for the
    non-key cells of a delete); or made whole from arrays (:meth:`from_wire`),
    the list fields then stay empty and :attr:`wire` holds the events.
    """

    schema: pb.TableSchema
    seqs: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    deletes: list[bool] = field(default_factory=list)
    cells: list[bytes] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)  # the RowOp each event came from
    wire: WireEvents | None = None
    key_index: list[int] = field(init=False)
    width: int = field(init=False)  # number of schema columns
    _columns: dict[int, tuple[str, pa.Array]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        names = [c.name for c in self.schema.columns]
        self.key_index = [names.index(k) for k in self.schema.primary_key]
        self.width = len(names)

    @classmethod
    def from_wire(cls, schema: pb.TableSchema, wire: WireEvents) -> EventBuffer:
        return cls(schema, wire=wire)

    def add(self, seq: int, pos: int, delete: bool, row: Sequence[bytes], op: int = 0) -> None:
        assert self.wire is None
        self.seqs.append(seq)
        self.positions.append(pos)
        self.deletes.append(delete)
        self.cells.extend(row)
        self.ops.append(op)

    @property
    def n_events(self) -> int:
        return len(self.seqs) if self.wire is None else int(self.wire.positions.size)

    @property
    def few(self) -> bool:
        """Built by :meth:`add`, at most :data:`FEW_EVENTS` events: decoded cell by cell."""
        return self.wire is None and len(self.seqs) <= FEW_EVENTS

    def position_array(self) -> np.ndarray:
        """The events' ``_pos``, increasing, as int64."""
        if self.wire is not None:
            return self.wire.positions
        return np.asarray(self.positions, np.int64)

    def column(self, i: int) -> tuple[str, pa.Array]:
        """Schema column ``i`` of the events: its name (``c{i}`` or ``v{i}``) and array."""
        got = self._columns.get(i)
        if got is None:
            col = self.schema.columns[i]
            w = self.wire
            if self.few:
                values = list(map(pb.Value.FromString, self.cells[i :: self.width]))
                got = self._columns[i] = _column(i, col, values)
                return got
            cells = (
                self.cells[i :: self.width]
                if w is None
                else gather(w.data, w.starts[i], w.lengths[i])
            )
            got = self._columns[i] = _wire_column(i, col, cells)
        return got

    def keys_table(self) -> pa.Table:
        """``_pos`` and the key columns (named ``c{i}``/``v{i}``) of the events."""
        arrays = [pa.array(self.position_array(), type=pa.int64())]
        names = ["_pos"]
        for i in self.key_index:
            name, arr = self.column(i)
            names.append(name)
            arrays.append(arr)
        return pa.Table.from_arrays(arrays, names=names)

    def to_arrow(self) -> pa.Table:
        w = self.wire
        seqs: Sequence[int] | np.ndarray = self.seqs if w is None else w.seqs
        dels: Sequence[bool] | np.ndarray = self.deletes if w is None else w.deletes
        ops: Sequence[int] | np.ndarray = self.ops if w is None else w.ops
        arrays: list[pa.Array] = [
            pa.array(seqs, type=pa.int64()),
            pa.array(self.position_array(), type=pa.int64()),
            pa.array(dels, type=pa.bool_()),
        ]
        names = ["_seq", "_pos", "_del"]
        for i in range(self.width):
            name, arr = self.column(i)
            names.append(name)
            arrays.append(arr)
        # Last, so that schema column i stays at position 3 + i.
        names.append("_op")
        arrays.append(pa.array(ops, type=pa.int8()))
        return pa.Table.from_arrays(arrays, names=names)


def net_effect_df(df: DataFrame, key_columns: Sequence[str]) -> DataFrame:
    """Keep, per primary key, only the last event in (_seq, _pos) order (lazy)."""
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy(*key_columns).orderBy(F.col("_seq").desc(), F.col("_pos").desc())
    return df.withColumn("_rn", F.row_number().over(order)).where(F.col("_rn") == 1).drop("_rn")


def net_effect(spark: SparkSession, events: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """Keep, per primary key, only the last event in (_seq, _pos) order (Spark job)."""
    out: pa.Table = net_effect_df(arrow_frame(spark, events), key_columns).toArrow()
    return out


def net_effect_positions(
    spark: SparkSession, segments: Sequence[pa.Table]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per segment, the sorted ``_pos`` of the last event of each key, and the
    ``_pos`` of the same key's first event (ONE Spark job).

    ``segments`` are :meth:`EventBuffer.keys_table` tables.  They go to Spark as
    one DataFrame: ``_s`` (the segment's index), ``_pos``, and the key columns,
    named by key position and Arrow type so that segments whose keys have the same
    shape share columns (the others are NULL there); Spark groups by ``_s`` and
    the key columns and keeps ``max(_pos)`` and ``min(_pos)``.
    """
    # deferred: pyspark loads with the first Spark job, not with this module
    from pyspark.sql import functions as F

    parts: list[pa.Table] = []
    key_names: dict[str, None] = {}
    for s, keys in enumerate(segments):
        arrays = [pa.array(np.full(keys.num_rows, s, np.int32)), keys.column("_pos")]
        names = ["_s", "_pos"]
        for j, col in enumerate(keys.columns[1:]):
            name = f"k{j}_{col.type}".replace(" ", "_")
            for bad in "[]<>(),:=":
                name = name.replace(bad, "_")
            names.append(name)
            key_names[name] = None
            arrays.append(col)
        parts.append(pa.Table.from_arrays(arrays, names=names))
    events = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
    df = arrow_frame(spark, events)
    agg = df.groupBy("_s", *key_names).agg(
        F.max("_pos").alias("_pos"), F.min("_pos").alias("_first")
    )
    got: pa.Table = agg.toArrow()
    seg = got.column("_s").to_numpy()
    pos = got.column("_pos").to_numpy()
    first = got.column("_first").to_numpy()
    order = np.lexsort((pos, seg))
    seg, pos, first = seg[order], pos[order], first[order]
    bounds = np.searchsorted(seg, np.arange(len(segments) + 1))
    return [
        (pos[bounds[s] : bounds[s + 1]], first[bounds[s] : bounds[s + 1]])
        for s in range(len(segments))
    ]
